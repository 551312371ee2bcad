from __future__ import annotations

import struct

import pytest

from tito_core import Trajectory
from tito_core.export import to_slime, to_trl, to_verl, training_branches
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


# ------------------------------------------------------------------------------------------- branches
def forked_rollout() -> Trajectory:
    """Three branches: branch 1 forks from branch 0 after its first turn (in the middle of its turns), branch 2
    from branch 1 at the first prompt (a summary, say, replaced the whole history)."""
    b0 = Trajectory("r")
    b0.append("prompt", [1, 2], turn=0)
    b0.append("output", [10, 11], [-0.1, -0.2], turn=0)  # generated in branch 0, shared with branch 1
    b0.append("prompt", [3], turn=1)
    b0.append("output", [12, 13, 14], [-0.3, -0.4, -0.5], turn=1)  # only in branch 0
    b0.set_status("completed")
    b1 = b0.fork(4, "the conversation history was rewritten at message 2")
    b1.append("prompt", [4, 5], turn=1)
    b1.append("output", [15], [-0.6], turn=1)
    b1.set_status("completed")
    b2 = b1.fork(2, "summarized")
    b2.append("prompt", [6], turn=0)
    b2.append("output", [16, 17], [-0.7, -0.8], turn=0)
    b2.set_status("completed")
    return b2


def test_every_branch_is_a_sample_and_each_generated_token_is_trained_once():
    final = forked_rollout()
    samples = training_branches(final)
    assert [(s.trajectory.branch, s.shared_prefix, s.final) for s in samples] == [
        (0, 0, False),
        (1, 4, False),
        (2, 2, True),
    ]
    trained = []  # (token, logprob) of every loss-1 token over all samples
    for sample in samples:
        fields = to_verl(sample)
        assert fields["prompt_ids"] + fields["response_ids"] == sample.trajectory.token_ids
        for token, mask, lp in zip(
            fields["response_ids"], fields["response_mask"], fields["response_logprobs"], strict=True
        ):
            if mask:
                trained.append((token, lp))
    trained.sort()
    assert [token for token, _ in trained] == list(range(10, 18))  # each exactly once, in the branch that made it
    assert [lp for _, lp in trained] == pytest.approx([-0.1, -0.2, -0.3, -0.4, -0.5, -0.6, -0.7, -0.8])
    branch1 = to_slime(samples[1])
    assert branch1["tokens"] == [1, 2, 10, 11, 4, 5, 15] and branch1["response_length"] == 1  # shared prefix: prompt
    assert branch1["loss_mask"] == [1] and branch1["rollout_log_probs"] == pytest.approx([-0.6])
    assert samples[1].lineage() == {
        "rollout_id": "r",
        "branch": 1,
        "parent_branch": 0,
        "shared_prefix": 4,
        "final": False,
    }
    assert to_trl(samples[2])["prompt_ids"] == [1, 2, 6] and to_trl(samples[2])["env_mask"] == [1, 1]


def test_last_keeps_only_the_final_branch_trained_whole():
    final = forked_rollout()
    (only,) = training_branches(final, branch_reward="last")
    assert only.final and only.trajectory is final and only.trained_from == 0
    assert to_verl(only) == to_verl(final)  # today's export of the trajectory itself
    with pytest.raises(ValueError, match="branch_reward must be one of"):
        training_branches(final, branch_reward="first")  # type: ignore[arg-type]


def test_a_branch_that_generated_nothing_gives_no_sample_unless_it_is_the_last():
    b0 = Trajectory("r")
    b0.append("prompt", [1, 2], turn=0)
    b0.set_status("failed", "the engine went away")  # no output at all
    b1 = b0.fork(0, "retried")
    b1.append("prompt", [1, 2], turn=0)
    b1.append("output", [9], [-0.5], turn=0)
    b2 = b1.fork(3, "the next call failed")  # keeps everything: generated nothing of its own
    b2.set_status("failed", "the engine went away")
    assert [s.trajectory.branch for s in training_branches(b2)] == [1, 2]
    assert to_verl(training_branches(b2)[-1])["response_ids"] == []


def test_agent_lightning_events_of_a_branch_are_its_own_calls():
    from tito_core.trainers.agentlightning import model_request_events

    b0 = Trajectory("r")
    b0.append("prompt", [1, 2], turn=0)
    b0.append("output", [10, 11], [-0.1, -0.2], turn=0)
    b0.add_turn(_turn(0, 0, 2, 2))
    b1 = b0.fork(4, "rewritten")
    b1.append("prompt", [3], turn=1)
    b1.append("output", [12], [-0.3], turn=1)
    b1.add_turn(_turn(1, 4, 1, 1))
    first, second = training_branches(b1)
    assert [e["request"]["rid"] for e in model_request_events(first)] == ["call-0"]
    assert [e["request"]["rid"] for e in model_request_events(second)] == ["call-1"]  # call 0 is branch 0's
    assert [e["request"]["rid"] for e in model_request_events(b1)] == ["call-0", "call-1"]


def _turn(index: int, start: int, plen: int, olen: int) -> Turn:
    return Turn(
        index=index, rid=f"call-{index}", prompt_start=start, prompt_len=plen, output_len=olen, finish_reason="stop",
        stop_reason="end_turn", usage=Usage(prompt_tokens=plen, completion_tokens=olen),
    )  # fmt: skip
