"""SGLang's wording of a refused session request (``SESSION_REFUSED_TEXTS``), pinned against the wording the repo
has from SGLang 0.5.23: the real server's answer seen by ``tests/integration/sglang/test_sessions.py`` and the
fault server's copy of it (``tests/faults/server.py``)."""

from __future__ import annotations

import json
import re

import pytest

from tito_core.errors import BackendError
from tito_sglang._sessions import SESSION_REFUSED_TEXTS, session_refused

REFUSALS = [
    "Invalid request: session id tito-3f2a does not exist",  # an unknown (or closed) session
    "Invalid request session id",  # a parent rid the session does not hold (the real server's answer)
    "Invalid request: a close was requested for session tito-3f2a",  # a request racing the session's close
]


def _error(status: int, message: str) -> BackendError:
    body = json.dumps({"object": "error", "message": message, "type": "BadRequestError", "code": status})
    return BackendError(message, status=status, body=body, backend="sglang")


@pytest.mark.parametrize("message", REFUSALS)
def test_each_refusal_is_a_refused_session(message: str) -> None:
    assert session_refused(_error(400, message))
    assert not session_refused(_error(500, message))


def test_each_text_matches_a_refusal() -> None:
    for text in SESSION_REFUSED_TEXTS:
        assert any(re.search(text, m, re.IGNORECASE) for m in REFUSALS), text


@pytest.mark.parametrize(
    "message",
    [
        "session_params must be an object",
        "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
    ],
)
def test_another_400_that_names_a_session_is_not_a_refusal(message: str) -> None:
    assert not session_refused(_error(400, message))
