"""Who may do what on a gateway: its key, each rollout's token, and the browser rules.

See docs/gateway.md, "Threat model and defences". The gateway's key (when it has one) opens rollouts and reaches
every rollout; each rollout's token reaches that rollout only; a credential is compared in constant time and never
written into an error or a log line. A request a web page could send (a foreign ``Host``, an ``Origin`` not
allowed, a POST that is not JSON) is refused before any of that.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Iterable, Sequence

from .errors import GatewayError

__all__ = ["Access", "allowed_hosts", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str, shown: str, port: int, extra: Sequence[str]) -> frozenset[str] | None:
    """The ``Host`` header values a gateway bound to ``host`` (``shown`` in URLs) serves; None: any.

    A wildcard bind (``0.0.0.0``, ``::``) without ``extra`` serves any Host: its api key is the defence there.
    A loopback bind also serves ``localhost``, ``127.0.0.1`` and ``[::1]``. An extra name without a port is
    served with and without the port.
    """
    if host in ("", "0.0.0.0", "::") and not extra:
        return None
    names = {host.lower(), shown.lower()}
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1", "[::1]"}
    values = {f"{name}:{port}" for name in names}
    for name in (e.lower() for e in extra):
        has_port = name.rsplit(":", 1)[-1].isdigit() and not name.endswith("]")
        values |= {name} if has_port else {name, f"{name}:{port}"}
    return frozenset(values)


def _same(credential: str | None, secret: str) -> bool:
    """Constant-time comparison of a request's credential with a secret."""
    return bool(secret) and credential is not None and hmac.compare_digest(credential.encode(), secret.encode())


class Access:
    """The gateway's credentials and browser rules.

    Args:
        api_key: The gateway's key, or None (loopback only).
        allow_hosts: More ``Host`` values to serve besides the bound address.
        allow_origins: Browser origins allowed to call (none by default).
    """

    def __init__(self, api_key: str | None, allow_hosts: Iterable[str] = (), allow_origins: Iterable[str] = ()):
        self.api_key = api_key
        self.allow_hosts = [h.lower() for h in allow_hosts]
        self.allow_origins = list(allow_origins)
        self.hosts: frozenset[str] | None = None  # the Host values served, set once the address is known
        # the viewer at /ui reads every rollout: the gateway's key, or without one a secret of its own (printed
        # by `tito serve` for its operator), never a rollout's token
        self.viewer_key = api_key or "tito-view-" + secrets.token_urlsafe(24)
        self._tokens: dict[str, str] = {}  # rollout token -> rollout id (open and recently finished rollouts)
        self._ids: dict[str, str] = {}  # rollout id -> its token

    def bind(self, host: str, shown: str, port: int) -> None:
        """Serve the Host values of this address (and ``allow_hosts``)."""
        self.hosts = allowed_hosts(host, shown, port, self.allow_hosts)

    def add(self, rollout_id: str, token: str) -> None:
        """Know a new rollout's token."""
        self._tokens[token] = rollout_id
        self._ids[rollout_id] = token

    def forget(self, rollout_id: str) -> None:
        """Forget a rollout's token (its record is gone from the gateway's memory)."""
        token = self._ids.pop(rollout_id, None)
        if token is not None:
            self._tokens.pop(token, None)

    def check_browser_rules(self, host: str, origin: str | None, method: str, content_type: str) -> None:
        """Refuse what a web page can send to a loopback server.

        A foreign ``Host`` (DNS rebinding), an ``Origin`` not allowed (a cross-origin page), a POST that is not
        JSON (a "simple" cross-origin request needs no CORS preflight, so only its content type tells it apart).

        Raises:
            GatewayError: 403 or 415.
        """
        if self.hosts is not None and host.lower() not in self.hosts:
            raise GatewayError(403, f"Host {host[:100]!r} is not this gateway's address (allow it with --allow-host)",
                               code="host_not_allowed")  # fmt: skip
        if origin is not None and origin not in self.allow_origins:
            raise GatewayError(403, f"requests from web pages are refused (Origin {origin[:100]!r}; allow one with "
                               "--allow-origin)", code="origin_not_allowed")  # fmt: skip
        if method == "POST" and content_type != "application/json":
            raise GatewayError(415, "a POST body must be JSON: Content-Type: application/json", code="not_json")

    def authorize_viewer(self, credential: str | None) -> None:
        """Check a request of the viewer's data (``/ui``): it must carry the viewer key (the gateway's key if any).

        Raises:
            GatewayError: 401 (the credential is never in the message).
        """
        if not _same(credential, self.viewer_key):
            raise GatewayError(401, "the viewer needs its key: open the /ui/#key=... address `tito serve` printed "
                               "(the gateway's api key when it has one)", code="invalid_viewer_key")  # fmt: skip

    def authorize_opening(self, credential: str | None) -> None:
        """Check a request to open a rollout: with an api key, it must carry it.

        Raises:
            GatewayError: 401 (the credential is never in the message).
        """
        if self.api_key is not None and not _same(credential, self.api_key):
            raise GatewayError(401, "a valid api key is required (Authorization: Bearer KEY)", code="invalid_api_key")

    def authorize(self, rollout_id: str, credential: str | None) -> None:
        """Check a request on a known rollout: it must carry the rollout's token, or the gateway's key.

        Raises:
            GatewayError: 401 for a missing or wrong credential (never echoed).
        """
        if _same(credential, self._ids.get(rollout_id, "")) or (
            self.api_key is not None and _same(credential, self.api_key)
        ):
            return
        message = (
            f"rollout {rollout_id!r} takes its own token: Authorization: Bearer <the token POST /rollouts returned>"
        )
        raise GatewayError(401, message, code="invalid_rollout_token")

    def rollout_of(self, credential: str | None) -> str:
        """The rollout a token belongs to (``/v1/chat/completions`` names the rollout by its token alone).

        Raises:
            GatewayError: 401 when the credential is no rollout's token (the credential is never echoed).
        """
        found = self._tokens.get(credential or "")
        if found is None:
            message = "give a rollout's token as the api key (Authorization: Bearer <token from POST /rollouts>)"
            raise GatewayError(401, message, code="invalid_rollout_token")
        return found

    def authorize_any(self, credential: str | None) -> None:
        """Check a request on no rollout (``/v1/models``): any rollout's token, or the key, when there is a key.

        Raises:
            GatewayError: 401.
        """
        if self.api_key is None or _same(credential, self.api_key) or (credential or "") in self._tokens:
            return
        raise GatewayError(401, "a valid api key or rollout token is required", code="invalid_api_key")
