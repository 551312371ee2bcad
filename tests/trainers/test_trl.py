"""TRL: the installed GRPOTrainer trains one step on tito rollouts given through its rollout_func hook."""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest

from tito_core.export import to_trl
from tito_core.trainers.trl import rollout_func, run_sync

from .helpers import WEIGHT_VERSION, solve, tool_tokens

trl = pytest.importorskip("trl", reason="trl is not installed (nox -s trainers installs trl==1.16.0)")
torch = pytest.importorskip("torch", reason="torch is not installed")
datasets = pytest.importorskip("datasets", reason="datasets (a trl dependency) is not installed")


def test_one_grpo_step_on_tito_rollouts(tiny_qwen3, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    answers = itertools.cycle(["12", "13"])  # alternating right and wrong: every group has an advantage
    produced = []

    async def rollout(prompt):
        traj = await solve(tokenizer, prompt, "3 * 4", next(answers))
        produced.append(traj)
        return traj

    seen = []

    versions = []

    def reward(completions, completion_ids, **kwargs):
        seen.extend(completion_ids)
        versions.extend(kwargs["weight_versions"])  # tito's extra column reaches the reward functions
        return [1.0 if "answer is 12" in text else 0.0 for text in completions]

    config = trl.GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=256,
        max_steps=1,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
    )
    dataset = datasets.Dataset.from_dict({"prompt": ["What is 3 times 4?", "Compute 3 * 4."]})
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func(rollout),
    )
    trainer.train()

    assert trainer.state.global_step == 1
    # the trainer consumed exactly tito's ids, one rollout per prompt it passed
    assert len(produced) == 4 and seen == to_trl(produced)["completion_ids"]
    assert versions == to_trl(produced)["weight_versions"] and {"7", None} == {v for row in versions for v in row}
    assert all(tool_tokens(t) > 0 for t in produced)
    # env_mask reached the loss: TRL counts only env_mask=1 tokens as completion length
    logged = next(entry for entry in trainer.state.log_history if "completions/mean_length" in entry)
    model_tokens = [sum(t.loss_mask[t.prompt_length :]) for t in produced]
    assert logged["completions/mean_length"] == pytest.approx(sum(model_tokens) / len(model_tokens))
    assert logged["completions/mean_length"] < sum(len(t) - t.prompt_length for t in produced) / len(produced)
    # and the step moved the weights
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert changed


def test_rollout_func_returns_columns_in_prompt_order(qwen3_tokenizer):
    async def rollout(prompt):
        return await solve(qwen3_tokenizer, prompt, prompt, prompt)

    out = rollout_func(rollout, max_concurrency=2)(["1 + 1", "2 * 3", "7 - 5"], trainer=None)
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", "weight_versions"}
    texts = [qwen3_tokenizer.decode(ids) for ids in out["completion_ids"]]
    assert ["The answer is 1 + 1." in texts[0], "The answer is 2 * 3." in texts[1], "7 - 5." in texts[2]] == [True] * 3
    columns = zip(out["completion_ids"], out["logprobs"], out["env_mask"], out["weight_versions"], strict=True)
    for ids, lps, mask, versions in columns:
        assert len(ids) == len(lps) == len(mask) == len(versions) and 0 < sum(mask) < len(mask)
        assert versions == [WEIGHT_VERSION if m else None for m in mask]


def test_rollout_func_rejects_a_non_trajectory():
    async def rollout(prompt):
        return {"completion_ids": [1]}

    with pytest.raises(TypeError, match="must return a tito Trajectory"):
        rollout_func(rollout)(["x"], trainer=None)


def test_run_sync_inside_a_running_loop():
    async def inner():
        return run_sync(asyncio.sleep(0, result=7))

    assert asyncio.run(inner()) == 7
