"""Train SmolLM2-135M-Instruct to use a calculator tool, by REINFORCE on tito rollouts, on the CPU.

The loop of a classic agent-tuning guide (collect with exact token ids, reward, policy gradient, evaluate),
on tito's rollout runner and its embedded backend:

1. collect: ``tito_core.arollout`` runs ``group_size`` rollouts of each task of the round (a Strands agent
   with a calculator tool; the first model call of each rollout is forced to call a tool), rewards them
   (1 when the last number of the final answer is right) and writes one record per rollout with its
   group-normalised advantage;
2. train: the records are read back and the LoRA adapter takes one REINFORCE step on the exact token ids of
   each trajectory, only the model's own tokens (loss mask 1) contributing;
3. evaluate: greedy rollouts on held-out tasks; accuracy = mean reward.

Generation and training use the same module: the backend is given the peft model itself
(``backend_options = {"model": ...}``), so round ``r + 1`` samples from the weights round ``r`` trained.
The backend labels those weights with the round that trained them (``weight_version``: 0 before training),
so every rollout record carries the weight versions of its tokens (``weight_version_min`` / ``_max``).

    python examples/train_reinforce/train_reinforce.py --out runs/train   # a full run (see README.md)
    python examples/train_reinforce/train_reinforce.py --rounds 1 --tasks-per-round 3 --eval-tasks 3 ...  # CI
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "arithmetic"))  # the calculator tool and the reward: arith.py

SYSTEM_PROMPT = "You are a calculator assistant. Call the calculator tool for arithmetic, then answer with the number."


# --- tasks ------------------------------------------------------------------------------------------


def make_tasks(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` distinct 3-digit sums, differences and products: too hard to do in the head, easy to copy."""
    rng = random.Random(seed)
    seen: set[str] = set()
    tasks: list[dict[str, Any]] = []
    while len(tasks) < count:
        a, b, op = rng.randint(100, 999), rng.randint(100, 999), rng.choice("+-*")
        expression = f"{a} {op} {b}"
        if expression in seen:
            continue
        seen.add(expression)
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        tasks.append(
            {"id": f"t{len(tasks):03d}", "prompt": f"What is {expression}?", "answer": str(answer)},
        )
    return tasks


# --- the policy gradient ----------------------------------------------------------------------------


@dataclass
class Rollout:
    """What training needs of one record: exact ids, the loss mask, the advantage."""

    token_ids: list[int]
    loss_mask: list[int]
    advantage: float
    group: int


@dataclass
class StepStats:
    loss: float
    loss_tokens: int  # model tokens in the normaliser (every usable rollout)
    signal_tokens: int  # model tokens of rollouts with a non-zero advantage (the ones with a gradient)
    groups: int  # groups with a reward spread
    grad_norm: float


def usable_rollouts(records: Sequence[Any], *, mask_forced: bool) -> tuple[list[Rollout], dict[str, int]]:
    """The rollouts to train on, and counts of what was left out and why.

    ``failed`` (an error, no policy sample) and ``aborted`` (cut by the clock) records are skipped;
    ``truncated`` ones are kept: a call that never closes its string is a policy sample, rewarded 0.
    With ``mask_forced``, the outputs of constrained (forced) turns are taken out of the loss mask.
    """
    from tito_core import Trajectory

    kept: list[Rollout] = []
    skipped: dict[str, int] = defaultdict(int)
    for record in records:
        if record.status in ("failed", "aborted") or record.advantage is None:
            skipped[record.status if record.advantage is not None else "no advantage"] += 1
            continue
        traj = Trajectory.from_record(record.trajectory)
        mask = list(traj.loss_mask)
        if mask_forced:
            for turn in traj.turns:
                if turn.constrained:
                    start = turn.output_start
                    mask[start : start + turn.output_len] = [0] * turn.output_len
        kept.append(Rollout(list(traj.token_ids), mask, float(record.advantage), record.group))
    return kept, dict(skipped)


@dataclass(frozen=True)
class OffPolicy:
    """Generated tokens of a round's rollouts, by the weights that produced them."""

    tokens: int  # generated tokens whose weight version is an integer (a round)
    off_policy: int  # of them, generated by weights older than the ones the step trains
    unknown: int  # generated tokens with no version, or a non-integer one (not counted either way)

    @property
    def share(self) -> float | None:
        """``off_policy / tokens``; None when no token has a known version."""
        return self.off_policy / self.tokens if self.tokens else None


def off_policy_tokens(records: Sequence[Any], trained_version: int) -> OffPolicy:
    """Count the tokens of ``records`` (final branches) generated before weights ``trained_version``.

    ``trained_version`` is the version of the weights the step updates: a token of an older version is
    off-policy (its logprob is the behaviour policy's, not the trained one's). This synchronous demo collects
    each round with the weights it then trains, so it reports 0; an asynchronous trainer would not.
    """
    from tito_core import Trajectory
    from tito_core.versions import int_version

    tokens = off = unknown = 0
    for record in records:
        for turn in Trajectory.from_record(record.trajectory).turns:
            if turn.weight_versions is None:
                unknown += turn.output_len
                continue
            for span in turn.weight_versions:
                n, version = span.end - span.start, int_version(span.version)
                if version is None:
                    unknown += n
                else:
                    tokens += n
                    off += n if version < trained_version else 0
    return OffPolicy(tokens=tokens, off_policy=off, unknown=unknown)


def group_token_logprobs(model: Any, rollouts: Sequence[Rollout]) -> list[Any]:
    """Log-probabilities (with grad) of each rollout's loss tokens under ``model``, teacher-forced on its ids."""
    import torch

    return [
        torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]
        for logits, targets in group_token_logits(model, rollouts)
    ]


def group_token_logits(model: Any, rollouts: Sequence[Rollout]) -> list[tuple[Any, Any]]:
    """Per rollout: the float32 logits (with grad) predicting each loss token, and those tokens' ids.

    The members of a group share their first prompt (system, tools, question), so it is run once: its KV
    cache (with grad) is expanded to the group and the members' own tokens are run on top of it, right-padded
    in one batch. Mathematically the same as running each full sequence; the LM head is applied only at the
    positions whose next token is a model token.
    """
    import torch
    from transformers import DynamicCache

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a LoRA adapter, or every weight
    body, head = base.model, base.lm_head
    first_loss = min(r.loss_mask.index(1) for r in rollouts)
    shared = _common_prefix([r.token_ids for r in rollouts])
    cut = min(shared, first_loss) - 1  # the prefix ends one token before the first scored position
    device = next(model.parameters()).device
    size = len(rollouts)
    batch_cache = None
    if cut > 0:
        prefix = torch.tensor([rollouts[0].token_ids[:cut]], device=device)
        out = body(input_ids=prefix, use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        layers = [(k.keys.expand(size, -1, -1, -1), k.values.expand(size, -1, -1, -1)) for k in cache.layers]
        batch_cache = DynamicCache(layers, config=body.config)
    cut = max(cut, 0)
    tails = [r.token_ids[cut:] for r in rollouts]
    width = max(len(t) for t in tails)
    inputs = torch.tensor([t + [0] * (width - len(t)) for t in tails], device=device)
    # transformers 5.24 renamed the cache argument `cache` (and warns on `past_key_values`)
    cache_arg = "cache" if "cache" in inspect.signature(type(body).forward).parameters else "past_key_values"
    hidden = body(input_ids=inputs, use_cache=True, **{cache_arg: batch_cache}).last_hidden_state
    results = []
    for row, rollout in enumerate(rollouts):
        # hidden[row, j] predicts token_ids[cut + j + 1]: scored where that token has loss mask 1
        positions = [j for j in range(len(tails[row]) - 1) if rollout.loss_mask[cut + j + 1]]
        targets = torch.tensor([rollout.token_ids[cut + j + 1] for j in positions], device=device)
        results.append((head(hidden[row, positions]).float(), targets))
    return results


def _common_prefix(sequences: Sequence[Sequence[int]]) -> int:
    first = sequences[0]
    length = min(len(s) for s in sequences)
    for i in range(length):
        if any(s[i] != first[i] for s in sequences):
            return i
    return length


def reinforce_step(model: Any, optimizer: Any, rollouts: Sequence[Rollout], *, max_grad_norm: float) -> StepStats:
    """One REINFORCE step: ``loss = -sum_i A_i * sum_t mask_it * logp_it / sum_i sum_t mask_it``.

    ``A_i`` is the group-normalised advantage of rollout ``i``; ``logp_it`` is recomputed with the current
    model on the exact recorded ids (teacher forcing); the normaliser is the number of model tokens of all
    usable rollouts (a token-level mean). A rollout whose advantage is 0 (every rollout of a group with equal
    rewards) contributes nothing and is not run.
    """
    import torch

    model.train()
    optimizer.zero_grad(set_to_none=True)
    normaliser = sum(sum(r.loss_mask) for r in rollouts)
    groups: dict[int, list[Rollout]] = defaultdict(list)
    for rollout in rollouts:
        if rollout.advantage != 0.0 and sum(rollout.loss_mask):
            groups[rollout.group].append(rollout)
    total = 0.0
    signal = 0
    for members in groups.values():
        logps = group_token_logprobs(model, members)
        loss = -sum(r.advantage * lp.sum() for r, lp in zip(members, logps, strict=True)) / normaliser
        loss.backward()  # one group at a time: only its activations are held
        total += float(loss.detach())
        signal += sum(len(lp) for lp in logps)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)) if groups else 0.0
    if groups:
        optimizer.step()
    model.eval()
    return StepStats(total, normaliser, signal, len(groups), grad_norm)


# --- the loop ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path("runs/train_reinforce"), help="output directory")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--train-tasks", type=int, default=64, help="size of the training task pool")
    parser.add_argument("--tasks-per-round", type=int, default=6, help="tasks drawn from the pool per round")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per task (a GRPO group)")
    parser.add_argument("--eval-tasks", type=int, default=12, help="held-out tasks, evaluated greedily")
    parser.add_argument("--temperature", type=float, default=0.6, help="sampling temperature of the rollouts")
    parser.add_argument("--max-new-tokens", type=int, default=40, help="per model call")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--mask-forced", action="store_true", help="leave the forced tool-call turns out of the loss")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core CPU)")
    parser.add_argument("--model-dir", default=None, help="a SmolLM2-135M-Instruct folder (default: built offline)")
    parser.add_argument("--plot-title", default=None)
    return parser.parse_args(argv)


def build_policy(args: argparse.Namespace) -> tuple[Any, str]:
    """SmolLM2-135M-Instruct in float32 with a LoRA adapter on the attention's query and value projections."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model_dir = args.model_dir
    if model_dir is None:
        from tito_transformers.models import build_smollm2

        model_dir = str(build_smollm2())
    torch.manual_seed(args.seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    lora = LoraConfig(
        r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]
    )
    return get_peft_model(base, lora), model_dir


def rollout_config(args: argparse.Namespace, model: Any, model_dir: str) -> dict[str, Any]:
    """The runner's config as a mapping: the backend gets the live peft model itself (``model``)."""
    from tito_transformers.templates import smollm2_tools

    return {
        "backend": "transformers",
        "tool_parser": "hermes",
        "tokenizer": model_dir,
        "chat_template": smollm2_tools(),
        "backend_options": {"model": model, "model_path": model_dir, "max_batch_size": 32, "num_threads": args.threads},
        "sampling": {"temperature": args.temperature, "max_new_tokens": args.max_new_tokens},
        "rollout": {
            "group_size": args.group_size,
            "concurrency": 32,
            "system_prompt": SYSTEM_PROMPT,
            "tools": ["arith:calculator"],
            "reward": "arith:reward",
            "group_reward": "tito_core.runner.rewards:group_normalized",
            "forced_tool_calls": 1,  # SmolLM2 never calls a tool unforced: the first call must be one
            "max_model_calls": 3,
            "max_tool_calls": 2,
            "timeout_s": 1800,
        },
    }


def at_version(config: dict[str, Any], version: int) -> dict[str, Any]:
    """``config`` with the backend labelling its weights ``version`` (the round whose step produced them)."""
    return {**config, "backend_options": {**config["backend_options"], "weight_version": version}}


async def evaluate(config: dict[str, Any], tasks: list[dict[str, Any]], path: Path, max_new_tokens: int) -> float:
    """Greedy accuracy on ``tasks``: one rollout each at temperature 0; a rollout without a reward counts 0."""
    from tito_core import arollout
    from tito_core.runner import read_records

    sampling = {"temperature": 0.0, "max_new_tokens": max_new_tokens}
    await arollout(config, tasks, path, group_size=1, group_reward="", sampling=sampling)
    records = list(read_records(path))
    if len(records) != len(tasks):
        raise SystemExit(f"evaluation wrote {len(records)} records for {len(tasks)} tasks")
    return sum(r.reward or 0.0 for r in records) / len(records)


def plot(metrics: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    evals = [(m["round"], m["eval_accuracy"]) for m in metrics]
    trains = [(m["round"], m["train_reward"]) for m in metrics if m["train_reward"] is not None]
    ax.plot(*zip(*trains, strict=True), "o-", label="train: mean reward (sampled)")
    ax.plot(*zip(*evals, strict=True), "s-", label="held-out: greedy accuracy")
    ax.set_xlabel("round (0 = before training)")
    ax.set_ylim(0, 1.02)
    ax.set_xticks([m["round"] for m in metrics])
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


async def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from tito_core import arollout
    from tito_core.runner import read_records

    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("rollouts_r*.jsonl"), *args.out.glob("eval_r*.jsonl")]:
        old.unlink()  # the runner resumes into an existing file: a new run starts from empty ones
    metrics_path = args.out / "metrics.jsonl"
    metrics_path.write_text("")
    pool = make_tasks(args.train_tasks + args.eval_tasks, args.seed)
    train_pool, held_out = pool[: args.train_tasks], pool[args.train_tasks :]
    rng = random.Random(args.seed + 1)

    model, model_dir = build_policy(args)
    config = rollout_config(args, model, model_dir)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    title = args.plot_title or (
        f"SmolLM2-135M + LoRA, REINFORCE on tito rollouts ({args.tasks_per_round} tasks x {args.group_size} / round)"
    )
    metrics: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        metrics.append(row)
        with metrics_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        plot(metrics, args.out / "train_reinforce.png", title)
        train = "   -  " if row["train_reward"] is None else f"{row['train_reward']:6.3f}"
        loss = "     -    " if row["loss"] is None else f"{row['loss']:+.3e}"
        print(
            f"round {row['round']:2d} | train reward {train} | eval accuracy {row['eval_accuracy']:.3f} | "
            f"loss {loss} | {row['seconds']:6.1f} s",
            flush=True,
        )

    started = time.perf_counter()
    accuracy = await evaluate(at_version(config, 0), held_out, args.out / "eval_r00.jsonl", args.max_new_tokens)
    emit({"round": 0, "train_reward": None, "eval_accuracy": accuracy, "loss": None,
          "seconds": time.perf_counter() - started})  # fmt: skip
    trained_any = False
    for round_ in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        tasks = rng.sample(train_pool, min(args.tasks_per_round, len(train_pool)))
        path = args.out / f"rollouts_r{round_:02d}.jsonl"
        summary = await arollout(at_version(config, round_ - 1), tasks, path)  # the weights of the last step
        collect_s = time.perf_counter() - t0
        records = list(read_records(path))
        if not records:
            raise SystemExit(f"round {round_}: no rollouts were written")
        unlabelled = [r.key for r in records if r.tokens.output and r.weight_version_max != str(round_ - 1)]
        if unlabelled:
            raise SystemExit(f"round {round_}: rollouts {unlabelled[:3]} do not record weight version {round_ - 1}")
        off_policy = off_policy_tokens(records, trained_version=round_ - 1)  # the step trains version round_ - 1
        rollouts, skipped = usable_rollouts(records, mask_forced=args.mask_forced)
        if not rollouts:
            raise SystemExit(f"round {round_}: every rollout failed or was aborted: {summary.statuses}")
        t1 = time.perf_counter()
        stats = reinforce_step(model, optimizer, rollouts, max_grad_norm=args.max_grad_norm)
        train_s = time.perf_counter() - t1
        if not math.isfinite(stats.loss) or not math.isfinite(stats.grad_norm):
            raise SystemExit(f"round {round_}: the loss is {stats.loss}, the gradient norm {stats.grad_norm}")
        if stats.loss_tokens == 0:
            raise SystemExit(f"round {round_}: no model tokens in the loss")
        trained_any = trained_any or stats.groups > 0
        rewards = [r.reward or 0.0 for r in records]
        t2 = time.perf_counter()
        eval_config = at_version(config, round_)
        accuracy = await evaluate(eval_config, held_out, args.out / f"eval_r{round_:02d}.jsonl", args.max_new_tokens)
        emit(
            {
                "round": round_,
                "train_reward": sum(rewards) / len(rewards),
                "eval_accuracy": accuracy,
                "loss": stats.loss,
                "seconds": time.perf_counter() - t0,
                "collect_s": collect_s,
                "train_s": train_s,
                "eval_s": time.perf_counter() - t2,
                "rollouts": len(records),
                "statuses": summary.statuses,
                "skipped": skipped,
                "groups_with_signal": stats.groups,
                "loss_tokens": stats.loss_tokens,
                "signal_tokens": stats.signal_tokens,
                "grad_norm": stats.grad_norm,
                "weight_versions": [summary.weight_version_min, summary.weight_version_max],
                "off_policy_tokens": off_policy.off_policy,
                "off_policy_share": off_policy.share,
                "unversioned_tokens": off_policy.unknown,
            }
        )
    if not trained_any:
        print("warning: no group had a reward spread in any round: the adapter was never updated", file=sys.stderr)
    first, last = metrics[0]["eval_accuracy"], metrics[-1]["eval_accuracy"]
    print(f"held-out greedy accuracy {first:.3f} -> {last:.3f}; metrics: {metrics_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
