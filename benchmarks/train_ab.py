"""Does TITO change learning? Two training runs from one seed: on the recorded ids, and through a text stack.

Both arms start from the same SmolLM2-135M-Instruct + LoRA (same seed), draw the same tasks at every step and
sample with the same per-step seeds (the runner gives each rollout its own seed from it), on the embedded
backend. Only what the trainer is given differs:

* **tito**: the recorded ``token_ids`` and ``loss_mask``; the old logprobs of the PPO ratio are the recorded
  (behaviour) logprobs, except in constrained turns, whose recorded logprobs are post-grammar and not the
  policy's (``Turn.constrained``; docs/why-tito.md): there the trainer's own are used, as tito's docs advise.
* **text**: the stack of the seed guide. Each rollout's conversation is rebuilt as messages (outputs decoded and
  parsed, tool results read back), re-rendered with the chat template and tokenized again
  (:func:`tito_core.analysis.drift.text_stack_view`); the trainer recomputes the old logprobs on those ids.

The step is the same for both: one PPO-clip update (eps 0.2) per batch of ``tasks x group`` rollouts with
group-normalised advantages, a token-level mean over every trained token. Per step each arm logs the mean
reward, the share of its trained tokens the text stack changes (and adds), the k3 estimate of
KL(sampler || trainer) on sampled tokens (the text arm: on the sampled tokens it still has, aligned), the
importance-ratio p1 / p50 / p99 the trainer used, the gradient norm and the trained tokens; every
``--eval-every`` steps the greedy accuracy on a fixed held-out set.

The off-policy settings (``--old trainer``, ``--tis C``, ``--ppo-epochs``, ``--minibatches``; ``train_ab_step``) and
the engine path (``--engine-url``: sampling on an SGLang server, the trainer's weights pushed to it every step,
``--staleness``; ``train_ab_engine``) are off by default; ``--preset qwen3-gpu`` bundles them into the run
docs/training-ab.md calls the decisive one (later flags override a preset's values).

    python benchmarks/train_ab.py --out runs/train_ab                 # both arms in parallel, 50 steps each
    python benchmarks/train_ab.py --steps 2 --tasks-per-step 1 ...    # the smoke size (nox -s train_demo)
    python benchmarks/train_ab.py --preset qwen3-gpu --model-dir ~/Qwen3-0.6B --engine-url http://127.0.0.1:30000

Writes ``train_ab.json`` (settings, both arms' rows, run times) and ``train_ab.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples" / "train_reinforce"))  # the demo's policy, config and grouped forward

import train_reinforce as demo  # noqa: E402  (after the path above; it adds examples/arithmetic: arith.py)
from train_ab_options import (  # noqa: E402
    PAIRS,
    PRESETS,
    arms_of,
    base_arm,
    check_args,
    engine_url_of,
    parse_args,
    tis_of,
    without_option,
)
from train_ab_step import CLIP, Row, Scoring, loss_positions, ppo_step, score_group, train_batch  # noqa: E402

__all__ = [
    "CLIP", "PAIRS", "PRESETS", "Row", "Scoring", "arms_of", "loss_positions", "parse_args", "ppo_step", "score_group",
    "train_batch", "without_option",
]  # fmt: skip


# --- tasks --------------------------------------------------------------------------------------------

WORDED = (
    ("A crate holds {a} bottles. How many bottles are in {b} crates and {c} loose bottles?", lambda a, b, c: a * b + c),
    ("Ann has {a} coins and spends {b} coins on each of {c} days. How many coins are left?", lambda a, b, c: a - b * c),
    ("What is ({a} + {b}) * {c}?", lambda a, b, c: (a + b) * c),
)


def make_tasks(count: int, seed: int) -> list[dict[str, Any]]:
    """Half the demo's 3-digit sums, differences and products, half two-step word problems (harder to set up)."""
    arithmetic = demo.make_tasks(count - count // 2, seed)
    rng = random.Random(seed + 7)
    worded: list[dict[str, Any]] = []
    while len(worded) < count // 2:
        text, answer = rng.choice(WORDED)
        a, b, c = rng.randint(200, 999), rng.randint(11, 49), rng.randint(3, 19)
        worded.append(
            {"id": f"w{len(worded):03d}", "prompt": text.format(a=a, b=b, c=c), "answer": str(answer(a, b, c))}
        )
    return [task for pair in zip(arithmetic, worded, strict=False) for task in pair] + arithmetic[len(worded) :]


# --- what each arm trains on ----------------------------------------------------------------------------


@dataclass
class Drift:
    """The text stack against the recorded ids, summed over a step's rollouts."""

    trained: int = 0  # tokens tito trains on
    changed: int = 0  # of them, changed or dropped by the re-render
    added: int = 0  # tokens the text stack trains on that the model never sampled
    stack_trained: int = 0  # tokens the text stack trains on
    different: int = 0  # rollouts whose ids differ
    compared: int = 0
    not_rebuilt: int = 0  # rollouts the text stack could not rebuild (left out of the text arm)


def free_logprobs(traj: Any) -> list[float | None]:
    """Per position: the recorded logprob where it is the policy's (an output of an unconstrained turn)."""
    lps: list[float | None] = [None] * len(traj.token_ids)
    recorded = traj.logprobs
    for turn in traj.turns:
        if not turn.constrained:
            for i in range(turn.output_start, turn.output_start + turn.output_len):
                lps[i] = recorded[i]
    return lps


def tito_row(record: Any, traj: Any, *, kept: bool = False, trained_from: int = 0) -> Row:
    """The recorded ids and mask; the recorded logprobs as the old ones, except in constrained turns.

    ``kept``: with each loss token's recorded kept set (an empty row where its call did not truncate).
    ``trained_from``: the first token the row trains (a leaf's prompt length; earlier tokens are its parent's).
    """
    free = free_logprobs(traj)
    mask = [0] * trained_from + list(traj.loss_mask[trained_from:])
    positions = loss_positions(mask)
    picked = [free[i] for i in positions]
    row = Row(list(traj.token_ids), mask, float(record.advantage), record.group, picked, picked)
    if kept:
        row.kept = kept_sets(traj, positions)
    return row


def tito_rows(record: Any, traj: Any, *, kept: bool, branches: str) -> list[Row]:
    """A rollout's rows: ``final``, one, its last branch whole; ``leaves``, one per leaf of its token tree.

    Leaves train each generated token once, in the context it was generated in
    (:func:`tito_core.export.training_branches`); a retried call's superseded attempt, which gets no reward, is left
    out.
    """
    if branches == "final":
        return [tito_row(record, traj, kept=kept)]
    from tito_core.export import training_branches

    return [
        tito_row(record, sample.trajectory, kept=kept, trained_from=sample.prompt_length)
        for sample in training_branches(traj)
        if sample.reward(record.reward, record.branch_rewards) is not None
    ]


def kept_sets(traj: Any, positions: Sequence[int]) -> tuple[list[int], list[int]]:
    """The kept sets of the tokens at ``positions`` as CSR (ids, offsets), from their turns' sampling masks."""
    rows: dict[int, list[int]] = {}
    for turn in traj.turns:
        if turn.sampling_mask is not None:
            for j, kept in enumerate(turn.sampling_mask.to_lists()):
                rows[turn.output_start + j] = kept
    ids: list[int] = []
    offsets = [0]
    for i in positions:
        ids.extend(rows.get(i, ()))
        offsets.append(len(ids))
    return ids, offsets


def text_row(record: Any, traj: Any, view: Any) -> Row:
    """The text stack's ids and mask; the sampler's logprob only where an equal token lines up with a free one."""
    free = free_logprobs(traj)
    aligned: dict[int, int] = {}
    matcher = difflib.SequenceMatcher(a=traj.token_ids, b=view.ids, autojunk=False)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            aligned[block.b + k] = block.a + k
    positions = loss_positions(view.loss_mask)
    sampled = [free[aligned[i]] if i in aligned else None for i in positions]
    return Row(list(view.ids), list(view.loss_mask), float(record.advantage), record.group, [None] * len(positions),
               sampled)  # fmt: skip


class Stack:
    """The text stack of the arm's chat template and tool parser, and the drift it causes."""

    def __init__(self, config: dict[str, Any]) -> None:
        from tito_core.config import load_config
        from tito_core.conversation import tool_specs_to_chat
        from tito_core.runner.worker import import_object

        setup = load_config(config).model_setup()
        self.renderer, self.parser = setup.renderer, setup.tool_parser
        self.specs = [import_object(path).tool_spec for path in config["rollout"]["tools"]]
        self.tools = tool_specs_to_chat(self.specs)

    def view(self, traj: Any) -> Any:
        """What the text stack trains on for ``traj``: its messages re-rendered and tokenized again."""
        from tito_core.analysis.drift import text_stack_messages, text_stack_view

        messages = text_stack_messages(traj, self.renderer, self.parser, tools=self.tools, tool_specs=self.specs)
        return text_stack_view(messages, self.renderer, tools=self.tools)

    def compare(self, traj: Any, view: Any, drift: Drift) -> None:
        """Add ``traj`` against its ``view`` to ``drift``."""
        from tito_core.analysis.drift import compare_ids

        comparison = compare_ids(traj, view, self.renderer)
        drift.compared += 1
        drift.different += not comparison.same_ids
        drift.trained += sum(traj.loss_mask)
        drift.changed += comparison.trained_lost
        drift.added += comparison.trained_added
        drift.stack_trained += sum(view.loss_mask)


def rows_of(
    arm: str, records: Sequence[Any], stack: Stack, *, branches: str = "final"
) -> tuple[list[Row], Drift, dict[str, int]]:
    """What ``arm`` trains on from a step's records (failed / aborted ones skipped, as the demo does).

    ``branches``: how a tito arm turns a rollout into rows (:func:`tito_rows`); the text arm re-renders the final
    branch's conversation, as a text stack does.
    """
    from tito_core import Trajectory
    from tito_core.errors import TitoError

    rows: list[Row] = []
    drift = Drift()
    skipped: dict[str, int] = defaultdict(int)
    for record in records:
        if record.status in ("failed", "aborted") or record.advantage is None:
            skipped[record.status] += 1
            continue
        traj = Trajectory.from_record(record.trajectory)
        try:
            view = stack.view(traj)
        except TitoError:
            drift.not_rebuilt += 1
            view = None
        if view is not None:
            stack.compare(traj, view, drift)
        if arm != "text":
            rows.extend(tito_rows(record, traj, kept=arm in PAIRS["truncated"], branches=branches))
        elif view is not None:
            rows.append(text_row(record, traj, view))
        else:
            skipped["text stack not rebuilt"] += 1
    return rows, drift, dict(skipped)


# --- one arm ----------------------------------------------------------------------------------------


def versions_of(records: Sequence[Any]) -> list[str]:
    """The weight versions a step's rollouts were sampled with (their oldest and newest, over every rollout)."""
    return sorted({v for r in records for v in (r.weight_version_min, r.weight_version_max) if v is not None})


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of a step, the same in both arms (the runner derives each rollout's from it)."""
    return seed * 1_000_003 + step


def policy(args: argparse.Namespace) -> tuple[Any, str, dict[str, Any]]:
    """The policy (LoRA, or every weight with ``--lora-rank 0``) on ``--device``, its folder and the runner's config."""
    import torch

    demo_args = argparse.Namespace(
        seed=args.seed, lora_rank=args.lora_rank, model_dir=args.model_dir, threads=args.threads,
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, group_size=args.group_size,
    )  # fmt: skip
    if args.lora_rank:
        model, model_dir = demo.build_policy(demo_args)
    else:
        from transformers import AutoModelForCausalLM

        model_dir = args.model_dir
        if model_dir is None:
            from tito_transformers.models import build_smollm2

            model_dir = str(build_smollm2())
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model.eval()
    model.to(args.device)
    config = demo.rollout_config(demo_args, model, model_dir)
    rollout = config["rollout"]
    if args.forced_tool_calls is not None:
        rollout["forced_tool_calls"] = args.forced_tool_calls
    if args.reward is not None:
        rollout["reward"] = args.reward
    return model, model_dir, config


async def run_arm(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``arm`` for ``args.steps`` steps; its rows (one per step), held-out accuracy before, wall time."""
    import torch

    torch.set_num_threads(args.threads)
    from tito_core import arollout
    from tito_core.runner import read_records

    out = args.out / arm
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()  # the runner resumes into an existing file: a new run starts from empty ones
    pool = make_tasks(args.train_tasks + args.eval_tasks, args.seed)
    train_pool, held_out = pool[: args.train_tasks], pool[args.train_tasks :]
    rng = random.Random(args.seed + 1)
    model, model_dir, config = policy(args)
    engine = None
    if args.engine_url:
        from train_ab_engine import Engine, engine_config

        url = engine_url_of(args, arm)
        config = engine_config(config, url, model_dir, thinking=args.thinking, timeout=args.engine_timeout)
        folder = Path(args.checkpoint_dir) / f"seed{args.seed}" / arm if args.checkpoint_dir else out / "weights"
        engine = Engine(url, model_dir, folder, staleness=args.staleness, tolerance=args.probe_tolerance)
    stack = Stack(config)
    pair_arm = base_arm(arm)
    truncated = pair_arm in PAIRS["truncated"]
    scoring = Scoring(args.temperature, use_kept=pair_arm == "mask") if truncated else None
    truncation = {"top_p": args.top_p, "top_k": args.top_k} if truncated else {}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()

    def versioned(version: int) -> dict[str, Any]:  # the embedded backend labels its weights; an engine is labelled
        return demo.at_version(config, version) if engine is None else config  # by the push

    async def evaluate(step: int) -> float:
        path = out / f"eval_s{step:03d}.jsonl"
        return await demo.evaluate(versioned(step), held_out, path, args.max_new_tokens)

    try:
        first_push = await engine.start(model) if engine is not None else None
        evals = {0: await evaluate(0)}
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            tasks = rng.sample(train_pool, min(args.tasks_per_step, len(train_pool)))
            path = out / f"rollouts_s{step:03d}.jsonl"
            seeded = versioned(step - 1)
            seeded["sampling"] = {**seeded["sampling"], **truncation, "seed": step_seed(args.seed, step)}
            seeded["rollout"] = {**seeded["rollout"], "current_version": step - 1}  # the trainer's weights now
            await arollout(seeded, tasks, path)
            records = list(read_records(path))
            collect_s = time.perf_counter() - t0
            train_rows, drift, skipped = rows_of(pair_arm, records, stack, branches=args.branches)
            if not train_rows:
                raise SystemExit(f"{arm} step {step}: nothing to train on ({skipped})")
            t1 = time.perf_counter()
            stats = train_batch(
                model, optimizer, train_rows, max_grad_norm=args.max_grad_norm, scoring=scoring, old=args.old,
                tis=tis_of(args, arm), epochs=args.ppo_epochs, minibatches_per_epoch=args.minibatches,
                seed=step_seed(args.seed, step),
            )  # fmt: skip
            train_s = time.perf_counter() - t1
            if not (math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])):
                raise SystemExit(
                    f"{arm} step {step}: the loss is {stats['loss']}, the gradient norm {stats['grad_norm']}"
                )
            served = engine.served if engine is not None else step - 1  # the weights this step's rollouts came from
            push = await engine.after_step(model, step) if engine is not None else None
            if step % args.eval_every == 0 or step == args.steps:
                evals[step] = await evaluate(step)
            rewards = [r.reward or 0.0 for r in records]
            row = {
                "step": step,
                "reward": sum(rewards) / len(rewards),
                "eval_accuracy": evals.get(step),
                **stats,
                "drift_changed_share": drift.changed / drift.trained if drift.trained else None,
                "drift_added_share": drift.added / drift.stack_trained if drift.stack_trained else None,
                "drift_rollouts": drift.different,
                "compared": drift.compared,
                "not_rebuilt": drift.not_rebuilt,
                "rollouts": len(records),
                "rows": len(train_rows),
                "statuses": dict(Counter(r.status for r in records)),
                "skipped": skipped,
                "sampled_version": served,
                "weight_versions": versions_of(records),
                "push": push,
                "collect_s": collect_s,
                "train_s": train_s,
                "seconds": time.perf_counter() - t0,
            }
            rows.append(row)
            with (out / "steps.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            acc = "" if row["eval_accuracy"] is None else f" | held-out {row['eval_accuracy']:.3f}"
            k3 = "-" if row["k3"] is None else f"{row['k3']:.2e}"
            print(f"[{arm}] step {step:3d} | reward {row['reward']:.3f}{acc} | k3 {k3} | grad {row['grad_norm']:.3f} | "
                  f"{row['seconds']:5.1f} s", flush=True)  # fmt: skip
    finally:
        if engine is not None:
            await engine.close()
    result = {"arm": arm, "eval_0": evals[0], "rows": rows, "wall_s": time.perf_counter() - started}
    if first_push is not None:
        result["engine_start"] = first_push
    return result


# --- both arms --------------------------------------------------------------------------------------


def run_both(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """Each arm in its own process, in parallel unless ``--serial`` or one engine serves them all; their results."""
    base = [a for a in argv if a != "--serial"]
    seed_out = args.out / f"seed{args.seed}"
    command = [sys.executable, __file__, *base, "--out", str(seed_out), "--seed", str(args.seed)]
    arms = arms_of(args)
    serial = args.serial or bool(args.engine_url and len(args.engine_url) == 1)  # each arm pushes its own weights
    procs = []
    for arm in arms:
        procs.append(subprocess.Popen([*command, "--arm", arm]))
        if serial and procs[-1].wait():
            break
    codes = [p.wait() for p in procs]
    if any(codes) or len(procs) < len(arms):
        raise SystemExit(f"an arm failed (exit codes {dict(zip(arms, codes, strict=False))})")
    return {arm: json.loads((seed_out / arm / "result.json").read_text()) for arm in arms}


def main(argv: Sequence[str] | None = None) -> int:
    """One arm (``--arm``), or every arm for every seed, then the JSON, the plot and the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    check_args(args)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.arm:
        result = asyncio.run(run_arm(args.arm, args))
        (args.out / args.arm / "result.json").write_text(json.dumps(result))
        return 0
    from train_ab_report import plot, summary_table  # the figures: benchmarks/train_ab_report.py

    runs = []
    for seed in args.seeds:
        args.seed = seed
        started = time.perf_counter()
        arms = run_both(args, without_option(argv, "--seeds"))
        runs.append({"seed": seed, "wall_s": time.perf_counter() - started, "arms": arms})
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("arm", "seed")}
    result = {"settings": settings, "runs": runs}
    (args.out / "train_ab.json").write_text(json.dumps(result, indent=1))
    plot(result, args.out / "train_ab.png")
    print(summary_table(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
