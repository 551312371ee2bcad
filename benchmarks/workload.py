"""The benchmark workload, shared by the fake server and every client (any Python >= 3.11).

One rollout is ``calls`` model calls of a Strands agent with one tool: the first ``calls - 1`` answers
think and call ``lookup``, the last thinks and answers. The trajectory grows by ``think`` generated
tokens and ``tool`` tool-result tokens per iteration, so the final trajectory has about
``BASE_TOKENS + 2 * (calls - 1) * per_iteration`` tokens. Text is deterministic, so the server and the
clients build the same strings from the same parameters.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Protocol

SYSTEM_PROMPT = "You are a research assistant. Use the lookup tool until you know the answer."
USER_PROMPT = "Find the answer, calling the lookup tool several times."
BASE_TOKENS = 330
"""Approximate first-prompt length (system, tool schema, user turn, generation header) with Qwen3."""

IM_END = 151645
TOOL_RESPONSE = 151665
"""``<tool_response>``: the Qwen3 template writes one per tool result, so their count is the turn index."""

_WORDS = [
    "amber",
    "basalt",
    "cobalt",
    "dune",
    "ember",
    "fjord",
    "granite",
    "harbor",
    "indigo",
    "jasper",
    "kelp",
    "lagoon",
    "meadow",
    "nectar",
    "obsidian",
    "prairie",
    "quartz",
    "river",
    "saffron",
    "tundra",
    "umber",
    "valley",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
]

SIZES = {1000: "1k", 8000: "8.6k", 32000: "34k", 128000: "137k"}
"""Target sizes (the name is the final trajectory length the Qwen3 template gives)."""


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer used here."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Tokenize."""
        ...


@dataclass(frozen=True)
class Workload:
    """Shape of one rollout."""

    calls: int
    think: int
    tool: int

    @classmethod
    def for_size(cls, target: int, calls: int = 8) -> Workload:
        """Think / tool-result sizes that give a final trajectory of about ``target`` tokens."""
        per_iteration = max(10, (target - BASE_TOKENS) // (2 * (calls - 1)))
        return cls(calls=calls, think=per_iteration, tool=per_iteration)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def filler(tokenizer: Tokenizer, n_tokens: int, seed: int) -> str:
    """Deterministic text of at most ``n_tokens`` tokens (and close to it)."""
    if n_tokens <= 0:
        return ""
    words = [f"{_WORDS[(i * 5 + seed) % len(_WORDS)]}{(i * 37 + seed) % 1009}" for i in range(n_tokens)]
    for _ in range(50):  # bounded: each pass shrinks the word list
        text = " ".join(words)
        count = len(tokenizer.encode(text, add_special_tokens=False))
        if count <= n_tokens:
            return text
        words = words[: max(1, min(len(words) - 1, len(words) * n_tokens // count))]
    return " ".join(words[:1])


def tool_query(turn: int) -> str:
    """The ``query`` argument of the tool call made at ``turn``."""
    return f"item-{turn}"


def answer_text(tokenizer: Tokenizer, workload: Workload, turn: int) -> str:
    """What the model answers at ``turn`` (without the final ``<|im_end|>``)."""
    think = filler(tokenizer, workload.think, seed=turn)
    if turn < workload.calls - 1:
        arguments = json.dumps({"query": tool_query(turn)})
        call = f'<tool_call>\n{{"name": "lookup", "arguments": {arguments}}}\n</tool_call>'
        return f"<think>\n{think}\n</think>\n\n{call}"
    return f"<think>\n{think}\n</think>\n\nThe answer is 42."


def reasoning_text(tokenizer: Tokenizer, workload: Workload, turn: int) -> str:
    """The reasoning part of the answer at ``turn`` (what a parser hands to Strands)."""
    return filler(tokenizer, workload.think, seed=turn)


def tool_blob(tokenizer: Tokenizer, workload: Workload) -> str:
    """The text the tool returns (plus a short per-query prefix)."""
    return filler(tokenizer, workload.tool, seed=99)
