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


# --- off-policy training: TIS, epochs, minibatches -------------------------------------------------------------


def sgd_delta(model: Any, rows: list[ab.Row], **options: Any) -> tuple[dict[str, Any], list[Any]]:
    """``train_batch`` on a copy of ``model``, plain SGD, no clipping: its figures and how far each weight moved."""
    model = copy.deepcopy(model)
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    stats = ab.train_batch(model, torch.optim.SGD(params, lr=0.5), rows, max_grad_norm=1e9, **options)
    return stats, [p.detach() - b for p, b in zip(params, before, strict=True)]


def test_tis_weights_are_the_trainers_old_over_the_behaviour_probability_capped() -> None:
    from train_ab_step import tis_weights

    weights = tis_weights([-1.0, -1.0, -1.0, -2.0], [-1.5, -0.5, None, -3.0], cap=2.0)
    assert weights == pytest.approx([math.exp(0.5), math.exp(-0.5), 1.0, 2.0])  # e^1 > 2: capped
    with pytest.raises(ValueError, match="positive"):
        tis_weights([-1.0], [-1.0], cap=0.0)


@pytest.mark.parametrize(("shift", "weight"), [(-1.0, 2.0), (0.5, math.exp(-0.5))])
def test_tis_scales_each_tokens_gradient_by_its_capped_weight(policy: Any, shift: float, weight: float) -> None:
    """Behaviour logprobs ``shift`` off the trainer's own: every token's weight is min(e^-shift, 2), and on the first
    update (ratio 1) the step is that multiple of the step without TIS."""
    rows = group([1.0, -0.5, -0.5], old_shift=shift, model=policy)
    stats, with_tis = sgd_delta(policy, rows, old="trainer", tis=2.0)
    _, without = sgd_delta(policy, group([1.0, -0.5, -0.5], old_shift=shift, model=policy), old="trainer")
    assert stats["tis_weight_mean"] == pytest.approx(weight, rel=1e-4)
    assert stats["tis_capped_share"] == (1.0 if weight == 2.0 else 0.0)
    assert stats["ratio_p1"] == pytest.approx(1.0) and stats["ratio_p99"] == pytest.approx(1.0)  # vs the trainer's
    assert any(d.abs().max() > 0 for d in without)
    for a, b in zip(with_tis, without, strict=True):
        assert torch.allclose(a, weight * b, rtol=1e-3, atol=1e-7)


def test_tis_without_the_trainers_old_logprobs_is_refused(policy: Any) -> None:
    with pytest.raises(ValueError, match="old='trainer'"):
        sgd_delta(policy, group([1.0, -1.0]), tis=2.0)


def test_with_the_defaults_a_batch_is_one_ppo_step(policy: Any) -> None:
    stats, moved = sgd_delta(policy, group([1.0, -0.5, -0.5], old_shift=0.1, model=policy))
    single, after = step(policy, group([1.0, -0.5, -0.5], old_shift=0.1, model=policy))
    start = [p.detach() for p in policy.parameters() if p.requires_grad]
    for d, a, s in zip(moved, after, start, strict=True):
        assert torch.allclose(s + d, a, atol=1e-7)
    assert stats["updates"] == 1 and stats["ratio_p50"] == single["ratio_p50"] and stats["k3"] == single["k3"]


def test_later_epochs_divide_by_the_batchs_first_logprobs_not_the_moved_weights(policy: Any) -> None:
    """Two epochs: the second update's ratio is against the logprobs scored before the first (so it is off 1 and
    clipped where it moved past 1 +- eps), not re-scored; two batches of one epoch re-score and differ."""
    model = copy.deepcopy(policy)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=2.0)
    stats = ab.train_batch(model, optimizer, group([1.0, -1.0]), max_grad_norm=1e9, old="trainer", epochs=2)
    assert stats["updates"] == 2 and stats["groups_with_signal"] == 1
    assert stats["ratio_p1"] < 1 < stats["ratio_p99"]  # the second epoch: the trainer moved from its old logprobs
    rescored = copy.deepcopy(policy)
    params_b = [p for p in rescored.parameters() if p.requires_grad]
    optimizer_b = torch.optim.SGD(params_b, lr=2.0)
    for _ in range(2):
        again = ab.train_batch(rescored, optimizer_b, group([1.0, -1.0]), max_grad_norm=1e9, old="trainer")
    assert again["ratio_p1"] == pytest.approx(1.0) and again["ratio_p99"] == pytest.approx(1.0)
    assert any(not torch.allclose(a, b) for a, b in zip(params, params_b, strict=True))


def test_minibatches_hold_whole_groups_and_every_row_once() -> None:
    import random

    from train_ab_step import minibatches

    rows = [ab.Row([0, 1], [0, 1], 0.0, g, [None], [None]) for g in (3, 1, 4, 1, 5, 9, 2, 6) for _ in range(2)]
    chunks = minibatches(rows, 3, random.Random(0))
    assert len(chunks) == 3 and sorted(map(id, (r for c in chunks for r in c))) == sorted(map(id, rows))
    homes = {r.group: {i for i, c in enumerate(chunks) if any(x.group == r.group for x in c)} for r in rows}
    assert all(len(home) == 1 for home in homes.values())  # a group is never split
    assert len(minibatches(rows, 50, random.Random(0))) == 7  # at most one per group
    (one,) = minibatches(rows, 1, random.Random(0))  # one minibatch: every row, by group in order of appearance
    assert [r.group for r in one] == [3, 3, 1, 1, 1, 1, 4, 4, 5, 5, 9, 9, 2, 2, 6, 6] and len(one) == len(rows)
    with pytest.raises(ValueError, match="at least 1"):
        minibatches(rows, 0, random.Random(0))


# --- rows per leaf ----------------------------------------------------------------------------------------------


def call(traj: Any, index: int, prompt: list[int], output: list[int]) -> None:
    """Add one model call (its new prompt, its output with logprobs -token/100, and its turn) to ``traj``."""
    from tito_core.trajectory.record import Turn, Usage

    start = len(traj.token_ids)
    traj.append("prompt", prompt, turn=index)
    traj.append("output", output, [-t / 100 for t in output], turn=index)
    traj.add_turn(Turn(index=index, rid=f"c{index}", prompt_start=start, prompt_len=len(prompt),
                       output_len=len(output), finish_reason="stop", stop_reason="end_turn",
                       usage=Usage(prompt_tokens=start + len(prompt), completion_tokens=len(output))))  # fmt: skip


def test_leaf_rows_train_every_generated_token_once_the_final_branch_loses_the_forked_off_ones() -> None:
    from tito_core import Trajectory

    first = Trajectory("r")
    call(first, 0, [1, 2], [10, 11])
    call(first, 1, [3], [12, 13, 14])  # the history is then rewritten: a fork after the first call
    first.set_status("completed")
    final = first.fork(4, "the conversation history was rewritten")
    call(final, 1, [4, 5], [15])
    final.set_status("completed")
    record = SimpleNamespace(advantage=0.5, group=2, reward=1.0, branch_rewards=None)

    def trained(rows: list[ab.Row]) -> list[tuple[int, float | None]]:
        return sorted((r.token_ids[i], old) for r in rows for i, old in zip(ab.loss_positions(r.loss_mask), r.old,
                                                                              strict=True))  # fmt: skip

    leaves = ab.tito_rows(record, final, kept=False, branches="leaves")
    assert len(leaves) == 2 and all((r.advantage, r.group) == (0.5, 2) for r in leaves)
    assert trained(leaves) == [(t, pytest.approx(-t / 100)) for t in range(10, 16)]  # each once, its own logprob
    (whole,) = ab.tito_rows(record, final, kept=False, branches="final")
    assert [t for t, _ in trained([whole])] == [10, 11, 15]  # the forked-off call is lost


# --- the command line -------------------------------------------------------------------------------------------


def test_a_preset_sets_the_defaults_and_a_flag_given_overrides_it() -> None:
    argv = ["--preset", "qwen3-gpu", "--model-dir", "/m", "--engine-url", "http://127.0.0.1:1"]
    args = ab.parse_args(argv)
    preset = ab.PRESETS["qwen3-gpu"]
    from train_ab_options import build_parser

    assert set(preset) <= {action.dest for action in build_parser()._actions}  # no key that is not an option
    assert {k: getattr(args, k) for k in preset} == preset
    assert args.steps >= 100 and args.seeds == [0, 1, 2] and args.tis_ab and args.tis is not None
    assert ab.arms_of(args) == ["mask", "mask+tis", "full", "full+tis"]
    ab.check_args(args)
    changed = ab.parse_args([*argv, "--steps", "3", "--seeds", "7", "--lora-rank", "8", "--tis", "1.5"])
    assert (changed.steps, changed.seeds, changed.lora_rank, changed.tis) == (3, [7], 8, 1.5)
    assert changed.staleness == preset["staleness"]  # the rest stays the preset's
    plain = ab.parse_args([])  # no preset: the CPU A/B's defaults, untouched by an earlier parse
    assert (plain.steps, plain.lora_rank, plain.tis, plain.old, plain.staleness, plain.device) == (
        50, 8, None, "behaviour", 0, "cpu"
    )  # fmt: skip
    assert ab.arms_of(plain) == ["tito", "text"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--preset", "qwen3-gpu"], "needs --model-dir and --engine-url"),
        (["--preset", "qwen3-gpu", "--model-dir", "/m"], "needs --engine-url"),
        (["--tis", "2"], "needs --old trainer"),
        (["--tis-ab"], "give the cap with --tis"),
        (["--old", "trainer", "--tis", "-1"], "positive"),
        (["--staleness", "1"], "--staleness needs --engine-url"),
        (["--device", "cuda"], "--device cuda needs --engine-url"),
        (["--pair", "truncated", "--arm", "tito"], "not an arm of --pair truncated"),
        (
            ["--pair", "truncated", "--old", "trainer", "--tis", "2", "--tis-ab", "--engine-url", "a", "b"],
            "one per arm (4: mask, mask+tis, full, full+tis), not 2",
        ),
        (["--ppo-epochs", "0"], "at least 1"),
    ],
)
def test_options_that_do_not_fit_together_are_refused_saying_why(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(message)):
        ab.check_args(ab.parse_args(argv))


def test_each_arm_gets_its_tis_and_its_engine() -> None:
    args = ab.parse_args(["--pair", "truncated", "--old", "trainer", "--tis", "2", "--tis-ab",
                          "--engine-url", "u0", "u1", "u2", "u3"])  # fmt: skip
    ab.check_args(args)
    assert [ab.tis_of(args, arm) for arm in ab.arms_of(args)] == [None, 2.0, None, 2.0]
    assert [ab.engine_url_of(args, arm) for arm in ab.arms_of(args)] == ["u0", "u1", "u2", "u3"]
    one = ab.parse_args(["--old", "trainer", "--tis", "2", "--engine-url", "u"])
    assert [ab.tis_of(one, arm) for arm in ab.arms_of(one)] == [2.0, 2.0]  # --tis alone: every arm
    assert {ab.engine_url_of(one, arm) for arm in ab.arms_of(one)} == {"u"}


# --- the engine path's pieces that run without an engine --------------------------------------------------------


def test_the_engine_serves_the_weights_staleness_steps_behind() -> None:
    from train_ab_engine import served_version

    assert [served_version(step, 0) for step in (1, 2, 3)] == [0, 1, 2]  # on-policy: the last step's weights
    assert [served_version(step, 2) for step in (1, 2, 3, 4, 5)] == [0, 0, 0, 1, 2]


@pytest.mark.parametrize("lora", [True, False])
def test_saved_weights_load_as_the_policy_with_its_adapter_merged(policy: Any, tmp_path: Path, lora: bool) -> None:
    """What is pushed to the engine: a checkpoint of the base architecture whose forward pass is the policy's, the
    model itself left untouched."""
    from train_ab_engine import save_weights
    from transformers import AutoModelForCausalLM

    from tito_testing.tiny_model import build_tiny_qwen3

    model = policy if lora else AutoModelForCausalLM.from_pretrained(build_tiny_qwen3(), dtype=torch.float32)
    ids = torch.tensor([PROMPT])
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    folder = save_weights(model, tmp_path / "v1", build_tiny_qwen3(), dtype="float32")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, expected, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    if lora:  # the adapter changes the logits: the merge is not a no-op
        with torch.no_grad(), policy.disable_adapter():
            assert not torch.allclose(policy(input_ids=ids).logits, expected, atol=1e-3)


def test_the_report_tells_four_arms_and_their_seeds_apart(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from train_ab_report import colour, figure_title, plot, summary_table

    arms = ["mask", "mask+tis", "full", "full+tis"]
    assert len({colour(arm, seed) for arm in arms for seed in range(3)}) == 12
    row = {
        "step": 1, "reward": 0.5, "eval_accuracy": 0.25, "drift_changed_share": None, "drift_added_share": None,
        "k3": 1e-4, "log_s_mean": -0.1, "clipped_share": 0.02, "ratio_p1": 0.9, "ratio_p50": 1.0, "ratio_p99": 1.1,
        "grad_norm": 0.3, "groups_with_signal": 2, "trained_tokens": 100,
    }  # fmt: skip
    runs = [{"seed": s, "arms": {a: {"rows": [row], "eval_0": 0.0, "wall_s": 60.0} for a in arms}} for s in (0, 1)]
    settings = {"pair": "truncated", "engine_url": ["http://127.0.0.1:1"], "model_dir": "/m/Qwen3-0.6B",
                "lora_rank": 0, "ppo_epochs": 2, "minibatches": 4, "staleness": 1, "tis": 2.0}  # fmt: skip
    assert figure_title(settings) == (
        "Qwen3-0.6B, full fine-tuning, sampled on SGLang: kept sets (mask) vs whole vocabulary (full); "
        "2 epochs x 4 minibatches, 1 step(s) stale, TIS cap 2.0"
    )
    plot({"settings": settings, "runs": runs}, tmp_path / "ab.png")
    assert (tmp_path / "ab.png").stat().st_size > 1000
    table = summary_table({"settings": settings, "runs": runs}).splitlines()
    assert len(table) == 2 + 2 * 4 and all(f"| {arm} |" in "\n".join(table) for arm in arms)
