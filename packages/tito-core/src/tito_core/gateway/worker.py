"""One gateway worker process of ``tito serve --workers N``: a whole :class:`~tito_core.gateway.Gateway` on a port.

Started by the supervisor (:mod:`~tito_core.gateway.workers`) with the ``spawn`` method. It serves its rollouts from
opening to end on its own port, with the gateway's checks (Host, Origin, the key, a token per rollout), hands its
records to the supervisor over the inherited pipe (:mod:`~tito_core.gateway.channel`) and journals what it answers
(:mod:`~tito_core.gateway.journal`). SIGTERM drains it as it drains ``tito serve``: a second SIGTERM stops the wait.
SIGINT is left to the supervisor (a terminal's Ctrl-C reaches the whole process group; the supervisor passes it on
once). The worker ends by itself when the supervisor's end of the pipe closes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from multiprocessing.connection import Connection
from pathlib import Path

import msgspec

from ..config import TitoConfig
from .channel import Channel, Ready, RemoteOutput
from .journal import Journal
from .service import Gateway

__all__ = ["WorkerSettings", "worker_main"]

logger = logging.getLogger("tito")


class WorkerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What every worker is started with (the same for each, but ``journal``)."""

    host: str = "127.0.0.1"
    api_key: str | None = None
    viewer_key: str = ""
    idle_timeout: float = 600.0
    drain_s: float = 30.0
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()
    journal: str | None = None
    """The journal file; None without an output (nothing is recorded, nothing to recover)."""
    journal_fsync: bool = False


def worker_main(conn: Connection, config: TitoConfig, settings: WorkerSettings) -> None:
    """The worker process's entry point: serve until SIGTERM or the supervisor's end, then drain and return."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="tito worker: %(message)s")
    asyncio.run(_serve(Channel(conn), config, settings))


async def _serve(channel: Channel, config: TitoConfig, settings: WorkerSettings) -> None:
    gateway = Gateway(
        config,
        api_key=settings.api_key,
        idle_timeout=settings.idle_timeout,
        allow_hosts=settings.allow_hosts,
        allow_origins=settings.allow_origins,
    )
    if settings.viewer_key:
        gateway.access.viewer_key = settings.viewer_key
    journal = Journal(Path(settings.journal), fsync=settings.journal_fsync) if settings.journal else None
    gateway.journal = journal
    gateway.writer = RemoteOutput(channel, journal) if journal is not None else gateway.writer
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_term() -> None:
        if stop.is_set():
            gateway.stop_draining()
        stop.set()

    def on_supervisor_gone() -> None:  # the pipe is idle between requests: readable now means closed
        loop.remove_reader(channel.conn.fileno())
        gateway.stop_draining()
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    try:
        base = await gateway.start(settings.host, 0)
        channel.request(Ready(base, os.getpid()))
        loop.add_reader(channel.conn.fileno(), on_supervisor_gone)
        await stop.wait()
    finally:
        await gateway.close(drain_s=settings.drain_s)
