"""Does incremental rendering equal the canonical full render? A check for any tokenizer + template.

tito renders a conversation incrementally: the first prompt, then each assistant turn exactly as the
model generated it, then only the new messages. When a chat template renders earlier messages
differently once later messages exist (Qwen3 drops the ``<think>`` block of earlier turns), the
tokens the model really saw are not a prefix of the canonical full render. tito keeps the real tokens
either way; this check tells you whether, where and why your template diverges.

Run it from the command line on a local tokenizer directory::

    python -m tito_core.analysis.prefix_check path/to/tokenizer [--template file.jinja] [--no-thinking]
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from strands.types.content import Messages
from strands.types.tools import ToolSpec

from ..conversation import tool_specs_to_chat
from ..errors import TemplateError
from ..render.mistral import is_mistral_common
from ..render.renderer import ChatRenderer, first_difference
from ..strands_front.messages import to_chat_messages

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_CONTEXT = 60


class PrefixReport(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of :func:`check_prefix_preservation`.

    Attributes:
        ok: True when the incremental render equals the canonical full render.
        position: Character offset of the first difference (None when ok).
        message_index: Index of the message whose rendering holds the first difference.
        reason: A diagnosis in words.
        incremental_excerpt: Text around ``position`` as tito renders it.
        canonical_excerpt: Text around ``position`` in the canonical full render.
        incremental_text: The whole incremental render.
        canonical_text: The whole canonical render.
        incremental_pieces: The incremental render as tito tokenizes it, piece by piece (first prompt,
            each assistant turn, each boundary + continuation); empty unless ok.
    """

    ok: bool
    reason: str
    position: int | None = None
    message_index: int | None = None
    incremental_excerpt: str = ""
    canonical_excerpt: str = ""
    incremental_text: str = ""
    canonical_text: str = ""
    incremental_pieces: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.ok:
            return "prefix-preserving: the incremental render equals the canonical full render"
        if self.position is None:
            where = "" if self.message_index is None else f" (message {self.message_index})"
            return f"NOT prefix-preserving{where}: {self.reason}"
        return (
            f"NOT prefix-preserving at character {self.position} (message {self.message_index}): {self.reason}\n"
            f"  tito (incremental): {self.incremental_excerpt!r}\n"
            f"  canonical (full):   {self.canonical_excerpt!r}"
        )


def check_prefix_preservation(
    tokenizer: PreTrainedTokenizerBase,
    messages: Messages,
    *,
    tools: Sequence[ToolSpec] | None = None,
    system_prompt: str | None = None,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> PrefixReport:
    """Compare tito's incremental render of ``messages`` with the template's full render.

    Each assistant message is assumed to have been generated exactly as the template renders it when it
    is the last message (which is how a model trained on the template writes it).

    Args:
        tokenizer: A tokenizer with a chat template.
        messages: A Strands conversation with at least one assistant turn.
        tools: Tool specs offered to the model.
        system_prompt: The system prompt.
        chat_template: A template overriding the tokenizer's.
        chat_template_kwargs: Extra template variables (e.g. ``{"enable_thinking": False}``).
    """
    if not any(m.get("role") == "assistant" for m in messages):
        raise ValueError("the conversation needs at least one assistant message to check")
    if is_mistral_common(tokenizer):
        return PrefixReport(
            ok=False,
            reason=(
                "not a chat template: this is a mistral-common tokenizer, which tito encodes with mistral-common as "
                "vLLM and SGLang do. Its encoding of a whole conversation is not prefix-preserving when a later user "
                "message arrives (tokenizer v3 moves the tools block and the system prompt to the last user message, "
                "v7 the tools block); render_mode='auto' re-encodes those calls (docs/models.md)"
            ),
        )
    try:
        return _check(tokenizer, messages, tools, system_prompt, chat_template, chat_template_kwargs)
    except Exception as exc:  # any tokenizer or template: a report, never a traceback
        return PrefixReport(
            ok=False,
            reason=f"could not render the conversation with this tokenizer: {type(exc).__name__}: {exc}",
        )


def _check(
    tokenizer: PreTrainedTokenizerBase,
    messages: Messages,
    tools: Sequence[ToolSpec] | None,
    system_prompt: str | None,
    chat_template: str | None,
    chat_template_kwargs: Mapping[str, Any] | None,
) -> PrefixReport:
    renderer = ChatRenderer(tokenizer, chat_template=chat_template, template_kwargs=chat_template_kwargs)
    chat_tools = tool_specs_to_chat(tools)
    full_chat = to_chat_messages(messages, system_prompt=system_prompt)
    last_is_assistant = bool(messages) and messages[-1].get("role") == "assistant"
    canonical = renderer.render(full_chat, tools=chat_tools, add_generation_prompt=not last_is_assistant)
    _, boundary = renderer.turn_tail

    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not assistant_at:
        raise ValueError("the conversation needs at least one assistant message to check")
    pieces: list[tuple[int, str]] = []  # (message index the text belongs to, text)
    first = assistant_at[0]
    pieces.append(
        (
            0,
            renderer.initial_text(to_chat_messages(messages[:first], system_prompt=system_prompt), chat_tools),
        )
    )
    for k, i in enumerate(assistant_at):
        before = renderer.render(
            to_chat_messages(messages[:i], system_prompt=system_prompt),
            tools=chat_tools,
            add_generation_prompt=True,
        )
        with_turn = renderer.render(
            to_chat_messages(messages[: i + 1], system_prompt=system_prompt),
            tools=chat_tools,
            add_generation_prompt=False,
        )
        if not with_turn.startswith(before):
            at = first_difference(before, with_turn)
            return _report(
                i,
                at,
                before,
                with_turn,
                "rendering an assistant turn changes the text before it (the generation prompt is not a prefix "
                "of the rendered turn), so the model's output cannot be placed after its prompt",
            )
        generated = with_turn[len(before) :]
        if boundary and generated.endswith(boundary):
            generated = generated[: -len(boundary)]
        pieces.append((i, generated))
        end = assistant_at[k + 1] if k + 1 < len(assistant_at) else len(messages)
        rest = messages[i + 1 : end]
        if rest:
            call_ids = [b["toolUse"]["toolUseId"] for b in messages[i]["content"] if "toolUse" in b]
            try:
                tail = renderer.continuation_text(to_chat_messages(rest, call_order=call_ids))
            except TemplateError as exc:
                return PrefixReport(ok=False, reason=str(exc), message_index=i + 1)
            pieces.append((i + 1, boundary + tail))
        elif end == len(messages):
            pieces.append((i, boundary))

    incremental = "".join(text for _, text in pieces)
    if incremental == canonical:
        return PrefixReport(
            ok=True,
            reason="the incremental render equals the canonical full render",
            incremental_text=incremental,
            canonical_text=canonical,
            incremental_pieces=tuple(text for _, text in pieces),
        )
    at = first_difference(incremental, canonical)
    offset, owner = 0, 0
    for index, text in pieces:
        if offset + len(text) > at:
            owner = index
            break
        offset += len(text)
    return _report(owner, at, incremental, canonical, _diagnose(incremental, canonical, at))


def _report(index: int, at: int, incremental: str, canonical: str, reason: str) -> PrefixReport:
    lo = max(at - _CONTEXT, 0)
    return PrefixReport(
        ok=False,
        reason=reason,
        position=at,
        message_index=index,
        incremental_excerpt=incremental[lo : at + _CONTEXT],
        canonical_excerpt=canonical[lo : at + _CONTEXT],
        incremental_text=incremental,
        canonical_text=canonical,
    )


def _markup_start(text: str, at: int) -> int:
    """Where the tag holding offset ``at`` starts (``at`` itself when it is not inside a ``<...>`` tag)."""
    start = text.rfind("<", 0, at + 1)
    return start if start != -1 and ">" not in text[start:at] else at


def _diagnose(incremental: str, canonical: str, at: int) -> str:
    ahead = incremental[at : at + 400]
    tag = _markup_start(incremental, at)  # "<think>" vs "<tool_call>" first differ after "<t"
    dropped = incremental.startswith("<think>", tag) and not canonical.startswith("<think>", tag)
    if dropped or ("<think>" in ahead and "<think>" not in canonical[at : at + len(ahead)]):
        return (
            "the template drops the reasoning (<think>...</think>) of earlier assistant turns, so the tokens the "
            "model saw are not a prefix of the canonical render; tito keeps the real tokens. To train on the "
            "canonical form, use a template that keeps reasoning (e.g. trl's qwen3_training.jinja)"
        )
    if incremental[:at].endswith("<think>") and canonical.startswith("</think>", at):
        return (
            "the template empties the reasoning of earlier assistant turns (<think></think>), so the tokens the "
            "model saw are not a prefix of the canonical render; tito keeps the real tokens"
        )
    if len(incremental) > len(canonical) and incremental.startswith(canonical):
        return "the incremental render has extra text at the end"
    return "the template renders earlier messages differently once later messages exist"


_SAMPLE_TOOL: ToolSpec = {
    "name": "lookup",
    "description": "Look up a fact.",
    "inputSchema": {"json": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
}
_SAMPLE: Messages = [
    {"role": "user", "content": [{"text": "What is the capital of France?"}]},
    {
        "role": "assistant",
        "content": [
            {"reasoningContent": {"reasoningText": {"text": "I should look it up."}}},
            {"toolUse": {"toolUseId": "call_1", "name": "lookup", "input": {"query": "capital of France"}}},
        ],
    },
    {
        "role": "user",
        "content": [{"toolResult": {"toolUseId": "call_1", "status": "success", "content": [{"text": "Paris"}]}}],
    },
    {
        "role": "assistant",
        "content": [{"reasoningContent": {"reasoningText": {"text": "Found it."}}}, {"text": "Paris."}],
    },
    {"role": "user", "content": [{"text": "And of Italy?"}]},
]


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: check a tokenizer's template on a built-in tool-use conversation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("tokenizer", help="tokenizer directory or name (AutoTokenizer.from_pretrained)")
    parser.add_argument("--template", help="a chat template file overriding the tokenizer's")
    parser.add_argument("--no-thinking", action="store_true", help="render with enable_thinking=False")
    args = parser.parse_args(argv)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        template = Path(args.template).read_text(encoding="utf-8") if args.template else None
    except Exception as exc:  # a report, never a traceback
        print(f"NOT checked: could not load {args.tokenizer!r}: {type(exc).__name__}: {exc}")
        return 2
    kwargs = {"enable_thinking": False} if args.no_thinking else None
    report = check_prefix_preservation(
        tokenizer,
        _SAMPLE,
        tools=[_SAMPLE_TOOL],
        system_prompt="You are helpful.",
        chat_template=template,
        chat_template_kwargs=kwargs,
    )
    print(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
