"""SGLang sessions: one engine session per tito sequence (a trajectory branch), so a call sends only new ids.

SGLang 0.5.23 keeps, per session, a tree of its requests; a ``/generate`` with ``session_params: {"id": S,
"rid": R}`` runs on ``prompt(R) + output_ids(R) + input_ids`` (the parent's whole output, stop token
included; a leading BOS of ``input_ids`` is dropped). An unknown session or parent is refused with HTTP 400
before anything is generated. :class:`SessionPool` holds, per sequence, the session, the request to continue
from and how many tokens the engine holds after it. A call continues its sequence's session only when the
trajectory it extends is exactly those tokens; any failed call drops the session (its parent may be lost,
half-generated or unrecorded), so the next call opens a new one and sends every id again.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import re
import urllib.request
import uuid
import weakref
from typing import Final, Literal

import msgspec

from tito_core.backend import GenerateRequest, GenerateResult
from tito_core.errors import (
    BackendConnectionError,
    BackendError,
    BackendResponseError,
    BackendTimeoutError,
    ConfigError,
)
from tito_core.http import HttpClient

__all__ = ["SESSION_MODES", "SGLangSessionError", "Session", "SessionMode", "SessionPool", "session_refused"]

logger = logging.getLogger("tito_sglang")

SessionMode = Literal["auto", "on", "off"]
SESSION_MODES: Final = ("auto", "on", "off")
_NO_ROUTE: Final = frozenset({404, 405})
_EXIT_TIMEOUT: Final = 2.0
_CLOSE_TRIES: Final = 3  # a session close that timed out or lost its connection: tried this many times
_encoder = msgspec.json.Encoder()


class SGLangSessionError(BackendError):
    """``session="on"``, but the server cannot keep sessions (no ``/open_session``, or it refused to open one)."""


class Session(msgspec.Struct, frozen=True):
    """One engine session as a call uses it.

    Attributes:
        id: The session id (tito picks it: ``tito-<hex>``).
        parent: The request whose prompt and output the session continues from; None before its first call.
        length: Tokens the engine holds after ``parent`` (its prompt + output); the next call sends the rest.
    """

    id: str
    parent: str | None = None
    length: int = 0


SESSION_REFUSED_TEXTS: Final[tuple[str, ...]] = (
    r"session id .*does not exist",  # "Invalid request: session id S does not exist"
    r"Invalid request session id",  # a parent rid the session does not hold
    r"close was requested for session",  # "... close was requested for session S"
)
"""SGLang 0.5.23's wording (regexes) of a 400 refusing a session request before generating anything."""
_SESSION_REFUSED: Final = re.compile("|".join(f"(?:{t})" for t in SESSION_REFUSED_TEXTS), re.IGNORECASE)


def session_refused(exc: BackendError) -> bool:
    """Whether ``exc`` is SGLang refusing a session request before generating anything.

    SGLang 0.5.23 answers HTTP 400 ("Invalid request: session id S does not exist", "Invalid request session
    id" for an unknown parent, "... close was requested for session S") when it creates the request.
    """
    return exc.status == 400 and bool(_SESSION_REFUSED.search(exc.body or ""))


def check_mode(mode: object) -> SessionMode:
    """``mode`` if it is a session mode, else a :class:`ConfigError`."""
    if mode not in SESSION_MODES:
        raise ConfigError(f"sglang: session must be 'auto', 'on' or 'off', not {mode!r}")
    return mode


class SessionPool:
    """The sessions of one backend, by sequence; support is detected once (the first ``/open_session``).

    Args:
        http: The backend's client.
        mode: ``auto`` (sessions where the server has them, else stateless with one warning), ``on`` (a
            :class:`SGLangSessionError` where it has none) or ``off``.
        close_at_exit: Close the sessions still held when the interpreter exits (a plain HTTP POST each);
            False for clients the user passes (their proxies and TLS settings are not reproduced there).
    """

    def __init__(self, http: HttpClient, mode: SessionMode, *, close_at_exit: bool = True) -> None:
        self.http = http
        self.mode: SessionMode = check_mode(mode)
        self.supported: bool | None = False if mode == "off" else None
        self.capacity = 131_072
        self._open: dict[str, Session] = {}
        self._to_close: list[str] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._lost_warned = False
        if mode != "off" and close_at_exit:
            atexit.register(_close_at_exit, weakref.ref(self))

    @property
    def open_count(self) -> int:
        """Sessions held for live sequences."""
        return len(self._open)

    async def begin(self, request: GenerateRequest) -> Session | None:
        """The session ``request`` runs in (opened when its sequence has none that fits), or None: stateless."""
        self._flush()
        sequence = request.sequence
        if sequence is None or self.supported is False:
            return None
        held = self._open.get(sequence)
        if held is not None:
            if held.length == request.prefix_len and held.length <= len(request.input_ids):
                return held
            # The trajectory is not what the engine holds (an unrecorded call): never build on it.
            self.end(sequence)
        session = await self._open_session()
        if session is not None:
            self._open[sequence] = session
        return session

    def advance(self, request: GenerateRequest, session: Session, result: GenerateResult) -> None:
        """After a recorded call: the session now ends with ``request``'s prompt and output."""
        sequence = request.sequence
        assert sequence is not None
        sampling = request.sampling
        if result.finish_reason == "abort" or (sampling.ignore_eos and sampling.stop_token_ids):
            # An aborted request is no parent to build on; with ignore_eos + stop_token_ids the answer may have
            # been cut after the engine's output (see _wire._stop_token_cut): the session holds more than tito.
            self.end(sequence)
            return
        length = len(request.input_ids) + len(result.output_ids)
        self._open[sequence] = Session(session.id, request.rid, length)

    def lost(self, sequence: str | None, session: Session, cause: BackendError) -> None:
        """The server refused ``sequence``'s ``session``, which is dropped; the call goes on without one.

        A session lost after it served calls (a restarted server) only costs this call its session: the next
        call opens a new one. A session refused on its first call cannot be kept by this server (a router
        spreading requests over workers): ``auto`` goes stateless for good with one warning, ``on`` raises
        :class:`SGLangSessionError`.
        """
        if sequence is not None:
            self.end(sequence)
        if session.parent is None:
            self._unsupported(
                f"session {session.id} was refused on its first request: {(cause.body or '')[:200]}", cause
            )
            return
        log = logger.info if self._lost_warned else logger.warning  # a restart loses every session at once
        self._lost_warned = True
        log(
            "sglang: %s no longer knows session %s (%s); this call sends the whole trajectory, the next opens a "
            "new session",
            self.http.base_url,
            session.id,
            (cause.body or "")[:200],
        )

    def end(self, sequence: str) -> None:
        """Forget ``sequence``'s session and close it on the server (in the background)."""
        session = self._open.pop(sequence, None)
        if session is not None:
            self._close_later(session.id)

    async def aclose(self) -> None:
        """Close every session still held, and wait for the closes already under way (this event loop's)."""
        for sequence in list(self._open):
            self.end(sequence)
        self._flush()
        loop = asyncio.get_running_loop()
        mine = [task for task in self._closing if task.get_loop() is loop]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)

    # -- server calls -----------------------------------------------------------------------------

    async def _open_session(self) -> Session | None:
        """Open a session; None when the server has none (``auto``: stateless from now on, one warning)."""
        session_id = f"tito-{uuid.uuid4().hex}"
        body = _encoder.encode({"capacity_of_str_len": self.capacity, "session_id": session_id})
        try:
            answer = await self.http.post("/open_session", body)
        except (BackendConnectionError, BackendTimeoutError):
            raise  # the server is unreachable: the call fails as it would without sessions
        except BackendError as exc:
            if exc.status is None:
                raise
            self._unsupported(f"POST /open_session answered HTTP {exc.status}: {(exc.body or '')[:200]}", exc)
            return None
        try:
            echoed = msgspec.json.decode(answer) if answer.strip() else None
        except (msgspec.DecodeError, UnicodeDecodeError):
            echoed = None
        if isinstance(echoed, str) and echoed != session_id:
            raise BackendResponseError(
                f"sglang: /open_session opened {echoed!r}, not the session {session_id!r} asked for",
                field="session_id",
                value=echoed,
                backend="sglang",
            )
        self.supported = True
        return Session(session_id)

    def _unsupported(self, why: str, cause: BackendError) -> None:
        if self.mode == "on":
            if cause.status in _NO_ROUTE:
                why = f"{self.http.base_url} has no session API ({why})"
            raise SGLangSessionError(
                f"sglang: session='on' but {why}; use session='auto' (stateless where sessions are missing) or 'off'",
                status=cause.status,
                body=cause.body,
                backend="sglang",
            ) from cause
        if self.supported is not False:
            self.supported = False
            logger.warning(
                "sglang: %s cannot keep sessions (%s): every call sends the whole trajectory (session='auto'; "
                "set session='off' to skip this check)",
                self.http.base_url,
                why,
            )

    def _close_later(self, session_id: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop here (TitoModel.reset from sync code): the next call or aclose closes it
            self._to_close.append(session_id)
            return
        task = loop.create_task(self._close(session_id))
        self._closing.add(task)
        task.add_done_callback(lambda done: self._closed(done, session_id))

    def _closed(self, task: asyncio.Task[None], session_id: str) -> None:
        self._closing.discard(task)
        if task.cancelled():  # its event loop ended first: close it later (next call, aclose, exit)
            self._to_close.append(session_id)

    def _flush(self) -> None:
        if not self._to_close:
            return
        pending, self._to_close = self._to_close, []
        for session_id in pending:
            self._close_later(session_id)

    async def _close(self, session_id: str) -> None:
        """Close a session on the server; a timeout or a lost connection is tried again (twice).

        Closing is idempotent (a second close of a closed session is refused, harmlessly), and a busy server
        answering late would otherwise keep the session, and its KV cache, until it exits. Seen with 1,000
        rollouts closing their sessions at once on a busy machine: 60 left open.
        """
        body = _encoder.encode({"session_id": session_id})
        for attempt in range(1, _CLOSE_TRIES + 1):
            try:
                await self.http.post("/close_session", body)
                return
            except (BackendTimeoutError, BackendConnectionError) as exc:
                if attempt == _CLOSE_TRIES:
                    logger.info("sglang: closing session %s failed %d times: %r", session_id, attempt, exc)
            except Exception as exc:  # best effort: the server frees it at exit at the latest
                logger.info("sglang: closing session %s failed: %r", session_id, exc)
                return

    def _leftover(self) -> list[str]:
        """Session ids not closed yet (for the exit hook)."""
        ids = [*self._to_close, *(s.id for s in self._open.values())]
        self._to_close, self._open = [], {}
        return ids


def _close_at_exit(ref: weakref.ReferenceType[SessionPool]) -> None:
    """At interpreter exit, close the sessions a pool still holds (synchronously, bounded, best effort)."""
    pool = ref()
    if pool is None:
        return
    ids = pool._leftover()
    if not ids:
        return
    headers = dict(pool.http.headers)
    for session_id in ids:
        request = urllib.request.Request(
            f"{pool.http.base_url}/close_session",
            data=_encoder.encode({"session_id": session_id}),
            headers=headers,
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=_EXIT_TIMEOUT):
                pass
        except Exception as exc:
            logger.debug("sglang: closing session %s at exit failed: %r", session_id, exc)
