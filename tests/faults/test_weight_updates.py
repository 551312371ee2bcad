"""Weight updates while rollouts are in flight (``tito_core.weights.weight_update``), against the fault server of
each adapter: keep mode loses nothing and labels every token once; abort mode continues every cut call from its
tokens (a partial rollout), again when a second update cuts the continuation, and keeps the tokens of a
continuation that fails; a refused pause, a lost resume and an update that fails halfway leave every engine
resumed (or name the one still paused) and every rollout with a status."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from strands import tool

from tests.helpers import add
from tito_core import partial
from tito_core.errors import ConfigError, WeightUpdateError
from tito_core.weights import weight_update

from .conftest import Harness, Outcome, add_after_pause, check_trajectory, first_gens
from .server import Fault, FaultServer, on_path

PAUSE = {"sglang": "/pause_generation", "vllm": "/pause"}
RESUME = {"sglang": "/continue_generation", "vllm": "/resume"}


def _covered_once(outcome: Outcome) -> list[int]:
    """Check that each turn's version spans tile its output exactly; return the turns' span counts."""
    counts = []
    for turn in outcome.traj.turns:
        spans = turn.weight_versions
        assert spans is not None, f"turn {turn.index} recorded no versions"
        assert spans[0].start == 0 and spans[-1].end == turn.output_len
        assert all(a.end == b.start for a, b in itertools.pairwise(spans))
        counts.append(len(spans))
    return counts


def _backend(h: Harness) -> Any:
    """A backend without a time limit of its own: the calls these tests hold end when the test acts (a hang ends at
    the rollout's limit, :meth:`Harness.rollout`)."""
    return h.backend(timeout=None)


async def _in_flight(h: Harness, n: int, backend: Any, tool: Any = add) -> list[asyncio.Task[Outcome]]:
    """``n`` rollouts of three model calls each, started; returns once all made a call. Keep-mode tests give a tool
    that waits for the pause (:func:`add_after_pause`), abort-mode ones a server that decodes the first calls until
    the pause cuts them (``decode_until_cut``)."""
    h.server.tool_turns = 2
    tasks = [asyncio.ensure_future(h.rollout(backend=backend, tools=(tool,))) for _ in range(n)]
    assert await h.wait_for(lambda: len(h.server.gen_requests()) >= n, timeout=10.0)
    return tasks


def _held(h: Harness) -> int:
    return sum(r.held for r in h.server.received)


async def test_keep_mode_loses_no_rollout_and_labels_every_token_once(h: Harness) -> None:
    backend = _backend(h)
    tasks = await _in_flight(h, 8, backend, add_after_pause(h.server))
    async with weight_update([backend], version=1):
        # the rollouts' next calls arrive while the engine is paused: they are held, not refused or aborted
        assert await h.wait_for(lambda: _held(h) == 8)
    outcomes = await asyncio.gather(*tasks)
    assert h.server.pauses == ["pause", "version:1", "resume"]
    for outcome in outcomes:
        assert outcome.error is None and outcome.traj.status == "completed"
        h.check(outcome)  # recorded exactly what the engine sent, no request generated twice
        _covered_once(outcome)
        versions = [[s.version for s in turn.weight_versions or ()] for turn in outcome.traj.turns]
        assert versions == [["default"], ["default", "1"], ["1"]]  # the held call straddled the update


async def test_a_refused_pause_resumes_the_engines_already_paused(h: Harness, qwen3_tokenizer: Any) -> None:
    other = await FaultServer(qwen3_tokenizer).start()
    try:
        first, second = h.backend(), h.backend(other.url)
        other.inject(Fault.http_status(500), on_path(PAUSE[h.adapter]))
        ran = False
        with pytest.raises(WeightUpdateError, match=f"{other.url} refused to pause") as caught:
            async with weight_update([first, second], version=2):
                ran = True
        assert not ran and caught.value.paused == []
        assert h.server.pauses == ["pause", "resume"] and other.pauses == []  # nothing left paused
        outcome = await h.rollout(backend=first)  # and the engine generates as before
        assert outcome.traj.status == "completed"
    finally:
        await other.aclose()


async def test_a_lost_resume_is_sent_again(h: Harness) -> None:
    backend = _backend(h)
    tasks = await _in_flight(h, 4, backend, add_after_pause(h.server))
    h.server.inject(Fault.reset(after_read=True), on_path(RESUME[h.adapter]))  # the first resume's answer is lost
    async with weight_update([backend], version="v2", retry_delay_s=0.05):
        assert await h.wait_for(lambda: _held(h) == 4)
    assert h.server.pauses == ["pause", "version:v2", "resume"]
    for outcome in await asyncio.gather(*tasks):
        assert outcome.traj.status == "completed"
        h.check(outcome)
        _covered_once(outcome)


async def test_an_update_that_fails_halfway_leaves_the_engine_resumed_and_every_rollout_with_a_status(
    h: Harness,
) -> None:
    backend = _backend(h)
    tasks = await _in_flight(h, 4, backend, add_after_pause(h.server))
    with pytest.raises(RuntimeError, match="the weight push failed"):
        async with weight_update([backend], version=3):
            assert await h.wait_for(lambda: _held(h) == 4)
            raise RuntimeError("the weight push failed")
    assert h.server.pauses == ["pause", "resume"]  # resumed; the version was not changed
    for outcome in await asyncio.gather(*tasks):
        assert outcome.traj.status == "completed"
        h.check(outcome)
        assert {s.version for turn in outcome.traj.turns for s in turn.weight_versions or ()} == {"default"}


async def test_an_engine_that_cannot_be_resumed_is_named_and_its_rollouts_end_with_a_status(h: Harness) -> None:
    backend = _backend(h)

    @tool(name="add")
    async def add_then_time_out(a: int, b: int) -> int:
        """Add two integers."""
        await h.server.paused()
        backend.http.timeout = 1.0  # for the next calls only: the paused engine holds them
        return a + b

    tasks = await _in_flight(h, 2, backend, add_then_time_out)
    h.server.inject(Fault.http_status(500), on_path(RESUME[h.adapter]), times=-1)
    with pytest.raises(WeightUpdateError, match="could not be resumed") as caught:
        async with weight_update([backend], version=4, resume_attempts=2, retry_delay_s=0.05):
            assert await h.wait_for(lambda: _held(h) == 2)
            backend.http.timeout = None  # the held calls keep theirs; the resumes get none
    assert caught.value.paused == [h.server.url]
    for outcome in await asyncio.gather(*tasks):  # held past the backend's timeout: ended, with the reason
        assert outcome.traj.status in ("failed", "aborted") and outcome.traj.status_reason
        h.check(outcome)
    h.server.rules.clear()
    await backend.resume_generation()  # the server's own state, for the next test


async def test_a_backend_without_pause_is_refused_before_anything() -> None:
    from tito_testing.scripted import ScriptedBackend
    from tito_testing.tokenizers import load_qwen_tokenizer

    with pytest.raises(ConfigError, match="has no pause"):
        async with weight_update([ScriptedBackend(load_qwen_tokenizer("qwen3"))]):
            pass


async def test_a_runner_pool_updates_every_server(h: Harness, qwen3_tokenizer: Any) -> None:
    from tito_core.runner.servers import ServerPool

    other = await FaultServer(qwen3_tokenizer).start()
    try:
        pool = ServerPool([(h.server.url, h.backend()), (other.url, h.backend(other.url))])
        async with pool.weight_update(version=5):
            assert h.server.pauses == other.pauses == ["pause"]
        assert h.server.pauses == other.pauses == ["pause", "version:5", "resume"]
    finally:
        await other.aclose()


async def test_recompute_mode_is_sglangs_retract_and_vllm_has_none(h: Harness) -> None:
    backend = h.backend()
    if h.adapter == "vllm":
        with pytest.raises(WeightUpdateError, match="cannot pause in 'recompute' mode"):
            async with weight_update([backend], mode="recompute"):
                pass
        assert h.server.pauses == []
    else:
        async with weight_update([backend], mode="recompute"):
            pass
        assert h.server.pauses == ["pause", "resume"]


def _continuation(rid: str | None) -> bool:
    """Whether ``rid`` is a continuation's: ``tito-<hex>-c<n>``."""
    return rid is not None and rid.count("-") == 2 and rid.rsplit("-", 1)[1][:1] == "c"


def _continued(outcomes: list[Outcome]) -> list[Any]:
    return [turn for o in outcomes for turn in o.traj.turns if turn.continued_rids]


async def test_abort_mode_continues_every_cut_call_from_its_tokens(h: Harness) -> None:
    backend = _backend(h)
    h.server.decode_until_cut = first_gens(8)  # each rollout's first call decodes until the abort-mode pause
    tasks = await _in_flight(h, 8, backend)
    async with weight_update([backend], version=1, mode="abort"):
        assert await h.wait_for(lambda: sum(r.cut for r in h.server.received) == 8)
        cut = [r.rid for r in h.server.received if r.cut]
        assert not any(_continuation(r.rid) for r in h.server.received)  # nothing is continued while paused
    outcomes = await asyncio.gather(*tasks)
    assert h.server.pauses == ["pause:abort", "version:1", "resume"]
    for outcome in outcomes:
        assert outcome.error is None and outcome.traj.status == "completed"
        assert outcome.traj.branch == 0 and len(outcome.traj.turns) == 3  # never restarted, nothing forked
        h.check(outcome)  # each turn: the cut answer, then its continuation's, each generated once
        _covered_once(outcome)
    continued = _continued(outcomes)
    assert sorted(t.rid for t in continued) == sorted(cut)
    for turn in continued:
        assert turn.continued_rids == (f"{turn.rid}-c1",) and turn.finish_reason == "stop"
        assert [s.version for s in turn.weight_versions or ()] == ["default", "1"]  # one turn, two spans
    assert sum(r.continued for r in h.server.received) == len(cut)


async def test_an_abort_while_a_continuation_decodes_continues_it_again(h: Harness) -> None:
    backend = _backend(h)
    first_calls = first_gens(2)
    h.server.decode_until_cut = lambda r: first_calls(r) or (r.rid or "").endswith("-c1")  # and their continuations
    tasks = await _in_flight(h, 2, backend)
    async with weight_update([backend], version=1, mode="abort"):
        assert await h.wait_for(lambda: sum(r.cut for r in h.server.received) == 2)
    assert await h.wait_for(lambda: sum(r.continued for r in h.server.received) == 2)
    async with weight_update([backend], version=2, mode="abort"):  # the continuations are decoding: cut again
        assert await h.wait_for(lambda: sum(r.cut and r.continued for r in h.server.received) == 2)
    outcomes = await asyncio.gather(*tasks)
    for outcome in outcomes:
        assert outcome.traj.status == "completed"
        h.check(outcome)
        _covered_once(outcome)
    twice = [t for t in _continued(outcomes) if len(t.continued_rids) == 2]
    assert len(twice) == 2
    for turn in twice:
        assert turn.continued_rids == (f"{turn.rid}-c1", f"{turn.rid}-c2")
        assert [s.version for s in turn.weight_versions or ()] == ["default", "1", "2"]


async def test_a_continuation_lost_to_a_fault_keeps_the_cut_tokens_and_ends_with_a_status(h: Harness) -> None:
    backend = _backend(h)
    h.server.decode_until_cut = first_gens(2)
    h.server.inject(Fault.reset(after_read=True), lambda r: (r.rid or "").endswith("-c1"), times=-1)
    tasks = await _in_flight(h, 2, backend)
    async with weight_update([backend], version=1, mode="abort"):
        assert await h.wait_for(lambda: sum(r.cut for r in h.server.received) == 2)
    for outcome in await asyncio.gather(*tasks):
        assert outcome.error is not None
        traj = outcome.traj
        assert traj.status in ("failed", "aborted") and traj.status_reason
        last = traj.turns[-1]  # the cut call: its tokens are recorded, as an aborted turn with no continuation
        assert last.finish_reason == "abort" and last.output_len > 0 and last.continued_rids == ()
        assert [s.version for s in last.weight_versions or ()] == ["default"]
        h.check(outcome)


async def test_a_rollout_cancelled_while_waiting_for_the_resume_keeps_the_cut_tokens(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting: list[object] = []
    real_wait = partial.wait_for_resume

    async def counted_wait(backend: Any) -> None:
        waiting.append(backend)
        await real_wait(backend)

    monkeypatch.setattr(partial, "wait_for_resume", counted_wait)
    backend = _backend(h)
    h.server.decode_until_cut = first_gens(2)
    models = [h.model(backend) for _ in range(2)]
    tasks = [asyncio.ensure_future(h.rollout(model=m)) for m in models]
    assert await h.wait_for(lambda: len(h.server.gen_requests()) >= 2, timeout=10.0)
    async with weight_update([backend], version=1, mode="abort"):
        assert await h.wait_for(lambda: sum(r.cut for r in h.server.received) == 2)
        # the cut calls wait for the resume, however slow the machine
        assert await h.wait_for(lambda: len(waiting) >= 2), "the cut calls never waited for the resume"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert not any(r.continued for r in h.server.received)
    for model in models:
        traj = model.trajectory
        assert traj.status == "aborted" and traj.status_reason
        assert len(traj.turns) == 1 and traj.turns[0].finish_reason == "abort" and traj.turns[0].output_len > 0
        check_trajectory(h.server, traj)


# -- the weight probe (weight_update(..., probe=...)) over HTTP ------------------------------------------------------

PROBE_IDS = (151644, 872, 198, 9707, 11, 1879, 0, 151645)


def _probe(logprob: float = -0.75) -> Any:
    from tito_core.weights import WeightProbe

    return WeightProbe(token_ids=PROBE_IDS, logprobs=(logprob,) * (len(PROBE_IDS) - 1))


async def test_a_probe_of_the_weights_served_passes_after_the_resume(h: Harness) -> None:
    backend = _backend(h)
    tasks = await _in_flight(h, 4, backend, add_after_pause(h.server))
    async with weight_update([backend], version=1, probe=_probe()) as update:
        assert not any(r.input_ids == list(PROBE_IDS) for r in h.server.received)  # nothing scored while paused
    assert h.server.pauses == ["pause", "version:1", "resume"]
    (score,) = update.probes
    assert score.passed and score.max_diff == 0.0 and score.tokens == len(PROBE_IDS) - 1
    scored = [r for r in h.server.received if r.input_ids == list(PROBE_IDS)]
    assert len(scored) == 1 and not scored[0].held  # one prefill, sent once the engine runs again
    for outcome in await asyncio.gather(*tasks):
        assert outcome.traj.status == "completed"
        h.check(outcome)


async def test_a_probe_of_other_weights_pauses_the_engine_again_and_its_rollouts_wait(h: Harness) -> None:
    backend = _backend(h)
    tasks = await _in_flight(h, 2, backend, add_after_pause(h.server, times=2))  # their next calls: after the probe
    h.server.prompt_logprob = -1.25  # the engine "loaded" other weights: 0.5 nats a token from the trainer's
    with pytest.raises(WeightUpdateError) as caught:
        async with weight_update([backend], version=2, probe=_probe()):
            pass
    message = str(caught.value)
    assert f"{h.server.url}: mean |logprob - the trainer's| 0.5 nats, max 0.5, over 7 tokens" in message
    again = {"sglang": "recompute", "vllm": "keep"}[h.adapter]  # recompute where the engine has it (SGLang)
    assert f"paused again ({again})" in message and caught.value.paused == [h.server.url]
    assert h.server.pauses == ["pause", "version:2", "resume", "pause"]  # left paused
    assert await h.wait_for(lambda: _held(h) == 2)  # the rollouts' next calls wait in the paused engine
    await backend.resume_generation()  # the operator resumes it: they go on
    for outcome in await asyncio.gather(*tasks):
        assert outcome.traj.status == "completed"
        h.check(outcome)
        _covered_once(outcome)


async def test_in_abort_mode_a_failed_probe_cuts_nothing_more_and_continues_nothing(h: Harness) -> None:
    backend = _backend(h)
    h.server.decode_until_cut = first_gens(2)
    tasks = await _in_flight(h, 2, backend)
    h.server.prompt_logprob = -2.0
    with pytest.raises(WeightUpdateError, match="paused again \\(abort\\)"):
        async with weight_update([backend], version=3, mode="abort", probe=_probe()):
            assert await h.wait_for(lambda: sum(r.cut for r in h.server.received) == 2)
    assert h.server.pauses == ["pause:abort", "version:3", "resume", "pause:abort"]
    # the cut calls were continued only after the probe: to the paused engine, which holds them
    probe_at = next(r.n for r in h.server.received if r.input_ids == list(PROBE_IDS))

    def continuations() -> list[Any]:  # (a probe's rid, tito-probe-<hex>, may look like one)
        return [r for r in h.server.received if _continuation(r.rid) and r.input_ids != list(PROBE_IDS)]

    assert await h.wait_for(lambda: len(continuations()) == 2)
    assert all(r.n > probe_at and r.held for r in continuations())
    await backend.resume_generation()  # the operator resumes the engine: the held continuations finish the turns
    for outcome in await asyncio.gather(*tasks):
        assert outcome.traj.status == "completed"
        h.check(outcome)
        _covered_once(outcome)
