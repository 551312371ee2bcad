"""The train/sample mismatch, measured: logprob gaps, and what a text-based stack would train on instead.

Two questions about a recorded rollout, answered without torch (the logprobs a trainer recomputes are
given by the caller, e.g. :func:`tito_transformers.scoring.token_logprobs`):

* **Logprob gap** (:func:`logprob_gap`): the recorded (sampler's) logprobs against the trainer's
  recomputed ones, as mean / max absolute difference and the k3 estimate of KL(sampler || trainer),
  over any selection of positions (all trained tokens, tool-call tokens, constrained turns).
* **Retokenization drift** (:func:`text_stack_view`, :func:`compare_ids`): the conversation a text-based
  stack holds at the end of the rollout (assistant text and tool calls parsed from the outputs, tool
  results as messages) re-rendered with the chat template and tokenized again, compared with the ids the
  engine actually consumed and produced: which spans differ, why (:data:`DriftCategory`), and how many
  loss-mask positions no longer line up.

The text stack is rebuilt from the trajectory itself, the way such a stack gets its messages: each
output is decoded and parsed by the same tool parser, tool results are read back out of the recorded
prompt segments, and the messages go through the same conversion tito applies to Strands messages.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from difflib import SequenceMatcher
from typing import Any, Literal

import msgspec
from strands.types.content import ContentBlock, Message, Messages

from .chat import ChatMessage, ChatRenderer, first_difference, to_chat_messages
from .errors import TemplateError
from .tool_parsers.base import ToolParser
from .trajectory import Trajectory

__all__ = [
    "DRIFT_CATEGORIES",
    "DriftCategory",
    "DriftSpan",
    "IdComparison",
    "LogprobGap",
    "TextStackView",
    "compare_ids",
    "logprob_gap",
    "output_regions",
    "text_stack_view",
]

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


# ------------------------------------------------------------------------------------------- logprobs
class LogprobGap(msgspec.Struct, frozen=True):
    """Recorded vs recomputed logprobs over a set of tokens.

    Attributes:
        tokens: How many tokens were compared.
        mean_abs: Mean of ``|new - old|`` (nats).
        max_abs: Largest ``|new - old|``.
        k3: Mean of ``exp(r) - 1 - r`` with ``r = new - old``: with tokens drawn by the sampler (``old``),
            an unbiased, non-negative estimate of KL(sampler || trainer).
        mean_diff: Mean of ``new - old`` (signed: positive when the trainer finds the tokens likelier).
    """

    tokens: int
    mean_abs: float
    max_abs: float
    k3: float
    mean_diff: float

    def as_dict(self) -> dict[str, float | int]:
        """The fields as a JSON-ready dict."""
        return msgspec.structs.asdict(self)


def logprob_gap(pairs: Iterable[tuple[float, float]]) -> LogprobGap:
    """Compare ``(old, new)`` logprob pairs: ``old`` recorded by the sampler, ``new`` recomputed by the trainer.

    An empty selection gives ``tokens=0`` and NaN statistics.
    """
    n = 0
    total_abs = total_diff = total_k3 = 0.0
    worst = 0.0
    for old, new in pairs:
        r = new - old
        n += 1
        total_abs += abs(r)
        total_diff += r
        # exp(r) - 1 - r, written with expm1 so tiny gaps are not lost to cancellation
        total_k3 += math.expm1(r) - r if r < 700 else math.inf
        worst = max(worst, abs(r))
    if n == 0:
        return LogprobGap(tokens=0, mean_abs=math.nan, max_abs=math.nan, k3=math.nan, mean_diff=math.nan)
    return LogprobGap(tokens=n, mean_abs=total_abs / n, max_abs=worst, k3=total_k3 / n, mean_diff=total_diff / n)


# ------------------------------------------------------------------------------------ output regions
def _char_ends(renderer: ChatRenderer, ids: Sequence[int]) -> list[int]:
    """``ends[k]``: length of the text decoded from ``ids[: k + 1]`` (a token's text ends there)."""
    return [len(renderer.decode(ids[: k + 1])) for k in range(len(ids))]


def _token_flags(ends: Sequence[int], spans: Sequence[tuple[int, int]]) -> list[bool]:
    """Per token: does its text overlap one of the character ``spans``."""
    flags = []
    start = 0
    for end in ends:
        flags.append(any(lo < end and start < hi for lo, hi in spans) if end > start else False)
        start = end
    return flags


def _call_spans(text: str, parser: ToolParser) -> list[tuple[int, int]]:
    """Character spans of the tool calls ``parser`` finds in ``text`` (markup included)."""
    spans: list[tuple[int, int]] = []
    at = 0
    for call in parser.parse(text).calls:
        found = text.find(call.raw, at)
        if found < 0:
            continue
        spans.append((found, found + len(call.raw)))
        at = found + len(call.raw)
    return spans


def _think_spans(text: str, think_start: str, think_end: str) -> list[tuple[int, int]]:
    spans = []
    first_end = text.find(think_end)
    if first_end != -1 and text.find(think_start, 0, first_end) == -1:
        spans.append((0, first_end + len(think_end)))
    for match in re.finditer(re.escape(think_start) + "(?s:.*?)(?:" + re.escape(think_end) + "|$)", text):
        spans.append(match.span())
    return spans


def output_regions(traj: Trajectory, renderer: ChatRenderer, parser: ToolParser) -> tuple[list[bool], list[bool]]:
    """Per token of the trajectory: ``(in a tool call, in a reasoning block)``, both False outside outputs.

    A token counts as a tool-call token when its decoded text overlaps a call the parser finds in its
    output (``<tool_call>`` to ``</tool_call>`` for hermes, markup included); a reasoning token likewise
    for the parser's think delimiters (``<think>`` ... ``</think>`` by default).
    """
    ids = traj.token_ids
    in_call = [False] * len(ids)
    in_think = [False] * len(ids)
    think_start = getattr(parser, "think_start", "<think>")
    think_end = getattr(parser, "think_end", "</think>")
    for seg in traj.segments:
        if seg.kind != "output":
            continue
        out = ids[seg.start : seg.end]
        text = renderer.decode(out)
        ends = _char_ends(renderer, out)
        for k, flag in enumerate(_token_flags(ends, _call_spans(text, parser))):
            in_call[seg.start + k] = flag
        for k, flag in enumerate(_token_flags(ends, _think_spans(text, think_start, think_end))):
            in_think[seg.start + k] = flag
    return in_call, in_think


# ----------------------------------------------------------------------------------- the text stack
_MARK = "\ue000tito-drift-{}\ue001"


def _pattern_around_marks(text: str, marks: Sequence[str]) -> re.Pattern[str]:
    """A regex matching ``text`` with each mark replaced by any text (captured), the rest literal."""
    parts = re.split("(" + "|".join(re.escape(m) for m in marks) + ")", text)
    regex = "".join("(.*?)" if part in marks else re.escape(part) for part in parts)
    return re.compile(regex, re.DOTALL)


def _read_first_prompt(
    renderer: ChatRenderer, text: str, tools: Sequence[Mapping[str, Any]] | None
) -> tuple[str | None, str]:
    """``(system, user)`` texts of a first prompt rendered from ``[system?, user]`` and the generation prompt."""
    for with_system in (True, False):
        marks = [_MARK.format(0), _MARK.format(1)] if with_system else [_MARK.format(1)]
        chat: list[ChatMessage] = [{"role": "system", "content": marks[0]}] if with_system else []
        chat.append({"role": "user", "content": _MARK.format(1)})
        rendered = renderer.render(chat, tools=tools, add_generation_prompt=True)
        match = _pattern_around_marks(rendered, marks).fullmatch(text)
        if match:
            return (match.group(1), match.group(2)) if with_system else (None, match.group(1))
    raise TemplateError("the first prompt is not a [system, user] conversation rendered by this template")


def _read_tool_results(renderer: ChatRenderer, text: str, count: int) -> list[str]:
    """Texts of ``count`` tool results, read from a recorded continuation (boundary + results + header)."""
    marks = [_MARK.format(k) for k in range(count)]
    chat: list[ChatMessage] = [
        {"role": "tool", "tool_call_id": f"call_{k}", "content": mark} for k, mark in enumerate(marks)
    ]
    rendered = renderer.continuation_text(chat)
    match = _pattern_around_marks(rendered, marks).search(text)
    if match is None or match.end() != len(text):
        raise TemplateError(f"a recorded prompt segment does not read as {count} tool result(s) of this template")
    return list(match.groups())


def _assistant_message(parsed: Any, turn: int) -> Message:
    """The Strands message tito gives the agent for one parsed output (as ``TitoModel`` streams it)."""
    content: list[ContentBlock] = []
    if parsed.reasoning:
        content.append({"reasoningContent": {"reasoningText": {"text": parsed.reasoning}}})
    if parsed.content or not (parsed.reasoning or parsed.calls):
        content.append({"text": parsed.content})
    for k, call in enumerate(parsed.calls):
        content.append({"toolUse": {"toolUseId": f"call_{turn}_{k}", "name": call.name, "input": call.input}})
    return {"role": "assistant", "content": content}


class TextStackView(msgspec.Struct, frozen=True):
    """A rollout as a text-based stack would feed it to a trainer.

    Attributes:
        messages: The chat messages the stack holds (system, user, assistant with tool calls, tool results).
        text: Their render with the chat template (no generation prompt).
        ids: ``text`` tokenized again.
        loss_mask: 1 on tokens of assistant turns: from the end of the generation prompt before each
            assistant message to the end of that message's render (what rendering the messages one by one
            and diffing gives; this includes whatever the template writes after the end-of-turn token).
    """

    messages: list[ChatMessage]
    text: str
    ids: list[int]
    loss_mask: list[int]


def _outputs_and_prompts(traj: Trajectory) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids before the output, output ids)`` per model call, in order."""
    ids = traj.token_ids
    pairs: list[tuple[list[int], list[int]]] = []
    at = 0
    for seg in traj.segments:
        if seg.kind == "output":
            pairs.append((ids[at : seg.start], ids[seg.start : seg.end]))
            at = seg.end
    return pairs


def text_stack_messages(
    traj: Trajectory,
    renderer: ChatRenderer,
    parser: ToolParser,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_specs: Sequence[Any] | None = None,
) -> list[ChatMessage]:
    """The final conversation of a rollout as chat messages, rebuilt from its recorded tokens.

    Raises:
        TemplateError: the recorded prompts do not read back as this template's system / user / tool turns.
    """
    pairs = _outputs_and_prompts(traj)
    if not pairs:
        raise TemplateError("the trajectory has no output")
    end_of_turn = renderer.end_of_turn_ids
    records = {t.index: t for t in traj.turns}
    system, user = _read_first_prompt(renderer, renderer.decode(pairs[0][0]), tools)
    messages: Messages = [{"role": "user", "content": [{"text": user}]}]
    calls = 0
    for turn, (prompt, output) in enumerate(pairs):
        if turn > 0:
            results = _read_tool_results(renderer, renderer.decode(prompt), calls)
            blocks: list[ContentBlock] = [
                {
                    "toolResult": {
                        "toolUseId": f"call_{turn - 1}_{k}",
                        "status": "success",
                        "content": [{"text": text}],
                    }
                }
                for k, text in enumerate(results)
            ]
            messages.append({"role": "user", "content": blocks})
        # the token the output stopped on is not part of the message (as when tito parses it at runtime):
        # the template's end of turn, the EOS, or the stop id the engine reported
        record = records.get(turn)
        stopped_on = record.matched_stop if record is not None and record.finish_reason == "stop" else None
        ended = bool(output) and (output[-1] in end_of_turn or output[-1] == stopped_on)
        body = output[:-1] if ended else output
        parsed = parser.parse(renderer.decode(body), tool_specs)
        calls = len(parsed.calls)
        messages.append(_assistant_message(parsed, turn))
    return to_chat_messages(messages, system_prompt=system)


def text_stack_view(
    messages: Sequence[ChatMessage],
    renderer: ChatRenderer,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> TextStackView:
    """Render ``messages`` with the chat template, tokenize again, and build the text stack's loss mask."""
    chat = list(messages)
    text = renderer.render(chat, tools=tools, add_generation_prompt=False)
    spans: list[tuple[int, int]] = []
    for k, message in enumerate(chat):
        if message.get("role") != "assistant":
            continue
        before = renderer.render(chat[:k], tools=tools, add_generation_prompt=True)
        upto = renderer.render(chat[: k + 1], tools=tools, add_generation_prompt=False)
        if not upto.startswith(before) or not text.startswith(upto):
            # the template re-renders history (e.g. drops earlier reasoning): locate by the longest
            # common prefix with the full text, as a stack diffing renders would
            start = min(len(before), _common_prefix(before, text))
            end = _common_prefix(upto, text)
        else:
            start, end = len(before), len(upto)
        if end > start:
            spans.append((start, end))
    ids, offsets = _encode_with_offsets(renderer, text)
    mask = [1 if any(lo <= a < hi for lo, hi in spans) else 0 for a, _ in offsets]
    return TextStackView(messages=chat, text=text, ids=ids, loss_mask=mask)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _encode_with_offsets(renderer: ChatRenderer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids of ``text`` (as :meth:`ChatRenderer.encode`) with each token's character span."""
    tok = renderer.tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise TemplateError("measuring drift needs a fast (Rust) Hugging Face tokenizer, for token offsets")
    encoding = backend.encode(text, add_special_tokens=False)
    ids: list[int] = list(encoding.ids)
    if ids != renderer.encode(text):
        raise TemplateError("the tokenizer's Rust backend does not encode like the tokenizer; offsets unusable")
    return ids, [(int(a), int(b)) for a, b in encoding.offsets]


# ------------------------------------------------------------------------------------- comparison
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
