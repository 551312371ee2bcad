"""Every use of an aiohttp private name, in one place, each with the reason it is needed.

aiohttp's public API has no way to refuse the reuse of a pooled connection that holds bytes the server sent
after a complete answer, nor to drop a session synchronously when its event loop is already closed. tito
needs both, so it touches these private names (present and unchanged in aiohttp 3.10 to 3.14, the range
``packages/tito-core/pyproject.toml`` allows; ``tests/core/test_aiohttp_compat.py`` checks each one against
the installed aiohttp, and ``nox -s aiohttp_compat`` against the oldest and the newest allowed):

=================================== =====================================================================
``aiohttp.client_proto``            the module of ``ResponseHandler``, the connection protocol (not in
                                    aiohttp's public names); subclassed by :func:`strict_handler_class`.
``ResponseHandler._payload``        the body stream of the answer being read: once it is at EOF the answer
                                    is complete, and any byte after it is stray.
``TCPConnector._factory``           the protocol factory handed to ``loop.create_connection``: replaced by
                                    :func:`install_strict_handler` so pooled connections use the strict
                                    handler.
``TCPConnector._factory.keywords``  aiohttp's factory is ``functools.partial(ResponseHandler, loop=loop)``:
                                    the loop the new protocols need (``TCPConnector._loop`` as a fallback).
``BaseConnector._close()``          the synchronous part of ``close()``: :func:`close_connector_now` marks a
                                    session of a closed loop closed without awaiting (so it is collected
                                    without "Unclosed connector" warnings).
=================================== =====================================================================

Should a future aiohttp drop one of them, tito degrades instead of failing: without ``_factory`` it logs once
and relies on the adapters' request-id checks; without ``_close`` a dead loop's session is left to the
garbage collector. The compatibility tests fail first, so the change is seen before a release.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

__all__ = ["close_connector_now", "install_strict_handler", "strict_handler_class"]

logger = logging.getLogger(__name__)

_STRICT_HANDLER: type[Any] | None = None
_warned_no_factory = False


def strict_handler_class() -> type[Any]:
    """``aiohttp``'s ``ResponseHandler`` made to refuse reuse of a connection with bytes left over.

    Why: aiohttp's connector decides whether an idle pooled connection may carry the next request with
    ``protocol.is_connected()`` only (transport open). Bytes the server sends after a complete response
    are parsed on arrival: a whole forged response then sits in the handler's message queue and is
    handed to the *next* request as its answer. ``should_close`` already reports that state (a queued
    message, an unfinished body, a parse error, bytes held back) and aiohttp consults it when a
    response is released, which catches bytes arriving in the same packet as the response; it is not
    consulted again when the idle connection is taken from the pool. So the subclass answers "not
    connected" whenever ``should_close`` is true, and also once bytes arrived while no request was
    waiting for them (a partial message would otherwise sit in the old parser; aiohttp makes a new
    parser per request and drops it, but the contract is simpler: any stray byte, no reuse).
    """
    global _STRICT_HANDLER
    if _STRICT_HANDLER is not None:
        return _STRICT_HANDLER
    from aiohttp.client_proto import ResponseHandler

    class _StrictResponseHandler(ResponseHandler):
        _tito_waiting = False  # a request was sent on this connection and its answer is not complete
        _tito_stray = False  # bytes arrived that no request was waiting for

        def set_response_params(self, **kwargs: Any) -> None:
            self._tito_waiting = True
            super().set_response_params(**kwargs)

        def data_received(self, data: bytes) -> None:
            if data and not self._tito_waiting:
                self._tito_stray = True
            super().data_received(data)
            payload = self._payload
            if self._tito_waiting and payload is not None and payload.is_eof():
                self._tito_waiting = False  # the answer is complete: anything after it is stray

        def is_connected(self) -> bool:
            return bool(super().is_connected() and not self._tito_stray and not self.should_close)

    _STRICT_HANDLER = _StrictResponseHandler
    return _STRICT_HANDLER


def install_strict_handler(connector: aiohttp.TCPConnector) -> None:
    """Make ``connector`` build :func:`strict_handler_class` protocols (``connector._factory``).

    Without ``_factory`` (a future aiohttp), tito logs once and relies on the request-id checks of the
    adapters.
    """
    global _warned_no_factory
    factory = getattr(connector, "_factory", None)
    loop = getattr(factory, "keywords", {}).get("loop") or getattr(connector, "_loop", None)
    if factory is None or loop is None:
        if not _warned_no_factory:
            _warned_no_factory = True
            logger.warning(
                "aiohttp %s has no TCPConnector._factory: connections with bytes left over after a "
                "response cannot be refused reuse; relying on request-id checks",
                _aiohttp_version(),
            )
        return
    handler = strict_handler_class()

    def make() -> Any:
        return handler(loop)

    connector._factory = make  # type: ignore[assignment]


def close_connector_now(connector: aiohttp.BaseConnector | None) -> None:
    """Mark ``connector`` closed without awaiting (its loop is closed): aiohttp's private ``_close()``.

    Its sockets cannot be closed through a closed loop; the garbage collector closes them.
    """
    close_now = getattr(connector, "_close", None)
    if callable(close_now):
        with contextlib.suppress(Exception):
            close_now()


def _aiohttp_version() -> str:
    import aiohttp

    return aiohttp.__version__
