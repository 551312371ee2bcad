"""The runner suite runs on the scripted backend (in process) and on local fake SGLang servers (real sockets)."""

from __future__ import annotations

import logging

import pytest

from .helpers import tokenizer_dir


@pytest.fixture(scope="session")
def qwen3_dir() -> str:
    return tokenizer_dir()


@pytest.fixture(autouse=True)
def _runner_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tito.runner")
