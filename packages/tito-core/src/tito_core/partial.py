"""Partial rollouts: a generation an engine aborted for a weight update goes on from the tokens it kept.

An engine paused in abort mode (:func:`tito_core.weights.weight_update` with ``mode="abort"``) ends the requests
in flight with the tokens generated so far. Instead of losing them or starting the turn again, the model call
sends a **continuation** once the engine is resumed: the same prompt followed by those tokens, asking for the
tokens still allowed. The engine prefills the whole of it under the new weights and samples the rest, so every
token is recorded once, with the logprob and the weight version of the weights that sampled it, in one turn
(two version spans).

A call is continued only when its output can be: the backend takes token ids (not chat messages), and the
output was not constrained by a grammar or asked for MoE routing decisions (a grammar would start again from
its first symbol; routing rows would not line up). Constraints passed through ``SamplingParams.extra`` (an
engine's ``regex``) also start again in a continuation: leave them out of runs updated in abort mode.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Collection, Sequence

import msgspec

from .backend import Backend, Capabilities, GenerateRequest, GenerateResult
from .sampling_mask import joined_masks
from .versions import VersionSpan
from .weights import aborted_by_update, aborting_updates, wait_for_resume

__all__ = ["Progress", "cannot_continue", "continuation", "finished_anyway", "go_on", "joined"]

logger = logging.getLogger("tito")


def cannot_continue(request: GenerateRequest, backend: Backend | Capabilities) -> str | None:
    """Why ``request``'s output cannot be continued after an abort, or None when it can."""
    if backend.renders_prompt:
        return f"the {backend.name} backend renders the prompt from messages, so it cannot be sent tokens to go on from"
    if request.grammar is not None:
        return "its output was constrained by a grammar, which would start again in a continuation"
    if request.return_routed_experts:
        return "it asked for MoE routing decisions, which a continuation would not line up with"
    return None


def finished_anyway(
    request: GenerateRequest, cut: GenerateResult, end_of_turn_ids: Collection[int]
) -> GenerateResult | None:
    """``cut`` relabelled with the end it reached before the abort, or None when it had not ended.

    An abort can race the end of a generation: the output already holds every token the call allowed (it ends at
    its limit: ``length``) or ends with a token it stops on (``stop``). Then nothing is left to continue, and the
    call ends as the engine would have ended it; the tokens are the engine's, unchanged.
    """
    ids = cut.output_ids
    limit = request.sampling.max_new_tokens
    if limit is not None and len(ids) >= limit:
        return msgspec.structs.replace(cut, finish_reason="length", matched_stop=None)
    sampling = request.sampling
    stops = {*sampling.stop_token_ids, *(() if sampling.ignore_eos else end_of_turn_ids)}
    if ids and ids[-1] in stops:
        return msgspec.structs.replace(cut, finish_reason="stop", matched_stop=ids[-1])
    return None


def continuation(request: GenerateRequest, so_far: GenerateResult, number: int) -> GenerateRequest | None:
    """The request that goes on from ``so_far`` (every token of ``request`` generated until now), or None.

    None when ``request``'s token limit is already reached: nothing is left to generate. The continuation's id is
    ``request``'s with ``-c<number>``; its prompt is ``request``'s ids then ``so_far``'s output, all of it
    cacheable (``prefix_len``) and none of it asking for prompt logprobs.
    """
    done = len(so_far.output_ids)
    sampling = request.sampling
    if sampling.max_new_tokens is not None:
        left = sampling.max_new_tokens - done
        if left <= 0:
            return None
        sampling = msgspec.structs.replace(sampling, max_new_tokens=left)
    ids = array("i", request.input_ids)
    ids.extend(so_far.output_ids)
    return GenerateRequest(
        rid=f"{request.rid}-c{number}",
        input_ids=ids,
        prefix_len=len(ids),
        sampling=sampling,
        return_logprobs=request.return_logprobs,
        return_sampling_mask=request.return_sampling_mask,
        sequence=request.sequence,
    )


def joined(first: GenerateResult, then: GenerateResult) -> GenerateResult:
    """One result for a generation and its continuation: ``first``'s prompt fields, both outputs, ``then``'s end.

    Logprobs, kept sets and version spans are kept only where both parts have them (an empty part needs none); the
    continuation's spans are shifted past ``first``'s output.
    """
    n = len(first.output_ids)
    m = len(then.output_ids)
    spans: tuple[VersionSpan, ...] | None = None
    if _both(first.weight_versions, n, then.weight_versions, m):
        shifted = (VersionSpan(version=s.version, start=s.start + n, end=s.end + n) for s in then.weight_versions or ())
        spans = (*(first.weight_versions or ()), *shifted)
    logprobs: list[float] | None = None
    if _both(first.output_logprobs, n, then.output_logprobs, m):
        logprobs = [*(first.output_logprobs or ()), *(then.output_logprobs or ())]
    return msgspec.structs.replace(
        first,
        output_ids=[*first.output_ids, *then.output_ids],
        output_logprobs=logprobs,
        finish_reason=then.finish_reason,
        matched_stop=then.matched_stop,
        weight_versions=spans,
        sampling_mask=joined_masks(first.sampling_mask, then.sampling_mask),
    )


def _both(a: Sequence[object] | None, n: int, b: Sequence[object] | None, m: int) -> bool:
    """Whether parts of ``n`` and ``m`` tokens both have values (a part with no tokens needs none; not both)."""
    if a is None and b is None:
        return False
    return (a is not None or n == 0) and (b is not None or m == 0)


class Progress:
    """A call's result so far, and the ids of the continuations joined into it."""

    __slots__ = ("result", "rids")

    def __init__(self, result: GenerateResult) -> None:
        self.result = result
        self.rids: list[str] = []


async def go_on(
    backend: Backend,
    capabilities: Capabilities,
    request: GenerateRequest,
    progress: Progress,
    *,
    end_of_turn_ids: Collection[int],
    check: Callable[[GenerateRequest, GenerateResult], None],
    rollout_id: str,
) -> None:
    """Continue an output a weight update aborted, after the resume, until it ends for another reason.

    Each :func:`continuation` sends the prompt and the tokens so far and asks for the rest; ``check`` validates
    every answer before it is joined; ``progress`` holds the joined result and the continuations' ids.
    """
    reason = cannot_continue(request, capabilities)
    if reason is not None:
        logger.warning(
            "rollout %s: a weight update aborted a call after %d tokens, which is not continued: %s",
            rollout_id,
            len(progress.result.output_ids),
            reason,
        )
        return
    while True:
        so_far = progress.result
        ended = finished_anyway(request, so_far, end_of_turn_ids)
        if ended is not None:
            progress.result = ended  # the abort raced the end of the output: nothing is left to generate
            return
        await wait_for_resume(backend)
        follow = continuation(request, so_far, len(progress.rids) + 1)
        if follow is None:
            return
        logger.info(
            "rollout %s: a weight update aborted request %s after %d tokens; continuing it as %s",
            rollout_id,
            request.rid,
            len(so_far.output_ids),
            follow.rid,
        )
        updates = aborting_updates(backend)
        more = await backend.generate(follow)
        check(follow, more)
        progress.rids.append(follow.rid)
        progress.result = joined(so_far, more)
        if more.finish_reason != "abort" or not aborted_by_update(backend, updates):
            return
