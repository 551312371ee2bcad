"""The A/B's engine path on the real server (benchmarks/train_ab.py, docs/training-ab.md "The decisive run").

Two steps of one arm of the decisive run's shape at the tiny size: rollouts sampled by SGLang with top-p/top-k,
the trainer (full fine-tuning, CPU) updating twice per batch with TIS, its weights pushed to the server after each
step. The weights must really reach the server: each step's rollouts carry the version pushed before it, the
server's logprobs of a fixed sequence afterwards are those of the last checkpoint's files (a forward pass of its
own, not the engine's word) and far from the initial model's.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_sglang import SGLangBackend

from ..reference import Reference
from ..weight_updates import BF16_MAX, BF16_MEAN, OTHER_MEAN
from .conftest import REPORT

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
IDS = [785, 2797, 11, 10865, 11652, 34208, 916, 279, 15678, 5562, 13, 151645, 198, 151644, 872, 198]


def _mean_abs(a: list[float | None], b: list[float]) -> tuple[float, float]:
    diffs = [abs((x or 0.0) - y) for x, y in zip(a, b, strict=True)]
    return sum(diffs) / len(diffs), max(diffs)


@pytest.mark.parametrize("staleness", [0, 1])
async def test_the_trainers_weights_reach_the_server_every_step(
    sglang_url: str, sglang_model_dir: Path, tmp_path: Path, staleness: int
) -> None:
    """``staleness`` 0: step 2 samples with the weights of step 1, and the server ends on step 2's. 1: the server
    is kept a step behind: both steps sample with the initial weights, and it ends on step 1's."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(BENCHMARKS))
    import train_ab as ab

    argv = [
        "--preset", "qwen3-gpu", "--model-dir", str(sglang_model_dir), "--engine-url", sglang_url,
        "--device", "cpu", "--threads", "2", "--out", str(tmp_path), "--steps", "2", "--train-tasks", "4",
        "--tasks-per-step", "1", "--group-size", "2", "--eval-tasks", "1", "--eval-every", "2",
        "--max-new-tokens", "8", "--top-k", "20", "--minibatches", "1", "--staleness", str(staleness),
        "--lr", "1e-2", "--reward", "train_ab_engine:first_sample_reward",  # a reward spread: a gradient each step
    ]  # fmt: skip
    args = ab.parse_args(argv)
    ab.check_args(args)
    args.seed = 0
    backend = SGLangBackend(sglang_url, timeout=300.0)
    try:
        result = await ab.run_arm("mask+tis", args)
        rows = result["rows"]
        assert [r["step"] for r in rows] == [1, 2] and all(r["groups_with_signal"] == 1 for r in rows)
        assert all(r["updates"] == 2 and r["tis_weight_mean"] is not None for r in rows)
        # each step sampled with the weights the server was given for it (the runner records the engine's spans)
        assert [r["weight_versions"] for r in rows] == ([["0"], ["1"]] if staleness == 0 else [["0"], ["0"]])
        assert [r["sampled_version"] for r in rows] == ([0, 1] if staleness == 0 else [0, 0])
        pushes = [result["engine_start"], *(r["push"] for r in rows if r["push"] is not None)]
        assert [p["version"] for p in pushes] == ([0, 1, 2] if staleness == 0 else [0, 1])
        for push in pushes:  # the probe in weight_update: the engine scores the sequence as the trainer does
            assert push["engine_vs_pushed"] < BF16_MEAN and push["engine_vs_pushed_max"] < BF16_MAX, push
        for push in pushes[1:]:  # and each step moved the weights well past that noise
            assert push["pushed_vs_previous"] > OTHER_MEAN, push
        # independently of the probe: the server now serves the files of the last checkpoint pushed
        last = pushes[-1]["version"]
        served = await backend.score(IDS)
        reference = Reference()
        near = _mean_abs(served, reference.score(tmp_path / "mask+tis" / "weights" / f"v{last}", IDS))
        far = _mean_abs(served, reference.score(sglang_model_dir, IDS))
        assert near[0] < BF16_MEAN and near[1] < BF16_MAX, near
        assert far[0] > OTHER_MEAN, far
        sampling = SamplingParams(max_new_tokens=2)
        answer = await backend.generate(
            GenerateRequest(rid=uuid.uuid4().hex, input_ids=IDS, prefix_len=0, sampling=sampling)
        )
        assert [span.version for span in answer.weight_versions or ()] == [str(last)]
        REPORT.append(
            f"train_ab on SGLang (2 steps, staleness {staleness}, full fine-tuning, 2 epochs, TIS): "
            + "; ".join(
                f"v{p['version']}: engine vs pushed {p['engine_vs_pushed']:.1e}, moved "
                + ("-" if p["pushed_vs_previous"] is None else f"{p['pushed_vs_previous']:.3f}")
                + f" nats, push {p['seconds']:.2f} s"
                for p in pushes
            )
            + f"; afterwards |server - v{last}'s files| {near[0]:.1e}, |server - initial| {far[0]:.3f}"
        )
    finally:  # the server's own model, labelled as it started, and running (a failed probe leaves it paused)
        await _restore(sglang_url, sglang_model_dir)
        await backend.set_weight_version("default")
        await backend.resume_generation()
        await backend.aclose()


async def _restore(url: str, model_dir: Any) -> None:
    """The server's own model again, for the tests after this one."""
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        body = {"model_path": str(model_dir), "abort_all_requests": False, "flush_cache": True}
        answer = await client.post("/update_weights_from_disk", json=body)
        assert answer.status_code == 200 and answer.json().get("success"), answer.text
