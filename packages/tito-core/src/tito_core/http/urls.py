"""Checks of what names the server: the base URL (a server root) and the headers sent with every request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final
from urllib.parse import urlsplit

from tito_core.errors import ConfigError

__all__ = ["check_base_url", "check_headers"]

_SCHEMES: Final = ("http", "https")


def check_base_url(url: str) -> str:
    """Return ``url`` without a trailing ``/`` if it is a server root, else raise :class:`ConfigError`.

    A server root is ``http://host[:port]`` or ``https://host[:port]``: tito appends the engine's API
    paths (``/generate``, ``/v1/completions``, ...) itself. The message names the mistake and the fix.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"base_url must be a server URL such as 'http://127.0.0.1:8000', got {url!r}")
    text = url.strip()
    if "://" not in text:
        raise ConfigError(f"base_url {url!r} has no scheme: write 'http://{text.rstrip('/')}' (or https://)")
    parts = urlsplit(text)
    if parts.scheme.lower() not in _SCHEMES:
        raise ConfigError(
            f"base_url {url!r} uses the unsupported scheme {parts.scheme!r}: tito speaks http:// and https://"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ConfigError(f"base_url {url!r} has a bad port: {exc}") from None
    if not parts.hostname:
        raise ConfigError(f"base_url {url!r} has no host: write e.g. '{parts.scheme}://127.0.0.1:8000'")
    root = f"{parts.scheme}://{parts.netloc}"
    path = parts.path.rstrip("/")
    if path.lower() == "/v1":
        raise ConfigError(
            f"base_url {url!r} ends in /v1: give the server root {root!r}; tito adds /v1/... (and the "
            "engine's native paths) itself"
        )
    if path or parts.query or parts.fragment:
        raise ConfigError(
            f"base_url {url!r} has a path ({parts.path!r}): give the server root {root!r}; tito adds the "
            "API paths itself"
        )
    return root


def check_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` as a dict, if every name and value is a string without a line break or NUL."""
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ConfigError(f"header {name!r}: names and values must be strings")
        if any(c in f"{name}{value}" for c in "\r\n\0"):
            raise ConfigError(f"header {name!r} contains a line break or NUL")
    return dict(headers)
