"""Token ids from text and back, fast: the Rust shortcut of a fast tokenizer and the worker threads.

:func:`rust_codec` calls a Hugging Face fast tokenizer's Rust backend directly where that gives exactly what
the tokenizer's own methods give; :func:`offload` runs long encodes and decodes on a small thread pool
(the Rust batch encoder releases the GIL). A tokenizer that another thread is changing at that moment
raises a ``RuntimeError`` whose message says so; :func:`is_busy_tokenizer` tells those apart from every
other ``RuntimeError`` by the exact texts in :data:`BUSY_TOKENIZER_MESSAGES`, and only those fall back to
the calling thread.
"""

from __future__ import annotations

import asyncio
import os
import threading
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tito_core.errors import UnsupportedContentError

__all__ = [
    "BUSY_TOKENIZER_MESSAGES",
    "OFFLOAD_CHARS",
    "OFFLOAD_TOKENS",
    "check_unicode",
    "id_list",
    "is_busy_tokenizer",
    "offload",
    "rust_codec",
]

_In = TypeVar("_In")
_Out = TypeVar("_Out")

OFFLOAD_CHARS = 4_096
"""Texts at least this long are tokenized on a worker thread (about 1k tokens, ~1 ms of Rust)."""
OFFLOAD_TOKENS = 1_024
"""Outputs at least this long are detokenized on a worker thread."""

BUSY_TOKENIZER_MESSAGES: dict[str, str] = {
    # PyO3's borrow errors, raised by the ``tokenizers`` library (its Rust objects are PyO3 classes).
    # tokenizers <= 0.22 raises the first when a thread changes a Tokenizer (truncation, padding) while
    # another thread encodes with it; 0.23 makes the Tokenizer's own setters wait on a lock instead, and
    # raises them from its other objects (tests/core/test_chat_codec.py provokes one and checks both
    # texts against the installed library).
    "Already borrowed": "tokenizers: an object was changed while another call was using it",
    "Already mutably borrowed": "tokenizers: an object was used while another call was changing it",
    # concurrent.futures: the worker pool is gone (the interpreter is shutting down)
    "cannot schedule new futures after interpreter shutdown": "concurrent.futures: no worker thread any more",
}
"""The ``RuntimeError`` messages after which the work is done on the calling thread instead, with why."""

_workers: ThreadPoolExecutor | None = None
_lock = threading.Lock()  # guards _workers


def is_busy_tokenizer(exc: BaseException) -> bool:
    """Whether ``exc`` says the tokenizer (or the worker pool) could not take the work now, nothing worse."""
    return isinstance(exc, RuntimeError) and str(exc) in BUSY_TOKENIZER_MESSAGES


def id_list(ids: Sequence[int]) -> list[int]:
    """``ids`` as a list of Python ints (an ``array`` converted in one call)."""
    return ids.tolist() if isinstance(ids, array) else list(ids)


def _worker_pool() -> ThreadPoolExecutor:
    global _workers
    with _lock:
        if _workers is None:
            workers = min(8, os.cpu_count() or 1)
            _workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tito-tokenize")
        return _workers


async def offload(work: Callable[[_In], _Out], arg: _In, inline: Callable[[_In], _Out]) -> _Out:
    """``work(arg)`` on the worker pool; ``inline(arg)`` on this thread if the tokenizer is busy being changed.

    Raises:
        RuntimeError: any other ``RuntimeError`` of ``work`` (see :func:`is_busy_tokenizer`).
    """
    try:
        return await asyncio.get_running_loop().run_in_executor(_worker_pool(), work, arg)
    except RuntimeError as exc:
        if not is_busy_tokenizer(exc):
            raise
        return inline(arg)


def check_unicode(text: str) -> None:
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


def rust_codec(
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
