"""Which recorded tokens lie in a tool call or a reasoning block, from the outputs' decoded text."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...render.renderer import ChatRenderer
from ...tool_parsers.base import ToolParser
from ...trajectory import Trajectory

__all__ = ["output_regions"]


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
