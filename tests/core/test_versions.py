"""Weight versions: span checks, their order, and what a model call records from a backend's answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from strands import Agent

from tito_core import TitoModel, Trajectory
from tito_core.backend import GenerateRequest, GenerateResult
from tito_core.errors import BackendResponseError
from tito_core.trajectory import Turn, Usage
from tito_core.versions import (
    VersionSpan,
    check_spans,
    clip_spans,
    decode_spans,
    int_version,
    version_key,
    version_range,
)
from tito_testing.scripted import ScriptedBackend

from .helpers import add, hermes_call


def span(version: str, start: int, end: int) -> VersionSpan:
    return VersionSpan(version=version, start=start, end=end)


def test_spans_that_tile_the_output_are_kept_and_same_version_neighbours_merged() -> None:
    assert check_spans([span("1", 0, 3), span("2", 3, 5)], 5, backend="b") == (span("1", 0, 3), span("2", 3, 5))
    assert check_spans([span("1", 0, 3), span("1", 3, 5)], 5, backend="b") == (span("1", 0, 5),)
    # an empty output: no span, or the single empty span SGLang reports for it
    assert check_spans([], 0, backend="b") == ()
    assert check_spans([span("default", 0, 0)], 0, backend="b") == ()


@pytest.mark.parametrize(
    ("spans", "n", "message"),
    [
        ([span("1", 0, 3)], 5, "cover 3 output tokens, the output has 5"),
        ([span("1", 0, 6)], 5, "cover 6 output tokens, the output has 5"),
        ([span("1", 0, 2), span("2", 3, 5)], 5, "a gap after token 2"),
        ([span("1", 0, 3), span("2", 2, 5)], 5, "an overlap after token 3"),
        ([span("1", 1, 5)], 5, "a gap after token 0"),
        ([span("1", 0, 3), span("2", 3, 3), span("2", 3, 5)], 5, r"span 1 \[3, 3\) is empty"),
        ([span("2", 3, 0)], 3, "is empty"),
        ([span("", 0, 5)], 5, "no version"),
        ([], 2, "cover 0 output tokens, the output has 2"),
        ([{"version": "1", "start": 0, "end": 2}], 2, "not a VersionSpan"),
    ],
)
def test_spans_that_do_not_tile_the_output_exactly_are_refused(spans: list[Any], n: int, message: str) -> None:
    with pytest.raises(BackendResponseError, match=message) as info:
        check_spans(spans, n, backend="b", field="meta_info.weight_versions")
    assert info.value.field == "meta_info.weight_versions" and info.value.backend == "b"


def test_decoding_takes_mappings_or_objects_and_integer_versions_as_text() -> None:
    class View:
        version, start, end = 7, 2, 4

    spans = decode_spans([{"version": "default", "start": 0, "end": 2}, View()], 4, backend="b")
    assert spans == (span("default", 0, 2), span("7", 2, 4))
    bad_spans = ({"version": 1.5, "start": 0, "end": 4}, {"version": True, "start": 0, "end": 4}, {"end": 4})
    for bad in bad_spans:
        with pytest.raises(BackendResponseError, match="span 0 is not"):
            decode_spans([bad], 4, backend="b")


def test_clipping_keeps_the_spans_of_the_tokens_kept() -> None:
    spans = (span("1", 0, 3), span("2", 3, 6))
    assert clip_spans(spans, 4) == (span("1", 0, 3), span("2", 3, 4))
    assert clip_spans(spans, 3) == (span("1", 0, 3),)


def test_versions_order_integers_numerically_after_named_versions() -> None:
    assert sorted(["10", "9", "default", "2", "base"], key=version_key) == ["base", "default", "2", "9", "10"]
    assert version_range(["10", "9", "default"]) == ("default", "10")
    assert version_range(["3"]) == ("3", "3")
    assert version_range([]) is None
    assert (int_version("12"), int_version("-1"), int_version("default"), int_version(None)) == (12, -1, None, None)


# ------------------------------------------------------------------------------------- through a model call
class Versioned(ScriptedBackend):
    """The scripted engine; call ``k``'s answer gets the spans ``spans[k](number of output tokens)``."""

    def __init__(self, tokenizer: Any, replies: list[str], spans: list[Callable[[int], Any]]) -> None:
        super().__init__(tokenizer, replies)
        self.spans = list(spans)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await super().generate(request)
        return msgspec.structs.replace(result, weight_versions=self.spans.pop(0)(len(result.output_ids)))


async def test_a_call_records_its_spans_on_the_turn_and_the_trajectory_places_them(qwen3_tokenizer: Any) -> None:
    def updated_after_two(n: int) -> tuple[VersionSpan, ...]:
        return (span("4", 0, 2), span("5", 2, n))

    replies = [hermes_call("add", {"a": 1, "b": 2}), "It is 3."]
    backend = Versioned(qwen3_tokenizer, replies, [updated_after_two, lambda n: (span("5", 0, n),)])
    model = TitoModel(backend, qwen3_tokenizer)
    await Agent(model=model, tools=[add], callback_handler=None).invoke_async("Add 1 and 2.")
    traj = model.reset()
    first, second = traj.turns
    assert first.weight_versions == (span("4", 0, 2), span("5", 2, first.output_len))
    assert second.weight_versions == (span("5", 0, second.output_len),)
    spans = traj.weight_versions()
    assert spans is not None
    covered = [i for s in spans for i in range(s.start, s.end)]
    generated = [i for i, m in enumerate(traj.loss_mask) if m]
    assert covered == generated  # every generated token exactly once, nothing else
    per_token = traj.token_weight_versions()
    assert per_token is not None and len(per_token) == len(traj)
    assert [per_token[i] for i in generated] == ["4", "4"] + ["5"] * (len(generated) - 2)
    assert all(per_token[i] is None for i, m in enumerate(traj.loss_mask) if not m)
    assert traj.weight_version_range() == ("4", "5")
    for back in (Trajectory.from_json(traj.to_json()), Trajectory.from_msgpack(traj.to_msgpack())):
        assert back == traj and back.turns[0].weight_versions == first.weight_versions


async def test_a_backend_that_reports_nothing_records_none(qwen3_tokenizer: Any) -> None:
    model = TitoModel(ScriptedBackend(qwen3_tokenizer, ["Four."]), qwen3_tokenizer)
    await Agent(model=model, callback_handler=None).invoke_async("2 + 2?")
    traj = model.reset()
    assert traj.turns[0].weight_versions is None
    assert traj.weight_versions() is None and traj.token_weight_versions() is None
    assert traj.weight_version_range() is None
    assert b"weight_versions" not in traj.to_json()  # the record an older tito wrote, byte for byte


def test_a_record_without_versions_still_decodes() -> None:
    old = (
        b'{"rollout_id":"r","branch":0,"token_ids":[1,2],"logprobs":[null,-0.5],'
        b'"segments":[{"kind":"prompt","start":0,"end":1,"turn":0},{"kind":"output","start":1,"end":2,"turn":0}],'
        b'"turns":[{"index":0,"rid":"x","prompt_start":0,"prompt_len":1,"output_len":1,"finish_reason":"stop",'
        b'"stop_reason":"end_turn","usage":{"prompt_tokens":1,"completion_tokens":1}}],"status":"completed"}'
    )
    traj = Trajectory.from_json(old)
    assert traj.turns[0].weight_versions is None and traj.weight_versions() is None


def test_the_range_with_branches_needs_every_branch_known() -> None:
    def turn(index: int, start: int, versions: tuple[VersionSpan, ...] | None) -> Turn:
        usage = Usage(prompt_tokens=start + 1, completion_tokens=1)
        return Turn(index=index, rid="r", prompt_start=start, prompt_len=1, output_len=1, finish_reason="stop",
                    stop_reason="end_turn", usage=usage, weight_versions=versions)  # fmt: skip

    traj = Trajectory("r")
    traj.append("prompt", [1], turn=0)
    traj.append("output", [2], [-0.1], turn=0)
    traj.add_turn(turn(0, 0, (span("1", 0, 1),)))
    traj.append("prompt", [3], turn=1)
    traj.append("output", [4], [-0.1], turn=1)
    traj.add_turn(turn(1, 2, (span("3", 0, 1),)))
    child = traj.fork(2, "history rewritten")  # keeps turn 0
    child.append("prompt", [5], turn=1)
    child.append("output", [6], [-0.1], turn=1)
    child.add_turn(turn(1, 2, (span("2", 0, 1),)))
    assert child.weight_version_range() == ("1", "2")
    assert child.weight_version_range(branches=True) == ("1", "3")  # the earlier branch's token of version 3
    unknown = child.fork(4, "again")
    unknown.append("prompt", [7], turn=2)
    unknown.append("output", [8], [-0.1], turn=2)
    unknown.add_turn(turn(2, 4, None))
    assert unknown.weight_version_range() is None and unknown.weight_version_range(branches=True) is None
