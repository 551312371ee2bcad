"""Every message text tito classifies by, pinned: httpx's against the installed library over a real local socket,
the engines' against their recorded answers (aiohttp's is in ``test_aiohttp_compat.py``).

A library or engine upgrade that changes one of them fails here instead of silently misclassifying (a lost
connection taken for a malformed answer, a context-window overflow taken for a plain 400).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from tito_core.http import DEFAULT_CONTEXT_LENGTH_PATTERNS
from tito_core.http.errors import CONTEXT_LENGTH_TEXTS, LIBRARY_TEXTS, from_httpx
from tito_core.http.transport import FramingError, MaybeSentError

DATA = Path(__file__).parents[1]

# -- httpx ---------------------------------------------------------------------------------------


@asynccontextmanager
async def answering(*parts: bytes) -> AsyncIterator[str]:
    """A raw TCP server on 127.0.0.1 that reads one request's head, sends ``parts`` a moment apart, closes."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            for index, part in enumerate(parts):
                if index:
                    await asyncio.sleep(0.02)
                writer.write(part)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(run, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def _httpx_error(*parts: bytes) -> httpx.HTTPError:
    async with answering(*parts) as url, httpx.AsyncClient() as client:
        with pytest.raises(httpx.HTTPError) as info:
            await client.get(url + "/g")
    return info.value


CUT_SHORT = {
    "Server disconnected": [(), (b"HTTP/1.1 200 OK\r\nContent-Le",)],  # before the answer, inside its head
    "peer closed connection without sending complete message body": [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b'{"output_ids": [1, 2'),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n", b'{"output_ids"'),
    ],
}


@pytest.mark.parametrize("text", sorted(CUT_SHORT))
async def test_each_httpx_cut_short_text_is_what_httpx_says(text: str) -> None:
    for parts in CUT_SHORT[text]:
        exc = await _httpx_error(*parts)
        assert isinstance(exc, httpx.RemoteProtocolError)
        assert text in str(exc)
        assert isinstance(from_httpx(exc, "http://x"), MaybeSentError)


def test_h11_text_for_a_head_cut_short_is_in_the_table() -> None:
    """h11's own wording, which httpcore (over HTTP/1.1) reports as "Server disconnected" instead: pinned on h11."""
    import h11

    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(b"HTTP/1.1 200 OK\r\nContent-Le")
    conn.receive_data(b"")
    with pytest.raises(h11.RemoteProtocolError) as info:
        conn.next_event()
    assert "peer unexpectedly closed connection" in LIBRARY_TEXTS["httpx.RemoteProtocolError"]
    assert "peer unexpectedly closed connection" in str(info.value)
    wrapped = httpx.RemoteProtocolError(str(info.value))
    assert isinstance(from_httpx(wrapped, "http://x"), MaybeSentError)


def test_every_httpx_text_is_pinned() -> None:
    assert set(LIBRARY_TEXTS["httpx.RemoteProtocolError"]) == {*CUT_SHORT, "peer unexpectedly closed connection"}


@pytest.mark.parametrize(
    "reply",
    [b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok", b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\nhello"],
)
async def test_an_httpx_malformed_answer_says_none_of_them(reply: bytes) -> None:
    exc = await _httpx_error(reply)
    assert isinstance(exc, httpx.RemoteProtocolError)
    assert isinstance(from_httpx(exc, "http://x"), FramingError), str(exc)


# -- the engines' context-window texts -----------------------------------------------------------


def _recorded(path: str) -> str:
    message: str = json.loads((DATA / path).read_text())["response"]["error"]["message"]
    return message


# Each engine's "prompt does not fit" answers: recorded from a real server where the repo has one, else the
# wording the engine's source raises (the same as the fault server in tests/faults/server.py sends).
ENGINE_BODIES = {
    "vllm": [
        _recorded("vllm/data/error_context_length.json"),  # vLLM 0.32, /inference/v1/generate, recorded
        "This model's maximum context length is 4096 tokens. However, your request has 4100 input tokens. "
        "Please reduce the length of the input messages.",
        # vLLM 0.32 CPU server, /inference/v1/generate, a 4100-token prompt in a 4096-token window (its answer in
        # the integration suite, which failed as a plain BackendError before this text was in the table)
        "Input length (4100) exceeds model's maximum context length (4096).",
    ],
    "sglang": [
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total "
        "of 4100 tokens: 4000 tokens from the input messages and 100 tokens for the completion. Please reduce the "
        "number of tokens in the input messages or the completion to fit within the limit.",
    ],
}


@pytest.mark.parametrize("engine", sorted(CONTEXT_LENGTH_TEXTS))
def test_each_engine_text_matches_one_of_its_answers_and_every_answer_is_matched(engine: str) -> None:
    patterns = [re.compile(p, re.IGNORECASE) for p in CONTEXT_LENGTH_TEXTS[engine]]
    bodies = ENGINE_BODIES[engine]
    for pattern in patterns:
        assert any(pattern.search(body) for body in bodies), f"{pattern.pattern!r} matches no {engine} answer"
    for body in bodies:
        assert any(pattern.search(body) for pattern in patterns), f"no {engine} text matches {body!r}"
        assert any(pattern.search(json.dumps({"error": {"message": body}})) for pattern in patterns)


def test_the_default_patterns_are_the_engine_texts_and_miss_other_400s() -> None:
    assert set(DEFAULT_CONTEXT_LENGTH_PATTERNS) == {p for ps in CONTEXT_LENGTH_TEXTS.values() for p in ps}
    other = _recorded("vllm/data/error_bad_request.json")  # vLLM 0.32's "You must pass at least one prompt"
    assert not any(re.search(p, other, re.IGNORECASE) for p in DEFAULT_CONTEXT_LENGTH_PATTERNS)
