"""Retokenization drift over a rollout file: what a text-based stack would have trained on (``tito audit --drift``).

Each record's latest branch is rebuilt as the text stack holds it
(:func:`~tito_core.analysis.drift.text_stack_messages`), re-rendered and tokenized again
(:func:`~tito_core.analysis.drift.text_stack_view`) and compared with the recorded ids
(:func:`~tito_core.analysis.drift.compare_ids`); the ledger counts the rollouts whose ids change, where, why, and
what it does to the loss mask.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ...errors import TitoError
from ...records import RolloutRecord
from ...render.renderer import ChatRenderer
from ...tool_parsers.base import ToolParser
from ...trajectory import Trajectory
from .compare import DRIFT_CATEGORIES, compare_ids
from .regions import output_regions
from .text_stack import text_stack_messages, text_stack_view

__all__ = ["DriftLedger", "DriftReport"]

_MASK_FIELDS = ("mask_raw_mismatch", "mask_aligned_mismatch", "trained_lost", "trained_added")


class DriftReport(msgspec.Struct, frozen=True, kw_only=True):
    """The drift of a rollout file's rollouts under a text stack.

    Attributes:
        compared: Rollouts compared.
        different_ids: Of them, rollouts whose re-rendered ids differ from the recorded ones.
        different_before_the_end: Rollouts with a difference before their last recorded token.
        mask_mismatch: Rollouts where a loss-mask position no longer lines up.
        rollouts_by_category: Rollouts with at least one differing span of each category.
        spans_by_category: Differing spans per category.
        same_text_spans_by_category: Of those, spans whose text is the same (only the token split differs).
        spans_by_where: Differing spans by where they sit on the recorded side (segment kind).
        mask: Summed over the rollouts: trained tokens, positions that disagree position by position, aligned
            tokens with another mask, trained tokens the re-render changed or dropped, tokens it would train on
            that the model never sampled.
        examples: A few differing spans per category (rollout, turn, both texts).
        skipped: Rollouts not compared, with the reason.
    """

    compared: int
    different_ids: int
    different_before_the_end: int
    mask_mismatch: int
    rollouts_by_category: dict[str, int]
    spans_by_category: dict[str, int]
    same_text_spans_by_category: dict[str, int]
    spans_by_where: dict[str, int]
    mask: dict[str, int]
    examples: dict[str, list[dict[str, Any]]]
    skipped: list[dict[str, str]]


class DriftLedger:
    """Compares each record added with its text stack; :meth:`report` sums up.

    Args:
        renderer: The chat template the rollouts ran with.
        parser: Their tool parser.
        tools: The tools as the template takes them (:func:`~tito_core.conversation.tool_specs_to_chat`).
        tool_specs: The tools' specs, for the parser.
        examples: How many differing spans to keep per category.
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        parser: ToolParser,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_specs: Sequence[Any] | None = None,
        examples: int = 3,
    ) -> None:
        self.renderer, self.parser = renderer, parser
        self.tools, self.tool_specs, self.keep = tools, tool_specs, examples
        self.compared = self.different = self.different_inside = self.mask_differs = 0
        self.rollouts: Counter[str] = Counter()
        self.spans: Counter[str] = Counter()
        self.same_text: Counter[str] = Counter()
        self.where: Counter[str] = Counter()
        self.mask: Counter[str] = Counter()
        self.examples: dict[str, list[dict[str, Any]]] = {category: [] for category in DRIFT_CATEGORIES}
        self.skipped: list[dict[str, str]] = []

    def add(self, record: RolloutRecord) -> None:
        """Compare ``record``'s latest branch with its text stack."""
        key = f"{record.task_id}:{record.sample}"
        traj = Trajectory.from_record(record.trajectory)
        if not any(segment.kind == "output" for segment in traj.segments):
            self.skipped.append({"rollout": key, "why": f"no output ({record.status}: {record.status_reason})"})
            return
        try:
            messages = text_stack_messages(traj, self.renderer, self.parser, tools=self.tools,
                                           tool_specs=self.tool_specs)  # fmt: skip
            view = text_stack_view(messages, self.renderer, tools=self.tools)
        except TitoError as exc:
            self.skipped.append({"rollout": key, "why": f"text stack not rebuilt: {exc}"})
            return
        in_call, in_think = output_regions(traj, self.renderer, self.parser)
        comparison = compare_ids(traj, view, self.renderer, in_call=in_call, in_think=in_think)
        self.compared += 1
        self.different += not comparison.same_ids
        self.different_inside += any(span.where != "end" for span in comparison.spans)
        self.mask_differs += comparison.mask_raw_mismatch > 0
        for name in _MASK_FIELDS:
            self.mask[name] += getattr(comparison, name)
        self.mask["trained_tokens"] += sum(traj.loss_mask)
        self.rollouts.update(comparison.by_category.keys())  # rollouts with such a span, not spans
        for span in comparison.spans:
            self.spans[span.category] += 1
            self.same_text[span.category] += span.same_text
            self.where[span.where] += 1
            if len(self.examples[span.category]) < self.keep:
                self.examples[span.category].append({"rollout": key, **span.as_dict()})

    def report(self) -> DriftReport:
        """The counts of everything added so far."""
        return DriftReport(
            compared=self.compared,
            different_ids=self.different,
            different_before_the_end=self.different_inside,
            mask_mismatch=self.mask_differs,
            rollouts_by_category=dict(self.rollouts),
            spans_by_category=dict(self.spans),
            same_text_spans_by_category=dict(self.same_text),
            spans_by_where=dict(self.where),
            mask=dict(self.mask),
            examples={category: spans for category, spans in self.examples.items() if spans},
            skipped=self.skipped,
        )
