"""The journal's deltas (``tito_core.gateway.deltas``) on hand-built trajectories: what a line carries, and the
trajectory rebuilt from the lines equal to the live one's record in the cases a gateway call alone does not reach
(a branch cut back below what a line already held, a segment that grows, pictures, a shape deltas do not hold)."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tito_core.gateway.deltas import BranchDelta, Delta, DeltaError, Rebuilt, Tracker
from tito_core.gateway.journal import Journal, read_journal
from tito_core.media import Image, MediaSpan, PromptMedia
from tito_core.rollout_core.tree import BranchTree
from tito_core.trajectory import Trajectory, Turn, Usage

PAD, VSTART, VEND = 151655, 151652, 151653


def _turn(traj: Trajectory, index: int, prompt_start: int, output_len: int) -> None:
    usage = Usage(prompt_tokens=len(traj) - output_len, completion_tokens=output_len)
    traj.add_turn(Turn(index=index, rid=f"c{index}", prompt_start=prompt_start,
                       prompt_len=len(traj) - output_len - prompt_start, output_len=output_len, finish_reason="stop",
                       stop_reason="end_turn", usage=usage))  # fmt: skip


def _image(colour: tuple[int, int, int]) -> Image:
    buf = io.BytesIO()
    PILImage.new("RGB", (56, 56), colour).save(buf, format="PNG")
    return Image(buf.getvalue())


def _with_image(image: Image, start: int) -> PromptMedia:
    span = MediaSpan(start=start, length=4, sha256=image.sha256, format=image.format, size=image.size,
                     grid_thw=(1, 4, 4), placeholder_id=PAD)  # fmt: skip
    return PromptMedia(span=span, item=image)


class _Lines:
    """A tracker and a reader side by side: each :meth:`journal` is one line, encoded and decoded as in a file."""

    def __init__(self, rollout_id: str) -> None:
        self.tracker = Tracker()
        self.rebuilt = Rebuilt(rollout_id)
        self.last: Delta | None = None

    def journal(self, traj: Trajectory) -> Delta:
        import msgspec

        found = self.tracker.delta(traj)
        assert found is not None
        delta, state = found
        self.tracker.commit(state)
        self.last = msgspec.json.decode(msgspec.json.encode(delta), type=Delta)
        self.rebuilt.apply(self.last)
        assert self.rebuilt.record() == traj.to_record()
        return self.last


def test_a_branch_cut_back_below_a_journaled_line_and_a_segment_that_grows_are_rebuilt_exactly() -> None:
    """A line written while a call on this branch was half done (another lineage's call answered then: its prompt
    appended, its output not), then that call fails and rolls back, and the next call appends other tokens of the
    same length: the next line carries them, not the stale ones. An output that grows in place (one segment, longer)
    is carried from the segment's start."""
    traj = Trajectory("r")
    lines = _Lines("r")
    traj.append("prompt", [1, 2, 3], turn=0)
    traj.append("output", [4, 5], [-0.5, -0.25], turn=0)
    _turn(traj, 0, 0, 2)
    lines.journal(traj)
    with pytest.raises(RuntimeError), traj.atomic():
        traj.append("prompt", [6, 7], turn=1)
        traj.append("output", [8], [-1.0], turn=1)
        lines.journal(traj)  # another lineage's answer: this half-done call's tokens are in a line
        raise RuntimeError("the call failed")
    traj.append("prompt", [9, 10], turn=1)
    traj.append("output", [11], [-2.0], turn=1)
    _turn(traj, 1, 5, 1)
    delta = lines.journal(traj)
    (change,) = delta.branches
    assert (change.segments_kept, change.turns_kept, change.token_ids) == (2, 1, [9, 10, 11])
    traj.append("output", [12, 13], [None, -0.125], turn=1)  # the same segment, longer: a new segment object
    delta = lines.journal(traj)
    (change,) = delta.branches
    assert (change.segments_kept, change.token_ids, change.logprobs) == (3, [11, 12, 13], [-2.0, None, -0.125])
    assert lines.tracker.delta(traj) is not None and lines.tracker.delta(traj)[0].branches == []  # type: ignore[index]


def test_a_new_branch_carries_only_what_it_added_to_its_parent_s_prefix_and_pictures_travel_once() -> None:
    """An image in the first prompt; a branch started off the first call (a rewrite, the parent stays open) holds a
    copy of the parent's prefix: its line names the parent and carries only its own tokens; the picture, held
    already, is not carried again; the current branch moving back to the parent is a line with no tokens."""
    red, blue = _image((255, 0, 0)), _image((0, 0, 255))
    root = Trajectory("r")
    tree = BranchTree(root)
    lines = _Lines("r")
    with root.atomic():
        root.append("prompt", [1, VSTART, PAD, PAD, PAD, PAD, VEND], turn=0)
        root.add_media([_with_image(red, 2)])
    root.append("output", [20, 21], [-0.5, -0.25], turn=0)
    _turn(root, 0, 0, 2)
    first = lines.journal(tree.current)
    assert list(first.pictures) == [red.sha256]
    child = tree.branch_off(root, len(root), "the conversation history was rewritten", "rewrite")
    with child.atomic():
        child.append("prompt", [30, VSTART, PAD, PAD, PAD, PAD, VEND], turn=1)
        child.add_media([_with_image(blue, 10)])
    child.append("output", [31], [-0.75], turn=1)
    _turn(child, 1, 9, 1)
    delta = lines.journal(tree.current)
    (change,) = delta.branches
    assert change.branch == 1 and change.base == 0 and change.segments_kept == 2 and change.media_kept == 1
    assert change.token_ids == [30, VSTART, PAD, PAD, PAD, PAD, VEND, 31]
    assert list(delta.pictures) == [blue.sha256]  # red is held already
    root.append("prompt", [40], turn=2)
    root.append("output", [41], [-0.5], turn=2)
    _turn(root, 2, 9, 1)
    tree.focus(root)
    delta = lines.journal(tree.current)
    assert delta.current == 0 and delta.others == [1] and [c.token_ids for c in delta.branches] == [[40, 41]]


def test_a_delta_that_does_not_apply_changes_nothing() -> None:
    traj = Trajectory("r")
    traj.append("prompt", [1, 2], turn=0)
    lines = _Lines("r")
    lines.journal(traj)
    before = lines.rebuilt.record()
    for bad in [
        Delta(current=0, branches=[BranchDelta(branch=0, segments_kept=5)]),
        Delta(current=0, branches=[BranchDelta(branch=0, segments_kept=1, token_ids=[3])]),  # no segment tiles it
        Delta(current=0, branches=[BranchDelta(branch=1, base=7)]),
        Delta(current=3),
    ]:
        with pytest.raises(DeltaError):
            lines.rebuilt.apply(bad)
        assert lines.rebuilt.record() == before


def test_a_shape_deltas_do_not_hold_is_journaled_whole_and_deltas_go_on_after_it(tmp_path: Path) -> None:
    """A branch that holds branches of its own (no gateway rollout has one) is journaled as its whole record; the
    next call's line, a delta again, rebuilds the trajectory exactly."""
    traj = Trajectory("r")
    traj.append("prompt", [1, 2], turn=0)
    inner, other = Trajectory("r", branch=1), Trajectory("r", branch=2)
    inner.branches = [other]
    traj.branches = [inner]
    rollout: Any = SimpleNamespace(id="r", task_id="t", sample=0, group=0, started=0.0, metadata={}, tool_calls=0,
                                   core=SimpleNamespace(trajectory=traj))  # fmt: skip
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.opened(rollout, "")
    journal.answered(rollout)
    assert b'"type":"call"' in path.read_bytes().splitlines()[-1]
    assert read_journal(path)["r"].trajectory.record() == traj.to_record()
    inner.branches = []
    traj.branches = [inner, other]
    traj.append("output", [3], [-0.5], turn=0)
    journal.answered(rollout)
    assert b'"type":"delta"' in path.read_bytes().splitlines()[-1]
    assert read_journal(path)["r"].trajectory.record() == traj.to_record()
    journal.close()
