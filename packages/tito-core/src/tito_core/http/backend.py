"""The base class of the HTTP adapters: the connection options every engine shares, parsed once."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypedDict

from tito_core.backend import Backend, GenerateRequest
from tito_core.errors import ConfigError
from tito_core.http.client import HttpClient
from tito_core.http.limits import response_byte_limit
from tito_core.http.retry import RetryPolicy
from tito_core.http.transport import Transport, Verify
from tito_core.http.urls import check_base_url, check_headers

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpBackend", "HttpOptions"]


class HttpOptions(TypedDict, total=False):
    """The connection options every HTTP adapter takes (see :class:`HttpBackend`), for ``**options`` typing."""

    timeout: float | None
    connect_timeout: float
    max_connections: int
    retry: RetryPolicy | Mapping[str, Any] | None
    headers: Mapping[str, str] | None
    api_key: str | None
    verify: Verify
    trust_env: bool
    client: httpx.AsyncClient | None
    transport: Transport | httpx.AsyncBaseTransport | None
    max_response_bytes: int | None


class HttpBackend(Backend):
    """Base class of the adapters that reach their engine over HTTP: the shared options, parsed once.

    Args:
        base_url: Server root (``http://host:port``); ``default_base_url`` when None.
        timeout: Seconds one request may take in all; None for no limit.
        connect_timeout: Seconds to open one connection.
        max_connections: Connections open at once per event loop.
        retry: Retry policy (a :class:`RetryPolicy` or a mapping of its fields) for connection failures
            and 429 / 503 answers.
        headers: Extra headers sent with every request.
        api_key: Sent as ``Authorization: Bearer ...`` (unless ``headers`` has an Authorization).
        verify: TLS verification: True, False, a CA bundle path or an ``ssl.SSLContext``.
        trust_env: Honour ``HTTP(S)_PROXY`` / ``NO_PROXY``.
        client: An ``httpx.AsyncClient`` to send through instead of aiohttp (not closed by tito).
        transport: A transport to send through instead of aiohttp: an ``httpx`` transport (tests, proxies,
            mounts) or a :class:`~tito_core.http.transport.Transport` (see :class:`HttpClient`).
        max_response_bytes: Body limit of a generation's answer; None derives it from the request
            (:func:`response_byte_limit`).

    A subclass adds its own options and takes these as ``**options: Unpack[HttpOptions]``; its signature
    (``inspect.signature``) then lists them all, so the plugin registry names a misspelt option.
    """

    default_base_url: ClassVar[str] = "http://127.0.0.1:8000"
    context_length_texts: ClassVar[tuple[str, ...]] = ()
    """Regexes (matched ignoring case) of the engine's "the prompt does not fit the context window" error bodies:
    a 400 / 413 / 422 whose body matches one is a :class:`~tito_core.errors.ContextLengthError`, any other a plain
    :class:`~tito_core.errors.BackendError`. Each adapter declares its own engine's wording (the core knows none),
    each text pinned by a test against the engine's recorded answer."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout: float | None = 600.0,
        connect_timeout: float = 5.0,
        max_connections: int = 1024,
        retry: RetryPolicy | Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
        verify: Verify = True,
        trust_env: bool = True,
        client: httpx.AsyncClient | None = None,
        transport: Transport | httpx.AsyncBaseTransport | None = None,
        max_response_bytes: int | None = None,
    ) -> None:
        all_headers = check_headers(headers or {})
        if api_key and not any(k.lower() == "authorization" for k in all_headers):
            all_headers["authorization"] = f"Bearer {api_key}"
        if max_response_bytes is not None and max_response_bytes < 1:
            raise ConfigError(f"max_response_bytes must be >= 1 (or None), got {max_response_bytes}")
        self.base_url = check_base_url(base_url if base_url is not None else self.default_base_url)
        self.max_response_bytes = max_response_bytes
        self._http = HttpClient(
            self.base_url,
            backend_name=self.name,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            retry=retry,
            headers=all_headers,
            verify=verify,
            trust_env=trust_env,
            client=client,
            transport=transport,
            context_length_patterns=self.context_length_texts,
        )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = _merged_signature(cls)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r})"

    @property
    def http(self) -> HttpClient:
        """The underlying HTTP client (shared plumbing: pooling, retries, error mapping)."""
        return self._http

    def response_limit(
        self,
        request: GenerateRequest,
        *,
        echoed_tokens: int = 0,
        prompt_logprob_tokens: int = 0,
        routed_expert_tokens: int = 0,
        context_length: int | None = None,
    ) -> int:
        """Body limit for the answer to ``request``: ``max_response_bytes``, else :func:`response_byte_limit`."""
        if self.max_response_bytes is not None:
            return self.max_response_bytes
        return response_byte_limit(
            request.sampling.max_new_tokens,
            echoed_tokens=echoed_tokens,
            logprobs=request.return_logprobs,
            prompt_logprob_tokens=prompt_logprob_tokens,
            routed_expert_tokens=routed_expert_tokens,
            context_length=context_length,
        )

    async def aclose(self) -> None:
        """Close the connections of the current event loop."""
        await self._http.aclose()


def _merged_signature(cls: type) -> inspect.Signature:
    """The signature of ``cls(...)``: its own ``__init__`` parameters, ``**options`` spelled out.

    When the subclass ``__init__`` takes ``**options`` (passed on to :class:`HttpBackend`), they are
    replaced by :class:`HttpBackend`'s keyword parameters, so ``inspect.signature(cls).bind(...)`` rejects
    an unknown option (the plugin registry turns that into a ``ConfigError`` listing the valid ones).
    """
    own = list(inspect.signature(cls.__init__).parameters.values())[1:]  # type: ignore[misc]
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in own):
        return inspect.Signature(own)
    params = [p for p in own if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in params}
    base = list(inspect.signature(HttpBackend.__init__).parameters.values())[1:]
    params += [p for p in base if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in names]
    return inspect.Signature(params)
