from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tito_core import Trajectory
from tito_core.errors import TrajectoryError
from tito_core.trajectory import Turn, Usage

ids = st.lists(st.integers(min_value=0, max_value=151668), max_size=40)
logprob = st.floats(min_value=-50, max_value=0, allow_nan=False)


@st.composite
def trajectories(draw):
    traj = Trajectory(draw(st.text(min_size=1, max_size=8)))
    for turn in range(draw(st.integers(0, 5))):
        prompt = draw(ids)
        traj.append("prompt", prompt, turn=turn)
        out = draw(ids)
        traj.append("output", out, [draw(logprob) for _ in out], turn=turn)
        traj.add_turn(
            Turn(
                index=turn,
                rid=f"r{turn}",
                prompt_start=0,
                prompt_len=len(prompt),
                output_len=len(out),
                finish_reason="stop",
                stop_reason="end_turn",
                usage=Usage(prompt_tokens=len(prompt), completion_tokens=len(out)),
            )
        )
    traj.tool_parse_errors = draw(st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=3))
    return traj


@given(trajectories())
def test_serialization_round_trips(traj):
    assert Trajectory.from_json(traj.to_json()) == traj
    assert Trajectory.from_msgpack(traj.to_msgpack()) == traj
    back = Trajectory.from_json(traj.to_json())
    assert back.token_ids == traj.token_ids and back.logprobs == traj.logprobs and back.loss_mask == traj.loss_mask


@given(trajectories())
def test_flat_views_are_aligned_and_derived_from_segments(traj):
    n = len(traj)
    assert len(traj.token_ids) == len(traj.loss_mask) == len(traj.logprobs) == n
    assert sum(s.length for s in traj.segments) == n
    for seg in traj.segments:
        assert traj.loss_mask[seg.start : seg.end] == [seg.loss] * seg.length
        assert all((lp is None) == (seg.kind != "output") for lp in traj.logprobs[seg.start : seg.end])


def test_memory_per_token_is_compact():
    traj = Trajectory()
    for turn in range(100):
        traj.append("prompt", range(500), turn=turn)
        traj.append("output", range(500), [-0.1] * 500, turn=turn)
    stored = traj._ids.itemsize * len(traj._ids) + traj._lps.itemsize * len(traj._lps)
    assert stored / len(traj) <= 16


def test_misaligned_logprobs_are_rejected_and_nothing_is_half_written():
    traj = Trajectory()
    traj.append("prompt", [1, 2], turn=0)
    with pytest.raises(TrajectoryError, match="2 tokens but 1 logprobs"):
        traj.append("output", [3, 4], [-0.1], turn=0)
    assert traj.token_ids == [1, 2] and len(traj.logprobs) == 2


@pytest.mark.parametrize("make", [list, iter], ids=["list", "iterator"])
@pytest.mark.parametrize("bad", [2.5, "x", 2**31, None])
def test_bad_token_ids_are_rejected_and_nothing_is_half_written(make, bad):
    traj = Trajectory()
    traj.append("prompt", [1, 2], turn=0)
    with pytest.raises(TrajectoryError, match="token ids must be integers"):
        traj.append("output", make([3, bad, 4]), [-0.1] * 3, turn=0)
    assert traj.token_ids == [1, 2] and len(traj.logprobs) == 2 and len(traj.segments) == 1


def test_closed_trajectory_cannot_grow_and_fork_needs_a_boundary():
    traj = Trajectory("r")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [4], [-1.0], turn=0)
    with pytest.raises(TrajectoryError, match="not a segment boundary"):
        traj.fork(2, "x")
    child = traj.fork(3, "retry", status="aborted")
    assert traj.closed and traj.status == "aborted" and "retry" in (traj.status_reason or "")
    assert child.rollout_id == "r" and child.branch == 1 and child.parent_branch == 0 and child.fork_at == 3
    assert child.token_ids == [1, 2, 3] and child.branches == [traj]
    with pytest.raises(TrajectoryError, match="closed"):
        traj.append("prompt", [5], turn=1)
    # a branch record nests its ancestors
    assert Trajectory.from_json(child.to_json()).branches[0].token_ids == [1, 2, 3, 4]


def test_close_marks_running_trajectories_aborted():
    traj = Trajectory()
    traj.close()
    assert traj.status == "aborted" and traj.status_reason


def test_a_trajectory_file_saved_while_running_reads_as_aborted(tmp_path):
    from tito_core.records import read_records

    running, done = Trajectory("a"), Trajectory("b")
    for traj in (running, done):
        traj.append("prompt", [1, 2], turn=0)
        traj.append("output", [3], [-0.5], turn=0)
    done.set_status("completed")
    path = tmp_path / "trajectories.jsonl"
    path.write_bytes(running.to_json() + b"\n" + done.to_json() + b"\n")
    first, second = (record.trajectory for record in read_records(path))
    assert (first.status, first.status_reason) == ("aborted", "saved while still running")
    assert (second.status, second.status_reason) == ("completed", None)
    assert first.token_ids == [1, 2, 3]


def test_routed_experts_are_stitched_over_turns():
    import struct

    traj = Trajectory()
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [4, 5], [-1.0, -1.0], turn=0)

    def rows(values):
        return struct.pack(f"<{len(values)}i", *values)

    base = dict(
        rid="r",
        prompt_start=0,
        finish_reason="stop",
        stop_reason="tool_use",
        usage=Usage(prompt_tokens=3, completion_tokens=2),
    )
    # (layers=1, top_k=2); turn 0 covers rows 0..3 (len(tokens) - 1 = 4 rows)
    traj.add_turn(
        Turn(
            index=0,
            prompt_len=3,
            output_len=2,
            routed_experts=rows([0, 1, 2, 3, 4, 5, 6, 7]),
            routed_experts_shape=(1, 2),
            **base,
        )
    )
    traj.append("prompt", [6], turn=1)
    traj.append("output", [7], [-1.0], turn=1)
    # turn 1 was cropped by the server: rows from position 4 on
    traj.add_turn(
        Turn(
            index=1,
            prompt_len=1,
            output_len=1,
            routed_experts=rows([8, 9, 10, 11]),
            routed_experts_start=4,
            routed_experts_shape=(1, 2),
            **base,
        )
    )
    data, shape = traj.routed_experts()
    assert shape == (1, 2)
    assert struct.unpack("<12i", data) == tuple(range(12))


# -- logprob storage: float32 while exact ----------------------------------------------------------

F32 = [-0.5, -0.125, -3.0517578125e-05, 0.0, float("-inf")]  # exactly representable in float32


def test_float32_logprobs_take_four_bytes_and_come_back_bit_exact() -> None:
    traj = Trajectory("r")
    traj.append("prompt", [1, 2], None, turn=0)
    traj.append("output", [3, 4, 5, 6, 7], F32, turn=0)
    assert traj._lps.itemsize == 4
    assert traj.logprobs[2:] == F32
    assert traj.logprobs[:2] == [None, None]


def test_a_value_float32_cannot_hold_widens_without_losing_earlier_values() -> None:
    traj = Trajectory("r")
    traj.append("output", [1, 2], [-0.5, -0.25], turn=0)
    traj.append("prompt", [3], [None], turn=1)
    traj.append("output", [4, 5], [-0.1, -0.75], turn=1)  # -0.1 is not a float32
    assert traj._lps.itemsize == 8
    assert traj.logprobs == [-0.5, -0.25, None, -0.1, -0.75]
    assert Trajectory.from_record(traj.to_record()).logprobs == traj.logprobs


def test_non_numeric_logprobs_are_rejected_and_the_tokens_not_kept() -> None:
    traj = Trajectory("r")
    with pytest.raises(TrajectoryError, match="numbers or None"):
        traj.append("output", [1, 2], ["a", "b"], turn=0)  # type: ignore[list-item]
    assert len(traj) == 0


@given(
    chunks=st.lists(
        st.lists(
            st.one_of(
                st.none(),
                st.floats(max_value=0.0, allow_nan=False),
                st.floats(max_value=0.0, allow_nan=False, width=32),
            ),
            min_size=1,
            max_size=8,
        ),
        max_size=6,
    )
)
def test_logprobs_are_stored_exactly_whatever_their_precision(chunks: list[list[float | None]]) -> None:
    traj = Trajectory("r")
    for i, chunk in enumerate(chunks):
        traj.append("output", list(range(len(chunk))), chunk, turn=i)
    expected = [x for chunk in chunks for x in chunk]
    assert traj.logprobs == expected
    assert Trajectory.from_record(traj.to_record()).logprobs == expected


def test_per_call_records_are_not_left_for_the_garbage_collector():
    """Hundreds of rollouts in one process keep thousands of records: none of them adds to each full collection."""
    import gc

    from tito_core.versions import VersionSpan

    traj = Trajectory("r")
    traj.append("prompt", [1, 2], turn=0)
    traj.append("output", [3], [-0.5], turn=0)
    span = VersionSpan(version="v1", start=0, end=1)
    traj.add_turn(
        Turn(
            index=0,
            rid="r0",
            prompt_start=0,
            prompt_len=2,
            output_len=1,
            finish_reason="stop",
            stop_reason="end_turn",
            usage=Usage(prompt_tokens=2, completion_tokens=1),
            weight_versions=(span,),
            continued_rids=("r0-c1",),
        )
    )
    records = [*traj.segments, *traj.turns, traj.turns[0].usage, span]
    assert not [record for record in records if gc.is_tracked(record)]
