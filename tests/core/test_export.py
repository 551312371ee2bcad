from __future__ import annotations

import struct

import pytest

from tito_core import Trajectory
from tito_core.export import to_slime, to_trl, to_verl
from tito_core.trajectory import Turn, Usage


def sample_trajectory(with_experts: bool = False) -> Trajectory:
    traj = Trajectory("r1")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [4, 5], [-0.5, -0.25], turn=0)
    traj.append("boundary", [6], turn=1)
    traj.append("prompt", [7, 8], turn=1)
    traj.append("output", [9], [-1.0], turn=1)
    rows = struct.pack("<16i", *range(16)) if with_experts else None
    for i, (start, plen, olen) in enumerate([(0, 3, 2), (5, 3, 1)]):
        traj.add_turn(
            Turn(
                index=i, rid="x", prompt_start=start, prompt_len=plen, output_len=olen, finish_reason="stop",
                stop_reason="end_turn", usage=Usage(prompt_tokens=plen, completion_tokens=olen),
                routed_experts=rows if i == 0 else None, routed_experts_shape=(2, 1) if i == 0 else None,
            )
        )  # fmt: skip
    traj.set_status("completed")
    return traj


def test_slime_fields_cover_the_response_only():
    fields = to_slime(sample_trajectory())
    assert fields["tokens"] == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert fields["response_length"] == 6
    assert fields["loss_mask"] == [1, 1, 0, 0, 0, 1]
    assert fields["rollout_log_probs"] == [-0.5, -0.25, 0.0, 0.0, 0.0, -1.0]
    assert len(fields["loss_mask"]) == len(fields["rollout_log_probs"]) == fields["response_length"]
    assert fields["status"] == "COMPLETED" and fields["rollout_id"] == "r1"


def test_slime_routed_experts_shape():
    fields = to_slime(sample_trajectory(with_experts=True))
    experts = fields["rollout_routed_experts"]
    assert experts.shape == (8, 2, 1)  # len(tokens) - 1 rows


def test_verl_and_trl():
    traj = sample_trajectory()
    verl = to_verl(traj)
    assert verl["prompt_ids"] == [1, 2, 3] and verl["response_ids"] == [4, 5, 6, 7, 8, 9]
    assert verl["response_mask"] == [1, 1, 0, 0, 0, 1] and verl["num_turns"] == 2
    trl = to_trl(traj)
    assert trl["completion_ids"] == verl["response_ids"] and trl["env_mask"] == verl["response_mask"]
    assert trl["logprobs"] == verl["response_logprobs"]


def test_trl_batch_is_columns_in_order():
    first, second = sample_trajectory(), Trajectory("r2")
    second.append("prompt", [10, 11], turn=0)
    second.append("output", [12], [-0.125], turn=0)
    batch = to_trl([first, second])
    assert batch["prompt_ids"] == [[1, 2, 3], [10, 11]]
    assert batch["completion_ids"] == [to_trl(first)["completion_ids"], [12]]
    assert batch["logprobs"][1] == [-0.125] and batch["env_mask"][1] == [1]
    assert to_trl([]) == {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}


def test_verl_metrics_defaults_and_overrides():
    traj = sample_trajectory()
    assert to_verl(traj)["metrics"] == {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1}
    metrics = to_verl(traj, metrics={"generate_sequences": 1.5})["metrics"]
    assert metrics["generate_sequences"] == 1.5 and metrics["num_preempted"] == -1
    with pytest.raises(ValueError, match="unknown verl metrics"):
        to_verl(traj, metrics={"latency": 1.0})
