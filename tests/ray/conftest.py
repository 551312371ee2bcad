"""The Ray suite: one local Ray cluster for the session (2 CPUs, a small object store), shut down at the end."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray: 2 CPUs (this machine's), 128 MiB of object store, no dashboard; workers import tests.*."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=2,
        object_store_memory=128 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}},
    )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def executor(ray_cluster: Any) -> Iterator[Any]:
    """One executor for the suite: its two workers start once (~20 s each on 2 shared cores) and are reused."""
    from tito_core.runner.ray_executor import RayExecutor

    with RayExecutor(2, concurrency=3, num_cpus=0.5) as shared:  # half a CPU each: Ray Data gets one too
        yield shared


@pytest.fixture(autouse=True)
def _runner_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="tito.runner")
