"""Fixtures of the embedded backend's suite: the tiny random Qwen3, Qwen3-MoE and Qwen2.5-VL (built offline, cached)
and backends.

Model loading is the slow part, so backends are shared per module; each test module that needs a different
configuration (float32 for exact comparisons, processed logprobs, a small batch bound) builds its own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
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
def tiny_moe_dir() -> Path:
    from tito_testing.tiny_moe import build_tiny_qwen3_moe

    return build_tiny_qwen3_moe()


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


class StepGate:
    """Holds the embedded backend's worker before a decoding step while closed (tests close it to queue companions)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.held = threading.Event()  # set once a step waits at the closed gate

    def close(self) -> None:
        self.held.clear()
        self.open.clear()

    def pass_through(self) -> None:
        if not self.open.is_set():
            self.held.set()
            if not self.open.wait(timeout=120):
                raise TimeoutError("the test never opened the step gate")


@pytest.fixture
def step_gate() -> StepGate:
    """The gate ``batch_sizes`` steps pass (open unless a test closes it)."""
    return StepGate()


@pytest.fixture
def batch_sizes(monkeypatch: pytest.MonkeyPatch, step_gate: StepGate) -> list[int]:
    """Rows in each batched decoding step of the embedded backend, recorded."""
    from tito_transformers import backend as backend_module

    seen: list[int] = []
    step = backend_module._Batch.step

    def recording(self: Any) -> None:
        step_gate.pass_through()
        seen.append(len(self.rows))
        step(self)

    monkeypatch.setattr(backend_module._Batch, "step", recording)
    return seen


@contextlib.contextmanager
def _decoded_together(backend: Any, n: int) -> Iterator[None]:
    saved = backend.max_batch_size, backend.batch_wait_s
    backend.max_batch_size, backend.batch_wait_s = n, 120.0
    try:
        yield
    finally:
        backend.max_batch_size, backend.batch_wait_s = saved


@pytest.fixture
def decode_together() -> Callable[[Any, int], contextlib.AbstractContextManager[None]]:
    """``with decode_together(backend, n):`` its idle worker waits until ``n`` requests are queued, then prefills them.

    The backend's own gathering (``batch_wait_ms``), made deterministic: the worker waits on the queue's
    condition for the n-th request, not on a clock, so a busy machine cannot split the batch (the wait's
    deadline is only a safety net). The backend's settings come back on leaving the block.
    """
    return _decoded_together
