"""``ChatRenderer``: chat messages to the text and token ids of a chat template, whole or incrementally.

The first model call renders the whole conversation (system prompt, tools, messages, generation
prompt). Later calls render only the new messages, by rendering them after a dummy ``[system, user]``
prefix and taking the difference, which must be a clean suffix (a :class:`~tito_core.errors.TemplateError`
otherwise). Assistant turns are never re-rendered: the model's own tokens are the truth. Tokenizing is
``tito_core.render.codec``'s job, and ``escape_special_text`` is ``tito_core.render.escape``'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tito_core.conversation import ChatMessage
from tito_core.errors import TemplateError, UnsupportedContentError
from tito_core.render.codec import OFFLOAD_CHARS, OFFLOAD_TOKENS, check_unicode, id_list, offload, rust_codec
from tito_core.render.escape import SpecialTextEscaper

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["ChatMessage", "ChatRenderer", "first_difference"]

"""One chat-template message (``{"role": ..., "content": ...}``)."""

_DUMMY_PREFIX: list[ChatMessage] = [
    {"role": "system", "content": "tito dummy system"},
    {"role": "user", "content": "tito dummy user"},
]
_PROBE_MARK = "tito-probe-7f3a9c"


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Index of the first item where ``a`` and ``b`` differ (``min(len)`` if one prefixes the other)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ChatRenderer:
    """Renders chat messages with a tokenizer's chat template and tokenizes the result.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        chat_template: A template string overriding the tokenizer's own.
        template_kwargs: Extra variables for the template (e.g. ``{"enable_thinking": False}``).
        escape_special_text: Encode the content of system, user and tool messages as plain text, so that text
            spelling a control token (``<|im_end|>`` inside a tool result) stays text. By default it becomes the
            control token, as it does when vLLM / SGLang apply the same template. Needs a fast tokenizer.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        escape_special_text: bool = False,
    ) -> None:
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template; pass chat_template=...")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.template_kwargs: Mapping[str, Any] = MappingProxyType(dict(template_kwargs or {}))
        self.escape_special_text = escape_special_text
        self._rust_encode, self._rust_decode = rust_codec(tokenizer)
        self._escaper = SpecialTextEscaper(tokenizer) if escape_special_text else None

    def render(
        self,
        chat: Sequence[ChatMessage],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool,
    ) -> str:
        """Render chat messages to text with the chat template."""
        try:
            text = self.tokenizer.apply_chat_template(
                list(chat),
                tools=[dict(t) for t in tools] if tools else None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except UnicodeEncodeError as exc:
            raise UnsupportedContentError(
                f"a message holds text that is not valid Unicode ({exc}); it has no tokens: decode tool output "
                "with errors='replace'"
            ) from exc
        except Exception as exc:  # jinja errors, template "raise_exception" calls
            raise TemplateError(f"the chat template failed to render: {exc}") from exc
        if not isinstance(text, str):
            raise TemplateError(f"the chat template rendered {type(text).__name__}, expected text")
        return text

    def encode(self, text: str) -> list[int]:
        """Tokenize rendered text (the template already holds any special tokens it wants).

        Raises:
            UnsupportedContentError: the text is not valid Unicode (a lone surrogate, e.g. from a tool
                result decoded with ``surrogateescape``); it has no tokens.
        """
        try:
            if self._rust_encode is not None:
                return self._rust_encode(text)
            return self._tokenizer_encode(text)
        except (TypeError, UnicodeEncodeError) as exc:
            check_unicode(text)
            raise TemplateError(f"the tokenizer failed on the rendered text: {exc}") from exc

    def _tokenizer_encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    @cached_property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows (added tokens included): valid ids are below it."""
        return len(self.tokenizer)

    async def aencode(self, text: str) -> list[int]:
        """:meth:`encode`, on a worker thread when the text is long and the Rust backend is used.

        The Rust batch encoder releases the GIL, so many concurrent rollouts tokenize their tool results on
        other cores while the event loop goes on; short texts are tokenized inline (a thread hop costs
        more than they do).
        """
        if self._rust_encode is None or len(text) < OFFLOAD_CHARS:
            return self.encode(text)
        try:
            return await offload(self._rust_encode, text, self._tokenizer_encode)
        except (TypeError, UnicodeEncodeError):
            return self.encode(text)  # raises the typed error

    async def adecode(self, ids: Sequence[int]) -> str:
        """:meth:`decode`, on a worker thread for long outputs (see :meth:`aencode`)."""
        if self._rust_decode is None or len(ids) < OFFLOAD_TOKENS:
            return self.decode(ids)
        return await offload(self._rust_decode, id_list(ids), self._tokenizer_decode)

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenize, keeping special tokens."""
        as_list = id_list(ids)
        if self._rust_decode is not None:
            return self._rust_decode(as_list)
        return self._tokenizer_decode(as_list)

    def _tokenizer_decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if not isinstance(text, str):
            raise TemplateError(f"the tokenizer decoded to {type(text).__name__}, expected text")
        return text

    def initial_text(self, chat: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None) -> str:
        """The first prompt: the whole conversation plus the generation prompt."""
        return self.render(chat, tools=tools, add_generation_prompt=True)

    async def initial_ids(self, chat: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None) -> list[int]:
        """Token ids of :meth:`initial_text` (message contents as plain text with ``escape_special_text``)."""
        return await self._encode_rendered(lambda c: self.initial_text(c, tools), chat)

    async def continuation_ids(self, chat: Sequence[ChatMessage], *, close_turn: bool) -> tuple[list[int], int]:
        """Token ids of the boundary after the last output, ``chat`` and the generation prompt.

        Returns the ids and how many leading ones are the boundary. ``close_turn``: the output did not end
        with the end-of-turn token, so the boundary starts with it (the template's way of closing a turn).
        """
        eot, boundary = self.turn_tail
        if close_turn:
            boundary = eot + boundary
        ids = await self._encode_rendered(lambda c: boundary + self.continuation_text(c), chat)
        if not boundary:
            return ids, 0
        boundary_ids = self._boundary_ids.get(boundary)
        if boundary_ids is None:  # one of two texts per template: tokenized once, not on every call
            boundary_ids = self._boundary_ids[boundary] = self.encode(boundary)
        return ids, len(boundary_ids) if ids[: len(boundary_ids)] == boundary_ids else 0

    async def _encode_rendered(
        self, render: Callable[[Sequence[ChatMessage]], str], chat: Sequence[ChatMessage]
    ) -> list[int]:
        """Encode ``render(chat)``; with ``escape_special_text``, control-token text in contents stays text."""
        text = render(chat)
        if self._escaper is not None:
            spans = self._escaper.content_spans(text, chat, render)
            if spans:
                return self._escaper.encode(text, spans, self.encode)
        return await self.aencode(text)

    def continuation_text(self, chat: Sequence[ChatMessage]) -> str:
        """Text the template adds for ``chat`` (new non-assistant messages) plus the generation prompt.

        Raises:
            TemplateError: when the messages do not render as a clean suffix of the dummy prefix.
        """
        prefix = self._dummy_prefix_text
        full = self.render([*_DUMMY_PREFIX, *chat], add_generation_prompt=True)
        if not full.startswith(prefix):
            at = first_difference(prefix, full)
            raise TemplateError(
                "rendering new messages changed the text before them, so they cannot be tokenized "
                f"incrementally (first difference at character {at}: {prefix[at : at + 40]!r} became "
                f"{full[at : at + 40]!r}); this chat template is not incremental for these messages"
            )
        return full[len(prefix) :]

    @cached_property
    def renders_system_in_place(self) -> bool:
        """Whether the template renders a system message after the first user message where it stands.

        Some raise (Mistral's, Qwen3.5's), drop it (gpt-oss') or join it into the leading system prompt
        (DeepSeek V3's); a front then has to put it in the system prompt itself.
        """
        try:
            text = self.continuation_text([{"role": "system", "content": _PROBE_MARK}, _DUMMY_PREFIX[1]])
        except TemplateError:
            return False
        return 0 <= text.find(_PROBE_MARK) < text.find(str(_DUMMY_PREFIX[1]["content"]))

    def tools_move(self, chat: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]] | None) -> bool:
        """Whether adding messages like ``chat`` changes the text before them once tools are rendered too.

        Some templates place the tools block relative to the *last* user message (Mistral's before it), so
        a full render of a longer conversation moves it; rendering new messages without tools, as the
        incremental render does, would then silently differ from what the template gives. The answer
        depends on the tools and on the roles of the new messages; it is cached on those.
        """
        key = (json.dumps(list(tools or ()), sort_keys=True, default=str), tuple(m.get("role", "") for m in chat))
        known = self._tools_move.get(key)
        if known is not None:
            return known
        try:
            prefix = self.render(_DUMMY_PREFIX, tools=tools, add_generation_prompt=False)
            full = self.render([*_DUMMY_PREFIX, *chat], tools=tools, add_generation_prompt=True)
        except TemplateError:
            return False  # the incremental render reports its own error
        moves = self._tools_move[key] = not full.startswith(prefix)
        return moves

    @cached_property
    def _generation_prompt(self) -> tuple[str, list[int]]:
        """The text ``add_generation_prompt`` adds after a user message, and its ids."""
        try:
            text = self.continuation_text([])
        except TemplateError:
            return "", []  # a template that is not incremental here: the prompt's state stays unknown
        return text, self.encode(text) if text else []

    def opens_reasoning(self, prompt_ids: Sequence[int], think_start: str, think_end: str) -> bool:
        """Whether a prompt ending in this template's generation prompt leaves a reasoning block open.

        True when the generation prompt pre-opens ``think_start`` (Qwen3.5, Qwen3-Thinking-2507); False when it
        opens none (or opens and closes one, e.g. ``enable_thinking=False``), or when ``prompt_ids`` do not end
        with its tokens (not known to be open).
        """
        text, ids = self._generation_prompt
        if not ids or len(prompt_ids) < len(ids) or list(prompt_ids[len(prompt_ids) - len(ids) :]) != ids:
            return False
        return text.rfind(think_start) > text.rfind(think_end)

    @cached_property
    def _tools_move(self) -> dict[tuple[str, tuple[str, ...]], bool]:
        return {}

    @cached_property
    def _boundary_ids(self) -> dict[str, list[int]]:
        return {}

    @cached_property
    def _dummy_prefix_text(self) -> str:
        return self.render(_DUMMY_PREFIX, add_generation_prompt=False)

    @cached_property
    def turn_tail(self) -> tuple[str, str]:
        r"""``(end_of_turn, boundary)``: what the template writes after an assistant message's content.

        ``end_of_turn`` is the token the model itself generates to end its turn (``<|im_end|>`` for
        Qwen); ``boundary`` is what follows it up to the next message (``"\\n"`` for Qwen), which the
        model never generates. Both are empty for templates that write nothing there.
        """
        probe = [{"role": "user", "content": "tito probe"}, {"role": "assistant", "content": _PROBE_MARK}]
        text = self.render(probe, add_generation_prompt=False)
        at = text.rfind(_PROBE_MARK)
        if at < 0:
            raise TemplateError("the chat template does not render assistant message content verbatim")
        tail = text[at + len(_PROBE_MARK) :]
        if not tail:
            return "", ""
        first = self.encode(tail)[0]
        eot = self.decode([first]) if first in set(self.tokenizer.all_special_ids) or self._is_added(first) else ""
        if eot and tail.startswith(eot):
            return eot, tail[len(eot) :]
        return "", tail

    def _is_added(self, token_id: int) -> bool:
        decoder = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        return token_id in decoder

    @cached_property
    def end_of_turn_ids(self) -> frozenset[int]:
        """Token ids that end a turn: the template's end-of-turn token and the tokenizer's EOS."""
        ids: set[int] = set()
        eot, _ = self.turn_tail
        if eot:
            ids.update(self.encode(eot))
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        return frozenset(ids)
