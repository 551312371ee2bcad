"""SGLang's "the prompt does not fit the context window" texts (the adapter's own table), pinned against its answers.

The wording SGLang 0.5.23's source raises (the same the fault server in tests/faults/server.py sends). An SGLang
upgrade that changes one fails here instead of a context-window overflow being taken for a plain 400.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tito_core.errors import BackendError, ContextLengthError
from tito_sglang import SGLangBackend
from tito_sglang.backend import CONTEXT_LENGTH_TEXTS

ANSWERS = [
    "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
    "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total of 4100 "
    "tokens: 4000 tokens from the input messages and 100 tokens for the completion. Please reduce the number of tokens "
    "in the input messages or the completion to fit within the limit.",
]


def test_each_text_matches_one_of_its_answers_and_every_answer_is_matched() -> None:
    patterns = [re.compile(p, re.IGNORECASE) for p in CONTEXT_LENGTH_TEXTS]
    for pattern in patterns:
        assert any(pattern.search(body) for body in ANSWERS), f"{pattern.pattern!r} matches no SGLang answer"
    for body in ANSWERS:
        assert any(pattern.search(json.dumps({"error": {"message": body}})) for pattern in patterns), body


@pytest.mark.parametrize("body", ANSWERS)
async def test_the_backend_makes_them_context_length_errors_and_no_other_400(body: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        text = body if request.url.path == "/long" else "field 'stop' is too long"
        return httpx.Response(400, json={"error": {"message": text}})

    backend = SGLangBackend("http://sglang.test", transport=httpx.MockTransport(answer))
    with pytest.raises(ContextLengthError):
        await backend.http.post("/long", b"{}")
    with pytest.raises(BackendError) as info:
        await backend.http.post("/other", b"{}")
    assert type(info.value) is BackendError
