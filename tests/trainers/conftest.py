"""The trainers' own packages, fed tito rollouts (nox -s trainers)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_qwen3():
    """The tiny random Qwen3 (offline, cached)."""
    from tito_testing.tiny_model import build_tiny_qwen3

    return build_tiny_qwen3()
