"""Partial rollouts (tito_core.partial): the continuation request and the joined result."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tito_core.backend import GenerateRequest, GenerateResult, SamplingParams
from tito_core.partial import cannot_continue, continuation, finished_anyway, joined
from tito_core.versions import VersionSpan
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import load_qwen_tokenizer


def _request(**fields: object) -> GenerateRequest:
    base: dict[str, object] = {
        "rid": "r",
        "input_ids": array("i", [1, 2, 3]),
        "prefix_len": 1,
        "sampling": SamplingParams(max_new_tokens=10, temperature=1.0),
        "sequence": "s",
    }
    return GenerateRequest(**{**base, **fields})  # type: ignore[arg-type]


def _cut(ids: list[int], version: str = "0") -> GenerateResult:
    return GenerateResult(
        output_ids=ids,
        output_logprobs=[-0.5] * len(ids),
        finish_reason="abort",
        prompt_tokens=3,
        cached_tokens=1,
        weight_versions=(VersionSpan(version=version, start=0, end=len(ids)),) if ids else None,
    )


def test_a_continuation_sends_the_prompt_and_the_cut_tokens_and_asks_for_the_rest() -> None:
    request = _request(return_prompt_logprobs=True)
    follow = continuation(request, _cut([7, 8, 9, 10]), 1)
    assert follow is not None
    assert follow.rid == "r-c1" and follow.sequence == "s"
    assert list(follow.input_ids) == [1, 2, 3, 7, 8, 9, 10] and follow.prefix_len == 7
    assert follow.sampling.max_new_tokens == 6 and follow.sampling.temperature == 1.0
    assert not follow.return_prompt_logprobs and follow.return_logprobs


def test_a_cut_with_every_token_allowed_has_no_continuation() -> None:
    assert continuation(_request(), _cut(list(range(10))), 1) is None
    unlimited = continuation(_request(sampling=SamplingParams()), _cut(list(range(10))), 2)
    assert unlimited is not None and unlimited.sampling.max_new_tokens is None and unlimited.rid == "r-c2"


def test_a_continuation_of_an_empty_prompt_holds_only_the_cut_tokens() -> None:
    follow = continuation(_request(input_ids=array("i"), prefix_len=0), _cut([5, 6]), 1)
    assert follow is not None and list(follow.input_ids) == [5, 6] and follow.prefix_len == 2


def test_joined_keeps_the_first_prompt_fields_both_outputs_and_the_last_end() -> None:
    then = GenerateResult(
        output_ids=[11, 12],
        output_logprobs=[-1.0, -2.0],
        finish_reason="stop",
        matched_stop=12,
        prompt_tokens=7,
        weight_versions=(VersionSpan(version="1", start=0, end=2),),
    )
    both = joined(_cut([7, 8, 9]), then)
    assert both.output_ids == [7, 8, 9, 11, 12] and both.output_logprobs == [-0.5, -0.5, -0.5, -1.0, -2.0]
    assert both.finish_reason == "stop" and both.matched_stop == 12
    assert both.prompt_tokens == 3 and both.cached_tokens == 1
    assert both.weight_versions == (
        VersionSpan(version="0", start=0, end=3),
        VersionSpan(version="1", start=3, end=5),
    )


def test_joined_reports_nothing_it_cannot_report_for_every_token() -> None:
    then = GenerateResult(output_ids=[11], output_logprobs=None, weight_versions=None)
    both = joined(_cut([7, 8]), then)
    assert both.output_logprobs is None and both.weight_versions is None  # never half a record
    empty_first = joined(_cut([]), GenerateResult(output_ids=[4], output_logprobs=[-1.0]))
    assert empty_first.output_logprobs == [-1.0] and empty_first.weight_versions is None


@given(
    st.lists(st.integers(0, 1000), max_size=20),
    st.lists(st.integers(0, 1000), max_size=20),
)
def test_joining_concatenates_every_token_once(first: list[int], then: list[int]) -> None:
    both = joined(_cut(first, "a"), _cut(then, "b"))
    assert both.output_ids == first + then
    assert both.output_logprobs == [-0.5] * (len(first) + len(then))
    spans = both.weight_versions or ()
    assert sum(s.end - s.start for s in spans) == len(first) + len(then)
    assert all(s.start < s.end for s in spans) and [s.start for s in spans[1:]] == [s.end for s in spans[:-1]]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [({"grammar": "root ::= x"}, "grammar"), ({"return_routed_experts": True}, "routing")],
)
def test_constrained_or_routed_calls_are_not_continued(fields: dict[str, object], reason: str) -> None:
    backend = ScriptedBackend(load_qwen_tokenizer("qwen3"))
    assert cannot_continue(_request(), backend) is None
    why = cannot_continue(_request(**fields), backend)
    assert why is not None and reason in why


def test_an_abort_that_raced_the_end_of_the_output_ends_the_call_as_the_engine_would_have() -> None:
    request = _request(sampling=SamplingParams(max_new_tokens=4, stop_token_ids=(99,)))
    at_limit = finished_anyway(request, _cut([5, 6, 7, 8]), end_of_turn_ids={2})
    assert at_limit is not None and at_limit.finish_reason == "length" and at_limit.output_ids == [5, 6, 7, 8]
    on_stop = finished_anyway(request, _cut([5, 99]), end_of_turn_ids={2})
    assert on_stop is not None and on_stop.finish_reason == "stop" and on_stop.matched_stop == 99
    on_eos = finished_anyway(request, _cut([5, 2]), end_of_turn_ids={2})
    assert on_eos is not None and on_eos.finish_reason == "stop"
    assert finished_anyway(request, _cut([5, 6]), end_of_turn_ids={2}) is None  # still under way
    ignoring = _request(sampling=SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert finished_anyway(ignoring, _cut([5, 2]), end_of_turn_ids={2}) is None  # eos does not end it there
