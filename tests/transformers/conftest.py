"""Fixtures of the embedded backend's suite: the tiny random Qwen3 and Qwen2.5-VL (built offline, cached) and backends.

Model loading is the slow part, so backends are shared per module; each test module that needs a different
configuration (float32 for exact comparisons, processed logprobs, a small batch bound) builds its own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest.importorskip("torch")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from tito_testing.tiny_model import build_tiny_qwen3

    return build_tiny_qwen3()


@pytest.fixture(scope="session")
def tiny_vl_dir() -> Path:
    from tito_testing.tiny_vl import build_tiny_qwen25_vl

    return build_tiny_qwen25_vl()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from tito_testing.tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer("qwen3")


@pytest.fixture(scope="module")
def tiny_backend(tiny_model_dir: Path) -> Iterator[Any]:
    """The tiny model in bfloat16 (its stored dtype; the default on CPU is float32), defaults otherwise."""
    from tito_transformers import TransformersBackend

    backend = TransformersBackend(tiny_model_dir, dtype="bfloat16")
    yield backend
    backend.close()


@pytest.fixture
async def backend(tiny_backend: Any) -> AsyncIterator[Any]:
    """The conformance kit's ``backend`` fixture."""
    yield tiny_backend


@pytest.fixture
def batch_sizes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows in each batched decoding step of the embedded backend, recorded."""
    from tito_transformers import backend as backend_module

    seen: list[int] = []
    step = backend_module._Batch.step

    def recording(self: Any) -> None:
        seen.append(len(self.rows))
        step(self)

    monkeypatch.setattr(backend_module._Batch, "step", recording)
    return seen
