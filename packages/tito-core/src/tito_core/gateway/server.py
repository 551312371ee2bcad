"""``tito serve``: run a :class:`~tito_core.gateway.Gateway` until SIGINT or SIGTERM, then write what is open.

The gateway prints one line with its address once it serves (``tito serve: serving on http://HOST:PORT``), so a
process that started it can wait for that line. On SIGINT or SIGTERM it stops taking requests, ends every open
rollout ``aborted`` (unless it ended otherwise), writes them to the output, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from ..config import TitoConfig
from .service import Gateway

__all__ = ["serve"]


async def serve(
    config: TitoConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
    output: str | Path | None = None,
    api_key: str | None = None,
    idle_timeout: float = 600.0,
) -> int:
    """Serve until SIGINT / SIGTERM; returns the exit status (0)."""
    gateway = Gateway(config, output=output, api_key=api_key, idle_timeout=idle_timeout)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        try:
            base = await gateway.start(host, port)
        except BaseException:
            await gateway.close()
            raise
        print(f"tito serve: serving on {base}", flush=True)
        await stop.wait()
        print("tito serve: shutting down; writing open rollouts as aborted", file=sys.stderr, flush=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
    await gateway.close()
    return 0
