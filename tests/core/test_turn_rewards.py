"""Per-turn rewards: the forms a reward takes, the per-turn advantage, and where the exports put them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tito_core.export import to_verl, turn_token_scores
from tito_core.records import rollout_record
from tito_core.runner.samples import training_rows
from tito_core.trajectory import Trajectory, Turn, Usage
from tito_core.turn_rewards import TurnRewardError, reward_of, turn_advantages


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1, (1.0, None)),
        (0.5, (0.5, None)),
        ([0.5, None, 1.0], (1.5, [0.5, None, 1.0])),
        ((1, 2, 3), (6.0, [1.0, 2.0, 3.0])),
        ({"turns": [0.0, 1.0, 0.0]}, (1.0, [0.0, 1.0, 0.0])),
        ({"turns": [0.0, 1.0, 0.0], "total": 5}, (5.0, [0.0, 1.0, 0.0])),
    ],
)
def test_a_reward_is_a_number_a_list_per_turn_or_a_mapping(value: object, expected: object) -> None:
    assert reward_of(value, 3) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1.0", "a reward must be a number, got str"),
        (True, "a reward must be a number, got bool"),
        (float("nan"), "a reward must be finite, got nan"),
        (float("inf"), "a reward must be finite, got inf"),
        ([1.0, 2.0], "2 per-turn rewards for a rollout of 3 model calls"),
        ([1.0, "x", 2.0], "the reward of turn 1 must be a number, got str"),
        ({"turn": [1, 2, 3]}, 'a reward mapping is {"turns": [...], "total"?: x}, got keys [\'turn\']'),
        ({"turns": [1, 2, 3], "total": None, "extra": 1}, "got keys"),
        ({"turns": "abc"}, "per-turn rewards must be a list, got str"),
    ],
)
def test_a_bad_reward_is_named(value: object, message: str) -> None:
    with pytest.raises(TurnRewardError, match=message.replace("[", r"\[").replace("]", r"\]").replace("?", r"\?")):
        reward_of(value, 3)


def test_turn_advantages_subtract_the_other_rollouts_reward_to_go_at_each_turn() -> None:
    group = [[1.0, 0.0, 1.0], [0.0, 1.0], [1.0]]
    # reward-to-go: [2, 1, 1], [1, 1], [1]
    assert turn_advantages(group) == [
        [2.0 - (1 + 1) / 2, 1.0 - 1.0, 1.0 - 0.0],  # turn 2: no other rollout reached it
        [1.0 - (2 + 1) / 2, 1.0 - 1.0],
        [1.0 - (2 + 1) / 2],
    ]
    assert turn_advantages([[None, 2.0]]) == [[2.0, 2.0]]  # alone: no baseline; None counts 0


rewards = st.lists(st.one_of(st.none(), st.floats(-5, 5, allow_nan=False)), min_size=1, max_size=6)


@given(st.lists(rewards, min_size=2, max_size=5), rewards)
def test_a_rollouts_baseline_never_depends_on_its_own_rewards_or_length(others: list, mine: list) -> None:
    """What makes the estimate unbiased: changing rollout 0's own rewards, or where it stops, moves its reward-to-go
    and nothing else: the baseline (reward-to-go minus advantage) at each turn stays the others'."""
    before = turn_advantages([mine, *others])[0]
    after = turn_advantages([[0.0] * (len(mine) + 1), *others])[0]
    to_go = [sum(r or 0.0 for r in mine[t:]) for t in range(len(mine))]
    baseline = [g - a for g, a in zip(to_go, before, strict=True)]
    baseline_after = [(len(mine) + 1 - t) * 0.0 - a for t, a in enumerate(after)]
    assert baseline == pytest.approx(baseline_after[: len(mine)], abs=1e-9)


def rewarded() -> Trajectory:
    """Prompt (3), output (2, turn 0), tool result (2), output (3, turn 1)."""
    traj = Trajectory("t:0")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [10, 11], [-0.5, -1.0], turn=0)
    usage = Usage(prompt_tokens=3, completion_tokens=2)
    traj.add_turn(Turn(index=0, rid="a", prompt_start=0, prompt_len=3, output_len=2, finish_reason="stop",
                       stop_reason="tool_use", usage=usage, tool_calls=1))  # fmt: skip
    traj.append("prompt", [4, 5], turn=1)
    traj.append("output", [20, 21, 22], [-0.1, -0.2, -0.3], turn=1)
    traj.add_turn(Turn(index=1, rid="b", prompt_start=5, prompt_len=2, output_len=3, finish_reason="stop",
                       stop_reason="end_turn", usage=usage))  # fmt: skip
    traj.close("completed")
    return traj


def test_each_turns_reward_sits_on_its_last_output_token_of_the_response() -> None:
    traj = rewarded()
    # the response starts at the first output (token 3): [10, 11, 4, 5, 20, 21, 22]
    assert turn_token_scores(traj, [0.5, 1.0]) == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert turn_token_scores(traj, [None, 1.0]) == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    fields = to_verl(traj, turn_rewards=[None, 1.0])
    assert len(fields["extra_fields"]["turn_token_scores"]) == len(fields["response_ids"])
    assert fields["extra_fields"]["turn_scores"] == [0.0, 1.0]  # verl's own field: one score per turn
    assert "extra_fields" not in to_verl(traj)


def test_the_export_rows_carry_per_turn_rewards() -> None:
    traj = rewarded()
    record = rollout_record(traj, task_id="t", sample=0, group=0, reward=1.5, server=None, started=0.0, wall_s=1.0,
                            agent_s=1.0, tool_calls=1, turn_rewards=[0.5, 1.0])  # fmt: skip
    (row,) = training_rows([record], "verl")
    assert row["turn_rewards"] == [0.5, 1.0] and row["reward"] == 1.5
    assert row["extra_fields"]["turn_token_scores"] == [0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert row["extra_fields"]["turn_scores"] == [0.5, 1.0]
    (trl,) = training_rows([record], "trl")
    assert trl["turn_rewards"] == [0.5, 1.0]  # a column TRL hands its reward functions


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_turn_rewards_are_written_and_read_back(tmp_path, suffix: str) -> None:
    from tito_core.records import open_writer, read_records

    traj = rewarded()
    rewarded_record = rollout_record(traj, task_id="t", sample=0, group=0, reward=1.5, server=None, started=0.0,
                                     wall_s=1.0, agent_s=1.0, tool_calls=1, turn_rewards=[0.5, None])  # fmt: skip
    plain = rollout_record(traj, task_id="t", sample=1, group=0, reward=1.0, server=None, started=0.0, wall_s=1.0,
                           agent_s=1.0, tool_calls=1)  # fmt: skip
    out = tmp_path / f"out{suffix}"
    with open_writer(out) as writer:
        writer.write(rewarded_record)
        writer.write(plain)
    back = {r.sample: r for r in read_records(out)}
    assert back[0].turn_rewards == [0.5, None] and back[1].turn_rewards is None
