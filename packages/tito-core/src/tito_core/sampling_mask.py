"""Sampling masks: the kept set of every output token under truncated sampling (top-k, top-p, min-p).

With truncation the engine samples from the distribution renormalised over a kept set, not from the full
vocabulary; a trainer that takes a log-softmax over the full vocabulary is off by the kept mass ``log S`` at every
token (:mod:`tito_core.kept_logprobs` is the fix). :class:`SamplingMask` holds the kept sets of one call's output
in CSR form: the kept ids row after row and ``rows + 1`` offsets, both little-endian int32, so a token costs
4 bytes per kept id plus 4 (docs/performance.md). A request that does not truncate records none
(:meth:`~tito_core.backend.SamplingParams.truncates`).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence

import msgspec

__all__ = ["SamplingMask", "joined_masks"]

_LITTLE = sys.byteorder == "little"


def _int32(values: Iterable[int]) -> bytes:
    out = array("i", values)
    if not _LITTLE:  # pragma: no cover - no big-endian CI machine
        out.byteswap()
    return out.tobytes()


def _ints(data: bytes) -> array[int]:
    out = array("i")
    out.frombytes(data)
    if not _LITTLE:  # pragma: no cover
        out.byteswap()
    return out


class SamplingMask(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """The kept set of each output token of one call, CSR.

    Attributes:
        token_ids: The kept ids of every row, row after row (little-endian int32; base64 in JSON).
        offsets: ``rows + 1`` little-endian int32 offsets into ``token_ids``, from 0: row ``i`` is
            ``token_ids[offsets[i]:offsets[i + 1]]``.
        temperature: The sampling temperature ``T`` the sets were kept at (from ``softmax(logits / T)``), as the
            request set it (the core stamps it when it records the call; 1.0 when the request left the engine's
            default).
    """

    token_ids: bytes
    offsets: bytes
    temperature: float = 1.0

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[int]]) -> SamplingMask:
        """The mask of these rows (one sequence of kept ids per output token)."""
        ids: array[int] = array("i")
        offsets = array("i", [0])
        for row in rows:
            ids.extend(row)
            offsets.append(len(ids))
        if not _LITTLE:  # pragma: no cover
            ids.byteswap()
            offsets.byteswap()
        return cls(token_ids=ids.tobytes(), offsets=offsets.tobytes())

    @classmethod
    def from_csr(cls, token_ids: Iterable[int], offsets: Iterable[int]) -> SamplingMask:
        """The mask of flat kept ids and their ``rows + 1`` offsets."""
        return cls(token_ids=_int32(token_ids), offsets=_int32(offsets))

    @property
    def rows(self) -> int:
        """How many output tokens the mask covers."""
        return max(len(self.offsets) // 4 - 1, 0)

    def csr(self) -> tuple[array[int], array[int]]:
        """The kept ids and the offsets as ``array('i')``."""
        return _ints(self.token_ids), _ints(self.offsets)

    def to_lists(self) -> list[list[int]]:
        """One list of kept ids per output token."""
        ids, offsets = self.csr()
        return [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]

    def problem(self, output_ids: Sequence[int], vocab_size: int) -> str | None:
        """What is wrong with this mask as the kept sets of ``output_ids``, or None when it fits.

        One row per output token, offsets from 0 that never go down and end at the number of ids, kept ids in
        the vocabulary, and each sampled token in its own row.
        """
        if len(self.token_ids) % 4 or len(self.offsets) % 4:
            return "its byte strings are not int32 data"
        ids, offsets = self.csr()
        if len(offsets) != len(output_ids) + 1:
            return f"{max(len(offsets) - 1, 0)} rows for {len(output_ids)} output tokens"
        if offsets[0] != 0 or offsets[-1] != len(ids):
            return f"offsets run from {offsets[0]} to {offsets[-1]}, not from 0 to {len(ids)}"
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):
            return f"a kept id is outside the vocabulary of {vocab_size}"
        for i, token in enumerate(output_ids):
            start, end = offsets[i], offsets[i + 1]
            if end < start:
                return f"offsets go down at row {i}"
            if token not in ids[start:end]:
                return f"output token {i} (id {token}) is not in its own kept set"
        return None


def joined_masks(first: SamplingMask | None, then: SamplingMask | None) -> SamplingMask | None:
    """The mask of an output and its continuation (None unless both parts have one)."""
    if first is None or then is None:
        return None
    ids, offsets = first.csr()
    more_ids, more_offsets = then.csr()
    base = offsets[-1]
    offsets.extend(base + o for o in more_offsets[1:])
    ids.extend(more_ids)
    return SamplingMask(token_ids=_int32(ids), offsets=_int32(offsets), temperature=first.temperature)
