"""Think-aware splitting of a model output into reasoning, visible content and raw tool-call regions.

Rules, applied left to right on the decoded output:

- Reasoning is the text inside ``<think>...</think>``. An unclosed ``<think>`` makes everything after
  it reasoning.
- ``reasoning_open`` (the caller knows the generation prompt pre-opened ``<think>``, e.g. Qwen3.5,
  Qwen3-Thinking-2507; the rollout reads it off its prompt tokens): the output starts inside
  reasoning, which runs to the first ``</think>`` (to the end when there is none). Inside reasoning
  there are no calls, so no arguments: that ``</think>`` is the model's own end of reasoning.
- Otherwise a lone ``</think>`` still ends reasoning that started with the output (models that skip
  ``<think>``, prompts the caller does not know): the first ``</think>`` outside any closed tool-call
  region with no ``<think>`` outside a region before it makes everything before it reasoning (a call
  never closed was a draft). One inside a closed region is argument text: a call's arguments are
  data, and the model's own tokens opened the call outside reasoning (the templates render
  arguments verbatim, ``"</think>"`` included).
- Reasoning is opaque: tool-call markup inside it is never reported, so a draft call is never run.
- Outside reasoning, a tool-call region runs from the start delimiter to its end delimiter (found by
  the parser's end finder, which can skip delimiters quoted inside arguments). A region is opaque
  too: think tags inside it are argument text. A region with no end runs to the end of the output.
- Stray delimiters (a ``</think>`` after the first think tag, a ``</tool_call>`` without a start) are
  plain content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from tito_core.conversation import ToolSpec
    from tito_core.tool_parsers.base import ParsedOutput

CallEndFinder = Callable[[str, int], "int | None"]
"""``(text, body_start) -> end``: index just past the call's end delimiter, or None when unclosed."""


class RawCall(NamedTuple):
    """A tool-call region found outside reasoning, not yet parsed.

    Attributes:
        raw: The exact text of the region, delimiters included.
        body: The text between the delimiters (to the end of the output when unclosed).
        closed: Whether the end delimiter was found.

    """

    raw: str
    body: str
    closed: bool


class ReasoningSplit(NamedTuple):
    """A model output split by :func:`split_reasoning`.

    Attributes:
        reasoning: Reasoning text with surrounding newlines stripped (blocks joined by a blank line),
            or None when there is none or it is blank.
        content: Text outside reasoning and outside tool-call regions, stripped.
        calls: Tool-call regions outside reasoning, in output order.

    """

    reasoning: str | None
    content: str
    calls: list[RawCall]


def index_past(text: str, delimiter: str, pos: int) -> int | None:
    """Index just past the first ``delimiter`` at or after ``pos``, or None when there is none."""
    at = text.find(delimiter, pos)
    return None if at == -1 else at + len(delimiter)


def find_delimiter_end(delimiter: str) -> CallEndFinder:
    """Build an end finder that stops at the first occurrence of ``delimiter``."""

    def find(text: str, body_start: int) -> int | None:
        return index_past(text, delimiter, body_start)

    return find


def skip_whitespace(text: str, pos: int) -> int:
    """Return the first index at or after ``pos`` that is not whitespace (``len(text)`` if none)."""
    n = len(text)
    while pos < n and text[pos].isspace():
        pos += 1
    return pos


def check_delimiters(**delimiters: str) -> None:
    """Raise ValueError unless every delimiter is a non-empty string and all differ."""
    for arg, value in delimiters.items():
        if not isinstance(value, str) or not value:
            raise ValueError(f"{arg} must be a non-empty string, got {value!r}")
    if len(set(delimiters.values())) != len(delimiters):
        raise ValueError(f"delimiters must differ: {delimiters}")


def split_reasoning(
    text: str,
    *,
    think_start: str = "<think>",
    think_end: str = "</think>",
    tool_start: str | None = None,
    tool_end: str | None = None,
    find_call_end: CallEndFinder | None = None,
    reasoning_open: bool = False,
) -> ReasoningSplit:
    """Split ``text`` into reasoning, content and raw tool-call regions (see the module docstring).

    Args:
        text: The decoded model output.
        think_start: Opening reasoning delimiter.
        think_end: Closing reasoning delimiter.
        tool_start: Opening tool-call delimiter; None to find no calls (all non-reasoning text is
            content).
        tool_end: Closing tool-call delimiter; required with ``tool_start``.
        find_call_end: Locates the end of a call whose body starts at the given index (the index
            returned is just past ``tool_end``); default: the first ``tool_end``.
        reasoning_open: The generation prompt left a reasoning block open (see the module docstring).

    """
    if tool_start is not None:
        if tool_end is None:
            raise ValueError("tool_end is required with tool_start")
        if find_call_end is None:
            find_call_end = find_delimiter_end(tool_end)
    reasoning: list[str] = []
    visible: list[str] = []
    calls: list[RawCall] = []
    pos, n = 0, len(text)

    lone_end = (
        text.find(think_end)
        if reasoning_open
        else _first_lone_end(text, think_start, think_end, tool_start, find_call_end)
    )
    if reasoning_open or lone_end != -1:
        # The reasoning block started with the output (opened by the generation prompt).
        close = n if lone_end == -1 else lone_end
        reasoning.append(text[:close])
        pos = n if lone_end == -1 else lone_end + len(think_end)

    # Next occurrence of each opening delimiter, searched again only once passed (keeps the scan linear).
    think_at = text.find(think_start, pos)
    call_at = -1 if tool_start is None else text.find(tool_start, pos)
    while pos < n:
        if 0 <= think_at < pos:
            think_at = text.find(think_start, pos)
        if 0 <= call_at < pos:
            assert tool_start is not None
            call_at = text.find(tool_start, pos)
        if call_at != -1 and (think_at == -1 or call_at < think_at):
            assert tool_start is not None and tool_end is not None and find_call_end is not None
            visible.append(text[pos:call_at])
            body_start = call_at + len(tool_start)
            end = find_call_end(text, body_start)
            if end is None:
                calls.append(RawCall(text[call_at:], text[body_start:], False))
                pos = n
            else:
                calls.append(RawCall(text[call_at:end], text[body_start : end - len(tool_end)], True))
                pos = end
        elif think_at != -1:
            visible.append(text[pos:think_at])
            inner = think_at + len(think_start)
            close = text.find(think_end, inner)
            if close == -1:
                reasoning.append(text[inner:])
                pos = n
            else:
                reasoning.append(text[inner:close])
                pos = close + len(think_end)
        else:
            visible.append(text[pos:])
            pos = n

    blocks = [block.strip("\n") for block in reasoning if block.strip()]
    return ReasoningSplit(
        reasoning="\n\n".join(blocks) if blocks else None,
        content="".join(visible).strip(),
        calls=calls,
    )


def _first_lone_end(
    text: str, think_start: str, think_end: str, tool_start: str | None, find_call_end: CallEndFinder | None
) -> int:
    """Index of the first ``think_end`` outside call regions, with no ``think_start`` outside one before it; or -1."""
    pos = 0
    end_at = text.find(think_end)
    while end_at != -1:
        call_at = -1 if tool_start is None else text.find(tool_start, pos, end_at)
        if text.find(think_start, pos, end_at if call_at == -1 else call_at) != -1:
            return -1  # a <think> opens first: the scan pairs the tags
        if call_at == -1:
            return end_at
        assert tool_start is not None and find_call_end is not None
        end = find_call_end(text, call_at + len(tool_start))
        if end is None:  # a call never closed was a draft (unless a <think> in it opens first)
            return -1 if text.find(think_start, call_at, end_at) != -1 else end_at
        pos = end
        if end_at < pos:
            end_at = text.find(think_end, pos)
    return -1


class ThinkAwareParser:
    """Shared base of the think-aware parsers: the checked reasoning delimiters and the reasoning split.

    ``markers`` name the format's fixed tool-call markers, checked to differ from the think delimiters.
    """

    name: str

    def __init__(self, *, think_start: str = "<think>", think_end: str = "</think>", **markers: str) -> None:
        check_delimiters(think_start=think_start, think_end=think_end, **markers)
        self.think_start = think_start
        self.think_end = think_end

    def parse(
        self, text: str, tools: Sequence[ToolSpec] | None = None, *, reasoning_open: bool = False
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls (``reasoning_open``: see :func:`split_reasoning`)."""
        raise NotImplementedError

    def _split_reasoning(
        self,
        text: str,
        tool_start: str,
        tool_end: str,
        find_call_end: CallEndFinder,
        reasoning_open: bool = False,
    ) -> ReasoningSplit:
        """:func:`split_reasoning` with this parser's think delimiters."""
        return split_reasoning(
            text,
            think_start=self.think_start,
            think_end=self.think_end,
            tool_start=tool_start,
            tool_end=tool_end,
            find_call_end=find_call_end,
            reasoning_open=reasoning_open,
        )


class DelimitedToolParser(ThinkAwareParser):
    """Shared base of parsers whose calls sit between tool-call tags: delimiters and the reasoning split.

    Subclasses set ``name``, implement ``_find_call_end`` (where a call whose body starts at an index
    ends) and turn the raw calls of :meth:`_split` into :class:`~tito_core.tool_parsers.base.ToolCall`.
    """

    def __init__(
        self,
        *,
        think_start: str = "<think>",
        think_end: str = "</think>",
        tool_start: str = "<tool_call>",
        tool_end: str = "</tool_call>",
    ) -> None:
        super().__init__(think_start=think_start, think_end=think_end, tool_start=tool_start, tool_end=tool_end)
        self.tool_start = tool_start
        self.tool_end = tool_end

    def _find_call_end(self, text: str, body_start: int) -> int | None:
        raise NotImplementedError

    def _split(self, text: str, reasoning_open: bool = False) -> ReasoningSplit:
        """Split ``text`` into reasoning, content and the raw calls outside reasoning."""
        return self._split_reasoning(text, self.tool_start, self.tool_end, self._find_call_end, reasoning_open)
