"""Strands rewrites the history of a long agent run on the embedded backend (the long-horizon example,
examples/arithmetic/long_horizon.toml, on the tiny random Qwen3): every rewrite forks, every branch is exported as
a training sample, each generated token trained once; a summary is model output in the branch that made it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from strands import tool

from tito_core import Trajectory, rollout
from tito_core.runner import read_records
from tito_core.runner.samples import generated_tokens, training_rows
from tito_testing.tokenizers import qwen_tokenizer_dir

from ..runner.helpers import trained_once

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"
Small = Literal[1, 2, 3, 4, 5]


@tool
def small_add(a: Small, b: Small) -> int:
    """Add two small integers."""
    return a + b


def _overrides(tiny_model_dir: Path, **rollout_keys: Any) -> dict[str, Any]:
    """The example's config on the tiny model: an enum-only tool, so each forced call ends within the token limit."""
    return {
        "prepare": "",  # no SmolLM2 build
        "tokenizer": str(qwen_tokenizer_dir("qwen3")),
        "backend_options": {"model_path": str(tiny_model_dir), "dtype": "bfloat16", "num_threads": 1},
        "sampling": {"temperature": 1.0, "max_new_tokens": 96, "seed": 3},
        "tools": ["tests.transformers.test_long_horizon:small_add"],
        "forced_tool_calls": 5,
        "max_model_calls": 6,
        "group_size": 1,
        **rollout_keys,
    }


def test_sliding_window_on_the_embedded_backend(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "long.jsonl"
    summary = rollout(EXAMPLE / "long_horizon.toml", EXAMPLE / "long_tasks.jsonl", out, **_overrides(tiny_model_dir))
    assert summary.written == 4
    records = list(read_records(out))
    for record in records:
        traj = Trajectory.from_record(record.trajectory)
        assert len(traj.all_branches) >= 2, record.status_reason  # the window trimmed the history: it forked
        assert all("rewritten" in (b.fork_reason or "") for b in traj.all_branches[1:])
        assert sum(len(b.turns) for b in traj.all_branches) >= 3
        trained_once(traj)
    rows = list(training_rows(records, "slime"))
    assert len(rows) > len(records) and sum(row["final"] for row in rows) == len(records)
    for row in rows:
        assert len(row["loss_mask"]) == len(row["rollout_log_probs"]) == row["response_length"]
    counts = generated_tokens(records)
    assert counts.final_branch < counts.all_branches  # what exporting the final branch alone dropped


def test_summarizing_on_the_embedded_backend_records_the_summary(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "long.jsonl"
    # Strands summarizes before a model call once the prompt fills 40 % of the window (proactive compression),
    # asking the model directly, without tools: the forced tool choice must not leak into that call.
    options = {
        "preserve_recent_messages": 2,
        "summary_ratio": 0.5,
        "proactive_compression": {"compression_threshold": 0.4},
    }
    overrides = _overrides(tiny_model_dir, conversation_manager="summarizing", conversation_manager_options=options)
    overrides["context_window_limit"] = 1024
    rollout(EXAMPLE / "long_horizon.toml", EXAMPLE / "long_tasks.jsonl", out, **overrides)
    summaries = 0
    for record in read_records(out):
        traj = Trajectory.from_record(record.trajectory)
        trained_once(traj)
        for branch in traj.all_branches:
            if branch.fork_reason == "a new lineage (the system prompt and the tool list changed)":  # the summarizer's
                own = branch.first_output_from(branch.fork_at)
                if own < len(branch):
                    summaries += 1
                    assert sum(branch.loss_mask[own:]) > 0  # the summary: model output, loss 1, in its branch
    assert summaries > 0
