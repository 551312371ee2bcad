"""One request as the embedded backend's worker thread sees it, and how its answer reaches the caller's event loop.

A :class:`_Job` carries the request, its sampling settings (filled before it is queued) and what decoding has
produced so far; :func:`_finish` builds its :class:`~tito_core.backend.GenerateResult` and :func:`_deliver`
resolves its future on the loop that awaits it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from tito_core.backend import FinishReason, GenerateRequest, GenerateResult
from tito_core.sampling_mask import SamplingMask
from tito_core.versions import VersionSpan

if TYPE_CHECKING:
    import torch

    from ._vision import _Pixels


class _Job:
    """One request as the worker sees it; fields after ``future`` are written by the worker thread only."""

    __slots__ = (
        "bitmask",
        "cancelled",
        "future",
        "generator",
        "greedy",
        "input_ids",
        "kept",
        "logprobs",
        "loop",
        "matcher",
        "max_new",
        "never",
        "output_ids",
        "pixels",
        "position",
        "prefix_len",
        "prompt_logprobs",
        "request",
        "rope_delta",
        "routing",
        "routing_shape",
        "stop_ids",
        "stop_strings",
        "temperature",
        "top_k",
        "top_p",
        "versions",
    )

    def __init__(self, request: GenerateRequest, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self.request = request
        self.input_ids = [int(i) for i in request.input_ids]
        self.prefix_len = request.prefix_len
        self.loop = loop
        self.future = future
        self.cancelled = False  # set from the event loop's thread; read by the worker between steps
        self.temperature = 1.0
        self.greedy = False
        self.top_p = 1.0
        self.top_k = 0
        self.max_new = 0
        self.stop_ids: frozenset[int] = frozenset()
        self.stop_strings: tuple[str, ...] = ()
        self.generator: torch.Generator | None = None
        self.matcher: Any = None  # xgrammar.GrammarMatcher of a constrained request (set before it is queued)
        self.bitmask: torch.Tensor | None = None  # its next-token mask, one bit per vocabulary id
        self.never: torch.Tensor | None = None  # ids never sampled (vision placeholders), set before queueing
        self.pixels: _Pixels | None = None  # the prompt's images' vision inputs, set before queueing
        self.rope_delta = 0  # a prompt with images: its next position minus its length (MRoPE)
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.kept: list[list[int]] | None = [] if request.return_sampling_mask else None  # each token's kept set
        self.prompt_logprobs: list[float | None] | None = None
        # routing rows (int32 bytes) from position routing_start() on, while the request asks and capture works
        self.routing: list[bytes] | None = [] if request.return_routed_experts else None
        self.routing_shape: tuple[int, int] | None = None  # (layers, top_k) once a row was captured
        self.position = 0  # tokens of this row already in the KV cache
        self.versions: list[tuple[str | None, int]] = []  # (weight version, first output index) at each change


def _finish(job: _Job, reason: FinishReason, matched: str | int | None = None) -> None:
    request = job.request
    result = GenerateResult(
        output_ids=list(job.output_ids),
        output_logprobs=list(job.logprobs) if request.return_logprobs else None,
        finish_reason=reason,
        matched_stop=matched,
        prompt_ids=job.input_ids,
        prompt_logprobs=job.prompt_logprobs if request.return_prompt_logprobs else None,
        prompt_tokens=len(job.input_ids),
        cached_tokens=0,
        weight_versions=_spans(job),
        sampling_mask=SamplingMask.from_rows(job.kept) if job.kept is not None else None,
        **_routed_experts(job),
    )
    _deliver(job, result)


def routing_start(job: _Job) -> int:
    """The first routing row a request gets: the previous call returned the rows before it (as SGLang's adapter asks).

    A sequence of N tokens has N - 1 rows (its last token was never fed to the model): after a call that ended at N1
    tokens, rows ``0 .. N1 - 2`` are recorded, and the next call (``prefix_len == N1``) starts at row N1 - 1.
    """
    return max(job.prefix_len - 1, 0)


def _routed_experts(job: _Job) -> dict[str, Any]:
    """The result's routing fields: rows ``routing_start .. len(input_ids) + len(output_ids) - 2``, or none."""
    shape = job.routing_shape
    if job.routing is None or shape is None:
        return {}
    start = routing_start(job)
    rows = max(len(job.input_ids) + len(job.output_ids) - 1 - start, 0)
    data = b"".join(job.routing)[: rows * shape[0] * shape[1] * 4]  # a prompt-only call fed its last token too
    if len(data) != rows * shape[0] * shape[1] * 4:  # a row was not captured: none rather than rows out of place
        return {}
    return {"routed_experts": data, "routed_experts_start": start, "routed_experts_shape": shape}


def _spans(job: _Job) -> tuple[VersionSpan, ...] | None:
    """The job's version spans over its output; None when it has no output or a token was sampled unlabelled."""
    if not job.versions or any(version is None for version, _ in job.versions):
        return None
    ends = [start for _, start in job.versions[1:]] + [len(job.output_ids)]
    return tuple(
        VersionSpan(version=version, start=start, end=end)
        for (version, start), end in zip(job.versions, ends, strict=True)
        if version is not None
    )


def _deliver(job: _Job, outcome: GenerateResult | BaseException) -> None:
    """Resolve the job's future on its own event loop (ignored if it was cancelled or the loop is gone)."""

    def resolve() -> None:
        if job.future.done():
            return
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the loop was closed: nobody waits for this answer
        job.loop.call_soon_threadsafe(resolve)
