"""Strands rewrites the history (sliding window, summaries): every branch is recorded and becomes a training
sample, each generated token trained once (scripted backend; the embedded suite runs the same on a real model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tito_core import rollout
from tito_core.cli import main
from tito_core.errors import ConfigError
from tito_core.export import training_branches
from tito_core.runner import read_records
from tito_core.tokenizers import load_tokenizer
from tito_core.trajectory import Trajectory

from .helpers import call, config, lines, tasks, tokenizer_dir, trained_once

SUMMARY = "SUMMARY: the agent added numbers."


class _Agent:
    """Three tool calls, then an answer; a summary when asked for one (the summarizer's own system prompt).

    Counts its own calls (a trimmed history no longer shows how many tools ran): rollouts run one at a time.
    """

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: Any) -> str:
        text = load_tokenizer(tokenizer_dir()).decode(list(request.input_ids))
        if "summar" in text.split("<|im_end|>")[0].lower():
            return SUMMARY
        self.calls += 1
        if self.calls <= 3:
            return call("add", a=self.calls, b=1)
        self.calls = 0  # the rollout ends here: the next one (rollouts run one at a time) starts over
        return "The answer is 3."


def test_sliding_window_forks_every_rewrite_and_every_branch_is_exported(tmp_path: Path) -> None:
    agent = _Agent()
    cfg = config([agent] * 50, tools=["tests.runner.helpers:add"], concurrency=1,
                 conversation_manager="sliding_window",
                 conversation_manager_options={"window_size": 4, "per_turn": True})  # fmt: skip
    out = tmp_path / "out.jsonl"
    rollout(cfg, tasks(1), out)
    (record,) = read_records(out)
    assert record.status == "completed"
    traj = Trajectory.from_record(record.trajectory)
    assert len(traj.all_branches) >= 3 and all("rewritten" in (b.fork_reason or "") for b in traj.all_branches[1:])
    trained_once(traj)
    final_only = sum(traj.loss_mask)
    everything = sum(sum(b.loss_mask[b.first_output_from(b.fork_at) :]) for b in traj.all_branches)
    assert everything > final_only  # what exporting the final branch alone used to drop
    assert main(["export", "--to", "verl", str(out), "-o", str(tmp_path / "verl.jsonl")]) == 0
    rows = lines(tmp_path / "verl.jsonl")
    assert [(r["branch"], r["parent_branch"], r["final"]) for r in rows] == [
        (b.branch, b.parent_branch, b is traj) for b in traj.all_branches
    ]
    assert sum(sum(r["response_mask"]) for r in rows) == everything
    assert {r["reward"] for r in rows} == {record.reward} and {r["task_id"] for r in rows} == {"t0"}
    assert (
        main(["export", "--to", "verl", str(out), "-o", str(tmp_path / "last.jsonl"), "--branch-reward", "last"]) == 0
    )
    (last,) = lines(tmp_path / "last.jsonl")
    assert sum(last["response_mask"]) == final_only and last["final"] is True


def test_the_summary_is_model_output_recorded_in_the_branch_that_generated_it(tmp_path: Path) -> None:
    agent = _Agent()
    cfg = config([agent] * 50, tools=["tests.runner.helpers:add"], concurrency=1,
                 conversation_manager="summarizing",
                 conversation_manager_options={"preserve_recent_messages": 2, "summary_ratio": 0.5})  # fmt: skip
    cfg["context_window_limit"] = 280  # the third tool result overflows it: Strands summarizes and retries
    out = tmp_path / "out.jsonl"
    rollout(cfg, tasks(1), out)
    (record,) = read_records(out)
    traj = Trajectory.from_record(record.trajectory)
    tokenizer = load_tokenizer(tokenizer_dir())
    summaries = [
        b for b in traj.all_branches
        if any(seg.kind == "output" and SUMMARY in tokenizer.decode(b.tokens(seg)) for seg in b.segments)
    ]  # fmt: skip
    assert summaries, [tokenizer.decode(b.token_ids[-40:]) for b in traj.all_branches]
    branch = summaries[0]
    assert branch.fork_reason == "a new lineage (the system prompt and the tool list changed)"  # the summarizer's
    going_on = [b for b in traj.all_branches if b.fork_kind == "compaction"]
    assert going_on, [(b.branch, b.fork_kind, b.fork_reason) for b in traj.all_branches]
    assert {(b.compacted_from.branch, b.compacted_from.turn) for b in going_on if b.compacted_from} == {
        (branch.branch, branch.turns[-1].index)
    }  # the agent goes on from the summary: linked to the call that wrote it
    sample = next(s for s in training_branches(traj) if s.trajectory is branch)
    assert tokenizer.decode(sample.trajectory.token_ids[sample.prompt_length :]).startswith(SUMMARY)
    assert sum(sample.trajectory.loss_mask[sample.prompt_length :]) > 0  # trained: loss 1
    trained_once(traj)


def test_a_bad_conversation_manager_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="must be one of"):
        rollout(config(["x"], conversation_manager="trimming"), tasks(1), tmp_path / "out.jsonl")
    with pytest.raises(ConfigError, match="bad `conversation_manager_options`"):
        rollout(config(["x"], conversation_manager="sliding_window", conversation_manager_options={"size": 3}),
                tasks(1), tmp_path / "out.jsonl")  # fmt: skip
    assert not (tmp_path / "out.jsonl").exists()


def test_rollout_batches_give_a_training_row_per_branch() -> None:
    pa = pytest.importorskip("pyarrow")
    from tito_core.runner.ray_executor import RolloutBatches

    cfg = config([_Agent()] * 50, tools=["tests.runner.helpers:add"], concurrency=1, group_size=2,
                 reward="tests.runner.helpers:sample_index", group_reward="tito_core.runner.rewards:group_normalized",
                 conversation_manager="sliding_window",
                 conversation_manager_options={"window_size": 4, "per_turn": True})  # fmt: skip
    batch = pa.Table.from_pylist([{**task, "group": 0} for task in tasks(1)])
    rows = RolloutBatches(cfg, samples="trl")(batch).to_pylist()
    by_sample = {s: [r for r in rows if r["sample"] == s] for s in (0, 1)}
    assert all(len(branches) >= 3 for branches in by_sample.values())  # one row per branch, not per rollout
    assert [r["branch"] for r in by_sample[0]] == list(range(len(by_sample[0])))
    for sample, advantage in ((0, -1.0), (1, 1.0)):  # the episode's advantage, on each of its branches
        assert [r["advantage"] for r in by_sample[sample]] == pytest.approx(
            [advantage] * len(by_sample[sample]), abs=1e-5
        )
    last = RolloutBatches({**cfg, "rollout": {**cfg["rollout"], "branch_reward": "last"}}, samples="trl")(batch)
    assert last.num_rows == 2 and set(last.column("final").to_pylist()) == {True}
    with pytest.raises(ConfigError, match="unknown samples format"):
        RolloutBatches(cfg, samples="openrlhf")  # type: ignore[arg-type]
