"""The transport seam under its first import path: :mod:`tito_core.http.transport` and its two implementations.

Kept so that ``from tito_core.transport import ...`` goes on working; new code imports from
:mod:`tito_core.http.transport` (the seam), :mod:`tito_core.http.aiohttp_transport` and
:mod:`tito_core.http.httpx_transport`.
"""

from __future__ import annotations

from tito_core.http.aiohttp_transport import AiohttpTransport
from tito_core.http.httpx_transport import HttpxTransport
from tito_core.http.transport import (
    BodyTooLargeError,
    FramingError,
    MaybeSentError,
    NotSentError,
    Response,
    Transport,
    TransportError,
    TransportTimeout,
    Verify,
    ssl_context,  # noqa: F401 - importable from here before the move, though never in __all__
)

__all__ = [
    "AiohttpTransport",
    "BodyTooLargeError",
    "FramingError",
    "HttpxTransport",
    "MaybeSentError",
    "NotSentError",
    "Response",
    "Transport",
    "TransportError",
    "TransportTimeout",
    "Verify",
]
