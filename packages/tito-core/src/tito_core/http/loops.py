"""One transport per event loop: made on a loop's first request, closed as that loop ends, let go when it died.

A transport's connections belong to the loop that opened them, so a client used from several loops (one
``asyncio.run`` per step, threads) keeps one transport per loop in a dict keyed by ``id(loop)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncGenerator, Callable

from tito_core.http.transport import Transport

__all__ = ["LoopTransport", "close_loop_transports", "discard_dead", "transport_for_loop"]


class LoopTransport:
    """A transport bound to one event loop (held weakly, so dead loops are noticed), closed when the loop ends.

    Made inside a running loop, it starts an async generator that does nothing until it is closed: the loop
    registers it, and ``asyncio.run`` (any runner calling ``loop.shutdown_asyncgens()``) closes it before the
    loop closes, which closes the transport on its own loop: no "Unclosed client session" is left behind. A
    loop closed without that step leaves the transport to :meth:`discard` (its connections cannot be awaited
    anymore; it is let go without warnings).
    """

    __slots__ = ("closer", "loop_ref", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: Transport) -> None:
        self.loop_ref = weakref.ref(loop)
        self.transport = transport
        self.closer = _close_with_loop(self)
        with contextlib.suppress(StopIteration):
            self.closer.asend(None).send(None)  # runs to its ``yield``: the running loop now holds it

    def alive(self) -> bool:
        """Whether the loop still exists and is not closed."""
        loop = self.loop_ref()
        return loop is not None and not loop.is_closed()

    def discard(self) -> None:
        """Let go of the transport of a loop that is gone, without awaiting anything."""
        self.transport.abandon()
        with contextlib.suppress(StopIteration, RuntimeError):
            self.closer.aclose().send(None)  # finishes the generator here, so no loop is asked to close it


def discard_dead(transports: dict[int, LoopTransport]) -> None:
    """When a client goes away: let go of the transports of loops already closed (a running loop closes its own)."""
    for entry in list(transports.values()):
        if not entry.alive():
            entry.discard()


async def _close_with_loop(entry: LoopTransport) -> AsyncGenerator[None, None]:
    """Closes ``entry``'s transport when the loop closes this generator (``shutdown_asyncgens``)."""
    try:
        yield
    finally:
        if entry.alive():
            await entry.transport.aclose()


def transport_for_loop(transports: dict[int, LoopTransport], make: Callable[[], Transport]) -> Transport:
    """The running loop's transport in ``transports`` (keyed by ``id(loop)``), made with ``make`` if it has none.

    The transports of loops that are gone are let go on the way (their connections cannot be used or awaited
    anymore).
    """
    loop = asyncio.get_running_loop()
    key = id(loop)
    entry = transports.get(key)
    if entry is not None and entry.loop_ref() is loop and not loop.is_closed():
        return entry.transport
    for stale in [k for k, e in transports.items() if not e.alive() or k == key]:
        transports.pop(stale).discard()
    transport = make()
    transports[key] = LoopTransport(loop, transport)
    return transport


async def close_loop_transports(transports: dict[int, LoopTransport]) -> None:
    """Close the running loop's transport in ``transports``; let go of the dead loops' ones; forget them all."""
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - called outside a loop
        loop = None
    entries = list(transports.values())
    transports.clear()
    for entry in entries:
        if loop is not None and entry.loop_ref() is loop:
            await entry.transport.aclose()
        elif not entry.alive():
            entry.discard()
