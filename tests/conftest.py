"""Shared fixtures: offline Qwen tokenizers and hypothesis profiles."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=25, deadline=None)
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    from tito_testing.tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer("qwen3")


@pytest.fixture(scope="session")
def qwen25_tokenizer():
    from tito_testing.tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer("qwen2.5")
