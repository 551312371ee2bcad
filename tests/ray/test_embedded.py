"""The embedded backend (the tiny random Qwen3, greedy, float32) on Ray: the Ray executor's workers and the Ray
Data entry point write exactly the records of the local executor for the same tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tito_core import arollout
from tito_core.records import record_from_row
from tito_core.runner import LocalExecutor, read_records
from tito_core.runner.ray_executor import RayExecutor, RolloutBatches

from ..runner.helpers import tasks, tokenizer_dir
from .helpers import comparable

pytest.importorskip("torch")
pytest.importorskip("tito_transformers")


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    from tito_testing.tiny_model import build_tiny_qwen3

    return {
        "backend": "transformers",
        "tokenizer": tokenizer_dir(),
        "backend_options": {"model_path": str(build_tiny_qwen3()), "dtype": "float32", "num_threads": 1},
        "sampling": {"temperature": 0.0, "max_new_tokens": 6},
        "rollout": {
            "group_size": 2,
            "concurrency": 4,
            "reward": "tests.ray.helpers:by_sample",
            "group_reward": "tests.ray.helpers:rank",
        },
    }


async def test_ray_workers_and_ray_data_match_the_local_executor(
    tmp_path: Path, config: dict[str, Any], executor: RayExecutor, ray_cluster: Any
) -> None:
    rows = tasks(4)
    local = await arollout(config, rows, tmp_path / "local.jsonl", executor=LocalExecutor(4))
    assert local.written == 8 and set(local.statuses) <= {"completed", "truncated"}
    expected = {r.key: comparable(r) for r in read_records(tmp_path / "local.jsonl")}
    assert all(len(c[7]) > 0 for c in expected.values())  # token ids were generated

    on_ray = await arollout(config, rows, tmp_path / "ray.jsonl", executor=executor)
    assert on_ray.statuses == local.statuses
    assert {r.key: comparable(r) for r in read_records(tmp_path / "ray.jsonl")} == expected

    # Ray Data: rows of tasks (with their group id) in, rows of the Parquet file's columns out
    dataset = ray_cluster.data.from_items([{**row, "group": n} for n, row in enumerate(rows)])
    out = dataset.map_batches(
        RolloutBatches,
        fn_constructor_kwargs={"config": config},
        batch_size=2,
        batch_format="pyarrow",
        concurrency=1,
        num_cpus=0.5,
    ).take_all()
    assert len(out) == 8
    assert {r.key: comparable(r) for r in map(record_from_row, out)} == expected


async def test_the_driver_builds_no_embedded_model_and_prestarted_workers_run_the_rollouts(
    tmp_path: Path, config: dict[str, Any], ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tito_transformers import backend as embedded

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the driver built the embedded model")

    monkeypatch.setattr(embedded.TransformersBackend, "__init__", refuse)  # in this process: the driver only
    with RayExecutor(1, concurrency=2, num_cpus=0.5) as executor:
        started: list[Any] = []
        prestart = executor.prestart

        def spy(settings: Any) -> None:
            prestart(settings)
            started.extend(executor.actors)

        monkeypatch.setattr(executor, "prestart", spy)
        summary = await arollout(config, tasks(2), tmp_path / "out.jsonl", executor=executor)
        assert summary.written == 4 and executor.lost == 0
        assert len(started) == 1 and executor.actors == started  # the actor started before the driver's checks ran it
