"""Agent Lightning v1: a tito rollout run by its local runner's entry point, recorded in its store as
events, read back by its own training bridge (triplets, then its verl RolloutAdapter) exactly."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from tito_core.errors import ConfigError
from tito_core.export import model_request_events, to_verl
from tito_core.trainers.agentlightning import post_rollout

from . import agl_agent
from .helpers import solve

pytest.importorskip(
    "agentlightning.server.app",
    reason="agentlightning is not installed (nox -s trainers installs agentlightning==1.0.2 with --no-deps)",
)
from agentlightning.controller.local_reconciler import (
    _build_env_from_map,
    _run_local_reconciler_worker,
)
from agentlightning.server.app import create_app
from agentlightning.verl.agl_rollout_manager import AglRolloutManagerBase, EnqueuedRollout

KEY = "test-key"
AGENT = "tests.trainers.agl_agent:Solve"


@pytest.fixture(scope="module")
def agl_url():
    """Agent Lightning's server (store and gateway app), on a free local port."""
    import uvicorn

    config = {
        "key": KEY,
        "default_proxy": {"model_name": "tiny", "train": {"temperature": 1}, "val": {"temperature": 1}},
    }
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "Agent Lightning's server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def run_like_the_local_runner(agl_url, monkeypatch, task):
    """Enqueue a rollout, run its agent class as the local runner's subprocess would, mark it succeeded."""
    api = httpx.Client(base_url=agl_url, headers={"Authorization": f"Bearer {KEY}"})
    local = {"agent_class": AGENT, "env_map": {"AGL_TASK": "input"}}
    (rollout,) = api.post("/api/rollouts", json=[{"input": task, "config": {"local": local}}]).raise_for_status().json()
    rid = rollout["rollout_id"]
    api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running", "last_attempt_id": "0"}}).raise_for_status()
    # the environment LocalReconciler._spawn_for gives the agent process
    monkeypatch.setenv("AGL_KEY", KEY)
    monkeypatch.setenv("AGL_EVENT_URL", f"{agl_url}/api/rollouts/{rid}/attempt/0/events")
    for name, value in _build_env_from_map(task, local["env_map"]).items():
        monkeypatch.setenv(name, value)
    agl_agent.TRAJECTORIES.clear()
    assert _run_local_reconciler_worker(AGENT) == 0
    api.patch(f"/api/rollouts/{rid}", json={"status": {"state": "succeeded"}}).raise_for_status()
    (traj,) = agl_agent.TRAJECTORIES
    return rid, traj


def completed(agl_url, rid):
    """The training bridge's view of a finished rollout (AglRolloutManager's own fetch)."""
    manager = AglRolloutManagerBase(agl_base_url=agl_url, agl_key=KEY, model="tiny", step=0)
    enqueued = EnqueuedRollout(data_id="d0", rollout_id=rid, step=0, sample_idx_in_step=0, enqueue_time=0.0)
    return manager._build_completed_rollout(enqueued, manager._get_rollout(rid))


def test_triplets_carry_exact_ids_and_logprobs(agl_url, monkeypatch):
    task = {"question": "What is 6 times 7?", "expression": "6 * 7", "answer": "42"}
    rid, traj = run_like_the_local_runner(agl_url, monkeypatch, task)
    result = completed(agl_url, rid)
    assert result.final_reward == 1.0 and len(result.triplets) == len(traj.turns) == 2
    ids, lps = traj.token_ids, traj.logprobs
    for triplet, turn in zip(result.triplets, traj.turns, strict=True):
        start, end = turn.output_start, turn.output_start + turn.output_len
        assert triplet.prompt["token_ids"] == ids[:start]
        assert triplet.response["token_ids"] == ids[start:end]
        assert triplet.response["log_probs"] == lps[start:end]  # bit for bit
    assert result.triplets[-1].reward == 1.0 and result.triplets[0].reward is None


def test_its_verl_adapter_rebuilds_the_trajectory(agl_url, monkeypatch):
    torch = pytest.importorskip("torch")
    from agentlightning.verl.rollout_adapter import RolloutAdapter

    task = {"question": "What is 2 + 5?", "expression": "2 + 5", "answer": "8"}  # a wrong answer: reward 0
    rid, traj = run_like_the_local_runner(agl_url, monkeypatch, task)
    result = completed(agl_url, rid)
    assert result.final_reward == 0.0
    adapter = RolloutAdapter(
        max_prompt_length=512,
        max_response_length=512,
        device=torch.device("cpu"),
        pad_token_id=151643,
        trace_aggregator_level="trajectory",
    )
    batch, metrics = adapter.get_train_data_batch([result])
    assert metrics["training/n_sample"] == 1 and metrics["training/n_trace_merge_mismatch_rows"] == 0
    row = batch.batch
    expected = to_verl(traj)
    prompt = row["prompts"][0][row["attention_mask"][0][:512].bool()].tolist()
    n = len(expected["response_ids"])
    assert prompt == expected["prompt_ids"]
    assert row["responses"][0][:n].tolist() == expected["response_ids"]
    assert row["response_mask"][0][:n].tolist() == expected["response_mask"]
    rollout_lps = row["rollout_log_probs"][0][:n]
    assert torch.equal(rollout_lps, torch.tensor(expected["response_logprobs"], dtype=torch.float32))


def test_event_payloads_and_a_missing_url(qwen3_tokenizer, monkeypatch):
    from tito_core import Trajectory
    from tito_core.trajectory import Turn, Usage

    traj = asyncio.run(solve(qwen3_tokenizer, "1 + 1?", "1 + 1", "2"))
    events = model_request_events(traj)
    choices = [e["response"]["choices"][0] for e in events]
    assert [c["token_ids"][-1] for c in choices] == [151645, 151645]  # the stop token is kept
    assert [len(c["logprobs"]["content"]) for c in choices] == [t.output_len for t in traj.turns]
    assert [e["model_version"] for e in events] == [7, 7]  # Agent Lightning's own field
    assert [c["weight_versions"] for c in choices] == [
        [{"version": "7", "start": 0, "end": t.output_len}] for t in traj.turns
    ]
    # an output without logprobs gets none (the bridge then trains without rollout logprobs)
    bare = Trajectory("r")
    bare.append("prompt", [1, 2], turn=0)
    bare.append("output", [3, 4], [None, None], turn=0)
    usage = Usage(prompt_tokens=2, completion_tokens=2)
    bare.add_turn(Turn(index=0, rid="x", prompt_start=0, prompt_len=2, output_len=2, finish_reason="stop",
                       stop_reason="end_turn", usage=usage))  # fmt: skip
    (event,) = model_request_events(bare)
    assert "logprobs" not in event["response"]["choices"][0] and event["response"]["prompt_token_ids"] == [1, 2]
    monkeypatch.delenv("AGL_EVENT_URL", raising=False)
    with pytest.raises(ConfigError, match="AGL_EVENT_URL"):
        asyncio.run(post_rollout(traj, 1.0))
