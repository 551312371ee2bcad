"""tito_core.analysis.drift: logprob gaps, and retokenization drift of constructed rollouts, classified.

Each rollout is built the way tito records one (first prompt rendered by the template, outputs as exact ids,
boundary and tool results from the incremental render), with outputs chosen to show one drift source each.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from tito_core.analysis.drift import (
    TextStackView,
    compare_ids,
    logprob_gap,
    output_regions,
    text_stack_messages,
    text_stack_view,
)
from tito_core.conversation import tool_specs_to_chat
from tito_core.render.renderer import ChatRenderer
from tito_core.tool_parsers.hermes import HermesToolParser
from tito_core.trajectory import Trajectory, Turn, Usage

SPEC: Any = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "inputSchema": {"json": {"type": "object", "properties": {"expression": {"type": "string"}}}},
}
TOOLS = tool_specs_to_chat([SPEC])
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'


def _record(
    renderer: ChatRenderer,
    outputs: list[list[int] | str],
    results: list[list[str] | str],
    *,
    closed: list[bool] | None = None,
    stop: str = "<|im_end|>",
) -> Trajectory:
    """A trajectory as tito records it: outputs (text or exact ids) each ended by ``stop`` unless not closed."""
    eot = renderer.encode(stop)
    chat = [{"role": "system", "content": "You add."}, {"role": "user", "content": "What is 2 + 3?"}]
    traj = Trajectory("t")
    traj.append("prompt", asyncio.run(renderer.initial_ids(chat, TOOLS)), turn=0)
    for k, output in enumerate(outputs):
        ended = closed is None or closed[k]
        ids = (renderer.encode(output) if isinstance(output, str) else list(output)) + (eot if ended else [])
        start = len(traj)
        traj.append("output", ids, [-0.5] * len(ids), turn=k)
        traj.add_turn(
            Turn(
                index=k,
                rid=f"r{k}",
                prompt_start=0,
                prompt_len=start,
                output_len=len(ids),
                finish_reason="stop" if ended else "length",
                stop_reason="end_turn",
                matched_stop=eot[0] if ended else None,
                usage=Usage(prompt_tokens=start, completion_tokens=len(ids)),
            )
        )
        if k < len(results):
            follow: list[Any] = (
                [{"role": "user", "content": results[k]}]  # a str: the user's next question
                if isinstance(results[k], str)
                else [{"role": "tool", "tool_call_id": f"c{j}", "content": r} for j, r in enumerate(results[k])]
            )
            ids, nb = asyncio.run(renderer.continuation_ids(follow, close_turn=not ended))
            traj.append("boundary", ids[:nb], turn=k + 1)
            traj.append("prompt", ids[nb:], turn=k + 1)
    return traj.close("completed")


def _compare(renderer: ChatRenderer, traj: Trajectory) -> Any:
    parser = HermesToolParser()
    messages = text_stack_messages(traj, renderer, parser, tools=TOOLS, tool_specs=[SPEC])
    view = text_stack_view(messages, renderer, tools=TOOLS)
    in_call, in_think = output_regions(traj, renderer, parser)
    return messages, view, compare_ids(traj, view, renderer, in_call=in_call, in_think=in_think)


@pytest.fixture(scope="module")
def qwen25(qwen25_tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(qwen25_tokenizer)


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer: Any) -> ChatRenderer:
    return ChatRenderer(qwen3_tokenizer)


def test_logprob_gap_statistics() -> None:
    gap = logprob_gap([(-1.0, -1.0), (-2.0, -1.0), (-0.5, -1.5)])
    assert gap.tokens == 3
    assert gap.mean_abs == pytest.approx(2 / 3)
    assert gap.max_abs == pytest.approx(1.0)
    assert gap.mean_diff == pytest.approx(0.0)
    # k3 = exp(r) - 1 - r for r = 0, +1, -1
    assert gap.k3 == pytest.approx((0 + (math.e - 2) + (math.exp(-1) - 1 + 1)) / 3)
    assert logprob_gap([(-3.0, -3.0)]).k3 == 0.0
    assert logprob_gap([]).tokens == 0 and math.isnan(logprob_gap([]).k3)


def test_canonical_rollout_differs_only_by_the_trailing_separator(qwen25: ChatRenderer) -> None:
    traj = _record(qwen25, [CALL, "The answer is 5."], [["5"]])
    messages, view, cmp = _compare(qwen25, traj)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    assert messages[3]["content"] == "5"
    # the template writes "\n" after the last <|im_end|>, which the model never generated
    assert view.ids[: len(traj)] == traj.token_ids
    assert len(view.ids) == len(traj) + 1
    assert [(s.category, s.where) for s in cmp.spans] == [("whitespace", "end")]
    # the stack's mask covers the "\n" after each <|im_end|>: the boundary between the two turns is
    # trained there and not by tito; the appended "\n" is a trained token the model never sampled
    assert cmp.mask_aligned_mismatch == 1
    assert cmp.trained_added == 1
    assert cmp.trained_lost == 0
    assert cmp.mask_raw_mismatch == 2
    row = json.loads(json.dumps(cmp.as_dict()))  # JSON-ready, derived fields included
    assert row["same_ids"] is False and row["by_category"] == {"whitespace": 1}
    assert row["first_mismatch"] == len(traj) and row["spans"][0]["same_text"] is False


def test_tool_call_json_spacing_is_rewritten(qwen25: ChatRenderer) -> None:
    compact = '<tool_call>\n{"name":"calculator","arguments":{"expression":"2 + 3"}}\n</tool_call>'
    traj = _record(qwen25, [compact, "5"], [["5"]])
    _, _, cmp = _compare(qwen25, traj)
    assert not cmp.same_ids
    json_spans = [s for s in cmp.spans if s.category == "tool_call_json"]
    assert json_spans and all(s.where == "output" and s.turn == 0 for s in json_spans)
    assert cmp.trained_lost > 0


def test_key_order_is_kept_but_reserialized(qwen25: ChatRenderer) -> None:
    swapped = '<tool_call>\n{"arguments": {"expression": "2 + 3"}, "name": "calculator"}\n</tool_call>'
    traj = _record(qwen25, [swapped, "5"], [["5"]])
    _, _, cmp = _compare(qwen25, traj)
    assert "tool_call_json" in cmp.by_category


def test_whitespace_around_content_is_stripped(qwen25: ChatRenderer) -> None:
    traj = _record(qwen25, [CALL, "  The answer is 5.\n\n"], [["5"]])
    _, _, cmp = _compare(qwen25, traj)
    inner = [s for s in cmp.spans if s.where == "output"]
    assert inner and {s.category for s in inner} == {"whitespace"}


def test_think_block_is_rewritten(qwen3: ChatRenderer) -> None:
    # the model wrote its reasoning without the newlines the template puts around it
    traj = _record(qwen3, ["<think>add them</think>" + CALL, "<think>\ndone\n</think>\n\n5"], [["5"]])
    messages, _, cmp = _compare(qwen3, traj)
    assert messages[2]["reasoning_content"] == "add them"
    think = [s for s in cmp.spans if s.category == "think"]
    assert think and think[0].turn == 0 and think[0].where == "output"


def test_a_second_question_drops_the_first_answers_reasoning_from_the_text_stack(qwen3: ChatRenderer) -> None:
    # Qwen3's template keeps reasoning only after the last user question: re-rendering the whole conversation
    # drops the think block the model wrote before its first answer, which tito recorded and trains on
    traj = _record(qwen3, ["<think>\nadd two and three\n</think>\n\n5", "<think>\nfive plus one\n</think>\n\n6"],
                   ["And plus one?"])  # fmt: skip
    messages, view, cmp = _compare(qwen3, traj)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[3]["content"] == "And plus one?" and messages[2]["reasoning_content"] == "add two and three"
    assert "add two and three" not in view.text and "five plus one" in view.text
    think = [s for s in cmp.spans if s.category == "think"]
    assert [(s.turn, s.where) for s in think] == [(0, "output")] and not think[0].rerendered_text.strip()
    assert cmp.trained_lost >= len(qwen3.encode("<think>\nadd two and three\n</think>\n\n"))


def test_an_unclosed_output_gets_an_end_of_turn_token(qwen25: ChatRenderer) -> None:
    traj = _record(qwen25, [CALL, "The answer is"], [["5"]], closed=[True, False])
    _, _, cmp = _compare(qwen25, traj)
    assert [s.category for s in cmp.spans] == ["special_tokens"]
    assert cmp.spans[0].rerendered_text == "<|im_end|>\n"
    assert cmp.trained_added == 2


def test_same_text_other_ids_is_bpe(qwen25: ChatRenderer) -> None:
    hello = qwen25.encode("Hello")
    assert len(hello) == 1
    pieces = qwen25.encode("Hel") + qwen25.encode("lo")  # the model sampled "Hello" in two pieces
    traj = _record(qwen25, [CALL, pieces], [["5"]])
    _, view, cmp = _compare(qwen25, traj)
    bpe = [s for s in cmp.spans if s.category == "bpe"]
    assert len(bpe) == 1
    assert bpe[0].recorded_text == bpe[0].rerendered_text == "Hello"
    assert bpe[0].recorded[1] - bpe[0].recorded[0] == 2
    assert bpe[0].rerendered[1] - bpe[0].rerendered[0] == 1
    # two trained tokens became one: every later position is shifted by one
    assert cmp.trained_lost == 2
    assert len(view.ids) == len(traj)  # one token fewer, one "\n" more at the end
    assert cmp.mask_raw_mismatch >= 1


def test_output_regions_mark_tool_call_and_think_tokens(qwen3: ChatRenderer) -> None:
    traj = _record(qwen3, ["<think>\nhm\n</think>\n\n" + CALL, "5"], [["5"]])
    in_call, in_think = output_regions(traj, qwen3, HermesToolParser())
    out = traj.segments[1]
    ids = traj.token_ids
    call_text = qwen3.decode([ids[i] for i in range(out.start, out.end) if in_call[i]])
    think_text = qwen3.decode([ids[i] for i in range(out.start, out.end) if in_think[i]])
    assert call_text == CALL
    assert think_text == "<think>\nhm\n</think>"
    assert not any(in_call[: out.start]) and not any(in_think[: out.start])


def test_an_output_stopped_on_another_eos_is_closed_with_the_templates_end_of_turn(qwen25: ChatRenderer) -> None:
    # the engine stopped on <|endoftext|> (reported as the matched stop): not part of the message, and the
    # template closes the turn with <|im_end|> instead
    traj = _record(qwen25, [CALL, "5"], [["5"]], stop="<|endoftext|>")
    messages, _, cmp = _compare(qwen25, traj)
    assert messages[-1]["content"] == "5"
    assert "<|endoftext|>" not in str(messages)
    special = [s for s in cmp.spans if s.category == "special_tokens"]
    assert special and all("<|endoftext|>" in s.recorded_text for s in special)
    assert all("<|im_end|>" in s.rerendered_text for s in special)


@pytest.mark.parametrize(("between", "spans"), [(1, 1), (2, 2)])
def test_changes_split_by_one_shared_token_are_one_span(qwen25: ChatRenderer, between: int, spans: int) -> None:
    word = lambda text: qwen25.encode(text)  # noqa: E731
    shared = [t for w in [" dog", " ox"][:between] for t in word(w)]
    assert len(shared) == between
    prompt = word("Say:")
    recorded = [*word("cat"), *shared, *word(" bird")]
    stack = [*word("fish"), *shared, *word(" cow")]
    traj = Trajectory("t")
    traj.append("prompt", prompt, turn=0)
    traj.append("output", recorded, [-1.0] * len(recorded), turn=0)
    view = TextStackView(messages=[], text="", ids=[*prompt, *stack], loss_mask=[0] * len(prompt) + [1] * len(stack))
    cmp = compare_ids(traj.close("completed"), view, qwen25)
    assert len(cmp.spans) == spans
    assert {s.category for s in cmp.spans} == {"content"}
    if spans == 1:
        assert cmp.spans[0].recorded_text == "cat dog bird"
        assert cmp.spans[0].rerendered_text == "fish dog cow"
    assert cmp.trained_lost == cmp.trained_added == 2  # the shared tokens stay aligned, with the same mask
    assert cmp.mask_aligned_mismatch == 0
