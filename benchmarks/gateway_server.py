"""The gateway under benchmark: a :class:`~tito_core.gateway.Gateway` in its own process, as ``tito serve`` runs it.

``python benchmarks/gateway_server.py --engine URL --tokenizer DIR [--output FILE] [--profile OUT]`` serves the
gateway's own routes (``tito_core.gateway.app.build_app``) on a free port of 127.0.0.1, in front of the SGLang
backend at ``URL`` (``session="off"``: every call sends the whole trajectory, as the benchmark's direct clients
do), with the hermes tool parser, and prints ``PORT <n>`` once it serves. One route is added for the benchmark:
``GET /_bench/times`` returns and clears the wall time of every ``Gateway.call`` since the last ask (the front's
decoding, the core's call with the engine's round trip, the front's answer): the gateway's service time without
aiohttp's HTTP handling. SIGTERM / SIGINT end it as ``tito serve`` ends: open rollouts are written ``aborted``.
With ``--profile OUT`` the whole process runs under cProfile, written to ``OUT`` (``.pstats``) and the top 40 by
own time to ``OUT.txt`` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import signal
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


async def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM / SIGINT, then close the gateway (open rollouts written ``aborted``)."""
    from aiohttp import web

    from tito_core.config import TitoConfig
    from tito_core.gateway import Gateway
    from tito_core.gateway.app import build_app

    config = TitoConfig(
        backend="sglang",
        backend_options={"base_url": args.engine, "session": "off", "timeout": 600.0},
        tokenizer=args.tokenizer,
        tool_parser="hermes",
    )
    gateway = Gateway(config, output=args.output or None)
    await gateway.prepare()
    times: list[float] = []
    call = gateway.call

    async def timed_call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await call(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - started)

    gateway.call = timed_call  # type: ignore[method-assign]

    async def bench_times(_request: web.Request) -> web.Response:
        taken = times[:]
        times.clear()
        return web.Response(body=json.dumps(taken), content_type="application/json")

    app = build_app(gateway)
    app.router.add_get("/_bench/times", bench_times)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
    await site.start()
    port = runner.addresses[0][1]
    gateway.base_url = f"http://127.0.0.1:{port}"
    gateway.registry.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"PORT {port}", flush=True)
    try:
        await stop.wait()
    finally:
        await gateway.close()  # the gateway's own shutdown: open rollouts written aborted, backend closed
        await runner.cleanup()


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, help="the (fake) SGLang server's base URL")
    parser.add_argument("--tokenizer", required=True, help="a Qwen3 tokenizer directory")
    parser.add_argument("--output", default="", help="the rollout file ended rollouts are written to")
    parser.add_argument("--profile", default="", help="run under cProfile; stats to this path (+ .txt)")
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
        Path(args.profile + ".txt").write_text(text.getvalue())


if __name__ == "__main__":
    main()
