"""The A/B benchmark's pieces, run by `nox -s train_demo` beside its smoke run.

The PPO step on the tiny random Qwen3 with a LoRA adapter, what each arm is given, and the tasks.
"""

from __future__ import annotations

import copy
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_ab as ab  # noqa: E402

demo = ab.demo
PROMPT = [9707, 1052, 11, 1246, 525, 498, 30, 151645, 198]


@pytest.fixture(scope="module")
def policy() -> Any:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tito_testing.tiny_model import build_tiny_qwen3

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(), dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # LoRA's B starts at 0: make the adapter matter
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    return model


def group(advantages: list[float], old_shift: float | None = None, model: Any = None) -> list[ab.Row]:
    """A group sharing PROMPT (output, a tool result, output); ``old_shift``: old = the model's own + shift."""
    rows = []
    for i, advantage in enumerate(advantages):
        ids = [*PROMPT, 100 + i, 200 + i, 151645, 151644, 872, 198, 17 + i, *([300 + i] * (i + 1)), 151645]
        mask = [0] * len(PROMPT) + [1, 1, 1, 0, 0, 0, 0] + [1] * (i + 2)
        n = len(ab.loss_positions(mask))
        rows.append(ab.Row(ids, mask, advantage, 0, [None] * n, [None] * n))
    if old_shift is not None:
        with torch.no_grad():
            for row, lp in zip(rows, demo.group_token_logprobs(model, rows), strict=True):  # type: ignore[arg-type]
                row.old = [x + old_shift for x in lp.tolist()]
                row.sampled = list(row.old)
    return rows


def step(model: Any, rows: list[ab.Row]) -> tuple[dict[str, Any], list[Any]]:
    """``ppo_step`` on a copy of ``model`` with plain SGD; its stats and the adapter's new weights."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    stats = ab.ppo_step(model, torch.optim.SGD(params, lr=0.5), rows, max_grad_norm=1e9)
    return stats, [p.detach().clone() for p in params]


def test_with_the_trainers_own_old_logprobs_the_step_is_the_demos_reinforce_step(policy: Any) -> None:
    advantages = [1.0, -0.5, -0.5]
    stats, after = step(policy, group(advantages))
    model = copy.deepcopy(policy)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    rollouts = [demo.Rollout(r.token_ids, r.loss_mask, r.advantage, r.group) for r in group(advantages)]
    demo.reinforce_step(model, torch.optim.SGD(params, lr=0.5), rollouts, max_grad_norm=1e9)
    for a, b in zip(after, params, strict=True):
        assert torch.allclose(a, b.detach(), atol=1e-6)
    assert any(not torch.equal(a, s) for a, s in zip(after, before, strict=True))  # it moved
    assert stats["ratio_p1"] == stats["ratio_p99"] == 1.0 and stats["groups_with_signal"] == 1
    assert stats["trained_tokens"] == sum(len(ab.loss_positions(r.loss_mask)) for r in group(advantages))


def test_old_logprobs_a_nat_above_the_trainers_clip_a_negative_advantage_to_no_gradient(policy: Any) -> None:
    before = [p.detach().clone() for p in policy.parameters() if p.requires_grad]
    stats, after = step(policy, group([-1.0, -1.0], old_shift=1.0, model=policy))  # ratio e^-1 < 1 - eps
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert stats["ratio_p50"] == pytest.approx(math.exp(-1), rel=1e-4)
    assert stats["k3"] == pytest.approx(math.expm1(-1) + 1, rel=1e-4)  # k3 of r = -1, every token
    _, moved = step(policy, group([1.0, 1.0], old_shift=1.0, model=policy))  # unclipped side: it learns
    assert any(not torch.equal(a, b) for a, b in zip(moved, before, strict=True))


def test_the_text_arm_keeps_the_samplers_logprob_only_on_equal_tokens_of_free_turns() -> None:
    turn = SimpleNamespace
    traj = SimpleNamespace(
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        logprobs=[None, None, -0.1, -0.2, None, -0.3, -0.4, -0.5],
        loss_mask=[0, 0, 1, 1, 0, 1, 1, 1],
        turns=[
            turn(constrained=True, output_start=2, output_len=2),
            turn(constrained=False, output_start=5, output_len=3),
        ],
    )
    record = SimpleNamespace(advantage=0.5, group=3)
    tito = ab.tito_row(record, traj)
    assert tito.old == tito.sampled == [None, None, -0.3, -0.4, -0.5]  # a forced turn's logprobs are post-grammar
    # the stack re-renders token 7 as 70, 71 and adds 9 at the end
    view = SimpleNamespace(ids=[1, 2, 3, 4, 5, 6, 70, 71, 8, 9], loss_mask=[0, 0, 1, 1, 0, 1, 1, 1, 1, 1])
    text = ab.text_row(record, traj, view)
    assert text.token_ids == view.ids and text.old == [None] * 7
    assert text.sampled == [None, None, -0.3, None, None, -0.5, None]
    assert (text.advantage, text.group) == (0.5, 3)


def test_tasks_are_distinct_and_their_answers_right() -> None:
    tasks = ab.make_tasks(40, seed=3)
    assert len({t["id"] for t in tasks}) == len(tasks) == 40
    assert sum(t["id"].startswith("w") for t in tasks) == 20
    assert tasks == ab.make_tasks(40, seed=3) and tasks != ab.make_tasks(40, seed=4)
    for task in tasks:
        a, b, c = [int(x) for x in (re.findall(r"\d+", task["prompt"]) + ["0"] * 3)[:3]]
        text = task["prompt"]
        expected = (
            a * b + c if "crate" in text else a - b * c if "coins" in text else (a + b) * c if "(" in text
            else eval(re.sub(r"What is (.*)\?", r"\1", text))
        )  # fmt: skip
        assert task["answer"] == str(expected), task


def test_the_child_command_drops_seeds_and_their_values() -> None:
    argv = ["--steps", "3", "--seeds", "0", "1", "--serial", "--seeds=4", "--out", "x"]
    assert ab.without_option(argv, "--seeds") == ["--steps", "3", "--serial", "--out", "x"]


def test_the_table_gives_ratios_as_their_distance_from_one() -> None:
    """Four decimals read 1.0000 for tito's ratios (within 2e-5 of 1): the table shows ratio - 1 instead."""
    from train_ab_report import _deviation

    assert _deviation(1.0) == "0"
    assert _deviation(1.0000189542770386) == "+1.9e-05"
    assert _deviation(0.9999983310699463) == "-1.7e-06"
    assert _deviation(None) == "-"


def test_each_seed_gets_its_own_shade() -> None:
    from train_ab_report import colour

    assert len({colour(arm, seed) for arm in ("tito", "text") for seed in range(3)}) == 6


def test_kept_sets_follow_the_loss_tokens_through_turns_with_and_without_a_mask() -> None:
    from tito_core.sampling_mask import SamplingMask

    turns = [
        SimpleNamespace(output_start=2, output_len=2, sampling_mask=SamplingMask.from_rows([[5, 7], [7]])),
        SimpleNamespace(output_start=6, output_len=1, sampling_mask=None),  # a call that did not truncate
    ]
    ids, offsets = ab.kept_sets(SimpleNamespace(turns=turns), [2, 3, 6])
    assert (ids, offsets) == ([5, 7, 7], [0, 2, 3, 3])


def truncated_rows(model: Any, k: int) -> list[ab.Row]:
    """:func:`group` rows whose kept sets are each token's own id and the model's top ``k`` at T 0.8, with the
    sampler's old logprobs: the renormalised ones (what the engine records under truncation)."""
    from tito_core.kept_logprobs import kept_logprobs

    rows = group([1.0, -1.0])
    with torch.no_grad():
        for row, (logits, targets) in zip(rows, demo.group_token_logits(model, rows), strict=True):  # type: ignore[arg-type]
            top = torch.topk(logits, k).indices.tolist()
            kept = [sorted({*t, int(target)}) for t, target in zip(top, targets.tolist(), strict=True)]
            row.kept = ([i for r in kept for i in r], [0, *torch.tensor([len(r) for r in kept]).cumsum(0).tolist()])
            row.old = kept_logprobs(logits, targets, row.kept, temperature=0.8).tolist()
            row.sampled = list(row.old)
    return rows


def scored(model: Any, rows: list[ab.Row], use_kept: bool) -> dict[str, Any]:
    """``ppo_step``'s figures for ``rows`` at T 0.8 (on a copy of ``model``: the step does not change it)."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    return ab.ppo_step(model, torch.optim.SGD(params, lr=0.0), rows, max_grad_norm=1e9,
                       scoring=ab.Scoring(0.8, use_kept=use_kept))  # fmt: skip


def test_over_the_kept_sets_the_ratio_is_one_over_the_vocabulary_it_is_the_kept_mass(policy: Any) -> None:
    rows = truncated_rows(policy, 5)
    mask, full = scored(policy, rows, use_kept=True), scored(policy, rows, use_kept=False)
    assert abs(mask["ratio_p1"] - 1) < 1e-5 and abs(mask["ratio_p99"] - 1) < 1e-5
    assert mask["k3"] < 1e-9 and mask["clipped_share"] == 0
    # the closed form: a full-vocabulary logprob falls short of the renormalised one by log S, in both arms alike
    assert mask["log_s_mean"] == pytest.approx(full["log_s_mean"], abs=1e-6)
    assert full["log_s_mean"] < -0.05
    assert full["ratio_p50"] < 1 and full["ratio_p99"] <= 1 + 1e-6
    assert full["k3"] > 1e-3
