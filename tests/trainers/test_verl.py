"""verl: AgentLoopOutput built and validated by the installed verl, and tito's agent loop loaded as verl loads one."""

from __future__ import annotations

import asyncio

import pytest

from tito_core.export import to_verl
from tito_testing.scripted import scripted_logprob

from .helpers import call, new_agent, solve

verl_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed (nox -s trainers installs verl==0.9.1 without its GPU stack)",
)
hydra_utils = pytest.importorskip("hydra.utils")
from omegaconf import OmegaConf  # noqa: E402 - verl's dependency, present once verl imports
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

IM_END = 151645


class StandInServer:
    """verl's server manager interface (``generate(request_id, *, prompt_ids, sampling_params)``) answering
    scripted texts as verl's own ``TokenOutput``."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls, self.outputs = tokenizer, list(texts), [], []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls.append((request_id, list(prompt_ids), dict(sampling_params)))
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) + [IM_END]
        self.outputs.append(ids)
        logprobs = [scripted_logprob(t, len(prompt_ids) + i) for i, t in enumerate(ids)]
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")


async def solve_row(model, raw_prompt, **row):
    """The rollout a verl dataset row runs: the calculator agent on the row's last user message."""
    result = await new_agent(model).invoke_async(raw_prompt[-1]["content"])
    return 1.0 if "42" in str(result) else 0.0


def trainer_config(response_length=1024):
    return OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": response_length}}, "data": {}})


def instantiate_like_worker(entry, server, tokenizer, config):
    """What verl's AgentLoopWorker does with a registry entry before awaiting ``run``."""
    return hydra_utils.instantiate(
        config=entry,
        trainer_config=verl_loop.DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        hf_model_type="qwen3",
        dataset_cls=object,
        data_config=verl_loop.DictConfigWrap(config.data),
        tools=verl_loop.ToolListWrap([]),
    )


ROW = {"raw_prompt": [{"role": "user", "content": "What is 6 times 7?"}], "extra_info": {}, "index": 0}


def check_output(out, server):
    assert isinstance(out, verl_loop.AgentLoopOutput)
    (_, first, params), (_, second, _) = server.calls
    assert params["temperature"] == 0.6 and params["logprobs"] is True  # verl's sampling params, passed on
    assert out.prompt_ids == first  # the first prompt, exactly as sent
    assert second[: len(first)] == first  # token in: the second call extends the first
    full = out.prompt_ids + out.response_ids
    assert full[: len(second)] == second
    # the model's outputs, exactly as the server returned them, are the loss-1 tokens
    reply1, reply2 = server.outputs
    assert full[len(first) : len(first) + len(reply1)] == reply1 and full[len(second) :] == reply2
    spans = [(len(first), len(first) + len(reply1)), (len(second), len(full))]
    expected = [int(any(a <= i < b for a, b in spans)) for i in range(len(first), len(full))]
    assert out.response_mask == expected
    model_positions = [i for i, m in enumerate(out.response_mask) if m]
    for i in model_positions:
        pos = len(first) + i
        assert out.response_logprobs[i] == pytest.approx(scripted_logprob(full[pos], pos))
    assert all(lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if not m)
    assert 0 < sum(out.response_mask) < len(out.response_mask)  # the tool result is in, masked out
    assert out.reward_score == 1.0 and out.num_turns == 2
    assert out.metrics.generate_sequences >= 0.0 and out.metrics.num_preempted == -1


def test_agent_loop_registered_by_name(qwen3_tokenizer):
    from tito_core.trainers.verl import register_agent_loop

    register_agent_loop("tito")
    entry = verl_loop._agent_loop_registry["tito"]
    assert entry == {"_target_": "tito_core.trainers.verl_agent_loop.TitoAgentLoop"}
    server = StandInServer(qwen3_tokenizer, [call("6 * 7"), "The answer is 42."])
    loop = instantiate_like_worker(entry, server, qwen3_tokenizer, trainer_config())
    row = {**ROW, "extra_info": {"tito_rollout": "tests.trainers.test_verl.solve_row"}}
    out = asyncio.run(loop.run({"temperature": 0.6, "top_p": 1.0, "logprobs": True}, **row))
    check_output(out, server)


def test_agent_loop_from_a_config_file(qwen3_tokenizer, tmp_path):
    path = tmp_path / "agent_loops.yaml"
    path.write_text(
        "- name: tito_solve\n"
        "  _target_: tito_core.trainers.verl_agent_loop.TitoAgentLoop\n"
        "  rollout: tests.trainers.test_verl.solve_row\n"
    )
    entries = {entry.name: entry for entry in OmegaConf.load(path)}  # as AgentLoopWorker reads the file
    server = StandInServer(qwen3_tokenizer, [call("6 * 7"), "The answer is 42."])
    loop = instantiate_like_worker(entries["tito_solve"], server, qwen3_tokenizer, trainer_config(response_length=8))
    out = asyncio.run(loop.run({"temperature": 0.6, "logprobs": True}, **ROW))
    # verl's response_length cuts the response, as its own loops do
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) == 8


def test_agent_loop_output_from_a_trajectory(qwen3_tokenizer):
    from pydantic import ValidationError

    from tito_core.trainers.verl import agent_loop_output

    traj = asyncio.run(solve(qwen3_tokenizer, "What is 6 times 7?", "6 * 7", "42"))
    out = agent_loop_output(traj, reward_score=0.5, metrics={"tool_calls": 0.25})
    fields = to_verl(traj)
    assert out.prompt_ids == fields["prompt_ids"] and out.response_ids == fields["response_ids"]
    assert out.response_mask == fields["response_mask"] and out.response_logprobs == fields["response_logprobs"]
    assert out.metrics.tool_calls == 0.25 and out.reward_score == 0.5
    assert out.extra_fields == {"min_global_steps": 7, "max_global_steps": 7}  # verl's own version fields
    # verl requires the metrics: without them its model refuses the output
    with pytest.raises(ValidationError, match="metrics"):
        verl_loop.AgentLoopOutput(**{k: v for k, v in fields.items() if k != "metrics"})


def test_per_turn_rewards_become_verls_token_level_returns_per_turn(qwen3_tokenizer):
    """``turn_token_scores`` (each turn's reward at its last output token) under verl's own REINFORCE++ returns:
    every token of a turn is credited with its turn's reward and the later ones', tool results with nothing."""
    import torch
    from verl.trainer.config.algorithm import AlgoConfig
    from verl.trainer.ppo.core_algos import compute_reinforce_plus_plus_outcome_advantage

    traj = asyncio.run(solve(qwen3_tokenizer, "What is 6 times 7?", "6 * 7", "42"))  # a call, then the answer
    fields = to_verl(traj, turn_rewards=[0.5, 1.0])
    out = verl_loop.AgentLoopOutput(**fields)  # verl's model takes it; `turn_scores` is one of verl's own keys
    assert out.extra_fields["turn_scores"] == [0.5, 1.0]  # as verl's: one score per turn
    scores = torch.tensor([fields["extra_fields"]["turn_token_scores"]], dtype=torch.float32)
    mask = torch.tensor([fields["response_mask"]], dtype=torch.float32)
    _, returns = compute_reinforce_plus_plus_outcome_advantage(scores, mask, config=AlgoConfig(gamma=1.0))
    turns: list[list[float]] = []  # the returns of each run of model tokens (one turn's output), in order
    current: list[float] | None = None
    for m, value in zip(fields["response_mask"], returns[0].tolist(), strict=True):
        if not m:
            current = None
            continue
        if current is None:
            current = []
            turns.append(current)
        current.append(value)
    assert len(turns) == 2 and set(turns[0]) == {1.5} and set(turns[1]) == {1.0}
    assert all(v == 0 for m, v in zip(fields["response_mask"], returns[0].tolist(), strict=True) if not m)
