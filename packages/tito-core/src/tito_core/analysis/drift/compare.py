"""Recorded ids against a text stack's: the differing spans, classified by cause, and the loss-mask damage."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Any, Literal

import msgspec

from ...render.renderer import ChatRenderer, first_difference
from ...trajectory import Trajectory
from .text_stack import TextStackView

__all__ = ["DRIFT_CATEGORIES", "DriftCategory", "DriftSpan", "IdComparison", "compare_ids"]

DriftCategory = Literal["think", "tool_call_json", "special_tokens", "whitespace", "bpe", "content"]
"""Why a span of ids differs, first match in this order:

* ``think``: a reasoning block (think tags) differs, e.g. a template that drops earlier ``<think>``;
* ``tool_call_json``: inside a tool call's markup (JSON re-serialized: spacing, key order, escapes);
* ``special_tokens``: a control token on either side (an end-of-turn the model never generated, text
  spelling a control token that becomes the token);
* ``whitespace``: the texts differ only in whitespace (stripped content, a separator after end-of-turn);
* ``bpe``: the same text, different ids (decode -> encode is not identity: merges across boundaries);
* ``content``: the text itself differs.
"""
DRIFT_CATEGORIES: tuple[DriftCategory, ...] = (
    "think",
    "tool_call_json",
    "special_tokens",
    "whitespace",
    "bpe",
    "content",
)


class DriftSpan(msgspec.Struct, frozen=True):
    """One place where the re-rendered ids differ from the recorded ones.

    Attributes:
        category: Why (:data:`DriftCategory`).
        where: What the recorded side is there: ``output`` (model tokens), ``prompt``, ``boundary``, or
            ``end`` (past the last recorded token).
        turn: The model call the recorded position belongs to.
        recorded: ``(start, end)`` in the recorded ids.
        rerendered: ``(start, end)`` in the re-rendered ids.
        recorded_text: Decoded recorded ids of the span.
        rerendered_text: Decoded re-rendered ids of the span.

    :attr:`same_text` tells a pure token-split difference (the same text, other ids) from a changed text,
    whatever the category: inside a tool call, a constrained decoder's splits are re-merged by a re-encode.
    """

    category: DriftCategory
    where: str
    turn: int
    recorded: tuple[int, int]
    rerendered: tuple[int, int]
    recorded_text: str
    rerendered_text: str

    @property
    def same_text(self) -> bool:
        """The two sides decode to the same text: only the token split differs."""
        return self.recorded_text == self.rerendered_text

    def as_dict(self) -> dict[str, Any]:
        """The fields, and :attr:`same_text`, as a JSON-ready dict."""
        return {**msgspec.to_builtins(self), "same_text": self.same_text}


class IdComparison(msgspec.Struct, frozen=True):
    """Recorded ids and mask against a text stack's.

    Attributes:
        spans: Every differing span, classified.
        recorded_tokens: Length of the recorded sequence.
        rerendered_tokens: Length of the re-rendered sequence.
        mask_raw_mismatch: Positions ``i`` where ``recorded_mask[i] != stack_mask[i]`` (the shorter mask padded
            with 0): what a trainer pairing the two position by position gets wrong.
        mask_aligned_mismatch: Tokens present on both sides (after aligning the sequences) whose masks differ.
        trained_lost: Tokens tito trains on (mask 1) that the re-render replaced or dropped.
        trained_added: Tokens the text stack trains on (mask 1) that the engine never produced.
        first_mismatch: First position where the ids differ (None when equal).
    """

    spans: list[DriftSpan]
    recorded_tokens: int
    rerendered_tokens: int
    mask_raw_mismatch: int
    mask_aligned_mismatch: int
    trained_lost: int
    trained_added: int
    first_mismatch: int | None

    @property
    def same_ids(self) -> bool:
        """The id sequences are equal."""
        return self.first_mismatch is None

    @property
    def by_category(self) -> dict[str, int]:
        """How many spans of each category, in the order they first occur."""
        return dict(Counter(span.category for span in self.spans))

    def as_dict(self) -> dict[str, Any]:
        """The fields, :attr:`same_ids` and :attr:`by_category` as a JSON-ready dict."""
        fields = msgspec.to_builtins(self)
        fields["spans"] = [span.as_dict() for span in self.spans]
        return {"same_ids": self.same_ids, **fields, "by_category": self.by_category}


def _segment_at(kind_at: Sequence[tuple[str, int]], i: int) -> tuple[str, int] | None:
    return kind_at[i] if i < len(kind_at) else None


def _special_ids(renderer: ChatRenderer) -> frozenset[int]:
    tok = renderer.tokenizer
    ids = set(getattr(tok, "all_special_ids", ()) or ())
    ids.update((getattr(tok, "added_tokens_decoder", None) or {}).keys())
    return frozenset(int(i) for i in ids)


def compare_ids(
    traj: Trajectory,
    view: TextStackView,
    renderer: ChatRenderer,
    *,
    in_call: Sequence[bool] | None = None,
    in_think: Sequence[bool] | None = None,
    think_tags: tuple[str, str] = ("<think>", "</think>"),
) -> IdComparison:
    """Align the recorded ids with the text stack's and classify each difference.

    ``in_call`` / ``in_think`` (per recorded token, from :func:`output_regions`) let spans inside tool
    calls and reasoning be named as such; without them only the texts decide.
    """
    recorded = traj.token_ids
    rec_mask = traj.loss_mask
    stack, stack_mask = view.ids, view.loss_mask
    kind_at: list[tuple[str, int]] = [("prompt", 0)] * len(recorded)
    for seg in traj.segments:
        kind_at[seg.start : seg.end] = [(seg.kind, seg.turn)] * seg.length
    specials = _special_ids(renderer)
    matcher = SequenceMatcher(None, recorded, stack, autojunk=False)
    spans: list[DriftSpan] = []
    aligned = lost = added = 0
    changes: list[list[int]] = []
    gap: tuple[int, int] | None = None  # the equal run since the last change
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            aligned += sum(rec_mask[i1 + k] != stack_mask[j1 + k] for k in range(i2 - i1))
            gap = (i1, i2)
            continue
        lost += sum(rec_mask[i1:i2])
        added += sum(stack_mask[j1:j2])
        # one token in common between two changes of the same segment is one change, split by the alignment
        # (``'`` + ``)`` re-encoded as ``')``): classify them together
        if (
            changes
            and gap is not None
            and gap[1] - gap[0] <= 1
            and _segment_at(kind_at, changes[-1][0]) == (_segment_at(kind_at, i1))
        ):
            changes[-1][1], changes[-1][3] = i2, j2
        else:
            changes.append([i1, i2, j1, j2])
        gap = None
    for i1, i2, j1, j2 in changes:
        old_text = renderer.decode(recorded[i1:i2])
        new_text = renderer.decode(stack[j1:j2])
        # the recorded tokens of the span; for an insertion, the tokens on either side of it
        touched = range(i1, i2) if i2 > i1 else range(max(i1 - 1, 0), min(i1 + 1, len(recorded)))
        if i1 >= len(recorded):
            where, turn = "end", kind_at[-1][1] if kind_at else 0
        else:
            where, turn = kind_at[i1]
        if any(t in old_text or t in new_text for t in think_tags) or (
            in_think is not None and any(in_think[k] for k in touched)
        ):
            category: DriftCategory = "think"
        elif (
            in_call is not None
            and len(touched) > 0
            and (any(in_call[k] for k in touched) if i2 > i1 else all(in_call[k] for k in touched))
        ):
            category = "tool_call_json"
        elif any(t in specials for t in recorded[i1:i2]) or any(t in specials for t in stack[j1:j2]):
            category = "special_tokens"
        elif "".join(old_text.split()) == "".join(new_text.split()):
            category = "bpe" if old_text == new_text else "whitespace"
        else:
            category = "content"
        spans.append(DriftSpan(category, where, turn, (i1, i2), (j1, j2), old_text, new_text))
    longest = max(len(recorded), len(stack))
    raw = sum(
        (rec_mask[i] if i < len(recorded) else 0) != (stack_mask[i] if i < len(stack) else 0) for i in range(longest)
    )
    first = None if recorded == stack else first_difference(recorded, stack)
    return IdComparison(
        spans=spans,
        recorded_tokens=len(recorded),
        rerendered_tokens=len(stack),
        mask_raw_mismatch=raw,
        mask_aligned_mismatch=aligned,
        trained_lost=lost,
        trained_added=added,
        first_mismatch=first,
    )
