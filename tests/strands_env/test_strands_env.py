"""strands-env on tito, with the real strands-env package (nox -s strands_env): its environments and Evaluator on
a tito model factory, and a strands-env environment as the tools, reward and tasks of ``tito rollout``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from strands import Agent
from strands_env.core import RolloutResult, TerminationReason
from strands_env.eval import Evaluator
from strands_sglang import Rollout

from tito_core import rollout
from tito_core.errors import ConfigError, DatasetError
from tito_core.integrations.strands_env import (
    EnvironmentAdapter,
    StrandsEnvModel,
    config_model_factory,
    model_factory,
    termination_reason,
    to_tasks,
    trajectory_of,
    write_tasks,
)
from tito_core.runner import read_records
from tito_testing.scripted import ScriptedBackend, ScriptedReply
from tito_testing.tokenizers import load_qwen_tokenizer, qwen_tokenizer_dir

from . import envs
from .envs import SYSTEM, AddEnv, ExactAnswer, SetupEnv, adder_reply, looping_reply, task


@pytest.fixture
def tokenizer() -> Any:
    return load_qwen_tokenizer("qwen3")


def _env(backend: ScriptedBackend, tokenizer: Any, **config: Any) -> tuple[AddEnv, ExactAnswer]:
    reward = ExactAnswer()
    factory = model_factory(backend, tokenizer, sampling={"max_new_tokens": 64})
    return AddEnv(model_factory=factory, reward_fn=reward, system_prompt=SYSTEM, **config), reward


# ------------------------------------------------------------------------------- strands-env drives
async def test_an_environment_rollout_on_tito_keeps_the_trajectory_as_its_token_level_result(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer, [adder_reply] * 2)
    env, reward = _env(backend, tokenizer)
    result = await env.rollout(task(3))
    assert result.termination_reason == TerminationReason.TASK_COMPLETE
    assert result.reward_result is not None and result.reward_result.reward == 1.0
    assert result.metrics["tool_calls"] == 1 and result.metrics["model_calls"] == 2
    assert result.metrics["per_tool_metrics"]["add"]["parse_errors"] == 0
    rollout_ = result.rollout
    assert isinstance(rollout_, Rollout)
    traj = trajectory_of(result)
    assert traj is not None and traj.status == "completed" and len(traj.turns) == 2
    assert rollout_.token_ids == traj.token_ids and rollout_.loss_mask == traj.loss_mask
    assert rollout_.logprobs == traj.logprobs
    # what the engine got and gave: the second prompt is the whole trajectory up to its last output
    assert list(backend.requests[1].input_ids) == traj.token_ids[: len(backend.requests[1].input_ids)]
    assert sum(n for _, n in rollout_.segment_info) == len(rollout_)
    assert [out for out, _ in rollout_.segment_info] == [False, True, False, True]
    assert rollout_.initial_prompt_length == traj.prompt_length
    text = tokenizer.decode(rollout_.token_ids[: rollout_.initial_prompt_length])
    assert SYSTEM in text and "What is 3 + 10?" in text
    seen_task, seen_result = reward.seen[0]
    assert seen_task.operands == [3, 10] and seen_result.final_response == "13"


async def test_strands_env_classifies_the_token_limit_of_a_tito_model(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer, [ScriptedReply(text="a very long answer " * 20)])
    env, _ = _env(backend, tokenizer)
    result = await env.rollout(task(1))
    assert result.termination_reason == TerminationReason.MAX_TOKENS_REACHED
    traj = trajectory_of(result)
    assert traj is not None and traj.status == "truncated" and sum(result.rollout.loss_mask) == 64


async def test_a_malformed_tool_call_counts_as_a_parse_error_of_that_tool(tokenizer: Any) -> None:
    backend = ScriptedBackend(tokenizer, ['<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>', "ok"])
    model = model_factory(backend, tokenizer)()
    assert isinstance(model, StrandsEnvModel)
    await Agent(model=model, tools=[envs.add], callback_handler=None).invoke_async("add")
    assert model.tool_parse_errors == {"add": 1}


def test_a_bad_model_option_fails_when_the_factory_is_built(tokenizer: Any) -> None:
    with pytest.raises(ConfigError):
        model_factory(ScriptedBackend(tokenizer), tokenizer, tool_parser="no-such-parser")


async def test_the_factory_from_a_config_builds_fresh_models_on_one_backend(tokenizer: Any) -> None:
    config = {"backend": "scripted", "tokenizer": str(qwen_tokenizer_dir("qwen3")),
              "backend_options": {"tokenizer": tokenizer, "replies": [adder_reply] * 2}}  # fmt: skip
    factory = config_model_factory(config)
    first, second = factory(), factory()
    assert isinstance(first, StrandsEnvModel) and first is not second and first.backend is second.backend
    result = await AddEnv(model_factory=factory, reward_fn=ExactAnswer()).rollout(task(5))
    assert result.reward_result is not None and result.reward_result.reward == 1.0


async def test_the_evaluator_runs_on_tito_and_resumes_without_new_model_calls(tokenizer: Any, tmp_path: Path) -> None:
    backend = ScriptedBackend(tokenizer, [adder_reply] * 100)
    factory = model_factory(backend, tokenizer)
    reward = ExactAnswer()

    async def env_factory() -> AddEnv:
        return AddEnv(model_factory=factory, reward_fn=reward, system_prompt=SYSTEM)

    output = tmp_path / "results.jsonl"
    tasks = [task(1), task(2, truth=0)]  # the second ground truth is wrong: reward 0

    def evaluator() -> Evaluator:
        return Evaluator(env_factory, n_samples_per_prompt=2, output_path=output, keep_rollout=True)

    results = await evaluator().run(tasks)
    assert sorted(results) == ["add1", "add2"] and len(backend.requests) == 8
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(row["task"]["id"] for row in rows) == ["add1_0", "add1_1", "add2_0", "add2_1"]
    assert all(row["result"]["rollout"]["token_ids"] and not row["aborted"] for row in rows)
    again = evaluator()
    resumed = await again.run(tasks)
    assert len(backend.requests) == 8 and sum(len(s) for s in resumed.values()) == 4
    assert again.compute_metrics(resumed, log=False) == {"pass@1": 0.5, "pass@2": 0.5}


# ------------------------------------------------------------------------------------ tito drives
def _config(replies: Any, adapter: str = "env", **rollout_keys: Any) -> dict[str, Any]:
    return {
        "backend": "scripted",
        "tokenizer": str(qwen_tokenizer_dir("qwen3")),
        "backend_options": {"tokenizer": load_qwen_tokenizer("qwen3"), "replies": replies},
        "rollout": {
            "concurrency": 2,
            "tools": [f"tests.strands_env.envs:{adapter}.tools"],
            "reward": f"tests.strands_env.envs:{adapter}.reward",
            "prepare": f"tests.strands_env.envs:{adapter}.prepare",
            **rollout_keys,
        },
    }


def test_tito_rollout_takes_the_environments_tools_system_prompt_reward_and_tasks(tmp_path: Path) -> None:
    envs.REWARD.seen.clear()
    dataset = envs.env.tasks([task(1), task(2, truth=0), {"id": "add3", "message": "What is 3 + 10?",
                                                          "ground_truth": 13, "operands": [3, 10]}])  # fmt: skip
    summary = rollout(_config([adder_reply] * 100), dataset, tmp_path / "out.jsonl", group_size=2)
    assert summary.statuses == {"completed": 6}
    records = sorted(read_records(tmp_path / "out.jsonl"), key=lambda r: (r.task_id, r.sample))
    assert [r.reward for r in records] == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert all(r.tokens.tool_calls == 1 for r in records)
    tokenizer = load_qwen_tokenizer("qwen3")
    assert SYSTEM in tokenizer.decode(records[0].trajectory.token_ids)
    seen = {t.id: (t, result) for t, result in envs.REWARD.seen}
    add3, result = seen["add3"]
    assert isinstance(add3, envs.AddTask) and add3.operands == [3, 10] and add3.ground_truth == 13
    assert isinstance(result, RolloutResult) and result.termination_reason == TerminationReason.TASK_COMPLETE
    assert result.messages[0]["role"] == "user" and result.final_response == "13"


def test_the_environments_loop_limit_ends_tito_rollouts_truncated(tmp_path: Path) -> None:
    envs.REWARD.seen.clear()
    rollout(_config([looping_reply] * 100, adapter="limited"), envs.limited.tasks([task(1)]), tmp_path / "o.jsonl")
    (record,) = read_records(tmp_path / "o.jsonl")
    assert record.status == "truncated" and "max_model_calls=2" in (record.status_reason or "")
    assert record.tokens.model_calls == 2 and record.reward == 0.0
    (_, result), = envs.REWARD.seen  # fmt: skip
    assert result.termination_reason == TerminationReason.MAX_TOOL_ITERATIONS_REACHED


def test_strands_envs_own_math_environment_scores_tito_rollouts(tmp_path: Path) -> None:
    config = _config([envs.boxed_reply] * 10, adapter="math")
    tasks = envs.math.tasks(
        [task(1).model_copy(update={"ground_truth": "11"}), task(2).model_copy(update={"ground_truth": "99"})]
    )
    rollout(config, tasks, tmp_path / "out.jsonl")
    records = sorted(read_records(tmp_path / "out.jsonl"), key=lambda r: r.task_id)
    assert [(r.status, r.reward) for r in records] == [("completed", 1.0), ("completed", 0.0)]
    prompt = load_qwen_tokenizer("qwen3").decode(records[0].trajectory.token_ids[:60])
    assert envs.math.environment.system_prompt[:40] in prompt  # MathEnv's own system prompt, through prepare


def test_a_plain_tito_dataset_gets_the_environments_reward_with_the_task_built_from_its_row(tmp_path: Path) -> None:
    envs.REWARD.seen.clear()
    prompt = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is 3 + 10?"},
    ]
    row = {"id": "plain", "prompt": prompt, "answer": 13, "operands": [3, 10]}  # operands: a metadata column
    rollout(_config([adder_reply] * 10), [row], tmp_path / "out.jsonl")
    (record,) = read_records(tmp_path / "out.jsonl")
    assert record.reward == 1.0
    ((seen, result),) = envs.REWARD.seen
    assert isinstance(seen, envs.AddTask) and (seen.id, seen.ground_truth, seen.operands) == ("plain", 13, [3, 10])
    assert seen.message == "What is 3 + 10?" and [m["role"] for m in seen.conversation_history] == ["user", "assistant"]
    first = result.messages[0]  # the prompt's history is left out, as strands-env's own rollouts do
    assert (first["role"], first["content"]) == ("user", [{"text": "What is 3 + 10?"}])
    assert len(result.rollout) == record.tokens.total


def test_written_tasks_are_a_dataset_file_for_the_command(tmp_path: Path) -> None:
    path = write_tasks([task(4)], tmp_path / "tasks.jsonl")
    summary = rollout(_config([adder_reply] * 10), path, tmp_path / "out.jsonl")
    (record,) = read_records(tmp_path / "out.jsonl")
    assert summary.statuses == {"completed": 1} and record.task_id == "add4" and record.reward == 1.0


def test_history_becomes_chat_messages_and_non_text_history_is_refused() -> None:
    history = [{"role": "user", "content": [{"text": "Hi."}]}, {"role": "assistant", "content": [{"text": "Hello."}]}]
    (converted,) = to_tasks([task(1).model_copy(update={"conversation_history": history})])
    assert converted.prompt == [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."},
                                {"role": "user", "content": "What is 1 + 10?"}]  # fmt: skip
    assert converted.answer == 11 and converted.metadata["strands_env_task"]["operands"] == [1, 10]
    tool_use = [{"role": "assistant", "content": [{"toolUse": {"toolUseId": "1", "name": "add", "input": {}}}]}]
    with pytest.raises(DatasetError, match="toolUse block"):
        to_tasks([task(1).model_copy(update={"conversation_history": tool_use})])
    with pytest.raises(DatasetError, match="repeats"):
        to_tasks([task(1), task(1)])


def test_an_environment_with_its_own_episode_code_is_refused() -> None:
    with pytest.raises(ConfigError, match="overrides reset"):
        EnvironmentAdapter(SetupEnv, reward_fn=ExactAnswer())
    with pytest.raises(ConfigError, match="no reward function"):
        _ = EnvironmentAdapter(AddEnv).reward


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        ("completed", None, TerminationReason.TASK_COMPLETE),
        ("truncated", "loop limit: max_tool_calls=2 reached", TerminationReason.MAX_TOOL_CALLS_REACHED),
        ("truncated", "loop limit: 5 messages exceed max_messages=4", TerminationReason.MAX_MESSAGES_REACHED),
        ("truncated", "ContextLengthError: prompt too long", TerminationReason.CONTEXT_WINDOW_OVERFLOW),
        ("truncated", "generation hit the token limit after 64 tokens", TerminationReason.MAX_TOKENS_REACHED),
        ("aborted", "timed out after 600 s", TerminationReason.TIMEOUT),
        ("failed", "BackendConnectionError: connection refused", TerminationReason.CONNECTION_ERROR),
        ("failed", "reward function raised ValueError: x", TerminationReason.UNCLASSIFIED_ERROR),
    ],
)
def test_tito_statuses_map_to_strands_env_termination_reasons(status: str, reason: str, expected: Any) -> None:
    assert termination_reason(status, reason) == expected
