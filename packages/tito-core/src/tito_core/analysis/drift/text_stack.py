"""The text stack: a rollout's conversation rebuilt from its recorded tokens, re-rendered and tokenized again.

The messages are rebuilt the way a text-based stack gets them: each output is decoded and parsed by the same
tool parser, tool results are read back out of the recorded prompt segments, and the messages go through the
same conversion tito applies to Strands messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from strands.types.content import ContentBlock, Message, Messages

from ...conversation import ChatMessage
from ...errors import TemplateError
from ...render.renderer import ChatRenderer
from ...strands_front.messages import to_chat_messages
from ...tool_parsers.base import ToolParser
from ...trajectory import Trajectory

__all__ = ["TextStackView", "text_stack_messages", "text_stack_view"]

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


def _read_user_message(renderer: ChatRenderer, text: str) -> str:
    """The text of a user follow-up, read from a recorded continuation (boundary + user message + header)."""
    mark = _MARK.format(0)
    rendered = renderer.continuation_text([{"role": "user", "content": mark}])
    match = _pattern_around_marks(rendered, [mark]).search(text)
    if match is None or match.end() != len(text):
        raise TemplateError(
            "a recorded prompt segment after an answer does not read as a user message of this template"
        )
    return match.group(1)


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
        TemplateError: the recorded prompts do not read back as this template's system / user / tool turns (a
            prompt after a turn with tool calls is read as their results, after an answer as the next question).
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
        if turn > 0 and not calls:  # an answer, then the user's next question (a multi-question rollout)
            messages.append(
                {"role": "user", "content": [{"text": _read_user_message(renderer, renderer.decode(prompt))}]}
            )
        elif turn > 0:
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
