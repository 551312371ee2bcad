"""The gateway's errors as OpenAI's error JSON: ``{"error": {"message", "type", "param", "code"}}`` and a status.

:class:`GatewayError` is what the gateway's own checks raise (a bad request naming its field, an unknown rollout,
a busy one); :func:`error_of` maps any other exception out of a model call (tito's typed errors) to a status and
an error body, so an engine failure reaches the client as JSON and never as a made-up answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ..errors import (
    BackendConnectionError,
    BackendError,
    BackendRequestError,
    BackendThrottledError,
    BackendTimeoutError,
    ConfigError,
    ContextLengthError,
    ContextWindowFullError,
    SamplingMaskError,
    TemplateError,
    TitoError,
    UnsupportedContentError,
)

__all__ = ["MAX_JSON_DEPTH", "GatewayError", "bad_request", "bounded_depth", "error_body", "error_of", "known_fields"]

MAX_JSON_DEPTH = 128
"""How deep a request's JSON arrays and objects may nest (serde_json's default). Deeper ones are a 400: msgspec and
``json`` decode them up to Python's recursion limit (~1,000), and what takes them later (the chat template, the
record's encoder) runs out of stack before that: a 500, or a finished rollout whose record could not be written."""


class GatewayError(TitoError):
    """A request the gateway refuses, with the HTTP status and OpenAI error fields to answer with.

    Args:
        status: The HTTP status (400 bad request, 401, 404 unknown rollout, 409 busy or finished, 413, ...).
        message: What is wrong, naming the field (``messages[2].content[0].type``) when there is one.
        param: The request field at fault, or None.
        code: A short machine-readable code, or None.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    @property
    def kind(self) -> str:
        """OpenAI's error ``type`` for the status."""
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")


_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def bad_request(param: str, message: str, *, code: str | None = None) -> GatewayError:
    """A 400 naming ``param``: ``"<param>: <message>"``."""
    return GatewayError(400, f"{param}: {message}", param=param, code=code or "unsupported_value")


def known_fields(body: Any, known: frozenset[str], api: str) -> Mapping[str, Any]:
    """``body`` when it is a JSON object of ``known`` fields only; else a 400 naming the first other one."""
    if not isinstance(body, Mapping):
        raise bad_request("body", "the request body must be a JSON object")
    for key in body:
        if key not in known:
            raise bad_request(str(key), f"this field is not supported by the tito gateway's {api}")
    return body


def bounded_depth(value: Any, where: str) -> Any:
    """``value`` when its arrays and objects nest at most :data:`MAX_JSON_DEPTH` deep; else a 400 naming ``where``.

    One level at a time (decoded JSON holds plain dicts and lists): ~1 ms on a 1.4 MB body of 1,500 messages.
    """
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(MAX_JSON_DEPTH):
        level = [
            child
            for item in level
            for child in (item.values() if type(item) is dict else item)
            if type(child) is dict or type(child) is list
        ]
        if not level:
            return value
    raise too_deep(where)


def too_deep(where: str) -> GatewayError:
    """The 400 for JSON nested deeper than :data:`MAX_JSON_DEPTH` at ``where``."""
    return bad_request(where, f"JSON nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects")


def error_body(error: GatewayError) -> dict[str, Any]:
    """OpenAI's error JSON for ``error``."""
    return {"error": {"message": error.message, "type": error.kind, "param": error.param, "code": error.code}}


def error_of(exc: BaseException) -> GatewayError:
    """The gateway error answering a model call that raised ``exc`` (the rollout already has its status)."""
    if isinstance(exc, GatewayError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (ContextWindowFullError, ContextLengthError)):
        return GatewayError(400, text, param="messages", code="context_length_exceeded")
    if isinstance(exc, SamplingMaskError):  # a truncating call the engine cannot record exactly
        return GatewayError(400, text, code="sampling_mask_unavailable")
    if isinstance(exc, (UnsupportedContentError, TemplateError, ConfigError)):
        return GatewayError(400, text, code="invalid_request")
    if isinstance(exc, BackendThrottledError):
        return GatewayError(429, text, code="engine_throttled")
    if isinstance(exc, (BackendTimeoutError, asyncio.TimeoutError)):
        return GatewayError(504, text, code="engine_timeout")
    if isinstance(exc, BackendConnectionError):
        return GatewayError(503, text, code="engine_unavailable")
    if isinstance(exc, BackendRequestError):
        return GatewayError(502, text, code="engine_refused_request")
    if isinstance(exc, BackendError):
        return GatewayError(502, text, code="engine_error")
    return GatewayError(500, text, code="internal_error")
