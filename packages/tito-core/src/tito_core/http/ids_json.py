"""The JSON text of each sequence's ids, kept by an HTTP adapter so that a call encodes only its new ids.

An adapter that sends the whole prompt as a JSON array each call (SGLang without sessions, vLLM's token
routes) would convert every id of a long trajectory again on every call (~0.12 us a token). Within one
:attr:`~tito_core.backend.GenerateRequest.sequence` the ids only grow, so :class:`IdsJson` keeps the text of
``input_ids[:prefix_len]`` per sequence and extends it with what the next request adds. A request that does
not extend what is kept (another sequence's, or a shorter one) gets a fresh text; the text is dropped when the
core ends the sequence (:meth:`IdsJson.end`) and the oldest are dropped past a byte budget.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence

import msgspec

from ..backend import GenerateRequest

__all__ = ["IdsJson"]

_JSON = msgspec.json.Encoder()


class _Text:
    """The ids of a sequence up to ``count`` as JSON (no brackets), and the last of them (a cheap check)."""

    __slots__ = ("body", "count", "last")

    def __init__(self) -> None:
        self.body = bytearray()
        self.count = 0
        self.last = -1


def _ids(values: Sequence[int]) -> list[int]:
    return values.tolist() if isinstance(values, array) else list(values)


class IdsJson:
    """Per-sequence JSON of the ids sent, so a request's JSON costs O(new ids), byte for byte msgspec's.

    Args:
        max_bytes: Texts kept in all; past it the least recently used sequences are dropped (and rebuilt, at
            full cost, if they come back).
    """

    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self._texts: OrderedDict[str, _Text] = OrderedDict()
        self._bytes = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()  # a backend may be shared by event loops in several threads

    def encode(self, request: GenerateRequest) -> bytes:
        """``request.input_ids`` as a JSON array (what ``msgspec.json.encode(list(ids))`` gives)."""
        ids = request.input_ids
        if request.sequence is None:
            return _JSON.encode(_ids(ids))
        with self._lock:
            text = self._texts.pop(request.sequence, None)
            if text is not None:
                self._bytes -= len(text.body)
        cut = request.prefix_len
        if text is None or text.count > cut or (text.count and ids[text.count - 1] != text.last):
            text = _Text()
        if text.count < cut:
            tail = _JSON.encode(_ids(ids[text.count : cut]))[1:-1]
            if text.body:
                text.body += b","
            text.body += tail
            text.count, text.last = cut, ids[cut - 1]
        new = _JSON.encode(_ids(ids[cut:]))
        with self._lock:
            self._texts[request.sequence] = text
            self._bytes += len(text.body)
            while self._bytes > self._max_bytes and len(self._texts) > 1:
                _, dropped = self._texts.popitem(last=False)
                self._bytes -= len(dropped.body)
        if not text.body:
            return new
        # one join: each ``+`` of a long body would copy all of it again (~0.4 ms per copy at 137k tokens)
        return b"".join((b"[", text.body, b"]" if len(new) == 2 else b"," + new[1:]))

    def end(self, sequence: str) -> None:
        """Forget ``sequence`` (the core ended it: a fork, a reset, a failed call)."""
        with self._lock:
            text = self._texts.pop(sequence, None)
            if text is not None:
                self._bytes -= len(text.body)

    def __len__(self) -> int:
        return len(self._texts)
