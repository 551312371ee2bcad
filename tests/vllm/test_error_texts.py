"""vLLM's "the prompt does not fit the context window" texts (the adapter's own table), pinned against its answers.

Recorded from a real server where the repository has one, else the wording vLLM's source raises. A vLLM upgrade that
changes one fails here instead of a context-window overflow being taken for a plain 400.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from tito_core.errors import BackendError, ContextLengthError
from tito_vllm import VLLMBackend, VLLMChatBackend
from tito_vllm._server import CONTEXT_LENGTH_TEXTS

DATA = Path(__file__).parent / "data"


def _recorded(name: str) -> str:
    message: str = json.loads((DATA / name).read_text())["response"]["error"]["message"]
    return message


ANSWERS = [
    _recorded("error_context_length.json"),  # vLLM 0.32, /inference/v1/generate, recorded
    "This model's maximum context length is 4096 tokens. However, your request has 4100 input tokens. "
    "Please reduce the length of the input messages.",
    # vLLM 0.32 CPU server, /inference/v1/generate, a 4100-token prompt in a 4096-token window (its answer in the
    # integration suite, which failed as a plain BackendError before this text was in the table)
    "Input length (4100) exceeds model's maximum context length (4096).",
]


def test_each_text_matches_one_of_its_answers_and_every_answer_is_matched() -> None:
    patterns = [re.compile(p, re.IGNORECASE) for p in CONTEXT_LENGTH_TEXTS]
    for pattern in patterns:
        assert any(pattern.search(body) for body in ANSWERS), f"{pattern.pattern!r} matches no vLLM answer"
    for body in ANSWERS:
        assert any(pattern.search(json.dumps({"error": {"message": body}})) for pattern in patterns), body


@pytest.mark.parametrize("backend_class", [VLLMBackend, VLLMChatBackend])
@pytest.mark.parametrize("body", ANSWERS)
async def test_the_backend_makes_them_context_length_errors_and_no_other_400(backend_class: type, body: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": body if request.url.path == "/long" else other}})

    other = _recorded("error_bad_request.json")  # vLLM 0.32's "You must pass at least one prompt"
    backend = backend_class("http://vllm.test", transport=httpx.MockTransport(answer))
    with pytest.raises(ContextLengthError):
        await backend.http.post("/long", b"{}")
    with pytest.raises(BackendError) as info:
        await backend.http.post("/other", b"{}")
    assert type(info.value) is BackendError
