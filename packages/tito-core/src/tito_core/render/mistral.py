"""Mistral models encoded the way their engines encode them: with mistral-common, not a chat template.

vLLM and SGLang serve Mistral models (``--tokenizer-mode mistral``) by encoding each conversation with
``mistral-common``: control tokens come only from the message structure, and text inside a message stays
text even when it spells ``[INST]`` or ``</s>``. tito does the same with a ``MistralCommonBackend``
tokenizer (transformers' wrapper over mistral-common): the first prompt is mistral-common's encoding of the
conversation, and later prompts are the ids mistral-common adds for the new messages, taken as the
difference of two encodings after a dummy ``[user, assistant]`` prefix. Assistant turns are never
re-encoded (the model's ids are the truth).

Measured with the Tekken tokenizers shipped in mistral-common (``docs/models.md``): with tokenizer v3 the
tools block and the system prompt are encoded with the *last* user message (v7: the tools block), so
once a later user message arrives the full encoding is no longer a prefix-extension of what the model
saw; ``render_mode="auto"`` detects that and renders the whole conversation for that call.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, cast

from ..errors import TemplateError, UnsupportedContentError
from .renderer import ChatMessage, ChatRenderer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["MistralCommonRenderer", "is_mistral_common", "mistral_call_id"]

_CALL_ID = re.compile(r"[A-Za-z0-9]{9}")
_DUMMY_USER: ChatMessage = {"role": "user", "content": "tito dummy user"}
_DUMMY_SYSTEM: ChatMessage = {"role": "system", "content": "tito dummy system"}
_DUMMY_TOOL = "tito_dummy"


def is_mistral_common(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` encodes with mistral-common (transformers' ``MistralCommonBackend``)."""
    inner = getattr(tokenizer, "tokenizer", None)
    return callable(getattr(inner, "encode_chat_completion", None)) and callable(
        getattr(tokenizer, "apply_chat_template", None)
    )


def mistral_call_id(call_id: str) -> str:
    """The tool-call id as mistral-common accepts it: 9 ASCII letters or digits.

    Ids the model wrote itself already are; others (hand-written histories, other formats) are replaced by
    the first 9 hex digits of their SHA-1, the same every time.
    """
    if _CALL_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha1(call_id.encode("utf-8")).hexdigest()[:9]


class MistralCommonRenderer(ChatRenderer):
    """A :class:`~tito_core.render.renderer.ChatRenderer` that encodes with mistral-common.

    Message content is always encoded as text (``escape_special_text`` is implied). The text views
    (:meth:`render`, :meth:`continuation_text`) decode the ids, for messages and diagnostics only.

    Args:
        tokenizer: A ``MistralCommonBackend``.
        template_kwargs: Extra arguments for mistral-common's request (e.g. ``reasoning_effort``).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = None
        self.template_kwargs = MappingProxyType(dict(template_kwargs or {}))
        self.escape_special_text = True
        self._rust_encode = self._rust_decode = None
        self._escaper = None
        eos = getattr(tokenizer, "eos_token_id", None)
        if not isinstance(eos, int):
            raise TemplateError("the mistral-common tokenizer has no end-of-sequence token id")
        self._eos = eos

    # ---------------------------------------------------------------------------------- encoding
    def _encode(
        self, chat: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None, *, generation: bool
    ) -> list[int]:
        """mistral-common's ids for ``chat``; ``generation=False`` leaves a last assistant turn open (no ``</s>``)."""
        messages = [_to_mistral(m) for m in chat]
        try:
            ids = self.tokenizer.apply_chat_template(
                messages,
                tools=[dict(t) for t in tools] if tools else None,
                tokenize=True,
                return_dict=False,
                continue_final_message=not generation,
                **self.template_kwargs,
            )
        except Exception as exc:  # mistral-common's validation and encoding errors
            raise TemplateError(f"mistral-common could not encode the conversation: {exc}") from exc
        return [int(i) for i in cast("list[int]", ids)]

    def render(
        self,
        chat: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool,
    ) -> str:
        """The decoded text of mistral-common's encoding (control-token text in content looks like the token)."""
        return self.decode(self._encode(chat, tools, generation=add_generation_prompt))

    async def initial_ids(self, chat: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        """mistral-common's encoding of the whole conversation (``<s>`` included)."""
        return self._encode(chat, tools, generation=True)

    async def continuation_ids(self, chat: Sequence[ChatMessage], *, close_turn: bool) -> tuple[list[int], int]:
        """The ids mistral-common adds for ``chat`` after an assistant turn; ``</s>`` first when ``close_turn``."""
        ids = self._continuation(chat)
        return ([self._eos, *ids], 1) if close_turn else (ids, 0)

    def continuation_text(self, chat: Sequence[ChatMessage]) -> str:
        """The decoded text of :meth:`continuation_ids` (without the boundary)."""
        return self.decode(self._continuation(chat))

    def _continuation(self, chat: Sequence[ChatMessage]) -> list[int]:
        if not chat:
            return []
        dummy = _dummy(chat)
        prefix = self._encode(dummy, None, generation=False)
        full = self._encode([*dummy, *chat], None, generation=True)
        head = [*prefix, self._eos]
        if full[: len(head)] != head:
            raise TemplateError(
                "mistral-common encoded the turn before the new messages differently once they were added, so "
                "they cannot be encoded on their own"
            )
        return full[len(head) :]

    def tools_move(self, chat: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None) -> bool:
        """Whether adding ``chat`` moves the tools block or the system prompt (v3: both go with the last user turn)."""
        key = (json.dumps(list(tools or ()), sort_keys=True, default=str), tuple(m.get("role", "") for m in chat))
        known = self._tools_move.get(key)
        if known is not None:
            return known
        dummy = [_DUMMY_SYSTEM, *_dummy(chat)]
        try:
            prefix = self._encode(dummy, tools, generation=False)
            full = self._encode([*dummy, *chat], tools, generation=True)
        except TemplateError:
            return False  # the incremental encoding reports its own error
        moves = self._tools_move[key] = full[: len(prefix)] != prefix
        return moves

    # ------------------------------------------------------------------------------ turn structure
    @cached_property
    def turn_tail(self) -> tuple[str, str]:
        """``("</s>", "")``: mistral-common ends an assistant turn with the end-of-sequence token, nothing after."""
        return self.decode([self._eos]), ""

    @cached_property
    def end_of_turn_ids(self) -> frozenset[int]:
        """The end-of-sequence id."""
        return frozenset({self._eos})


def _dummy(chat: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``[user, assistant]`` before ``chat``: the assistant calls a tool for each leading tool result."""
    results = []
    for message in chat:
        if message.get("role") != "tool":
            break
        results.append(str(message.get("tool_call_id", "")))
    if not results:
        return [_DUMMY_USER, {"role": "assistant", "content": "tito dummy assistant"}]
    calls = [{"id": i, "type": "function", "function": {"name": _DUMMY_TOOL, "arguments": {}}} for i in results]
    return [_DUMMY_USER, {"role": "assistant", "content": "", "tool_calls": calls}]


def _to_mistral(message: ChatMessage) -> dict[str, Any]:
    """A tito chat message as mistral-common's OpenAI-style request takes it."""
    out = dict(message)
    if out.get("role") == "assistant":
        if out.pop("reasoning_content", None):
            raise UnsupportedContentError(
                "an earlier assistant turn holds reasoning, which tito cannot encode with mistral-common yet "
                "(render_mode='full' re-encodes earlier turns; use 'incremental' or 'auto')"
            )
        calls = out.pop("tool_calls", None)
        if calls:
            out["tool_calls"] = [
                {
                    "id": mistral_call_id(str(call["id"])),
                    "type": "function",
                    "function": {
                        "name": call["function"]["name"],
                        "arguments": json.dumps(call["function"]["arguments"], ensure_ascii=False),
                    },
                }
                for call in calls
            ]
            if not out.get("content"):
                out.pop("content", None)
    elif out.get("role") == "tool":
        out["tool_call_id"] = mistral_call_id(str(out.get("tool_call_id", "")))
    return out
