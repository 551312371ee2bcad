"""The engines' image scenario (tests/integration/image_scenario.py) on the embedded backend: the same ids.

The vLLM and SGLang suites run the same two turns and the same image agent on the same tiny random Qwen2.5-VL and
record their trajectories (tests/integration/cross_engine.py). Here the embedded backend (bf16, like the servers)
runs them and compares with those records when they exist (else records its own, for the servers to compare):

* every prompt id is equal up to the first output token where the greedy choices part, and the loss masks too
  (a prompt is the render of the same history: a difference there is a bug, not numerics); in the agent, whose
  tool calls and answer are regex-forced text, every prompt part is equal even after the spelling parts;
* the greedy output ids are equal, or where they part, the two tokens are a near-tie: a plain bf16 forward pass
  of the checkpoint (tests/integration/reference.py) gives them logprobs within bf16 noise of each other, so the
  two kernels' rounding may pick either (after that, nothing is comparable: the next prompts hold other outputs).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ..integration.cross_engine import record_and_compare_ids
from ..integration.image_scenario import (
    AGENT_PICTURES,
    TOOL_IMAGE,
    USER_IMAGE,
    agent_ids,
    check_agent,
    describe_spans,
    near_tie,
    run_agent,
    turn_ids,
    two_turns,
)

pytest.importorskip("strands")


@pytest.fixture(scope="module")
def processor(tiny_vl_dir: Path) -> Any:
    """The model's HF processor, built in code: this environment has no torchvision (tito_testing.vision)."""
    from transformers import AutoTokenizer

    from tito_testing.vision import hf_processor, vl_chat_template

    return hf_processor(AutoTokenizer.from_pretrained(str(tiny_vl_dir)), vl_chat_template())


def backend(model_dir: Path) -> Any:
    from tito_transformers import TransformersBackend

    return TransformersBackend(model_dir, dtype="bfloat16")


def test_two_image_turns_give_the_engines_ids(tiny_vl_dir: Path, processor: Any) -> None:
    async def run() -> Any:
        embedded = backend(tiny_vl_dir)
        try:
            return await two_turns(embedded, processor, return_logprobs=True)
        finally:
            await embedded.aclose()

    first, second, _, answers = asyncio.run(run())
    assert [a.prompt_tokens for a in answers] == [len(first), len(second)]
    ids, mask = turn_ids(first, second, answers)
    gap = near_tie(tiny_vl_dir, processor, ids, [USER_IMAGE, TOOL_IMAGE])
    print(record_and_compare_ids("transformers", tiny_vl_dir, "image-turns", ids, mask, gap, always_record=False))


def test_the_image_agent_gives_the_engines_ids(tiny_vl_dir: Path, processor: Any) -> None:
    agent, trajectory = asyncio.run(run_agent(backend(tiny_vl_dir), tiny_vl_dir, lambda regex: {"regex": regex}))
    check_agent(processor, agent, trajectory)
    print(f"image agent: {len(trajectory.token_ids)} tokens, image spans {describe_spans(trajectory)}")
    ids, mask = agent_ids(trajectory)
    gap = near_tie(tiny_vl_dir, processor, ids, [USER_IMAGE, *AGENT_PICTURES])
    line = record_and_compare_ids("transformers", tiny_vl_dir, "image-agent", ids, mask, gap, forced=True,
                                  always_record=False)  # fmt: skip
    print(line)
