"""Several inference servers behind one backend name: sticky, least-loaded, health-checked routing.

Each rollout leases one server for its whole life (its prefix stays in that server's cache). A new lease
goes to the healthy server with the fewest rollouts in flight. A server that fails a health check is
drained (no new leases; rollouts already on it go on or fail on their own) and checked again every
``interval`` seconds; it takes leases again once it passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..backend import Backend
from ..errors import BackendConnectionError, TitoError
from ..weights import WeightUpdate, weight_update

__all__ = ["Server", "ServerPool", "probe"]

logger = logging.getLogger("tito.runner")


@runtime_checkable
class HealthChecked(Protocol):
    """A backend with its own health check (e.g. SGLang's ``GET /health``)."""

    async def health(self) -> bool: ...


async def probe(backend: Backend, timeout: float = 10.0) -> str | None:
    """Check a backend: None when healthy, else why not.

    Uses the backend's ``health()`` when it has one, else asks its context length (which reaches an HTTP
    engine, and costs nothing in process).
    """
    try:
        async with asyncio.timeout(timeout):
            if isinstance(backend, HealthChecked):
                return None if await backend.health() else "health check failed"
            await backend.max_context_length()
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except (TitoError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@dataclass(eq=False)
class Server:
    """One inference server: its backend, its load and its health."""

    name: str
    backend: Backend
    in_flight: int = 0
    leased: int = 0
    healthy: bool = True
    last_error: str | None = None


class ServerPool:
    """Route rollouts between servers; see the module doc.

    Args:
        servers: ``(name, backend)`` pairs; the name (a base URL) is what records and summaries show.
        interval: Seconds between health checks of each server.
        probe_timeout: Seconds one health check may take.
    """

    def __init__(self, servers: Sequence[tuple[str, Backend]], *, interval: float = 10.0, probe_timeout: float = 10.0):
        if not servers:
            raise TitoError("a server pool needs at least one server")
        self.servers = [Server(name, backend) for name, backend in servers]
        self.interval = interval
        self.probe_timeout = probe_timeout
        self._changed = asyncio.Condition()
        self._checker: asyncio.Task[None] | None = None

    def weight_update(
        self, *, version: str | int | None = None, **options: Any
    ) -> AbstractAsyncContextManager[WeightUpdate]:
        """Pause every server of the pool around a weight update (:func:`tito_core.weights.weight_update`).

        ``async with pool.weight_update(version=7): await push_weights()``: the rollouts in flight go on after it.
        """
        return weight_update([s.backend for s in self.servers], version=version, **options)

    async def check_all(self) -> list[Server]:
        """Check every server now; returns the unhealthy ones."""
        results = await asyncio.gather(*(probe(s.backend, self.probe_timeout) for s in self.servers))
        async with self._changed:
            for server, error in zip(self.servers, results, strict=True):
                self._set(server, error)
            self._changed.notify_all()
        return [s for s in self.servers if not s.healthy]

    async def require_all(self) -> None:
        """Check every server; raise :class:`BackendConnectionError` naming each one that fails."""
        bad = await self.check_all()
        if bad:
            listing = "; ".join(f"{s.name}: {s.last_error}" for s in bad)
            raise BackendConnectionError(f"unreachable inference server(s): {listing}")

    def _set(self, server: Server, error: str | None) -> None:
        if error is None and not server.healthy:
            logger.warning("server %s is healthy again", server.name)
        elif error is not None and server.healthy:
            logger.warning("server %s failed its health check (%s): drained until it passes", server.name, error)
        server.healthy, server.last_error = error is None, error

    def start(self) -> None:
        """Start the periodic health checks (in this event loop)."""
        if self._checker is None and len(self.servers) > 1:
            self._checker = asyncio.get_running_loop().create_task(self._check_forever())

    async def _check_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self.check_all()

    async def suspect(self, server: Server) -> None:
        """A rollout on ``server`` lost its connection: check it now rather than at the next interval."""
        error = await probe(server.backend, self.probe_timeout)
        async with self._changed:
            self._set(server, error)
            self._changed.notify_all()

    def server(self, name: str) -> Server:
        """The server called ``name``."""
        for server in self.servers:
            if server.name == name:
                return server
        raise TitoError(f"no server {name!r} in this pool (it has {', '.join(s.name for s in self.servers)})")

    @contextlib.asynccontextmanager
    async def lease(self, name: str | None = None) -> AsyncIterator[Server]:
        """Hold the least-loaded healthy server for one rollout (waits while none is healthy).

        With ``name``, hold that server whatever its health: the routing was done elsewhere (a distributed
        executor's driver routes every rollout of the cluster with one pool and names the server to use).
        """
        if name is not None:
            server = self.server(name)
        else:
            server = await self._least_loaded()
        # no await since the choice: no other rollout can choose before this one is counted
        server.in_flight += 1
        server.leased += 1
        try:
            yield server
        finally:
            server.in_flight -= 1

    async def _least_loaded(self) -> Server:
        """The healthy server with the fewest rollouts in flight; waits (and re-checks) while none is healthy."""
        async with self._changed:
            while not any(s.healthy for s in self.servers):
                try:
                    await asyncio.wait_for(self._changed.wait(), timeout=self.interval)
                except TimeoutError:
                    await self._recheck_locked()
            return min((s for s in self.servers if s.healthy), key=lambda s: (s.in_flight, s.leased))

    async def _recheck_locked(self) -> None:
        for server in self.servers:
            self._set(server, await probe(server.backend, self.probe_timeout))

    async def aclose(self) -> None:
        """Stop the health checks and close every backend."""
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
            self._checker = None
        for server in self.servers:
            await server.backend.aclose()
