"""``tito serve``: run a :class:`~tito_core.gateway.Gateway` until SIGINT or SIGTERM, then write what is open.

The gateway prints one line with its address once it serves (``tito serve: serving on http://HOST:PORT``), so a
process that started it can wait for that line. On SIGINT or SIGTERM it stops taking new rollouts and calls,
gives the calls in flight up to ``drain_s`` seconds to finish (each recorded before it is answered; a second
signal stops the wait), cancels the ones still running, ends every open rollout ``aborted`` (unless it ended
otherwise), writes them to the output, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..config import TitoConfig
from ..errors import ConfigError
from .service import Gateway

__all__ = ["api_key_from", "serve", "stop_on_signals"]


def api_key_from(api_key: str | None, api_key_file: str | None) -> str | None:
    """The gateway's key: ``--api-key``, ``--api-key-file`` (its first line) or ``TITO_API_KEY``; one at most.

    None when none is given. A key given empty (``--api-key ""``, ``TITO_API_KEY=``) is an error, not "no key": a
    gateway meant to be locked would otherwise serve anyone.

    Raises:
        ConfigError: Both flags given; a key that is empty or only whitespace (naming where it came from); a file
            that cannot be read.
    """
    if api_key is not None and api_key_file is not None:
        raise ConfigError("give the api key once: --api-key or --api-key-file")
    if api_key_file is not None:
        try:
            lines = Path(api_key_file).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"--api-key-file {api_key_file}: cannot read it ({exc.strerror})") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise ConfigError(f"--api-key-file {api_key_file}: the file's first line is empty")
        return key
    if api_key is not None:
        return _not_blank(api_key, "--api-key")
    env = os.environ.get("TITO_API_KEY")
    return None if env is None else _not_blank(env, "TITO_API_KEY")


def _not_blank(key: str, source: str) -> str:
    if not key.strip():
        raise ConfigError(f"{source} is empty: give a key, or leave it out (unset) to serve on loopback without one")
    return key


async def serve(
    config: TitoConfig,
    *,
    host: str = "127.0.0.1",
    port: int = 8100,
    output: str | Path | None = None,
    api_key: str | None = None,
    idle_timeout: float = 600.0,
    drain_s: float = 30.0,
    allow_hosts: Sequence[str] = (),
    allow_origins: Sequence[str] = (),
) -> int:
    """Serve until SIGINT / SIGTERM; returns the exit status (0)."""
    gateway = Gateway(
        config,
        output=output,
        api_key=api_key,
        idle_timeout=idle_timeout,
        allow_hosts=allow_hosts,
        allow_origins=allow_origins,
    )
    with stop_on_signals(gateway.stop_draining) as stop:  # a second signal: stop waiting for the calls in flight
        try:
            base = await gateway.start(host, port)
        except BaseException:
            await gateway.close(drain_s=0)
            raise
        print(f"tito serve: serving on {base}", flush=True)
        key = "<the api key>" if api_key else gateway.access.viewer_key  # a key the operator has is not echoed
        print(f"tito serve: viewer at {base}/ui/#key={key}", flush=True)
        await stop.wait()
        in_flight = len(gateway.registry.busy())
        print(
            f"tito serve: shutting down; {in_flight} calls in flight get up to {drain_s:g} s (a second Ctrl-C: stop "
            "waiting), then open rollouts are written as aborted",
            file=sys.stderr,
            flush=True,
        )
        await gateway.close(drain_s=drain_s)
    return 0


@contextlib.contextmanager
def stop_on_signals(on_second: Callable[[], None]) -> Iterator[asyncio.Event]:
    """An event that SIGINT or SIGTERM sets, in the running loop; a second signal calls ``on_second`` too.

    The handlers are removed on the way out (``tito serve`` and ``tito serve --workers`` share them).
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            on_second()
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
