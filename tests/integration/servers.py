"""Process plumbing shared by the real-server suites: ports, logs, readiness, clean shutdown."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, lines: int = 60) -> str:
    """The last lines of a server log, for error messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started with ``start_new_session=True``: its whole process group, SIGTERM then SIGKILL."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # children may outlive the leader for a moment
        os.killpg(process.pid, signal.SIGKILL)


def wait_until_healthy(
    url: str,
    process: subprocess.Popen[bytes],
    log: Path,
    *,
    name: str,
    timeout: float,
    warm_up: Callable[[httpx.Client], None],
) -> None:
    """Poll ``/health`` until it answers 200, then run ``warm_up``; raise with the log tail on failure."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=url, timeout=10.0) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_tail(log)}")
            try:
                if client.get("/health").status_code == 200:
                    warm_up(client)  # the first requests of a fresh server are slow
                    return
            except httpx.TransportError:
                pass
            time.sleep(1.0)
    raise RuntimeError(f"{name} was not healthy after {timeout:.0f} s:\n{log_tail(log)}")


@contextlib.contextmanager
def sglang_process(
    python: str,
    model_dir: Path,
    workdir: Path,
    *,
    flags: list[str],
    kernel_stand_in: str,
    warm_up: Callable[[httpx.Client], None],
    env: dict[str, str] | None = None,
    name: str = "sglang",
    timeout: float = 300.0,
) -> Iterator[str]:
    """``python -m sglang.launch_server`` on ``model_dir`` (loopback, CPU, the ``sgl_kernel`` stand-in in
    ``workdir``), its log in ``workdir``; yields its URL once healthy and warmed up, and stops its whole process
    group on exit. The one launch of the SGLang suite (tests/integration/sglang/conftest.py) and the benchmarks."""
    (workdir / "shim" / "sgl_kernel").mkdir(parents=True)
    (workdir / "shim" / "sgl_kernel" / "__init__.py").write_text(kernel_stand_in)
    port = free_port()
    log = workdir / "server.log"
    merged = dict(os.environ)
    merged.update(
        {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(workdir / "shim"), merged.get("PYTHONPATH")])),
            "SGLANG_USE_CPU_ENGINE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": merged.get("OMP_NUM_THREADS", "2"),
            **(env or {}),
        }
    )
    command = [
        python, "-m", "sglang.launch_server", "--model-path", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), *flags,
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, env=merged, cwd=workdir, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log, name=name, timeout=timeout, warm_up=warm_up)
        yield url
    finally:
        stop_process_group(process)


def engine_state(url: str, engine: str) -> dict[str, object]:
    """What a real server holds now: ``paused``, ``running`` and ``waiting`` requests (their engines' own views).

    SGLang: ``GET /ready`` answers 503 while paused; ``GET /v1/loads`` counts the scheduler's running batch
    (which keeps a request that finished just before an in-place pause until the scheduler's next step) and
    its waiting queues; an idle one is flushed, which SGLang refuses while anything else is left (a request in
    the grammar queue, a chunked prefill). vLLM: ``GET /is_paused``, and the ``num_requests_running`` /
    ``num_requests_waiting`` gauges of ``GET /metrics``. Neither engine lists its open sessions (SGLang keeps
    them in the scheduler only): tito's own session pools are checked by the tests that open them.
    """
    with httpx.Client(base_url=url, timeout=30.0) as client:
        if engine == "sglang":
            paused = client.get("/ready").status_code == 503
            loads = client.get("/v1/loads", params={"include": "core,queues"}).json()["loads"]
            running = sum(int(load.get("num_running_reqs", 0)) for load in loads)
            waiting = sum(int(load.get("num_waiting_reqs", 0)) for load in loads)
            if not paused and not running and not waiting:  # the very check a weight update's flush makes
                flushed = client.post("/flush_cache")
                if flushed.status_code != 200:
                    return {"paused": paused, "running": running, "waiting": waiting, "flush": flushed.text}
        else:
            paused = bool(client.get("/is_paused").json().get("is_paused"))
            metrics = client.get("/metrics").text
            running = int(metric_sum(metrics, "vllm:num_requests_running"))
            waiting = int(metric_sum(metrics, "vllm:num_requests_waiting"))
    return {"paused": paused, "running": running, "waiting": waiting}


def metric_sum(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (every label set) in a ``/metrics`` answer."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.split("{", 1)[0].split(" ", 1)[0] == name
    )


RESUME = {"sglang": "/continue_generation", "vllm": "/resume"}


def fail_if_left_busy(request: Any, engine: str, fixtures: tuple[str, ...]) -> None:
    """After a test that used one of ``fixtures`` (server URLs): fail it, naming what it left, when the server is
    paused or holds a running or queued request; a paused server is resumed so the next tests meet a working one."""
    import pytest

    for name in fixtures:
        if name in request.fixturenames:
            url = request.getfixturevalue(name)
            left = left_busy(url, engine)
            if left is not None:
                if left["paused"]:
                    httpx.post(url + RESUME[engine], json={}, timeout=30.0)
                pytest.fail(f"{request.node.name} left {url} busy: {left}")


def left_busy(url: str, engine: str, *, settle_s: float = 60.0) -> dict[str, object] | None:
    """None once the server is idle (not paused, nothing running or queued); else what it still holds after
    ``settle_s`` (an abort or a finished request is let settle: the engine's own state is polled, no sleep
    decides). A paused server is reported at once: nothing settles while paused."""
    deadline = time.monotonic() + settle_s
    while True:
        state = engine_state(url, engine)
        if not state["paused"] and not state["running"] and not state["waiting"] and "flush" not in state:
            return None
        if state["paused"] or time.monotonic() > deadline:
            return state
        time.sleep(0.05)
