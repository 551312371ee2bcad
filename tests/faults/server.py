"""A controllable fault server: enough SGLang and vLLM to drive real rollouts, misbehaving on request.

Built on raw asyncio streams (not an HTTP framework) so it can misbehave at the byte level: reset a
connection before or after reading a request, cut a body, forge a second response after the first,
send conflicting framing headers, or go away and come back on the same port.

Routes:
    SGLang: ``POST /generate``, ``POST /abort_request``, ``GET /server_info``, ``GET /model_info``,
    ``GET /health``, and with ``sessions=True`` ``POST /open_session`` / ``/close_session`` and ``/generate``
    with ``session_params`` (as SGLang 0.5.23: the parent's prompt and output, then the ids sent; an unknown
    session or parent is a 400). vLLM: ``GET /v1/models``, ``POST /inference/v1/generate``, ``POST /v1/completions``.
    Weight updates (both dialects): ``POST /pause_generation`` / ``/pause``, ``/continue_generation`` / ``/resume``,
    ``/update_weight_version``. A generation that arrives while the server is paused is held (keep mode) and
    answered after the resume; when the version changed meanwhile, its first half is labelled with the version it
    arrived under and the rest with the new one (``weight_versions`` spans), as a request frozen mid-decode.
    A generation that ``decode_until_cut`` matches (a predicate on its :class:`Received`) decodes until a pause in
    abort mode (``{"mode": "abort"}`` / ``?mode=abort``) ends it with ``finish_reason`` abort and the first half
    of its ids; a later request whose prompt is such a prompt plus its half gets the other half (a partial
    rollout's continuation, labelled with the version current then). A tool awaits :meth:`FaultServer.paused`
    so that its rollout's next call meets a paused engine.
    Control (for a server in another process): ``GET /_control/log``, ``POST /_control/random``
    (``{"rate": 0.1, "seed": 7}``), ``POST /_control/clear``.

Generation is deterministic and driven by the prompt: the last ``<tool_response>`` in the prompt holds a
step number (0 when there is none); below ``tool_turns`` the answer is a hermes ``<tool_call>`` of
``add(a=step, b=1)`` (whose result is the next step), otherwise a final answer. Every answer carries a
tag derived from the request id, so two requests never get the same ids, and ends with ``<|im_end|>``.
Ids come from the real tokenizer; logprobs are finite and < 0; the request id is echoed (SGLang
``meta_info.id = rid``, vLLM ``request_id = "generate-tokens-<rid>"`` / ``id = "cmpl-<rid>"``).

The server logs every request it received (:attr:`FaultServer.received`: path, rid, time, whether it
generated, the fault applied) and exactly what it answered per rid (:attr:`FaultServer.answers`).
Faults are scripted per request (:meth:`FaultServer.inject`): by generation-request number or a
predicate, or at random with a seed (:meth:`FaultServer.random_faults`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import socket
import struct
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

IM_END = 151645
TOOL_RESPONSE = 151665
TOOL_RESPONSE_END = 151666
VOCAB_SIZE = 151669  # len() of the offline Qwen3 tokenizer
MODEL = "fault/qwen3"
GENERATE_PATHS = {
    "/generate": "sglang",
    "/inference/v1/generate": "vllm-generate",
    "/v1/completions": "vllm-completions",
}
_MAX_HEAD = 64 * 1024
_ANSWERS_WHOLE = frozenset({"refuse", "kill-after_answer", "extra", "hold"})  # faults that deliver the answer first


# --------------------------------------------------------------------------------------------- faults


@dataclass(frozen=True)
class Fault:
    """One way to misbehave on one request. Build them with the class methods."""

    kind: str
    status: int = 0
    delay: float = 0.0
    headers: tuple[tuple[str, str], ...] = ()
    mode: str = ""
    size: int = 0
    body: bytes = b""
    for_s: float | None = None
    until: asyncio.Event | None = field(default=None, compare=False, repr=False)

    @property
    def name(self) -> str:
        """A short label for logs and test ids."""
        parts = [self.kind, str(self.status) if self.status else "", self.mode]
        return "-".join(p for p in parts if p)

    @classmethod
    def http_status(cls, status: int, *, retry_after: str | None = None, body: bytes | None = None) -> Fault:
        """Answer ``status`` without generating (429 / 503 with or without ``Retry-After``, 500, 502...)."""
        headers = (("Retry-After", retry_after),) if retry_after is not None else ()
        text = body if body is not None else json.dumps({"error": f"injected HTTP {status}"}).encode()
        return cls("status", status=status, headers=headers, body=text)

    @classmethod
    def context_length(cls) -> Fault:
        """HTTP 400 saying the prompt does not fit the context window (the engine's own wording)."""
        return cls("context_length", status=400)

    @classmethod
    def reset(cls, *, after_read: bool, delay: float = 0.0) -> Fault:
        """Reset the connection (RST) before reading the request, or after reading it (after ``delay``)."""
        return cls("reset", mode="after_read" if after_read else "before_read", delay=delay)

    @classmethod
    def hang(cls) -> Fault:
        """Read the request, generate nothing, never answer; log when the client closes the connection."""
        return cls("hang")

    @classmethod
    def cut(cls, *, framing: str = "length") -> Fault:
        """Send half the body: ``length`` (Content-Length of the whole, then close) or ``eof``
        (no Content-Length, ``Connection: close``, the body is whatever came before the close)."""
        return cls("cut", mode=framing)

    @classmethod
    def extra_bytes(cls, *, until: asyncio.Event | None = None) -> Fault:
        """Answer, then write a forged complete response on the same keep-alive connection: in the same
        write, or (``until``) once the test sets that event while the connection sits idle; whether that
        late write found the connection idle is logged in :attr:`FaultServer.late_forgeries`."""
        return cls("extra", until=until)

    @classmethod
    def hold(cls, until: asyncio.Event) -> Fault:
        """Read the request and answer it normally once the test sets ``until``; meanwhile it counts in
        :attr:`FaultServer.holding` (a test waits for requests in flight that cannot end, then acts)."""
        return cls("hold", until=until)

    @classmethod
    def content_length(cls, mode: str) -> Fault:
        """Framing violations: ``conflict`` (two different Content-Length headers) or ``negative``."""
        return cls("content_length", mode=mode)

    @classmethod
    def oversize(cls, size: int) -> Fault:
        """A valid answer padded to ``size`` bytes, streamed in 1 MiB chunks until the client goes away."""
        return cls("oversize", size=size)

    @classmethod
    def bad(cls, mode: str) -> Fault:
        """A well-formed answer with a bad field; ``mode`` is one of :data:`BAD_FIELDS`."""
        if mode not in BAD_FIELDS and mode not in SGLANG_BAD_FIELDS:
            raise ValueError(f"unknown bad field {mode!r}; choose from {sorted({*BAD_FIELDS, *SGLANG_BAD_FIELDS})}")
        return cls("bad", mode=mode)

    @classmethod
    def raw(cls, body: bytes, status: int = 200) -> Fault:
        """Answer exactly ``body`` (used by the fuzz tests)."""
        return cls("raw", status=status, body=body)

    @classmethod
    def refuse_after(cls, for_s: float | None) -> Fault:
        """Answer normally, then close every connection and the listener so connections are refused;
        listen again on the same port after ``for_s`` seconds (never when None)."""
        return cls("refuse", for_s=for_s)

    @classmethod
    def kill(cls, *, restart_after: float | None) -> Fault:
        """The server dies with the request read (every connection reset, the listener closed) and
        comes back on the same port after ``restart_after`` seconds (never when None)."""
        return cls("kill", for_s=restart_after)

    @classmethod
    def kill_after_answer(cls, *, restart_after: float | None) -> Fault:
        """Answer normally, then die 50 ms later (every idle connection reset, the listener closed);
        come back on the same port after ``restart_after`` seconds (never when None)."""
        return cls("kill", mode="after_answer", for_s=restart_after)


SGLANG_BAD_FIELDS = {"prompt_tokens": "meta_info.prompt_tokens one more than the prompt the engine ran on"}

BAD_FIELDS = {
    "logprobs_short": "one logprob fewer than output ids",
    "logprob_ids_mismatch": "the logprob entries name other ids than output_ids",
    "logprob_positive": "a logprob of +0.5",
    "logprob_nan": "a NaN logprob (Python's json writes NaN)",
    "logprob_inf": "a -Infinity logprob",
    "no_logprobs": "logprobs requested but absent",
    "id_vocab": "an output id equal to the vocabulary size",
    "id_negative": "a negative output id",
    "id_huge": "an output id of 2**31",
    "finish_unknown": "an unknown finish reason",
    "finish_abort": "finish reason abort (with the tool call already generated)",
    "wrong_id": "the echoed request id is another request's",
    "prompt_echo": "the echoed prompt ids differ from those sent (SGLang: input_token_logprobs ids)",
    "not_json": "an HTML page with status 200",
    "wrong_shape": "JSON of the wrong shape",
}

Match = int | Callable[["Received"], bool]


def from_gen(first: int) -> Callable[[Received], bool]:
    """A predicate matching every generation request from number ``first`` on."""
    return lambda r: r.gen is not None and r.gen >= first


def on_path(path: str) -> Callable[[Received], bool]:
    """A predicate matching every request to ``path``."""
    return lambda r: r.path == path


@dataclass
class Rule:
    """Apply ``fault`` to the requests ``when`` matches, ``times`` times (-1: always); ``then`` is called with each
    request it applies to, as it applies (a test acts the moment the request is there)."""

    fault: Fault
    when: Match
    times: int = 1
    then: Callable[[Received], None] | None = None

    def matches(self, req: Received) -> bool:
        if self.times == 0:
            return False
        if isinstance(self.when, int):
            return req.gen == self.when
        return bool(self.when(req))


# ------------------------------------------------------------------------------------------------ log


@dataclass
class Received:
    """One request the server received (``path`` is None when it was reset before being read)."""

    n: int
    gen: int | None
    method: str | None
    path: str | None
    rid: str | None
    time: float
    generated: bool = False
    fault: str | None = None
    status: int | None = None
    client_closed: bool = False
    input_ids: list[int] | None = None
    max_new_tokens: int | None = None
    sent_ids: int | None = None  # ids the request carried (fewer than input_ids in a session)
    session: str | None = None
    parent: str | None = None
    version: str = "default"  # the weight version when the request arrived
    held: bool = False  # it arrived while the server was paused, and waited for the resume
    cut: bool = False  # a pause in abort mode ended it while it was decoding
    continued: bool = False  # it continued a generation cut by an abort-mode pause


@dataclass
class Answer:
    """Exactly what was sent for one generation of ``rid`` (bad fields included)."""

    rid: str
    path: str
    output_ids: list[int]
    logprobs: list[float]
    finish: str
    fault: str | None = None


@dataclass
class _Draft:
    """A generation before it is written in one engine's dialect."""

    rid: str
    echo_rid: str
    prompt: list[int]
    ids: list[int]
    lps: list[float]
    lp_ids: list[int]
    finish: str
    text: str
    prompt_echo: list[int] | None = None
    with_logprobs: bool = True
    prompt_lp_start: int | None = None
    prompt_lp_ids: list[int] | None = None
    prompt_tokens: int | None = None  # reported instead of len(prompt)
    prompt_lp: float = -0.75  # every prompt logprob given (the server's "weights")
    vllm_prompt_lps: bool = False  # /v1/completions asked for prompt_logprobs
    versions: list[dict[str, Any]] = field(default_factory=list)  # weight_versions spans over ids


@dataclass(eq=False)
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    task: asyncio.Task[None] | None = None
    busy: bool = False
    extra_tasks: list[asyncio.Task[None]] = field(default_factory=list)


class _Request:
    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.path, _, self.query = target.partition("?")
        self.headers = headers
        self.body = body


def _logprob(rid: str, position: int) -> float:
    return -((zlib.crc32(f"{rid}:{position}".encode()) % 5000) / 1000.0 + 0.001)


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable"}  # fmt: skip


def http_response(
    status: int,
    body: bytes,
    *,
    headers: tuple[tuple[str, str], ...] = (),
    close: bool = False,
    length: bool = True,
    content_type: str = "application/json",
) -> bytes:
    """An HTTP/1.1 response, byte for byte."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", f"Content-Type: {content_type}"]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    lines.extend(f"{k}: {v}" for k, v in headers)
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# --------------------------------------------------------------------------------------------- server


class FaultServer:
    """The fault server. ``await start()``, drive clients at :attr:`url`, ``await stop()``.

    Args:
        tokenizer: The Qwen3 tokenizer the answers are encoded with.
        tool_turns: Tool calls before the final answer in one agent invocation.
        context_length: Reported by ``/server_info`` and ``/v1/models``.
    """

    def __init__(
        self, tokenizer: Any, *, tool_turns: int = 1, context_length: int = 32768, sessions: bool = False
    ) -> None:
        self.tokenizer = tokenizer
        self.sessions_enabled = sessions
        self.sessions: dict[str, dict[str, list[int]]] = {}  # open session -> rid -> its prompt (+ output)
        self.sessions_closed: list[str] = []
        self.tool_turns = tool_turns
        self.context_length = context_length
        self.port = 0
        self.rules: list[Rule] = []
        self.received: list[Received] = []
        self.answers: dict[str, list[Answer]] = {}
        self.forged: list[list[int]] = []
        self.holding = 0  # requests held by a hold fault right now
        self.late_forgeries: list[bool] = []  # per late extra-bytes fault: written (True) or the connection was busy
        self.aborts: list[str] = []
        self.faults_injected = 0
        self._gen_count = 0
        self._random: tuple[float, random.Random, tuple[Fault, ...]] | None = None
        self._seen_rids: set[str] = set()
        self._server: asyncio.Server | None = None
        self._conns: set[_Conn] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._encode_cache: dict[str, list[int]] = {}
        self.weight_version = "default"
        self.prompt_logprob = -0.75  # the logprob of every prompt token it scores: a test changes it to "load" others
        self.pauses: list[str] = []  # "pause" / "pause:abort" / "resume" / "version:<v>", in order
        # the generations that decode until an abort-mode pause cuts them (the others answer at once)
        self.decode_until_cut: Callable[[Received], bool] | None = None
        self._running = asyncio.Event()
        self._running.set()
        self._cut = asyncio.Event()  # set (and replaced) by each abort-mode pause
        self._paused = asyncio.Event()  # set (and replaced) by each pause
        self._rests: dict[tuple[int, ...], tuple[list[int], str]] = {}  # prompt + half -> other half, finish

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def listening(self) -> bool:
        """Whether the listener is open."""
        return self._server is not None

    async def start(self) -> FaultServer:
        """Listen on 127.0.0.1 (a free port the first time, the same port afterwards)."""
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self.port, reuse_address=True, backlog=4096, limit=_MAX_HEAD
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self, *, reset: bool = False) -> None:
        """Close the listener and every connection (with a reset when ``reset``)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._conns):
            self._drop(conn, reset=reset)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2.0)

    async def aclose(self) -> None:
        """Stop and cancel every background task."""
        await self.stop()
        for task in list(self._background):
            task.cancel()
        for task in list(self._background):
            with contextlib.suppress(BaseException):
                await task

    def _later(self, delay: float, coro_fn: Callable[[], Any]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            await coro_fn()

        task = asyncio.ensure_future(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _drop(self, conn: _Conn, *, reset: bool) -> None:
        self._conns.discard(conn)
        if reset:
            _rst(conn.writer)
        else:
            conn.writer.close()
        for task in conn.extra_tasks:
            task.cancel()
        if conn.task is not None and conn.task is not asyncio.current_task():
            conn.task.cancel()

    # -- scripting --------------------------------------------------------------------------------

    def inject(
        self, fault: Fault, when: Match = 0, *, times: int = 1, then: Callable[[Received], None] | None = None
    ) -> Rule:
        """Apply ``fault`` to the requests ``when`` matches (an int: that generation request, 0-based); call ``then``
        with each of them as the fault is applied."""
        rule = Rule(fault, when, times, then)
        self.rules.append(rule)
        return rule

    def random_faults(self, rate: float, seed: int, faults: tuple[Fault, ...]) -> None:
        """Fault the first arrival of each generation rid with probability ``rate`` (seeded)."""
        self._random = (rate, random.Random(seed), faults)

    def _pick(self, req: Received, *, pre_read: bool) -> Fault | None:
        for rule in self.rules:
            if (rule.fault.kind == "reset" and rule.fault.mode == "before_read") != pre_read:
                continue
            if rule.matches(req):
                if rule.times > 0:
                    rule.times -= 1
                if rule.then is not None:
                    rule.then(req)
                return rule.fault
        if pre_read or self._random is None or req.path not in GENERATE_PATHS or req.rid in self._seen_rids:
            return None
        rate, rng, faults = self._random
        if rng.random() < rate:
            return rng.choice(faults)
        return None

    async def paused(self, times: int = 1) -> None:
        """Return once the server has been paused ``times`` times in all (either mode)."""
        while sum(p.startswith("pause") for p in self.pauses) < times:
            await self._paused.wait()

    # -- log views --------------------------------------------------------------------------------

    def generations(self, rid: str) -> int:
        """How many times the engine started generating ``rid``."""
        return sum(1 for r in self.received if r.rid == rid and r.generated)

    def duplicates(self) -> list[str]:
        """Request ids the engine generated more than once."""
        counts: dict[str, int] = {}
        for r in self.received:
            if r.generated and r.rid is not None:
                counts[r.rid] = counts.get(r.rid, 0) + 1
        return sorted(rid for rid, n in counts.items() if n > 1)

    def gen_requests(self) -> list[Received]:
        """The generation requests received, in order."""
        return [r for r in self.received if r.path in GENERATE_PATHS]

    def bad_parents(self) -> list[str]:
        """Session parents (``session_params.rid``) whose own request was not answered cleanly: lost to a fault,
        refused, or answered with a bad field. A client must never continue from such a request."""
        clean = {
            r.rid
            for r in self.received
            if r.generated and (r.fault is None or r.fault in _ANSWERS_WHOLE) and r.status in (None, 200)
            and all(a.fault is None for a in self.answers.get(r.rid or "", []))
        }  # fmt: skip
        return [r.parent for r in self.received if r.parent is not None and r.parent not in clean]

    def log_json(self) -> bytes:
        """Everything logged, as JSON (for a server in another process)."""
        return json.dumps(
            {
                "received": [asdict(r) | {"input_ids": None} for r in self.received],
                "answers": {rid: [asdict(a) for a in answers] for rid, answers in self.answers.items()},
                "forged": self.forged,
                "aborts": self.aborts,
                "faults_injected": self.faults_injected,
                "bad_parents": self.bad_parents(),
                "session_calls": sum(1 for r in self.received if r.parent is not None),
                "sessions_open": len(self.sessions),
            }
        ).encode()

    # -- connection loop --------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(reader, writer, asyncio.current_task())
        if self._server is None:  # accepted just before stop() closed the listener: a stopped server serves nothing
            self._drop(conn, reset=True)
            return
        self._conns.add(conn)
        try:
            while conn in self._conns:
                first = await reader.read(1)
                if not first:
                    break
                pending = Received(len(self.received), self._gen_count, None, None, None, time.monotonic())
                fault = self._pick(pending, pre_read=True)
                if fault is not None:
                    pending.fault = fault.name
                    self.received.append(pending)
                    self.faults_injected += 1
                    self._drop(conn, reset=True)
                    break
                request = await self._read_request(first, reader)
                if request is None:
                    break
                conn.busy = True
                await self._handle(conn, request)
                conn.busy = False
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._conns.discard(conn)
            with contextlib.suppress(Exception):
                writer.close()

    @staticmethod
    async def _read_request(first: bytes, reader: asyncio.StreamReader) -> _Request | None:
        head = first + await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                body += await reader.readexactly(size)
                await reader.readexactly(2)
            return _Request(method, target, headers, bytes(body))
        length = int(headers.get("content-length", "0"))
        return _Request(method, target, headers, await reader.readexactly(length) if length else b"")

    async def _send(self, conn: _Conn, data: bytes, *, close: bool = False) -> None:
        conn.writer.write(data)
        await conn.writer.drain()
        if close:
            self._drop(conn, reset=False)

    async def _handle(self, conn: _Conn, request: _Request) -> None:
        path = request.path
        keep = request.headers.get("connection", "").lower() != "close"
        is_gen = path in GENERATE_PATHS
        body: dict[str, Any] = {}
        if request.body:
            try:
                body = json.loads(request.body)
            except ValueError:
                body = {}
        rid = body.get("rid") if path in ("/generate", "/abort_request") else body.get("request_id")
        rec = Received(
            len(self.received), self._gen_count if is_gen else None, request.method, path,
            rid if isinstance(rid, str) else None, time.monotonic(),
        )  # fmt: skip
        if is_gen:
            self._gen_count += 1
            rec.input_ids = list(body.get("input_ids") or body.get("token_ids") or body.get("prompt") or [])
            rec.sent_ids = len(rec.input_ids)
            sampling = body.get("sampling_params") or body
            rec.max_new_tokens = sampling.get("max_new_tokens", sampling.get("max_tokens"))
        self.received.append(rec)
        rec.version = self.weight_version
        if is_gen and not self._running.is_set():  # paused: frozen until the resume
            rec.held = True
            await self._running.wait()
        if is_gen and self.sessions_enabled and isinstance(body.get("session_params"), dict):
            refused = self._session_prompt(rec, body["session_params"])
            if refused is not None:
                rec.status = 400
                await self._send(conn, http_response(400, json.dumps({"error": {"message": refused}}).encode()))
                return
        if is_gen:
            rec.continued = tuple(rec.input_ids or ()) in self._rests
        if is_gen and self.decode_until_cut is not None and self.decode_until_cut(rec):
            await self._cut.wait()
            rec.cut = True
        fault = self._pick(rec, pre_read=False)
        if is_gen and rec.rid is not None:
            self._seen_rids.add(rec.rid)
        if fault is not None:
            rec.fault = fault.name
            self.faults_injected += 1
            await self._faulty(conn, request, rec, body, fault, keep)
            return
        status, payload = self._route(request, rec, body, None)
        rec.status = status
        await self._send(conn, http_response(status, payload, close=not keep), close=not keep)

    def _route(self, request: _Request, rec: Received, body: dict[str, Any], bad: str | None) -> tuple[int, bytes]:
        path = request.path
        if path in GENERATE_PATHS and request.method == "POST":
            rec.generated = True
            return 200, self._generate(path, rec, body, bad)
        if path == "/abort_request":
            if rec.rid is not None:
                self.aborts.append(rec.rid)
            return 200, b"{}"
        if path == "/health":
            return 200, b""
        if path in ("/pause_generation", "/pause"):
            self._running.clear()
            if body.get("mode") == "abort" or "mode=abort" in request.query:
                self._cut.set()
                self._cut = asyncio.Event()
                self.pauses.append("pause:abort")
            else:
                self.pauses.append("pause")
            self._paused.set()
            self._paused = asyncio.Event()
            return 200, b'{"status": "paused"}'
        if path in ("/continue_generation", "/resume"):
            self._running.set()
            self.pauses.append("resume")
            return 200, b'{"status": "resumed"}'
        if path == "/update_weight_version":
            self.weight_version = str(body.get("new_version"))
            self.pauses.append(f"version:{self.weight_version}")
            return 200, b'{"success": true}'
        if path == "/open_session" and self.sessions_enabled:
            session_id = body.get("session_id") or f"s{len(self.sessions)}-{rec.n}"
            if session_id in self.sessions:
                return 400, json.dumps({"error": {"message": f"session {session_id} is open"}}).encode()
            self.sessions[session_id] = {}
            return 200, json.dumps(session_id).encode()
        if path == "/close_session" and self.sessions_enabled:
            if self.sessions.pop(str(body.get("session_id")), None) is not None:
                self.sessions_closed.append(str(body.get("session_id")))
            return 200, b""
        if path in ("/server_info", "/get_server_info"):
            return 200, json.dumps({"context_length": self.context_length, "model_path": MODEL}).encode()
        if path == "/model_info":
            return 200, json.dumps({"model_path": MODEL, "is_generation": True}).encode()
        if path == "/v1/models":
            card = {"id": MODEL, "object": "model", "max_model_len": self.context_length}
            return 200, json.dumps({"object": "list", "data": [card]}).encode()
        if path == "/_control/log":
            return 200, self.log_json()
        if path == "/_control/random":  # {"rate": 0.1, "seed": 7}: random faults from RANDOM_FAULTS
            self.random_faults(float(body.get("rate", 0.0)), int(body.get("seed", 0)), RANDOM_FAULTS)
            return 200, b"{}"
        if path == "/_control/clear":
            self.received.clear()
            self.answers.clear()
            self.forged.clear()
            self.late_forgeries.clear()
            self.aborts.clear()
            self.faults_injected = 0
            self._seen_rids.clear()
            self.sessions_closed.clear()
            return 200, b"{}"
        return 404, json.dumps({"error": f"no route {request.method} {path}"}).encode()

    # -- faults -----------------------------------------------------------------------------------

    async def _faulty(
        self, conn: _Conn, request: _Request, rec: Received, body: dict[str, Any], fault: Fault, keep: bool
    ) -> None:
        kind = fault.kind
        if kind == "status":
            rec.status = fault.status
            rec.generated = fault.status not in (429, 503)  # a 500 may come after the engine started
            await self._send(conn, http_response(fault.status, fault.body, headers=fault.headers))
        elif kind == "context_length":
            rec.status = 400
            n = len(rec.input_ids or [])
            if request.path == "/generate":
                message = (
                    f"The input ({n} tokens) is longer than the model's context length ({self.context_length} tokens)."
                )
                payload = {"object": "error", "message": message, "type": "BadRequestError", "code": 400}
            else:
                message = (
                    f"This model's maximum context length is {self.context_length} tokens. However, your request "
                    f"has {n} input tokens. Please reduce the length of the input messages."
                )
                payload = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
            await self._send(conn, http_response(400, json.dumps(payload).encode()))
        elif kind == "reset":
            rec.generated = request.path in GENERATE_PATHS
            if fault.delay:
                await asyncio.sleep(fault.delay)
            self._drop(conn, reset=True)
        elif kind == "hang":
            rec.generated = request.path in GENERATE_PATHS
            try:
                while await conn.reader.read(65536):
                    pass
            except ConnectionError:
                pass
            rec.client_closed = True
            self._drop(conn, reset=False)
        elif kind == "cut":
            _, payload = self._route(request, rec, body, None)
            half = payload[: len(payload) // 2]
            rec.status = 200
            if fault.mode == "eof":
                await self._send(conn, http_response(200, half, length=False, close=True), close=True)
            else:
                head = http_response(200, payload)[: -len(payload)]
                await self._send(conn, head + half, close=True)
        elif kind == "extra":
            _, payload = self._route(request, rec, body, None)
            rec.status = 200
            forged = self._forged(request.path)
            if fault.until is not None:
                await self._send(conn, http_response(200, payload))
                until = fault.until

                async def late() -> None:
                    await until.wait()
                    idle = conn in self._conns and not conn.busy
                    if idle:
                        conn.writer.write(forged)
                    self.late_forgeries.append(idle)

                task = asyncio.ensure_future(late())
                conn.extra_tasks.append(task)
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            else:
                await self._send(conn, http_response(200, payload) + forged)
        elif kind == "hold":
            assert fault.until is not None
            self.holding += 1
            try:
                await fault.until.wait()
            finally:
                self.holding -= 1
            status, payload = self._route(request, rec, body, None)
            rec.status = status
            await self._send(conn, http_response(status, payload, close=not keep), close=not keep)
        elif kind == "content_length":
            _, payload = self._route(request, rec, body, None)
            rec.status = 200
            if fault.mode == "conflict":
                headers = (("Content-Length", str(len(payload))), ("Content-Length", str(len(payload) // 2)))
            else:
                headers = (("Content-Length", "-1"),)
            await self._send(conn, http_response(200, payload, length=False, headers=headers), close=True)
        elif kind == "oversize":
            _, payload = self._route(request, rec, body, None)
            rec.status = 200
            pad = fault.size - len(payload) - len(',"pad":""')
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {fault.size}\r\n\r\n"
            head = head.encode()
            await self._send(conn, head + payload[:-1] + b',"pad":"')
            chunk = b"x" * (1 << 20)
            sent = 0
            while sent < pad and conn in self._conns:
                piece = chunk[: min(len(chunk), pad - sent)]
                conn.writer.write(piece)
                await conn.writer.drain()
                sent += len(piece)
            if conn in self._conns:
                await self._send(conn, b'"}')
        elif kind == "bad":
            status, payload = self._route(request, rec, body, fault.mode)
            rec.status = status
            await self._send(conn, http_response(status, payload))
        elif kind == "raw":
            rec.generated = request.path in GENERATE_PATHS
            rec.status = fault.status
            await self._send(conn, http_response(fault.status, fault.body))
        elif kind == "refuse":
            status, payload = self._route(request, rec, body, None)
            rec.status = status
            await self._send(conn, http_response(status, payload, close=True), close=True)
            await self.stop()
            if fault.for_s is not None:
                self._later(fault.for_s, self.start)
        elif kind == "kill":
            if fault.mode == "after_answer":
                status, payload = self._route(request, rec, body, None)
                rec.status = status
                await self._send(conn, http_response(status, payload))
                await asyncio.sleep(0.05)
            else:
                rec.generated = request.path in GENERATE_PATHS
            await self.stop(reset=True)
            if fault.for_s is not None:
                self._later(fault.for_s, self.start)
        else:  # pragma: no cover - a typo in a test
            raise ValueError(f"unknown fault kind {kind!r}")

    def _forged(self, path: str) -> bytes:
        """A complete response the engine never generated for any request (output ids recorded as forged)."""
        ids = [*self._encode("FORGED output that no request asked for."), IM_END]
        self.forged.append(ids)
        draft = _Draft(rid="forged", echo_rid="forged", prompt=[], ids=ids, lps=[-0.5] * len(ids), lp_ids=list(ids),
                       finish="stop", text="FORGED")  # fmt: skip
        payload = self._dialect(path, draft)
        return http_response(200, payload)

    # -- generation -------------------------------------------------------------------------------

    def _session_prompt(self, rec: Received, params: dict[str, Any]) -> str | None:
        """Expand a session request's ids to the prompt the engine runs on; the refusal message, if refused."""
        rec.session, rec.parent = params.get("id"), params.get("rid")
        nodes = self.sessions.get(str(rec.session))
        if nodes is None:
            return f"Invalid request: session id {rec.session} does not exist"
        prefix: list[int] = []
        if rec.parent is not None:
            if rec.parent not in nodes:
                return "Invalid request session id"
            prefix = nodes[rec.parent]
        rec.input_ids = [*prefix, *(rec.input_ids or [])]
        if rec.rid is not None:
            nodes[rec.rid] = list(rec.input_ids)  # the output is added once generated (as SGLang's Req)
        return None

    def _encode(self, text: str) -> list[int]:
        ids = self._encode_cache.get(text)
        if ids is None:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            if len(self._encode_cache) < 4096:
                self._encode_cache[text] = ids
        return ids

    def _step(self, prompt: list[int]) -> int:
        """The step number in the last tool response of the prompt (0 when there is none)."""
        try:
            start = len(prompt) - 1 - prompt[::-1].index(TOOL_RESPONSE)
        except ValueError:
            return 0
        try:
            end = prompt.index(TOOL_RESPONSE_END, start)
        except ValueError:
            return self.tool_turns
        text = self.tokenizer.decode(prompt[start + 1 : end]).strip()
        try:
            return int(text)
        except ValueError:
            return self.tool_turns

    def _text(self, rid: str, prompt: list[int]) -> str:
        step = self._step(prompt)
        tag = f"{zlib.crc32(rid.encode()):08x}"
        if step < self.tool_turns:
            call = json.dumps({"name": "add", "arguments": {"a": step, "b": 1}})
            return f"Step {step}, ref {tag}.\n<tool_call>\n{call}\n</tool_call>"
        return f"Done after {step} steps, ref {tag}."

    def _generate(self, path: str, rec: Received, body: dict[str, Any], bad: str | None) -> bytes:
        rid = rec.rid or f"anon-{rec.n}"
        prompt = list(rec.input_ids or [])
        rest = self._rests.pop(tuple(prompt), None)
        if rest is not None:  # the continuation of a generation an abort-mode pause cut
            ids, finish = rest
            text = self.tokenizer.decode(ids)
        else:
            text = self._text(rid, prompt)
            ids = [*self._encode(text)[:4000], IM_END]
            finish = "stop"
        limit = rec.max_new_tokens
        if isinstance(limit, int) and 0 <= limit < len(ids):
            ids, finish = ids[:limit], "length"
        if rec.cut and len(ids) >= 2:
            half = len(ids) // 2
            self._rests[(*prompt, *ids[:half])] = (ids[half:], finish)
            ids, finish = ids[:half], "abort"
        lps = [_logprob(rid, i) for i in range(len(ids))]
        if path == "/generate":
            with_lp = bool(body.get("return_logprob"))
            start = body.get("logprob_start_len")
            prompt_lp_start = start if with_lp and isinstance(start, int) and start >= 0 else None
            echo = None
            vllm_prompt_lps = False
        else:
            sampling = body.get("sampling_params") or body
            with_lp = sampling.get("logprobs") is not None
            prompt_lp_start = None
            echo = list(prompt) if (path == "/v1/completions" or body.get("return_token_ids")) else None
            vllm_prompt_lps = path == "/v1/completions" and body.get("prompt_logprobs") is not None
        draft = _Draft(rid=rid, echo_rid=rid, prompt=prompt, ids=ids, lps=lps, lp_ids=list(ids), finish=finish,
                       text=text, prompt_echo=echo, with_logprobs=with_lp, prompt_lp_start=prompt_lp_start,
                       prompt_lp_ids=prompt[prompt_lp_start:] if prompt_lp_start is not None else None,
                       prompt_lp=self.prompt_logprob)  # fmt: skip
        draft.vllm_prompt_lps = vllm_prompt_lps
        draft.versions = self._spans(rec, len(ids))
        if bad in ("not_json", "wrong_shape"):
            self.answers.setdefault(rid, []).append(Answer(rid, path, [], [], "none", bad))
            if bad == "not_json":
                return b"<html><body><h1>502 Bad Gateway</h1></body></html>"
            return b'{"output_ids": "none", "meta_info": []}' if path == "/generate" else b'{"choices": {"0": 1}}'
        if bad is not None:
            self._mutate(draft, bad)
        self.answers.setdefault(rid, []).append(Answer(rid, path, list(draft.ids), list(draft.lps), draft.finish, bad))
        nodes = self.sessions.get(str(rec.session)) if rec.session is not None else None
        if nodes is not None and rid in nodes:
            nodes[rid] = [*prompt, *ids]  # what a child of this request continues from
        return self._dialect(path, draft)

    def _spans(self, rec: Received, n: int) -> list[dict[str, Any]]:
        """The weight_versions spans of an answer of ``n`` ids: two when the version changed while it was held."""
        now = self.weight_version
        if rec.version == now or n < 2:
            return [{"version": now, "start": 0, "end": n}]
        half = n // 2
        return [{"version": rec.version, "start": 0, "end": half}, {"version": now, "start": half, "end": n}]

    @staticmethod
    def _mutate(d: _Draft, bad: str) -> None:
        if bad == "logprobs_short":
            d.lps, d.lp_ids = d.lps[:-1], d.lp_ids[:-1]
        elif bad == "logprob_ids_mismatch":
            d.lp_ids[0] = d.lp_ids[0] + 1
        elif bad == "logprob_positive":
            d.lps[1] = 0.5
        elif bad == "logprob_nan":
            d.lps[1] = math.nan
        elif bad == "logprob_inf":
            d.lps[1] = -math.inf
        elif bad == "no_logprobs":
            d.with_logprobs = False
        elif bad in ("id_vocab", "id_negative", "id_huge"):
            value = {"id_vocab": VOCAB_SIZE, "id_negative": -5, "id_huge": 2**31}[bad]
            d.ids[1] = d.lp_ids[1] = value
        elif bad == "prompt_tokens":
            d.prompt_tokens = len(d.prompt) + 1
        elif bad == "finish_unknown":
            d.finish = "exploded"
        elif bad == "finish_abort":
            d.finish = "abort"
        elif bad == "wrong_id":
            d.echo_rid = "tito-" + "0" * 32
        elif bad == "prompt_echo":
            changed = list(d.prompt)
            if changed:
                changed[-2] = changed[-2] + 1 if changed[-2] < VOCAB_SIZE - 1 else 0
            d.prompt_echo = changed
            if d.prompt_lp_ids is not None and d.prompt_lp_ids:
                d.prompt_lp_ids = [*d.prompt_lp_ids[:-2], d.prompt_lp_ids[-2] + 1, d.prompt_lp_ids[-1]]

    @staticmethod
    def _dialect(path: str, d: _Draft) -> bytes:
        """The draft as the engine behind ``path`` writes it (Python's json: NaN stays NaN)."""
        n_prompt = len(d.prompt)
        if path == "/generate":
            finish: dict[str, Any] = (
                {"type": "stop", "matched": d.ids[-1] if d.ids else None}
                if d.finish == "stop"
                else {"type": d.finish, "length": len(d.ids)}
            )
            meta: dict[str, Any] = {
                "id": d.echo_rid,
                "finish_reason": finish,
                "prompt_tokens": d.prompt_tokens if d.prompt_tokens is not None else n_prompt,
                "completion_tokens": len(d.ids),
                "cached_tokens": 0,
                "weight_version": d.versions[-1]["version"] if d.versions else "default",
                "weight_versions": d.versions,
            }
            if d.with_logprobs:
                meta["output_token_logprobs"] = [[lp, i, None] for lp, i in zip(d.lps, d.lp_ids, strict=False)]
                if d.prompt_lp_ids is not None and d.prompt_lp_start is not None:
                    meta["input_token_logprobs"] = [
                        [None if d.prompt_lp_start + k == 0 else d.prompt_lp, i, None]
                        for k, i in enumerate(d.prompt_lp_ids)
                    ]
                else:
                    meta["input_token_logprobs"] = []
            return json.dumps({"text": d.text, "output_ids": d.ids, "meta_info": meta}).encode()
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(d.ids), "completion_tokens": len(d.ids),
                 "prompt_tokens_details": None}  # fmt: skip
        choice: dict[str, Any] = {"index": 0, "finish_reason": d.finish, "stop_reason": None, "token_ids": d.ids,
                                  "routed_experts": None}  # fmt: skip
        if path == "/inference/v1/generate":
            choice["weight_versions"] = d.versions
        if path == "/inference/v1/generate":
            if d.with_logprobs:
                choice["logprobs"] = {
                    "content": [
                        {"token_id": i, "logprob": lp, "rank": 1} for lp, i in zip(d.lps, d.lp_ids, strict=False)
                    ]
                }
            else:
                choice["logprobs"] = None
            out = {"request_id": f"generate-tokens-{d.echo_rid}", "model": MODEL, "created": int(time.time()),
                   "usage": usage, "prompt_logprobs": None, "prompt_token_ids": d.prompt_echo, "output_mode": "tokens",
                   "choices": [choice]}  # fmt: skip
            return json.dumps(out).encode()
        choice["text"] = d.text
        choice["prompt_token_ids"] = d.prompt_echo
        choice["prompt_logprobs"] = None
        if d.vllm_prompt_lps:
            choice["prompt_logprobs"] = [None] + [{str(i): {"logprob": d.prompt_lp, "rank": 1}} for i in d.prompt[1:]]
        if d.with_logprobs:
            choice["logprobs"] = {
                "text_offset": [0] * len(d.lps),
                "token_logprobs": d.lps,
                "tokens": [f"token_id:{i}" for i in d.lp_ids],
                "top_logprobs": None,
            }
        else:
            choice["logprobs"] = None
        out = {"id": f"cmpl-{d.echo_rid}", "object": "text_completion", "created": int(time.time()), "model": MODEL,
               "choices": [choice], "usage": usage}  # fmt: skip
        return json.dumps(out).encode()


# ------------------------------------------------------------------------------------ run standalone

RANDOM_FAULTS: tuple[Fault, ...] = (
    Fault.http_status(500),
    Fault.http_status(503),
    Fault.http_status(429),
    Fault.reset(after_read=True),
    Fault.hang(),
    Fault.cut(),
    Fault.extra_bytes(),
    Fault.content_length("conflict"),
    Fault.bad("id_vocab"),
    Fault.bad("logprob_positive"),
    Fault.bad("wrong_id"),
    Fault.bad("finish_unknown"),
)
"""The faults the load test draws from (each one a single request; none takes the server down)."""


async def _main(args: argparse.Namespace) -> None:
    from tito_testing.tokenizers import load_qwen_tokenizer

    server = FaultServer(load_qwen_tokenizer("qwen3"), tool_turns=args.tool_turns, sessions=not args.no_sessions)
    if args.fault_rate:
        server.random_faults(args.fault_rate, args.seed, RANDOM_FAULTS)
    await server.start()
    print(f"PORT {server.port}", flush=True)
    stop = asyncio.get_running_loop().create_future()
    with contextlib.suppress(NotImplementedError):
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    await stop
    await server.aclose()


def main() -> None:
    """``python tests/faults/server.py [--fault-rate 0.1 --seed 7]``: prints ``PORT <n>`` once listening."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tool-turns", type=int, default=1)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-sessions", action="store_true", help="answer 404 on /open_session")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
