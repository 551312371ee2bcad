"""``escape_special_text``: encode rendered text so that control-token text inside message contents stays text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from tito_core.errors import ConfigError, TemplateError

__all__ = ["SpecialTextEscaper"]

_Message = dict[str, Any]  # a chat-template message, as the renderers take them


class SpecialTextEscaper:
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
        self, text: str, chat: Sequence[_Message], render: Callable[[Sequence[_Message]], str]
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
        marked: list[_Message] = []
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
