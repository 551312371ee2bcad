"""Requests through ``httpx``: a user's ``AsyncClient`` or ``httpx`` transport (proxies, mounts, HTTP/2, mocks)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from tito_core.http.errors import from_httpx
from tito_core.http.transport import Response, TransportTimeout, Verify, too_large

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpxTransport"]


class HttpxTransport:
    """Requests through ``httpx``: a user's ``AsyncClient`` (left open), or one made over a user's transport.

    Args:
        base_url: Server root.
        client: An ``httpx.AsyncClient`` to send through; tito never closes it.
        transport: An ``httpx.AsyncBaseTransport`` (``AsyncHTTPTransport(proxy=...)``, ``MockTransport``,
            ...) for a client this object makes and closes.
        headers: Headers sent with every request (added to the client's own).
        connect_timeout: Seconds to open one connection.
        verify: TLS verification, for the client made here (see :data:`~tito_core.http.transport.Verify`).
        trust_env: Honour proxy environment variables, for the client made here.

    """

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float | None = 5.0,
        verify: Verify = True,
        trust_env: bool = True,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self._owned = client is None
        if client is None:
            client = httpx.AsyncClient(
                transport=transport,
                verify=verify,
                trust_env=trust_env,
                timeout=httpx.Timeout(None, connect=connect_timeout),
                follow_redirects=False,
            )
        self.client = client

    async def request(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None,
        max_body: int | None,
    ) -> Response:
        """Send one request, read its whole answer (see :class:`~tito_core.http.transport.Transport`)."""
        import httpx

        all_headers = {**self.headers, **(headers or {})}
        try:
            async with asyncio.timeout(timeout):
                try:
                    async with self.client.stream(
                        method, self.base_url + path, content=body, headers=all_headers
                    ) as answer:
                        return await _read_httpx(answer, max_body)
                except (httpx.TransportError, httpx.DecodingError) as exc:
                    raise from_httpx(exc, self.base_url) from exc
        except TimeoutError as exc:  # asyncio.timeout's (the library's own are mapped above)
            raise TransportTimeout(f"no complete answer within {timeout} s") from exc

    async def aclose(self) -> None:
        """Close the client made here (a client passed in is the caller's to close)."""
        if self._owned:
            await self.client.aclose()

    def abandon(self) -> None:
        """Nothing to do: httpx warns about nothing left open."""


async def _read_httpx(answer: httpx.Response, max_body: int | None) -> Response:
    length = answer.headers.get("content-length")
    if max_body is not None and length is not None and length.isdigit() and int(length) > max_body:
        raise too_large(max_body, int(length))
    parts = bytearray()
    async for chunk in answer.aiter_bytes():
        parts += chunk
        if max_body is not None and len(parts) > max_body:
            raise too_large(max_body, None)
    headers = {k.lower(): v for k, v in answer.headers.multi_items()}
    if len(headers) != len(answer.headers.multi_items()):
        headers = {k: ", ".join(answer.headers.get_list(k)) for k in headers}
    return Response(answer.status_code, headers, bytes(parts))
