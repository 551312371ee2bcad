"""A weight update while agent rollouts are in flight, on a real engine (shared by the vLLM and SGLang suites).

``tito_core.weights.weight_update`` pauses the engine in keep mode once half the rollouts have made their first
call, holds the pause for a second (the other calls are frozen mid-decode or queued), labels the weights "1" and
resumes. Nothing may be lost or generated twice, and every output token carries exactly one version, the
versions of a rollout never going back. The weights themselves are not changed here: the engines' relabel route
stands for the trainer's push.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from strands import Agent, tool

from tito_core import TitoModel, Trajectory, weight_update
from tito_core.backend import Backend, SamplingParams

TOOL_RX = r'<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9], "b": [1-9]\}\}\n</tool_call>'
ANSWER_RX = r"The sum is [0-9]{1,2}\."


async def keep_mode_update(
    backend: Backend, tokenizer: Any, constrain: Callable[[str], dict[str, Any]], *, rollouts: int = 8
) -> list[Trajectory]:
    """Run ``rollouts`` three-call agents and update the weights while they run; returns their trajectories.

    ``constrain(regex)`` is the engine's ``SamplingParams.extra`` for a regex (SGLang ``regex``, vLLM
    ``structured_outputs``): two forced ``add`` calls, then a forced answer.
    """

    models: list[TitoModel] = []

    async def one(seed: int) -> Trajectory:
        def params(regex: str) -> SamplingParams:
            return SamplingParams(max_new_tokens=64, temperature=1.0, seed=seed, extra=constrain(regex))

        model = TitoModel(backend, tokenizer, sampling=params(TOOL_RX))
        models.append(model)
        calls: list[int] = []

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            calls.append(a + b)
            if len(calls) == 2:
                model.update_config(sampling=params(ANSWER_RX))
            return a + b

        agent = Agent(model=model, tools=[add], callback_handler=None, system_prompt="Use the add tool.")
        await agent.invoke_async("What is 2 + 3? Then add 4.")
        return model.reset()

    tasks = [asyncio.ensure_future(one(seed)) for seed in range(rollouts)]
    for _ in range(600):  # until half the rollouts finished their first call (at most 60 s)
        await asyncio.sleep(0.1)
        if sum(bool(m.trajectory.turns) for m in models) >= rollouts // 2 or any(t.done() for t in tasks):
            break
    async with weight_update([backend], version=1):
        await asyncio.sleep(1.0)  # the rollouts in flight wait, frozen: none is aborted
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        await backend.set_weight_version("default")  # the label the other tests expect


def check_versions(trajectories: list[Trajectory]) -> str:
    """Every rollout completed; each output token carries one version; versions never go back. One line to report."""
    both = 0
    for traj in trajectories:
        assert traj.status == "completed", traj.status_reason
        assert len(traj.turns) == 3
        labels: list[str] = []
        for turn in traj.turns:
            spans = turn.weight_versions
            assert spans is not None and spans[0].start == 0 and spans[-1].end == turn.output_len
            assert all(a.end == b.start for a, b in itertools.pairwise(spans))
            labels.extend(s.version for s in spans for _ in range(s.start, s.end))
        assert sum(traj.loss_mask) == len(labels)  # every generated token labelled exactly once
        assert labels == sorted(labels, key=lambda v: v != "default")  # "default" tokens, then "1" tokens
        assert labels[-1] == "1"  # the end was generated after the update
        both += "default" in labels
    assert both >= len(trajectories) // 2, f"only {both} rollouts straddled the update"

    def spans(traj: Trajectory) -> list[list[tuple[str, int, int]]]:
        return [[(s.version, s.start, s.end) for s in turn.weight_versions or ()] for turn in traj.turns]

    straddling = [t for t in trajectories if any(len(turn) > 1 for turn in spans(t))]  # one call, two versions
    sample = (straddling or [t for t in trajectories if "default" in str(spans(t))])[0]
    return f"{len(straddling)} of {len(trajectories)} rollouts had a call that straddled the update; one: " + "; ".join(
        f"call {n}: {turn}" for n, turn in enumerate(spans(sample))
    )
