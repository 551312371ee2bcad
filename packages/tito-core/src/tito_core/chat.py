"""Incremental rendering with the chat template (the Strands conversion moved to :mod:`tito_core.strands_messages`).

The first model call renders the whole conversation (system prompt, tools, messages, generation
prompt). Later calls render only the new messages, by rendering them after a dummy ``[system, user]``
prefix and taking the difference, which must be a clean suffix (a :class:`TemplateError` otherwise).
Assistant turns are never re-rendered: the model's own tokens are the truth.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from .conversation import ChatMessage as ChatMessage
from .conversation import tool_specs_to_chat as tool_specs_to_chat
from .errors import ConfigError, TemplateError, UnsupportedContentError
from .strands_messages import TEXT_JOINER as TEXT_JOINER
from .strands_messages import system_text as system_text
from .strands_messages import to_chat_messages as to_chat_messages

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_In = TypeVar("_In")
_Out = TypeVar("_Out")

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


OFFLOAD_CHARS = 4_096
"""Texts at least this long are tokenized on a worker thread (about 1k tokens, ~1 ms of Rust)."""
OFFLOAD_TOKENS = 1_024
"""Outputs at least this long are detokenized on a worker thread."""
_SHARED_RENDERERS = 16
_shared: OrderedDict[tuple[int, str | None, str, bool], ChatRenderer] = OrderedDict()
_workers: ThreadPoolExecutor | None = None
_lock = threading.Lock()  # guards _shared and _workers


def _id_list(ids: Sequence[int]) -> list[int]:
    return ids.tolist() if isinstance(ids, array) else list(ids)


def _worker_pool() -> ThreadPoolExecutor:
    global _workers
    with _lock:
        if _workers is None:
            workers = min(8, os.cpu_count() or 1)
            _workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tito-tokenize")
        return _workers


async def _offload(work: Callable[[_In], _Out], arg: _In, inline: Callable[[_In], _Out]) -> _Out:
    """``work(arg)`` on the worker pool; ``inline(arg)`` on this thread if the tokenizer is busy being changed."""
    try:
        return await asyncio.get_running_loop().run_in_executor(_worker_pool(), work, arg)
    except RuntimeError:  # the Rust tokenizer was mutably borrowed elsewhere ("Already borrowed")
        return inline(arg)


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
        self._rust_encode, self._rust_decode = _rust_codec(tokenizer)
        self._escaper = _SpecialTextEscaper(tokenizer) if escape_special_text else None

    @classmethod
    def shared(
        cls,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        escape_special_text: bool = False,
    ) -> ChatRenderer:
        """The renderer for ``tokenizer``, shared by every model with the same tokenizer object and settings.

        A renderer learns a few things about its template once (the dummy-prefix text, the end-of-turn
        tokens, whether the Rust shortcut is exact); sharing it spares every new rollout that work. The
        cache holds the last :data:`_SHARED_RENDERERS` combinations. A mistral-common tokenizer (transformers'
        ``MistralCommonBackend``) gets a :class:`~tito_core.mistral.MistralCommonRenderer`, which encodes
        with mistral-common as vLLM and SGLang do for Mistral models.

        Raises:
            ConfigError: ``chat_template`` given with a mistral-common tokenizer (it has no template).
        """
        from .mistral import MistralCommonRenderer, is_mistral_common

        make: Callable[[], ChatRenderer]
        if is_mistral_common(tokenizer):
            if chat_template is not None:
                raise ConfigError(
                    "chat_template= cannot be used with a mistral-common tokenizer (MistralCommonBackend): it "
                    "encodes conversations with mistral-common, which has no chat template, as vLLM and SGLang "
                    "do in their mistral tokenizer mode. Drop chat_template= (tito then encodes with "
                    "mistral-common too), or load the model's Hugging Face tokenizer (tokenizer.json) to render "
                    "with a template"
                )
            make = lambda: MistralCommonRenderer(tokenizer, template_kwargs=template_kwargs)  # noqa: E731
        else:
            make = lambda: cls(  # noqa: E731
                tokenizer,
                chat_template=chat_template,
                template_kwargs=template_kwargs,
                escape_special_text=escape_special_text,
            )
        try:
            kwargs_key = json.dumps(dict(template_kwargs or {}), sort_keys=True)
        except (TypeError, ValueError):  # unusual template variables: no sharing
            return make()
        key = (id(tokenizer), chat_template, kwargs_key, escape_special_text)
        with _lock:
            renderer = _shared.get(key)
            if renderer is not None and renderer.tokenizer is tokenizer:
                _shared.move_to_end(key)
                return renderer
        renderer = make()
        with _lock:
            _shared[key] = renderer  # the renderer holds the tokenizer, so its id stays unique while cached
            while len(_shared) > _SHARED_RENDERERS:
                _shared.popitem(last=False)
        return renderer

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
            _check_unicode(text)
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
            return await _offload(self._rust_encode, text, self._tokenizer_encode)
        except (TypeError, UnicodeEncodeError):
            return self.encode(text)  # raises the typed error

    async def adecode(self, ids: Sequence[int]) -> str:
        """:meth:`decode`, on a worker thread for long outputs (see :meth:`aencode`)."""
        if self._rust_decode is None or len(ids) < OFFLOAD_TOKENS:
            return self.decode(ids)
        return await _offload(self._rust_decode, _id_list(ids), self._tokenizer_decode)

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenize, keeping special tokens."""
        as_list = _id_list(ids)
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
        boundary_ids = self.encode(boundary)
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
    def _tools_move(self) -> dict[tuple[str, tuple[str, ...]], bool]:
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


def _check_unicode(text: str) -> None:
    """Raise :class:`UnsupportedContentError` naming where ``text`` stops being encodable Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        around = text[max(0, exc.start - 20) : exc.end + 20]
        raise UnsupportedContentError(
            f"text holds a lone surrogate {text[exc.start]!r} at character {exc.start} ({around!r}): it is not "
            "valid Unicode and has no tokens; decode tool output with errors='replace'"
        ) from None


_CODEC_PROBE = 'tito probe: Grüße, 世界 🙂 \t\n  x=[1, 2]<|im_end|>\n<think>\n</think> {"a": null}'


def _rust_codec(
    tokenizer: Any,
) -> tuple[Callable[[str], list[int]] | None, Callable[[list[int]], str] | None]:
    """``encode`` / ``decode`` straight on a fast tokenizer's Rust backend, where that is exactly the same.

    ``tokenizer.encode`` / ``decode`` of a Hugging Face fast tokenizer add per-call Python work (input
    validation, converting every id of the list back to Python ints) that costs more than the Rust call
    on long texts. The shortcut is taken only when the backend is configured as transformers would use it
    (no truncation, padding or special-token splitting; no clean-up of spaces on decode) and it agrees with
    the tokenizer's own methods on a probe text; otherwise tito keeps calling the tokenizer.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(tokenizer, "is_fast", False):
        return None, None
    try:
        plain = (
            backend.truncation is None
            and backend.padding is None
            and not getattr(tokenizer, "split_special_tokens", False)
            and not backend.encode_special_tokens
        )
        if not plain:
            return None, None

        # The batch encoders release the GIL while Rust works (``encode`` of one text holds it most of the
        # time: the event loop ran at 14 % of its speed beside it), so the loop and other rollouts go on
        # meanwhile; ``encode_batch_fast`` (tokenizers >= 0.21) also skips the offsets (~15 % faster).
        # ``decode`` leaves the GIL.
        encode_batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

        def encode(text: str) -> list[int]:
            ids: list[int] = encode_batch([text], add_special_tokens=False)[0].ids
            return ids

        def decode(ids: list[int]) -> str:
            text: str = backend.decode(ids, skip_special_tokens=False)
            return text

        probe_ids = tokenizer.encode(_CODEC_PROBE, add_special_tokens=False)
        if encode(_CODEC_PROBE) != probe_ids:
            return None, None
        same_decode = not getattr(tokenizer, "clean_up_tokenization_spaces", False) and decode(
            probe_ids
        ) == tokenizer.decode(probe_ids, skip_special_tokens=False)
        return encode, decode if same_decode else None
    except Exception:  # an unusual tokenizer object: keep to its public methods
        return None, None


class _SpecialTextEscaper:
    """Encodes rendered text so that control-token text inside message contents stays plain text.

    A fast tokenizer cuts its added tokens (control tokens) out of the text first and encodes the pieces
    between them on their own. Escaping keeps that, but cuts only at the added tokens the *template*
    wrote: the pieces, message contents included, are encoded by a copy of the tokenizer that has no added
    tokens. Ids outside the contents are therefore the same as a plain encode.
    """

    def __init__(self, tokenizer: Any) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or not getattr(tokenizer, "is_fast", False):
            raise ConfigError(
                f"escape_special_text needs a fast (Rust) Hugging Face tokenizer, got {type(tokenizer).__name__}"
            )
        from tokenizers import Tokenizer

        spec = json.loads(backend.to_str())
        added = {str(t["content"]): int(t["id"]) for t in spec.get("added_tokens", [])}
        spec["added_tokens"] = []
        self._plain = Tokenizer.from_str(json.dumps(spec))
        self._ids = added
        # leftmost, then longest, as the tokenizer matches its added tokens
        self._pattern = (
            re.compile("|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))) if added else None
        )
        self._checked = False

    def content_spans(
        self, text: str, chat: Sequence[ChatMessage], render: Callable[[Sequence[ChatMessage]], str]
    ) -> list[tuple[int, int]]:
        """Where in ``text`` (``render(chat)``) the non-assistant contents holding control-token text are.

        Found by rendering again with a placeholder for each such content, so the template's own markup is
        never mistaken for content. Empty when no content holds control-token text.

        Raises:
            TemplateError: the template does not render such a content verbatim.
        """
        pattern = self._pattern
        if pattern is None:
            return []
        contents: dict[str, str] = {}
        marked: list[ChatMessage] = []
        for k, message in enumerate(chat):
            content = message.get("content")
            if message.get("role") != "assistant" and isinstance(content, str) and pattern.search(content):
                mark = f"\ue000tito-escape-{k}\ue001"
                contents[mark] = content
                message = {**message, "content": mark}
            marked.append(message)
        if not contents:
            return []
        spans: list[tuple[int, int]] = []
        rebuilt: list[str] = []
        at = 0
        for piece in re.split("(" + "|".join(map(re.escape, contents)) + ")", render(marked)):
            if piece in contents:
                piece = contents[piece]
                spans.append((at, at + len(piece)))
            rebuilt.append(piece)
            at += len(piece)
        if "".join(rebuilt) != text:
            raise TemplateError(
                "escape_special_text: the chat template does not render message contents verbatim, so their "
                "control-token text cannot be told from the template's own"
            )
        return spans

    def encode(self, text: str, spans: Sequence[tuple[int, int]], encode: Callable[[str], list[int]]) -> list[int]:
        """The ids of ``text`` with the added tokens inside ``spans`` encoded as plain text.

        Raises:
            TemplateError: the tokenizer's added tokens do not behave as plain cut points (the escape would
                not be exact).
        """
        if not self._checked:  # once: with no content excluded, the escape must reproduce the tokenizer exactly
            if self._cut(text, []) != encode(text):
                raise TemplateError(
                    "escape_special_text: this tokenizer's added tokens are not plain cut points (normalized or "
                    "whitespace-stripping added tokens), so the escape would not be exact"
                )
            self._checked = True
        return self._cut(text, spans)

    def _cut(self, text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
        assert self._pattern is not None
        ids: list[int] = []
        start = 0
        for match in self._pattern.finditer(text):
            if any(lo <= match.start() < hi for lo, hi in spans):
                continue
            if match.start() > start:
                ids.extend(self._plain.encode(text[start : match.start()], add_special_tokens=False).ids)
            ids.append(self._ids[match.group()])
            start = match.end()
        if start < len(text):
            ids.extend(self._plain.encode(text[start:], add_special_tokens=False).ids)
        return ids
