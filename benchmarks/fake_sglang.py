"""A fast fake SGLang server for the benchmark: native ``/generate`` with canned answers, ids and logprobs.

Run as its own process (``python benchmarks/fake_sglang.py --tokenizer DIR``); it binds a free port on
127.0.0.1 and prints ``PORT <n>`` on stdout once it accepts connections. A minimal HTTP/1.1 server on
asyncio (keep-alive, ``Content-Length`` bodies) with msgspec JSON, so the server costs little CPU on the
cores it shares with the clients.

``/generate`` answers like SGLang 0.5 (``text``, ``output_ids`` with the stop token, ``meta_info`` with
``finish_reason``, token counts and ``[logprob, id, null]`` triples for output tokens and, from
``logprob_start_len``, input tokens). The answer for a prompt is chosen by the number of
``<tool_response>`` tokens in it (the turn index), for the workload last set with ``POST /configure``.
``/configure`` may also give ``answers`` (the answer text of each turn, instead of the workload's) and
``image_tokens`` (how many tokens SGLang's processor would expand each image into). Images come as SGLang 0.5
takes them: one placeholder (``<|image_pad|>``) per image in ``input_ids`` and the image itself as a base64
``data:`` URL in ``image_data``; the server decodes each and counts the expanded prompt in ``prompt_tokens``.
For every ``/generate`` the server records its handler time (from the whole request being read to the
response bytes being ready: request decode, answer build, response encode); ``GET /stats`` returns and
clears those times, so clients can subtract them from their wall time.

Engine faults (``benchmarks/gateway.py``): ``POST /faults`` ``{"rate": 0.1, "seed": 7}`` makes each ``/generate``
misbehave with that probability, in one of the ways the fault suite (``tests/faults``) checks: HTTP 500 (not
retried), HTTP 503 (retried with the same rid), a positive logprob or an out-of-vocabulary output id (answers a
client must refuse, never record) or the connection closed after the request was read. From then on the server
logs every generation (``GET /log``: per request its rid, what it did, the SHA-1 of the prompt ids and the turn
answered, and the canned output of every turn), so a checker can prove that each recorded output is exactly one
clean answer to the prompt recorded before it.

Weight updates (``benchmarks/weight_update.py``, ``benchmarks/gateway_10k.py``): ``/pause_generation`` (any mode but
``abort``, which this server cannot do) holds every ``/generate`` that arrives until ``/continue_generation``, which
answers the held ones first; ``/update_weight_version`` relabels the weights. With ``"weight_versions": true`` in
``/configure``, every answer's ``meta_info.weight_versions`` names the version it was generated under (one span over
its output), and the log records it; ``GET /log`` also lists the pauses, resumes and relabels at their place in the
log. ``GET /progress``: the generations so far (clean ones apart), those held, whether paused, the version.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hashlib
import os
import random
import signal
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import IM_END, TOOL_RESPONSE, Workload, answer_text

CONTEXT_LENGTH = 262144
VOCAB_SIZE = 151669  # len() of the offline Qwen3 tokenizer: the first out-of-vocabulary id
IMAGE_PAD = 151655
"""``<|image_pad|>``: SGLang expands each one into its image's tokens."""
_MAX_HEADER = 64 * 1024
FAULTS = ("500", "503", "logprob_positive", "id_vocab", "reset")
_RESET = -1  # a handler status: close the connection without answering


class _SessionParams(msgspec.Struct):
    id: str
    rid: str | None = None


class _GenerateBody(msgspec.Struct):
    input_ids: list[int]
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int | None = None
    session_params: _SessionParams | None = None
    image_data: list[str] | None = None


class _Extras(msgspec.Struct):
    """The optional part of ``/configure``: answer texts per turn, tokens per image."""

    answers: list[str] | None = None
    image_tokens: int = 0
    weight_versions: bool = False


class _Pause(msgspec.Struct):
    mode: str = "in_place"


class _NewVersion(msgspec.Struct):
    new_version: str | int


class _Session(msgspec.Struct):
    """What SGLang keeps per session: the last request's id and its whole sequence (prompt and output)."""

    rid: str | None = None
    tokens: array = msgspec.field(default_factory=lambda: array("i"))
    tool_responses: int = 0
    image_tokens: int = 0  # what the session's images added to its sequence, past one placeholder each


class _Canned(msgspec.Struct):
    text: str
    output_ids: list[int]
    head: bytes  # the constant start of the response, up to the open meta_info object


class FakeSGLang:
    """State and request handlers (synchronous: every handler is pure CPU work)."""

    def __init__(self, tokenizer_dir: str) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.workload: Workload | None = None
        self.image_tokens = 0
        self.canned: dict[int, _Canned] = {}
        self.handler_times: list[float] = []
        self.requests = 0
        self.sessions: dict[str, _Session] = {}
        self.fault_rate = 0.0
        self.fault_rng = random.Random(0)
        self.log: list[tuple[str, str, str, int]] | None = None  # rid, "ok" or the fault, prompt SHA-1, turn
        self.versions: list[str] = []  # the weight version of each log entry
        self.events: list[tuple[str, str, int]] = []  # pause / resume / version, its value, the log's length then
        self.report_versions = False
        self.weight_version = "default"
        self.paused = False
        self.held: list[tuple[_HttpProtocol, bytes, bool]] = []  # generations waiting for the resume
        self.clean = 0  # clean generations answered
        self._decoder = msgspec.json.Decoder(_GenerateBody)
        self._encoder = msgspec.json.Encoder()
        self.routes: dict[tuple[str, str], Callable[[bytes], tuple[int, bytes]]] = {
            ("POST", "/generate"): self.generate,
            ("POST", "/configure"): self.configure,
            ("POST", "/abort_request"): lambda _body: (200, b"{}"),
            # weight updates: a pause holds the generations that arrive until the resume
            ("POST", "/pause_generation"): self.pause,
            ("POST", "/continue_generation"): self.resume,
            ("POST", "/update_weight_version"): self.relabel,
            ("GET", "/progress"): self.progress,
            ("POST", "/open_session"): self.open_session,
            ("POST", "/close_session"): self.close_session,
            ("GET", "/stats"): self.stats,
            ("POST", "/faults"): self.faults,
            ("GET", "/log"): self.generation_log,
            ("GET", "/health"): lambda _body: (200, b"ok"),
            ("GET", "/server_info"): lambda _body: (
                200,
                self._encoder.encode({"context_length": CONTEXT_LENGTH, "model_path": "fake/qwen3"}),
            ),
            ("GET", "/model_info"): lambda _body: (
                200,
                self._encoder.encode(
                    {"model_path": "fake/qwen3", "is_generation": True, "has_image_understanding": False}
                ),
            ),
            ("GET", "/v1/models"): lambda _body: (
                200,
                self._encoder.encode({"data": [{"id": "fake/qwen3", "max_model_len": CONTEXT_LENGTH}]}),
            ),
        }

    def configure(self, body: bytes) -> tuple[int, bytes]:
        """Set the workload and pre-build every answer of it."""
        self.workload = msgspec.json.decode(body, type=Workload)
        extras = msgspec.json.decode(body, type=_Extras)
        self.image_tokens = extras.image_tokens
        self.report_versions = extras.weight_versions
        self.canned = {}
        for turn in range(self.workload.calls):
            text = extras.answers[turn] if extras.answers else answer_text(self.tokenizer, self.workload, turn)
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), IM_END]
            logprobs = [[-0.25, token, None] for token in ids]
            head = self._encoder.encode(
                {"text": text, "output_ids": ids, "meta_info": {"output_token_logprobs": logprobs}}
            )
            # Keep the meta_info object open so per-request fields can follow.
            self.canned[turn] = _Canned(text=text, output_ids=ids, head=head[:-2] + b",")
        self.handler_times.clear()
        return 200, b"{}"

    def stats(self, _body: bytes) -> tuple[int, bytes]:
        """Handler times (seconds) of the ``/generate`` calls since the last ``/stats``, in arrival order."""
        times, self.handler_times = self.handler_times, []
        return 200, self._encoder.encode(times)

    def faults(self, body: bytes) -> tuple[int, bytes]:
        """Inject faults at ``rate`` (seeded) from now on, and log every generation (the log starts empty)."""
        asked = msgspec.json.decode(body)
        self.fault_rate = float(asked.get("rate", 0.0))
        self.fault_rng = random.Random(int(asked.get("seed", 0)))
        self.log, self.versions, self.events = [], [], []
        return 200, b"{}"

    def generation_log(self, _body: bytes) -> tuple[int, bytes]:
        """The generation log since ``/faults``, with each entry's weight version and each turn's canned output.

        ``events``: the pauses, resumes and relabels as ``[kind, value, log length then]``; the canned outputs'
        logprobs are all -0.25.
        """
        answers = {str(turn): canned.output_ids for turn, canned in self.canned.items()}
        log = {"log": self.log or [], "versions": self.versions, "events": self.events, "answers": answers}
        return 200, self._encoder.encode(log)

    def _event(self, kind: str, value: str) -> None:
        self.events.append((kind, value, len(self.log or ())))

    def pause(self, body: bytes) -> tuple[int, bytes]:
        """``/pause_generation``: hold the generations that arrive from now on.

        ``abort`` is refused: nothing here is ever cut mid-decode, so an abort-mode pause could not be what it claims.
        """
        mode = msgspec.json.decode(body or b"{}", type=_Pause).mode
        if mode == "abort":
            return 400, b'{"error": "the fake server pauses in place or retracts; it cannot abort"}'
        self.paused = True
        self._event("pause", mode)
        return 200, b'{"status":"paused"}'

    def resume(self, _body: bytes) -> tuple[int, bytes]:
        """``/continue_generation``: answer the held generations (in arrival order), then serve again."""
        self.paused = False
        self._event("resume", "")
        held, self.held = self.held, []
        for protocol, body, close in held:
            protocol.answer_held(body, close)
        return 200, b'{"status":"resumed"}'

    def relabel(self, body: bytes) -> tuple[int, bytes]:
        """``/update_weight_version``: the weights' new label."""
        self.weight_version = str(msgspec.json.decode(body, type=_NewVersion).new_version)
        self._event("version", self.weight_version)
        return 200, b'{"success":true}'

    def progress(self, _body: bytes) -> tuple[int, bytes]:
        """Generations so far (all, and clean ones), held ones, whether paused, and the weight version."""
        state = {"requests": self.requests, "clean": self.clean, "held": len(self.held), "paused": self.paused,
                 "version": self.weight_version}  # fmt: skip
        return 200, self._encoder.encode(state)

    def _fault(self, kind: str, canned: _Canned, meta: dict[str, Any]) -> tuple[int, bytes]:
        """The faulty answer ``kind`` (see :data:`FAULTS`)."""
        if kind == "reset":
            return _RESET, b""
        if kind in ("500", "503"):
            return int(kind), self._encoder.encode({"error": f"injected engine fault ({kind})"})
        ids = list(canned.output_ids)
        logprobs: list[list[Any]] = [[-0.25, token, None] for token in ids]
        if kind == "id_vocab":
            ids[0] = logprobs[0][1] = VOCAB_SIZE
        else:  # logprob_positive
            logprobs[0][0] = 0.5
        meta["output_token_logprobs"] = logprobs
        return 200, self._encoder.encode({"text": canned.text, "output_ids": ids, "meta_info": meta})

    def open_session(self, body: bytes) -> tuple[int, bytes]:
        """``/open_session``: answers the session id (the one asked for, else a new one)."""
        asked = msgspec.json.decode(body).get("session_id") or f"session-{len(self.sessions)}-{time.monotonic_ns()}"
        self.sessions[asked] = _Session()
        return 200, self._encoder.encode(asked)

    def close_session(self, body: bytes) -> tuple[int, bytes]:
        """``/close_session``: forget the session."""
        self.sessions.pop(msgspec.json.decode(body).get("session_id"), None)
        return 200, b"{}"

    def _prompt(self, request: _GenerateBody) -> tuple[Any, int, _Session | None] | tuple[None, str, None]:
        """The whole prompt (session prefix + sent ids), its ``<tool_response>`` count and the session, or an error."""
        ids, params = request.input_ids, request.session_params
        if params is None:
            return ids, ids.count(TOOL_RESPONSE), None
        session = self.sessions.get(params.id)
        if session is None or params.rid != session.rid:
            return None, f"session {params.id!r} does not continue from {params.rid!r}", None
        prompt = array("i", session.tokens) if params.rid is not None else array("i")
        prompt.extend(ids)
        return prompt, session.tool_responses + ids.count(TOOL_RESPONSE), session

    def _image_tokens(self, request: _GenerateBody) -> int | str:
        """The tokens the request's images add to its prompt once expanded, or why SGLang would refuse them."""
        images = request.image_data or []
        if not images:
            return 0
        placeholders = request.input_ids.count(IMAGE_PAD)  # in a session: the sent ids carry the new images
        if placeholders != len(images):
            return f"Prompt has {placeholders} image placeholders but {len(images)} image inputs were provided"
        for url in images:
            head, _, data = url.partition(";base64,")
            if not head.startswith("data:image/") or not data:
                return f"image_data entry {url[:40]!r} is not a base64 data: URL"
            try:
                base64.b64decode(data, validate=True)
            except binascii.Error as exc:
                return f"image_data entry is not base64: {exc}"
        return len(images) * (self.image_tokens - 1)

    def generate(self, body: bytes) -> tuple[int, bytes]:
        """One non-streaming ``/generate`` (in a session: the session's sequence followed by the sent ids)."""
        started = time.perf_counter()
        request = self._decoder.decode(body)
        if self.workload is None:
            return 503, b'{"error": "not configured: POST /configure first"}'
        ids, count, session = self._prompt(request)
        if ids is None:
            return 400, self._encoder.encode({"error": count})
        extra = self._image_tokens(request)
        if isinstance(extra, str):
            return 400, self._encoder.encode({"error": extra})
        turn = min(int(count), self.workload.calls - 1)
        canned = self.canned[turn]
        self.requests += 1
        fault = ""
        if self.log is not None:
            if self.fault_rate and self.fault_rng.random() < self.fault_rate:
                fault = self.fault_rng.choice(FAULTS)
            digest = hashlib.sha1(array("i", ids).tobytes()).hexdigest()
            self.log.append((request.rid or "", fault or "ok", digest, turn))
            self.versions.append(self.weight_version)
        earlier = session.image_tokens if session is not None else 0
        if session is not None and not fault:
            session.rid, session.tool_responses = request.rid, int(count)
            session.image_tokens += extra
            session.tokens = ids + array("i", canned.output_ids)  # a new array: ``ids`` is this prompt
        meta: dict[str, Any] = {
            "id": request.rid or f"fake-{self.requests}",
            "finish_reason": {"type": "stop", "matched": IM_END},
            "prompt_tokens": len(ids) + earlier + extra,
            "completion_tokens": len(canned.output_ids),
            "cached_tokens": 0,
            "e2e_latency": 0.0,
        }
        if self.report_versions:
            meta["weight_versions"] = [{"version": self.weight_version, "start": 0, "end": len(canned.output_ids)}]
        if fault:
            self.handler_times.append(time.perf_counter() - started)
            return self._fault(fault, canned, meta)
        self.clean += 1
        start = request.logprob_start_len
        if request.return_logprob and start is not None and start >= 0:
            meta["input_token_logprobs"] = [
                [None if i == 0 else -0.5, token, None] for i, token in enumerate(ids[start:], start)
            ]
        payload = canned.head + self._encoder.encode(meta)[1:] + b"}"
        self.handler_times.append(time.perf_counter() - started)
        return 200, payload


class _HttpProtocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and ``Content-Length`` bodies: what httpx and aiohttp send."""

    def __init__(self, app: FakeSGLang) -> None:
        self.app = app
        self.buffer = bytearray()
        self.head: tuple[str, str, int, bool] | None = None  # method, path, body length, close after
        self.transport: asyncio.Transport | None = None
        self.holding = False  # a generation of this connection waits for the resume: read nothing more

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and not self.holding:
            if self.head is None:
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self.buffer) > _MAX_HEADER:
                        self._reply(431, b"header too large", close=True)
                    return
                self.head = self._parse_head(bytes(self.buffer[:end]))
                del self.buffer[: end + 4]
            method, path, length, close = self.head
            if len(self.buffer) < length:
                return
            body = bytes(self.buffer[:length])
            del self.buffer[:length]
            self.head = None
            route = (method, path.split("?", 1)[0])
            handler = self.app.routes.get(route)
            if handler is None:
                self._reply(404, b'{"error": "not found"}', close=close)
            elif route == ("POST", "/generate") and self.app.paused:
                self.holding = True  # answered by the resume (answer_held)
                self.app.held.append((self, body, close))
            else:
                self._handle(handler, body, close)

    def _handle(self, handler: Callable[[bytes], tuple[int, bytes]], body: bytes, close: bool) -> None:
        assert self.transport is not None
        try:
            status, payload = handler(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            status, payload = 400, msgspec.json.encode({"error": str(exc)})
        if status == _RESET:  # an injected fault: the request was read, no answer comes
            self.transport.close()
            self.transport = None
            return
        self._reply(status, payload, close=close)

    def answer_held(self, body: bytes, close: bool) -> None:
        """Generate the held request now (the server was resumed), then read on."""
        self.holding = False
        if self.transport is None:  # the client went away meanwhile
            return
        self._handle(self.app.generate, body, close)
        if self.buffer:
            self.data_received(b"")

    @staticmethod
    def _parse_head(raw: bytes) -> tuple[str, str, int, bool]:
        lines = raw.decode("latin-1").split("\r\n")
        method, path, _version = lines[0].split(" ", 2)
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        return method, path, length, close

    def _reply(self, status: int, payload: bytes, *, close: bool) -> None:
        assert self.transport is not None
        reasons = {200: "OK", 400: "Bad Request", 404: "Not Found", 431: "Too Large", 500: "Error", 503: "Unavailable"}
        reason = reasons.get(status, "Status")
        content_type = b"text/plain" if payload == b"ok" else b"application/json"
        header = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(payload)}\r\n".encode()
            + b"Content-Type: "
            + content_type
            + (b"\r\nConnection: close\r\n\r\n" if close else b"\r\n\r\n")
        )
        self.transport.write(header + payload)
        if close:
            self.transport.close()
            self.transport = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


async def serve(app: FakeSGLang, host: str, port: int) -> None:
    """Serve until SIGTERM / SIGINT."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _HttpProtocol(app), host, port, backlog=2048)
    stop = loop.create_future()

    def finish() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, finish)
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)
    async with server:
        await stop


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="a Qwen3 tokenizer directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    app = FakeSGLang(args.tokenizer)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(app, args.host, args.port))


if __name__ == "__main__":
    main()
