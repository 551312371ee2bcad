"""A real SGLang server for the integration suite: tiny random Qwen3, CPU engine, loopback only.

One server per test session, and a second one for the tiny Qwen2.5-VL when an image test runs. SGLang 0.5.23's
CPU engine imports two functions from the CPU build of ``sgl_kernel``, which is not on PyPI; the suite writes a
pure-torch stand-in for them into a temporary directory that only the server process sees (``PYTHONPATH``).
Attention runs on ``torch_native``.

Environment:
    TITO_SGLANG_PYTHON  interpreter with sglang installed (default: the one running the tests)
    TITO_SGLANG_URL     use an already running server instead of starting one (nothing is stopped)
    TITO_SGLANG_VL_URL  the same for the second server, the tiny Qwen2.5-VL of tests/integration/sglang/test_images.py
    TITO_SGLANG_START_TIMEOUT  seconds to wait for the server to be healthy (default 900)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tito_sglang import SGLangBackend

from ..servers import fail_if_left_busy, sglang_process

pytestmark = pytest.mark.integration

# A stand-in for the two CPU kernels SGLang's CPU engine calls. Anything else raises if ever called
# (SGLang only probes torch.ops.sgl_kernel for fast paths, which stay off).
SGL_KERNEL_STANDIN = textwrap.dedent(
    '''
    """Pure-torch stand-in for the two sgl_kernel CPU functions SGLang's CPU engine needs (tests only)."""
    import ctypes

    import torch


    def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                     out_cache_loc, pool_len):
        """req_to_token[row, start:end] = the next (end - start) cache slots, request after request."""
        starts = start_offset.tolist()
        ends = end_offset.tolist()
        cursor = 0
        for row, start, end in zip(req_pool_indices.tolist(), starts, ends):
            count = max(0, end - start)
            if count:
                req_to_token[row, start:end] = out_cache_loc[cursor:cursor + count].to(req_to_token.dtype)
            cursor += count


    def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
        """For every layer buffer, copy the token slots src_loc to tgt_loc (all reads before writes)."""
        sources = src_loc.tolist()
        targets = tgt_loc.tolist()
        if not sources:
            return
        for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
            staging = ctypes.create_string_buffer(stride * len(sources))
            staging_base = ctypes.addressof(staging)
            for i, src in enumerate(sources):
                ctypes.memmove(staging_base + i * stride, base + src * stride, stride)
            for i, tgt in enumerate(targets):
                ctypes.memmove(base + tgt * stride, staging_base + i * stride, stride)


    # Ops SGLang's Qwen3.5 model module looks up when it is imported on CPU; the Qwen-VL image processor imports
    # that module, so without them no Qwen-VL model loads ("No processor registered for architecture"). Declared
    # without a kernel: a call fails. Only Qwen3.5 calls them.
    _OPS = torch.library.Library("sgl_kernel", "FRAGMENT")
    for _op in (
        "fused_sigmoid_mul_cpu",
        "fused_qk_gemma_rmsnorm_cpu",
        "fused_qk_gemma_rmsnorm_with_gate_cpu",
        "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    ):
        if not hasattr(torch.ops.sgl_kernel, _op):
            _OPS.define(f"{_op}(...) -> ()")


    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise NotImplementedError(f"sgl_kernel.{name} is not provided by the test stand-in")

        unavailable.__name__ = name
        return unavailable
    '''
)

SERVER_FLAGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-overlap-schedule",
    "--dtype", "bfloat16",
    "--context-length", "4096",
    "--max-running-requests", "8",
    "--max-total-tokens", "65536",
    "--served-model-name", "tiny",
    # an idle scheduler polls its sockets instead of spinning: a server waiting while the suite uses the other
    # one (text / tiny VL) took a whole core of CI's two, and the tiny VL server's start then outran its limit
    "--sleep-on-idle",
]  # fmt: skip

SERVER_PYTHON = os.environ.get("TITO_SGLANG_PYTHON") or sys.executable
# A hang guard, not a budget: beside heavy work the tiny VL server's tokenizer process alone took 250 s to start.
START_TIMEOUT = float(os.environ.get("TITO_SGLANG_START_TIMEOUT", "900"))
REPORT: list[str] = []  # measurements the tests print at the end of the run


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORT:
        terminalreporter.section("SGLang integration measurements")
        for line in REPORT:
            terminalreporter.write_line(line)


def _sglang_missing() -> str | None:
    probe = subprocess.run([SERVER_PYTHON, "-c", "import sglang, torch"], capture_output=True, text=True, timeout=120)
    if probe.returncode == 0:
        return None
    last = (probe.stderr.strip().splitlines() or ["?"])[-1]
    return f"sglang is not importable by {SERVER_PYTHON} ({last}); run `nox -s integration_sglang`"


def _warm_up(client: httpx.Client) -> None:
    warm = {"input_ids": [151644, 872, 198], "sampling_params": {"max_new_tokens": 4}}
    client.post("/generate", json=warm, timeout=120.0).raise_for_status()


@pytest.fixture(scope="session")
def sglang_model_dir() -> Path:
    """The tiny random Qwen3 model (built once, cached)."""
    if (reason := _sglang_missing()) is not None:
        print(f"\nSKIP sglang integration suite: {reason}", file=sys.stderr)
        pytest.skip(reason)
    from tito_testing.tiny_model import build_tiny_qwen3

    return build_tiny_qwen3()


@pytest.fixture(scope="session")
def sglang_url(sglang_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running SGLang server (started here and stopped at the end of the session)."""
    if external := os.environ.get("TITO_SGLANG_URL"):
        yield external.rstrip("/")
        return
    with _serve(sglang_model_dir, tmp_path_factory.mktemp("sglang"), name="sglang") as url:
        yield url


@pytest.fixture(scope="session")
def sglang_vl_model_dir(sglang_model_dir: Path) -> Path:
    """The tiny random Qwen2.5-VL (built once, cached; torch and transformers come with the SGLang env)."""
    tiny_vl = pytest.importorskip("tito_testing.tiny_vl", reason="tito_testing.tiny_vl is not in this tree")
    path: Path = tiny_vl.build_tiny_qwen25_vl()
    return path


@pytest.fixture(scope="session")
def sglang_vl_url(sglang_vl_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A second server, for the tiny VL model, started by the first test that needs it (TITO_SGLANG_VL_URL: use
    one already running). Its start is reported with the suite's measurements."""
    if external := os.environ.get("TITO_SGLANG_VL_URL"):
        yield external.rstrip("/")
        return
    started = time.monotonic()
    with _serve(sglang_vl_model_dir, tmp_path_factory.mktemp("sglang-vl"), name="sglang (tiny VL)") as url:
        REPORT.append(
            f"tiny VL server start (a second server, its cost to the suite): {time.monotonic() - started:.1f} s"
        )
        yield url


@contextlib.contextmanager
def _serve(model_dir: Path, workdir: Path, *, name: str) -> Iterator[str]:
    """Start ``sglang.launch_server`` on ``model_dir`` (loopback, CPU, the stand-in kernels); stop it on exit."""
    keep_alive = {
        # uvicorn's keep-alive (SGLang: 5 s) closed a connection whose request was being prefilled, on a busy
        # machine, when its timer fired 5 s after the previous answer on it (seen twice in the weight-update
        # test's re-scoring: 'Server disconnected'; tito never re-sends a generation, so the call failed).
        # tito keeps idle connections 2 s; a longer server keep-alive leaves that timer out of the suite.
        "SGLANG_TIMEOUT_KEEP_ALIVE": os.environ.get("SGLANG_TIMEOUT_KEEP_ALIVE", "60"),
    }
    started = time.monotonic()
    with sglang_process(
        SERVER_PYTHON,
        model_dir,
        workdir,
        flags=SERVER_FLAGS,
        kernel_stand_in=SGL_KERNEL_STANDIN,
        warm_up=_warm_up,
        env=keep_alive,
        name=name,
        timeout=START_TIMEOUT,
    ) as url:
        print(
            f"\n{name} ready at {url} in {time.monotonic() - started:.1f} s (log: {workdir / 'server.log'})",
            file=sys.stderr,
        )
        yield url


@pytest.fixture
async def sglang_backend(sglang_url: str) -> AsyncIterator[SGLangBackend]:
    backend = SGLangBackend(sglang_url, timeout=120.0)
    yield backend
    await backend.aclose()


@pytest.fixture(autouse=True)
def _server_left_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used a real server: the server is not paused and holds no running or queued
    request. A test that leaves one fails with what it left (the next test would otherwise meet it)."""
    yield
    fail_if_left_busy(request, "sglang", ("sglang_url", "sglang_vl_url"))
