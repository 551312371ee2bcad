"""Validation of an engine's answer: nothing enters a trajectory before :func:`check_result` accepts it.

Ids must be in the tokenizer's vocabulary, each output id must have one finite logprob <= 0, the finish reason
must be known, a token-in prompt echoed back must equal what was sent, and weight-version spans must cover the
output. No output id may be one the request said never to sample (vision placeholders), and for a prompt with
images the engine's ``prompt_tokens`` must be the expanded length tito sent (an engine that expanded the
placeholders again, or not at all, consumed other tokens than the trajectory would record). That check lives
here, once, because it compares the answer with the request, as the prompt echo check does.

A failed check is a :class:`~tito_core.errors.BackendResponseError` naming the field and the value.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import cast

from ..backend import GenerateRequest, GenerateResult
from ..errors import BackendResponseError
from ..render.renderer import first_difference
from ..versions import check_spans

__all__ = ["bad_answer", "check_result"]

_FINISH_REASONS = frozenset({"stop", "length", "abort"})
_LOGPROB_SLACK = 1e-6  # float error of a log-softmax at a token of probability ~1
SHOWN = 8  # ids shown in an error message


def bad_answer(backend: str, field: str, value: object, detail: str) -> BackendResponseError:
    """The error for an answer whose ``field`` holds ``value``, which is wrong as ``detail`` says."""
    return BackendResponseError(f"{backend}: invalid {field}: {detail}", field=field, value=value, backend=backend)


def _check_ids(ids: Sequence[int], vocab_size: int, backend: str, field: str) -> None:
    if not len(ids):
        return
    try:
        packed = array("q", ids)
    except TypeError:
        wrong = next(i for i in ids if not isinstance(i, int))
        raise bad_answer(backend, field, wrong, f"token ids must be integers, got {wrong!r}") from None
    except OverflowError:
        huge = next(i for i in ids if not -(2**63) <= i < 2**63)
        raise bad_answer(backend, field, huge, f"token id {huge} is outside the tokenizer's vocabulary") from None
    values = ids if isinstance(ids, list) else packed  # min / max walk a list faster than an array
    low, high = min(values), max(values)
    if low < 0:
        raise bad_answer(backend, field, low, f"negative token id {low}")
    if high >= vocab_size:
        raise bad_answer(
            backend, field, high, f"token id {high} is outside the tokenizer's vocabulary (size {vocab_size})"
        )


_NUMBERS = frozenset({float, int})


def _plainly_valid(values: Sequence[float | None]) -> bool:
    """True when every value is a finite float or int <= the slack, checked in C (a 9k-token output: ~0.4 ms).

    All finite and <= 0 makes the sum finite; a NaN or an infinity makes it NaN or infinite. False (also for
    None entries or a huge sum that overflows) only means "look closer": the loop names the culprit.
    """
    if not set(map(type, values)) <= _NUMBERS:
        return False
    numbers = cast("Sequence[float]", values)
    try:
        return math.isfinite(sum(numbers)) and max(numbers) <= _LOGPROB_SLACK
    except OverflowError:  # ints too large for a float
        return False


def _check_logprobs(values: Sequence[float | None], backend: str, field: str, *, allow_none: bool) -> None:
    if len(values) and _plainly_valid(values):
        return
    for position, value in enumerate(values):
        if value is None:
            if allow_none:
                continue
            raise bad_answer(backend, field, None, f"no logprob at position {position}")
        if type(value) not in (float, int) or not math.isfinite(value) or value > _LOGPROB_SLACK:
            raise bad_answer(
                backend, field, value, f"logprob {value!r} at position {position} is not a finite number <= 0"
            )


def check_result(request: GenerateRequest, result: GenerateResult, *, vocab_size: int, backend: str) -> None:
    """Check that an engine answer is self-consistent and fits the request before anything is recorded.

    Raises:
        BackendResponseError: naming the field and the value at fault.
    """
    if not isinstance(result, GenerateResult):
        raise bad_answer(backend, "result", type(result).__name__, "generate() must return a GenerateResult")
    output_ids = result.output_ids
    _check_ids(output_ids, vocab_size, backend, "output_ids")
    if request.never_sample and output_ids:
        banned = set(request.never_sample).intersection(output_ids)
        if banned:
            token = min(banned)
            raise bad_answer(
                backend,
                "output_ids",
                token,
                f"the engine sampled token {token}, which the request marks never_sample (a vision placeholder)",
            )
    if result.finish_reason not in _FINISH_REASONS:
        raise bad_answer(backend, "finish_reason", result.finish_reason, "expected 'stop', 'length' or 'abort'")
    lps = result.output_logprobs
    if lps is not None:
        if len(lps) != len(output_ids):
            raise bad_answer(
                backend, "output_logprobs", len(lps), f"{len(lps)} logprobs for {len(output_ids)} output ids"
            )
        _check_logprobs(lps, backend, "output_logprobs", allow_none=False)
    elif request.return_logprobs and output_ids:
        raise bad_answer(backend, "output_logprobs", None, "logprobs were requested but the engine returned none")
    if result.prompt_ids is not None:
        _check_ids(result.prompt_ids, vocab_size, backend, "prompt_ids")
        if request.messages is None:  # token-in: the engine must have consumed exactly what was sent
            try:
                same = array("i", result.prompt_ids) == request.input_ids
            except OverflowError:
                same = False
            if not same:
                at = first_difference(result.prompt_ids, request.input_ids)
                sent = list(request.input_ids[at : at + SHOWN])
                raise bad_answer(
                    backend,
                    "prompt_ids",
                    list(result.prompt_ids[at : at + SHOWN]),
                    f"the engine consumed a different prompt (first difference at token {at}: sent {sent})",
                )
    new_prompt = len(request.input_ids) - request.prefix_len
    if result.prompt_logprobs is not None and request.messages is None:
        if len(result.prompt_logprobs) != new_prompt:
            raise bad_answer(
                backend,
                "prompt_logprobs",
                len(result.prompt_logprobs),
                f"{len(result.prompt_logprobs)} prompt logprobs for {new_prompt} new prompt tokens",
            )
        _check_logprobs(result.prompt_logprobs, backend, "prompt_logprobs", allow_none=True)
    for field in ("prompt_tokens", "cached_tokens"):
        count = getattr(result, field)
        if count is not None and (type(count) is not int or count < 0):
            raise bad_answer(backend, field, count, "a token count must be a non-negative integer")
    if request.media and result.prompt_tokens is not None and result.prompt_tokens != len(request.input_ids):
        raise bad_answer(
            backend,
            "prompt_tokens",
            result.prompt_tokens,
            f"the engine consumed {result.prompt_tokens} prompt tokens for a prompt of {len(request.input_ids)} "
            f"with {len(request.media)} image(s) or video(s): its expansion differs from tito's",
        )
    if result.weight_versions is not None:
        check_spans(result.weight_versions, len(output_ids), backend=backend)
    if request.return_sampling_mask:
        mask = result.sampling_mask
        if mask is None:
            if output_ids:
                raise bad_answer(
                    backend, "sampling_mask", None, "sampling masks were requested but the engine returned none"
                )
        else:
            problem = mask.problem(output_ids, vocab_size)
            if problem is not None:
                raise bad_answer(backend, "sampling_mask", mask.rows, problem)
