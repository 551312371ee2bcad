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

from ..integration.cross_engine import compare_ids, write_ids
from ..integration.image_scenario import (
    AGENT_PICTURES,
    TOOL_IMAGE,
    USER_IMAGE,
    VISION_START,
    agent_ids,
    check_agent,
    describe_spans,
    run_agent,
    turn_ids,
    two_turns,
)

pytest.importorskip("strands")

BF16_MAX = 2e-2  # the engines' bf16 noise bound (tests/integration/weight_updates.py)


@pytest.fixture(scope="module")
def processor(tiny_vl_dir: Path) -> Any:
    """The model's HF processor, built in code: this environment has no torchvision (tito_testing.vision)."""
    from transformers import AutoTokenizer

    from tito_testing.vision import hf_processor, vl_chat_template

    return hf_processor(AutoTokenizer.from_pretrained(str(tiny_vl_dir)), vl_chat_template())


def backend(model_dir: Path) -> Any:
    from tito_transformers import TransformersBackend

    return TransformersBackend(model_dir, dtype="bfloat16")


def compare(
    model_dir: Path, processor: Any, case: str, ids: list[int], mask: list[int], images: list[Any], *, forced: bool
) -> str:
    """Compare with the servers' records (record ours when there is none); explain each output difference.

    ``forced``: every output a later prompt renders is regex-forced text, so every prompt part is compared even
    after the outputs' spelling parts (cross_engine.compare_ids)."""
    compared, missing, differences = compare_ids("transformers", model_dir, case, ids, mask, forced=forced)
    if not compared:
        write_ids("transformers", model_dir, case, ids, mask)
        return f"{case}: recorded {len(ids)} ids ({'; '.join(missing)})"
    lines = [f"{case}: {len(ids)} ids, compared with {compared}"]
    for difference in differences:
        gap = near_tie(model_dir, processor, ids, difference.position, difference.theirs, images)
        lines.append(
            f"parts from {difference.other}'s at output token {difference.position}: {difference.ours} here, "
            f"{difference.theirs} there, logprobs {gap:.1e} apart under a bf16 forward pass"
        )
        assert gap < BF16_MAX, lines[-1]
    return "; ".join(lines)


def near_tie(model_dir: Path, processor: Any, ids: list[int], position: int, theirs: int, images: list[Any]) -> float:
    """How far apart the logprobs of ``ids[position]`` and ``theirs`` are after ``ids[:position]``."""
    from ..integration.reference import Reference

    shown = images[: ids[:position].count(VISION_START)]
    pixels = processor.image_processor(images=[i.to_pil() for i in shown]) if shown else None
    reference = Reference()
    ours = reference.score(model_dir, [*ids[: position + 1]], images=pixels)[-1]
    other = reference.score(model_dir, [*ids[:position], theirs], images=pixels)[-1]
    return abs(ours - other)


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
    print(compare(tiny_vl_dir, processor, "image-turns", ids, mask, [USER_IMAGE, TOOL_IMAGE], forced=False))


def test_the_image_agent_gives_the_engines_ids(tiny_vl_dir: Path, processor: Any) -> None:
    agent, trajectory = asyncio.run(run_agent(backend(tiny_vl_dir), tiny_vl_dir, lambda regex: {"regex": regex}))
    check_agent(processor, agent, trajectory)
    print(f"image agent: {len(trajectory.token_ids)} tokens, image spans {describe_spans(trajectory)}")
    ids, mask = agent_ids(trajectory)
    print(compare(tiny_vl_dir, processor, "image-agent", ids, mask, [USER_IMAGE, *AGENT_PICTURES], forced=True))
