"""The `tito rollout` example (examples/arithmetic) on the embedded backend, with the tiny random Qwen3.

The example's own model (SmolLM2, built by its ``prepare`` hook) is replaced by the tiny model through the
runner's overrides, as command-line flags would: the point is the whole path -- config, dataset, tools,
reward, group reward, 16 tasks x 4 samples batched in process, the file, and a rerun that adds nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tito_core import Trajectory, rollout
from tito_core.runner import read_records
from tito_testing.tokenizers import qwen_tokenizer_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"


def test_the_arithmetic_example_runs_and_a_rerun_adds_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides: dict[str, Any] = {
        "prepare": "",  # no SmolLM2 build: the tiny model below
        "tokenizer": str(qwen_tokenizer_dir("qwen3")),
        "backend_options": {"model_path": str(tiny_model_dir), "dtype": "bfloat16", "num_threads": 1},
        "sampling": {"temperature": 1.0, "max_new_tokens": 8, "seed": 0},
    }
    out = tmp_path / "rollouts.jsonl"
    summary = rollout(EXAMPLE / "tito.toml", EXAMPLE / "tasks.jsonl", out, **overrides)
    assert summary.planned == summary.written == 64 and not summary.interrupted
    records = list(read_records(out))
    assert sorted({r.group for r in records}) == list(range(16))
    assert all(sorted(r.sample for r in records if r.group == g) == [0, 1, 2, 3] for g in range(16))
    for record in records:
        assert record.status in ("completed", "truncated")  # gibberish: mostly the 8-token limit
        assert record.reward in (0.0, 1.0) and record.advantage is not None
        traj = Trajectory.from_record(record.trajectory)
        assert record.tokens.output == sum(traj.loss_mask) >= 1
        assert [lp is not None for lp in traj.logprobs] == [bool(m) for m in traj.loss_mask]
    again = rollout(EXAMPLE / "tito.toml", EXAMPLE / "tasks.jsonl", out, **overrides)
    assert (again.skipped, again.written) == (64, 0)
    lines = out.read_bytes().splitlines()
    assert len(lines) == 64 + 16  # the records, and each group's advantages entry after its last record
    assert sum(line.startswith(b'{"kind":"advantages"') for line in lines) == 16
