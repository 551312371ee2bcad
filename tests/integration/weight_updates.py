"""Weight updates while agent rollouts are in flight, on a real engine (shared by the vLLM and SGLang suites).

``keep_mode_update``: ``tito_core.weights.weight_update`` pauses the engine in keep mode once half the rollouts have
made their first call, holds the pause for a second (the other calls are frozen mid-decode or queued), labels the
weights "1" and resumes. Nothing may be lost or generated twice, and every output token carries exactly one
version, the versions of a rollout never going back. The weights themselves are not changed there: the engines'
relabel route stands for the trainer's push.

``new_weights_mid_rollout``: another checkpoint is loaded mid-run, in keep or abort mode (partial rollouts), and
every token's recorded logprob is compared with the engine's re-scoring under the weights of its span.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from strands import Agent, tool
from strands.event_loop.streaming import process_stream
from strands.types.content import Messages

from tito_core import TitoModel, Trajectory, weight_update
from tito_core.backend import Backend, GenerateRequest, PauseMode, SamplingParams

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


async def new_weights_mid_rollout(
    backend: Backend,
    tokenizer: Any,
    load: Callable[[str], Awaitable[None]],
    *,
    mode: PauseMode,
    rollouts: int = 8,
    calls: int = 2,
    tokens: int = 96,
) -> str:
    """``rollouts`` chat rollouts of ``calls`` unconstrained calls; new weights are loaded mid-run in ``mode``.

    ``load(version)`` loads the second checkpoint for ``"1"`` and the first one again for ``"default"`` (the
    engine's own update route), labelled so. Once two rollouts made a call, ``weight_update`` pauses the engine,
    loads the second checkpoint and resumes. Then every output token's recorded logprob is compared with the
    engine's prompt logprob of that token re-scored under the weights of its span.

    Checked: every rollout ends with its ``calls`` turns on one branch, each turn's spans tile its output; in
    ``abort`` mode the cut calls were continued (``continued_rids``) and every token of theirs matches its span's
    weights (the continuation is prefilled under the new ones); in ``keep`` mode the tokens before the update
    match. Returns one line to report.
    """
    models: list[TitoModel] = []

    async def one(seed: int) -> Trajectory:
        sampling = SamplingParams(max_new_tokens=tokens, temperature=1.0, seed=seed, ignore_eos=True)
        model = TitoModel(backend, tokenizer, sampling=sampling)
        models.append(model)
        messages: Messages = []
        for call in range(calls):
            messages.append({"role": "user", "content": [{"text": f"Tell story {seed}, part {call}."}]})
            async for event in process_stream(model.stream(messages)):
                if "stop" in event:
                    messages.append(event["stop"][1])  # the assistant message, as Strands' agent loop builds it
        return model.reset()

    tasks = [asyncio.ensure_future(one(seed)) for seed in range(rollouts)]
    try:
        for _ in range(1200):  # until two rollouts made their first call (at most 120 s)
            await asyncio.sleep(0.1)
            if sum(bool(m.trajectory.turns) for m in models) >= 2 or any(t.done() for t in tasks):
                break
        async with weight_update([backend], version="1", mode=mode):
            await load("1")
        trajectories = list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
    for traj in trajectories:
        assert traj.branch == 0 and len(traj.turns) == calls, (traj.branch, traj.status_reason)
        assert traj.status == "truncated", traj.status_reason  # each call ends at its token limit
        for turn in traj.turns:
            spans = turn.weight_versions
            assert spans is not None and spans[0].start == 0 and spans[-1].end == turn.output_len
            assert all(a.end == b.start for a, b in itertools.pairwise(spans))
    continued = [turn for traj in trajectories for turn in traj.turns if turn.continued_rids]
    if mode == "abort":
        assert len(continued) >= 2, [  # what each call recorded, when too few were cut
            [(t.finish_reason, t.output_len, [(s.version, s.end) for s in t.weight_versions or ()]) for t in x.turns]
            for x in trajectories
        ]
        # each went on under the new weights (a call cut before its first token has only their span)
        assert all([s.version for s in turn.weight_versions or ()][-1] == "1" for turn in continued)
    else:
        assert not continued

    async def rescore(traj: Trajectory) -> list[float | None]:
        """Prompt logprobs of the whole trajectory under the weights loaded now (position i: token i + 1)."""
        ids = traj.token_ids
        request = GenerateRequest(rid=uuid.uuid4().hex, input_ids=ids, prefix_len=1,
                                  sampling=SamplingParams(max_new_tokens=1), return_prompt_logprobs=True)  # fmt: skip
        scored = await backend.generate(request)
        assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == len(ids) - 1
        return list(scored.prompt_logprobs)

    # (weights re-scored under, version of the span, continued turn?) -> |recorded - re-scored| of its tokens
    diffs: dict[tuple[str, str, bool], list[float]] = {}
    try:
        for weights in ("1", "default"):
            await load(weights)  # (again for "1": the engine's prefix cache may hold KV of the generation)
            for traj in trajectories:
                scored, recorded = await rescore(traj), traj.logprobs
                for turn in traj.turns:
                    for span in turn.weight_versions or ():
                        at = range(turn.output_start + span.start, turn.output_start + span.end)
                        got = [abs(recorded[i] - (scored[i - 1] or 0.0)) for i in at]  # type: ignore[operator]
                        diffs.setdefault((weights, span.version, bool(turn.continued_rids)), []).extend(got)
    finally:
        await backend.set_weight_version("default")
    own = {(v, c): max(d) for (w, v, c), d in diffs.items() if w == v}  # each token under its span's weights
    assert sum(len(d) for (w, v, _), d in diffs.items() if w == v) == sum(sum(t.loss_mask) for t in trajectories)
    other = max(max(d) for (w, v, _), d in diffs.items() if w != v)
    assert other > 0.05, f"the two checkpoints score the tokens alike ({other:.2e}): was the update a no-op?"
    assert max(d for (v, _), d in own.items() if v == "default") < 2e-2, own  # bf16, batched differently
    if mode == "abort":
        assert max(d for (_, cont), d in own.items() if cont) < 2e-2, own  # partial rollouts are exact
    sample = next(iter(continued), None) or next(
        t for traj in trajectories for t in traj.turns if len(t.weight_versions or ()) > 1
    )
    matched = ", ".join(
        f"{v!r} tokens{' of continued calls' if c else ''} {d:.2e} over {len(diffs[v, v, c])}"
        for (v, c), d in sorted(own.items())
    )
    return (
        f"new weights mid-rollout ({mode}): {rollouts} rollouts x {calls} calls, {len(continued)} calls cut and "
        f"continued, e.g. rid {sample.rid} + {list(sample.continued_rids)}: "
        f"{[(s.version, s.start, s.end) for s in sample.weight_versions or ()]}; max |logprob - re-scored under "
        f"its span's weights|: {matched}; under the other checkpoint {other:.2e}"
    )
