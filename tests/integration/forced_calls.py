"""Forced tool calls (Strands' ``tool_choice``) on a real engine, shared by the vLLM and SGLang suites.

The core builds the grammar from the tool parser and the engine applies it with its own constrained decoding
(xgrammar behind vLLM's ``structured_outputs.grammar`` and SGLang's ``ebnf``). The tiny random model writes
gibberish, so a call it makes under the grammar is the grammar's doing; its ids and logprobs are still the
engine's own samples, recorded verbatim.
"""

from __future__ import annotations

import math
import uuid
import warnings
from array import array
from typing import Any, Literal

from pydantic import BaseModel
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

from tito_core import TitoModel
from tito_core.backend import Backend, GenerateRequest, SamplingParams

EOS = (151645, 151643)  # <|im_end|>, <|endoftext|>: the tiny model's end-of-generation ids
Small = Literal[1, 2, 3, 4, 5]


class Pair(BaseModel):
    """Two small numbers."""

    a: Small
    b: Small


async def forced_first_call(
    backend: Backend, tokenizer: Any, *, parser: str, answer_extra: dict[str, Any]
) -> tuple[float, float]:
    """``tool_choice="any"`` forces the first call; after the tool ran, the answer is forced by ``answer_extra``.

    Returns the largest and the mean absolute difference (nats) between the logprobs the engine reported for the
    forced call and the same ids re-scored by the engine without the grammar (its prompt logprobs).
    """
    seen: list[tuple[int, int]] = []
    sampling: dict[str, Any] = {"max_new_tokens": 96, "temperature": 1.0, "seed": 3}
    model = TitoModel(backend, tokenizer, tool_parser=parser, tool_choice="any", sampling=sampling)

    @tool
    def add(a: Small, b: Small) -> int:
        """Add two small integers."""
        seen.append((a, b))
        model.update_config(tool_choice="auto", sampling={**sampling, "extra": answer_extra})
        return a + b

    agent = Agent(model=model, tools=[add], callback_handler=None, conversation_manager=NullConversationManager())
    await agent.invoke_async("What is 2 + 3?")
    traj = model.trajectory
    assert len(seen) == 1 and all(1 <= v <= 5 for v in seen[0]), seen
    assert traj.status == "completed", traj.status_reason
    first, second = traj.turns[0], traj.turns[1]
    assert first.stop_reason == "tool_use" and first.finish_reason == "stop"
    assert first.constrained and not second.constrained
    assert second.stop_reason == "end_turn"
    output = traj.token_ids[first.output_start : first.output_start + first.output_len]
    assert output[-1] in EOS, f"after the call the grammar lets only an end token through, got {output[-1]}"
    a, b = seen[0]
    text = tokenizer.decode(output[:-1])
    expected = {
        "hermes": f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>',
        "qwen_xml": (
            f"<tool_call>\n<function=add>\n<parameter=a>\n{a}\n</parameter>\n<parameter=b>\n{b}\n</parameter>\n"
            "</function>\n</tool_call>"
        ),
    }[parser]
    assert text == expected
    logprobs = traj.logprobs[first.output_start : first.output_start + first.output_len]
    assert all(lp is not None and math.isfinite(lp) and lp <= 0 for lp in logprobs)
    assert traj.loss_mask[first.output_start : first.output_start + first.output_len] == [1] * first.output_len

    # The engine reports logprobs after the grammar's mask: re-scored without it, the same ids differ.
    # Both at temperature 1.0, so the sampled distribution is the raw one the prompt logprobs report.
    prompt = traj.token_ids[: first.output_start]
    rescored = await backend.generate(
        GenerateRequest(
            rid=f"rescore-{uuid.uuid4().hex}",
            input_ids=array("i", [*prompt, *output]),
            prefix_len=len(prompt),
            sampling=SamplingParams(max_new_tokens=1, temperature=1.0),
            return_prompt_logprobs=True,
        )
    )
    assert rescored.prompt_logprobs is not None and len(rescored.prompt_logprobs) == len(output)
    gaps = [abs(lp - free) for lp, free in zip(logprobs, rescored.prompt_logprobs, strict=True) if free is not None]
    assert gaps and max(gaps) > 1.0, f"a forced call re-scored without its grammar should differ, got {gaps}"
    return max(gaps), sum(gaps) / len(gaps)


async def forced_structured_output(backend: Backend, tokenizer: Any) -> None:
    """``structured_output`` forces the output tool: the answer is a valid ``Pair``, recorded as one turn."""
    model = TitoModel(backend, tokenizer, sampling={"max_new_tokens": 64, "temperature": 1.0, "seed": 4})
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Agent.structured_output_async is deprecated
        pair = await agent.structured_output_async(Pair, "Pick two small numbers.")
    assert isinstance(pair, Pair)
    traj = model.trajectory
    assert len(traj.turns) == 1 and traj.turns[0].finish_reason == "stop"
    assert traj.token_ids[-1] in EOS
