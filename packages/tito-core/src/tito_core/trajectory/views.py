"""Per-token views derived from a trajectory's segments and turn records (mask, routing rows, weight versions).

Pure functions over what :class:`~tito_core.trajectory.Trajectory` holds; its properties and methods of the
same names call them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..versions import VersionSpan, version_range
from .record import Segment, SegmentKind, Turn

__all__ = [
    "add_segment",
    "first_output_from",
    "loss_mask",
    "routed_experts",
    "sampling_masks",
    "token_weight_versions",
    "version_range_of",
    "weight_versions",
]


def add_segment(segments: list[Segment], kind: SegmentKind, start: int, end: int, turn: int) -> Segment:
    """Record tokens ``start:end`` in ``segments``; returns the segment that now holds them.

    The last segment grows when it is of the same kind and turn and ends at ``start``; else a new one is added.
    """
    last = segments[-1] if segments else None
    if last is not None and last.kind == kind and last.turn == turn and last.end == start:
        seg = Segment(kind=kind, start=last.start, end=end, turn=turn)
        segments[-1] = seg
    else:
        seg = Segment(kind=kind, start=start, end=end, turn=turn)
        segments.append(seg)
    return seg


def loss_mask(segments: Sequence[Segment], length: int) -> list[int]:
    """1 for the tokens of output segments, 0 for the other ``length`` positions."""
    mask = [0] * length
    for seg in segments:
        if seg.kind == "output":
            mask[seg.start : seg.end] = [1] * seg.length
    return mask


def first_output_from(segments: Sequence[Segment], start: int, length: int) -> int:
    """Offset of the first generated token at or after ``start`` (``length`` when there is none)."""
    for seg in segments:
        if seg.kind == "output" and seg.end > start:
            return max(seg.start, start)
    return length


def routed_experts(turns: Sequence[Turn], length: int) -> tuple[bytes, tuple[int, int]] | None:
    """Routing rows of a trajectory of ``length`` tokens (``length - 1`` rows of ``layers x top_k`` int32).

    Later turns overwrite the rows they report again. None when no turn reported routing.
    """
    shape: tuple[int, int] | None = None
    for turn in turns:
        if turn.routed_experts is not None and turn.routed_experts_shape is not None:
            shape = turn.routed_experts_shape
    if shape is None:
        return None
    row = shape[0] * shape[1] * 4
    rows = max(length - 1, 0)
    out = bytearray(rows * row)
    for turn in turns:
        if turn.routed_experts is None or turn.routed_experts_shape != shape:
            continue
        start = turn.routed_experts_start * row
        data = turn.routed_experts[: max(len(out) - start, 0)]
        out[start : start + len(data)] = data
    return bytes(out), shape


def sampling_masks(turns: Sequence[Turn], start: int, end: int) -> tuple[list[int], list[int], bool] | None:
    """The kept sets of token positions ``start:end`` in CSR form.

    Kept ids, ``end - start + 1`` offsets, and whether a truncating turn among them has none
    (``sampling_mask_missing``). A row is empty where no kept set was recorded (prompt tokens, calls that did not
    truncate: the whole vocabulary). None when no turn in the range recorded kept sets or says they are missing.
    """
    rows: dict[int, list[int]] = {}
    missing = False
    for turn in turns:
        first = turn.output_start
        if first + turn.output_len <= start or first >= end:
            continue
        missing |= turn.sampling_mask_missing is not None
        if turn.sampling_mask is not None:
            for i, row in enumerate(turn.sampling_mask.to_lists()):
                if start <= first + i < end:
                    rows[first + i] = row
    if not rows and not missing:
        return None
    ids: list[int] = []
    offsets = [0]
    for position in range(start, end):
        ids.extend(rows.get(position, ()))
        offsets.append(len(ids))
    return ids, offsets, missing


def weight_versions(turns: Sequence[Turn], since: int = 0) -> list[VersionSpan] | None:
    """Each turn's version spans at trajectory token positions, for the turns whose output starts at ``since`` on.

    None when one of them generated tokens without versions.
    """
    spans: list[VersionSpan] = []
    for turn in turns:
        if turn.output_len == 0 or turn.output_start < since:
            continue
        if turn.weight_versions is None:
            return None
        base = turn.output_start
        spans.extend(
            VersionSpan(version=s.version, start=base + s.start, end=base + s.end) for s in turn.weight_versions
        )
    return spans


def token_weight_versions(spans: Sequence[VersionSpan], length: int) -> list[str | None]:
    """Per position of ``length``, the version of the span covering it (None outside every span)."""
    out: list[str | None] = [None] * length
    for span in spans:
        out[span.start : span.end] = [span.version] * (span.end - span.start)
    return out


def version_range_of(span_lists: Iterable[list[VersionSpan] | None]) -> tuple[str, str] | None:
    """``(oldest, newest)`` version over span lists (:func:`~tito_core.versions.version_range`).

    None when one of them is None (tokens without versions) or when there are no spans at all.
    """
    versions: set[str] = set()
    for spans in span_lists:
        if spans is None:
            return None
        versions.update(span.version for span in spans)
    return version_range(versions)
