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

    python benchmarks/train_ab.py --out runs/train_ab                 # both arms in parallel, 50 steps each
    python benchmarks/train_ab.py --steps 2 --tasks-per-step 1 ...    # the smoke size (nox -s train_demo)

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

PAIRS = {"drift": ("tito", "text"), "truncated": ("mask", "full")}
"""The arm pairs: recorded ids vs a text stack's; under top-p/top-k, the kept sets used by the trainer vs not."""
ARMS = tuple(arm for arms in PAIRS.values() for arm in arms)
CLIP = 0.2


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
class Row:
    """One rollout as an arm's trainer takes it; the lists run over the loss tokens, in order."""

    token_ids: list[int]
    loss_mask: list[int]
    advantage: float
    group: int
    old: list[float | None]  # the ratio's old logprob; None: the trainer's own (detached)
    sampled: list[float | None]  # the sampler's logprob of this very token, where the arm still has it
    kept: tuple[list[int], list[int]] | None = None  # each loss token's kept set (CSR ids, offsets); [] = all


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


def loss_positions(mask: Sequence[int]) -> list[int]:
    """The positions the grouped forward scores: mask 1, never position 0 (nothing predicts it)."""
    return [i for i in range(1, len(mask)) if mask[i]]


def free_logprobs(traj: Any) -> list[float | None]:
    """Per position: the recorded logprob where it is the policy's (an output of an unconstrained turn)."""
    lps: list[float | None] = [None] * len(traj.token_ids)
    recorded = traj.logprobs
    for turn in traj.turns:
        if not turn.constrained:
            for i in range(turn.output_start, turn.output_start + turn.output_len):
                lps[i] = recorded[i]
    return lps


def tito_row(record: Any, traj: Any, *, kept: bool = False) -> Row:
    """The recorded ids and mask; the recorded logprobs as the old ones, except in constrained turns.

    ``kept``: with each loss token's recorded kept set (an empty row where its call did not truncate).
    """
    free = free_logprobs(traj)
    positions = loss_positions(traj.loss_mask)
    picked = [free[i] for i in positions]
    row = Row(list(traj.token_ids), list(traj.loss_mask), float(record.advantage), record.group, picked, picked)
    if kept:
        row.kept = kept_sets(traj, positions)
    return row


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


def rows_of(arm: str, records: Sequence[Any], stack: Stack) -> tuple[list[Row], Drift, dict[str, int]]:
    """What ``arm`` trains on from a step's records (failed / aborted ones skipped, as the demo does)."""
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
            rows.append(tito_row(record, traj, kept=arm in PAIRS["truncated"]))
        elif view is not None:
            rows.append(text_row(record, traj, view))
        else:
            skipped["text stack not rebuilt"] += 1
    return rows, drift, dict(skipped)


# --- the step ---------------------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass(frozen=True)
class Scoring:
    """How the trainer scores rows with kept sets: ``softmax(logits / temperature)`` over each token's kept set.

    ``use_kept`` False: over the whole vocabulary instead (the common mistake), off by ``log S`` per token.
    """

    temperature: float
    use_kept: bool


def score_group(model: Any, members: Sequence[Row], scoring: Scoring | None) -> tuple[list[Any], list[Any]]:
    """Per row: the trainer's logprobs of its loss tokens (with grad), and their ``log S`` (detached).

    ``log S``: the log of the mass each kept set holds, by which a full-vocabulary logprob falls short (empty
    without ``scoring``).
    """
    import torch

    from tito_core.kept_logprobs import kept_logprobs

    if scoring is None:
        return demo.group_token_logprobs(model, members), [torch.zeros(0)] * len(members)  # type: ignore[arg-type]
    used, log_s = [], []
    for row, (logits, targets) in zip(members, demo.group_token_logits(model, members), strict=True):  # type: ignore[arg-type]
        if row.kept is None:
            raise SystemExit("a row without kept sets in the truncated pair")
        kept = kept_logprobs(logits, targets, row.kept, temperature=scoring.temperature)
        full = torch.log_softmax(logits / scoring.temperature, dim=-1).gather(1, targets[:, None])[:, 0]
        used.append(kept if scoring.use_kept else full)
        log_s.append((full - kept).detach())
    return used, log_s


def ppo_step(
    model: Any, optimizer: Any, rows: Sequence[Row], *, max_grad_norm: float, scoring: Scoring | None = None
) -> dict[str, Any]:
    """One PPO-clip update on ``rows``; groups without a reward spread are scored (no grad) for the figures.

    ``scoring``: how to score rows with kept sets (the truncated pair); None: ``log_softmax(logits)``.
    """
    import torch

    model.train()
    optimizer.zero_grad(set_to_none=True)
    normaliser = sum(len(loss_positions(r.loss_mask)) for r in rows)
    groups: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        if loss_positions(row.loss_mask):
            groups[row.group].append(row)
    ratios: list[float] = []
    k3: list[float] = []
    log_masses: list[float] = []
    total, signal = 0.0, 0
    for members in groups.values():
        learns = any(r.advantage != 0.0 for r in members)
        with torch.set_grad_enabled(learns):
            logps, log_s = score_group(model, members, scoring)
            loss = torch.zeros(())
            for row, lp, mass in zip(members, logps, log_s, strict=True):
                log_masses.extend(m for m, o in zip(mass.tolist(), row.old, strict=False) if o is not None)
                if len(lp) != len(row.old):
                    raise SystemExit(f"scored {len(lp)} tokens for a row of {len(row.old)} loss tokens")
                detached = lp.detach()
                old = torch.tensor([d if o is None else o for o, d in zip(row.old, detached.tolist(), strict=True)])
                ratio = torch.exp(lp - old)
                clipped = torch.clamp(ratio, 1 - CLIP, 1 + CLIP)
                loss = loss - torch.minimum(ratio * row.advantage, clipped * row.advantage).sum() / normaliser
                ratios.extend(ratio.detach().tolist())
                for s, t in zip(row.sampled, detached.tolist(), strict=True):
                    if s is not None:
                        r = t - s
                        k3.append(math.expm1(r) - r)
        if learns:
            loss.backward()
            total += float(loss.detach())
            signal += 1
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm)) if signal else 0.0
    if signal:
        optimizer.step()
    model.eval()
    return {
        "loss": total,
        "trained_tokens": normaliser,
        "groups_with_signal": signal,
        "grad_norm": grad_norm,
        "ratio_p1": quantile(ratios, 0.01),
        "ratio_p50": quantile(ratios, 0.5),
        "ratio_p99": quantile(ratios, 0.99),
        "clipped_share": sum(not 1 - CLIP <= r <= 1 + CLIP for r in ratios) / len(ratios) if ratios else None,
        "log_s_mean": sum(log_masses) / len(log_masses) if log_masses else None,  # over the free tokens
        "k3": sum(k3) / len(k3) if k3 else None,
        "k3_tokens": len(k3),
    }


# --- one arm ----------------------------------------------------------------------------------------


def step_seed(seed: int, step: int) -> int:
    """The sampling seed of a step, the same in both arms (the runner derives each rollout's from it)."""
    return seed * 1_000_003 + step


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
    demo_args = argparse.Namespace(
        seed=args.seed, lora_rank=args.lora_rank, model_dir=args.model_dir, threads=args.threads,
        temperature=args.temperature, max_new_tokens=args.max_new_tokens, group_size=args.group_size,
    )  # fmt: skip
    model, model_dir = demo.build_policy(demo_args)
    config = demo.rollout_config(demo_args, model, model_dir)
    stack = Stack(config)
    truncated = arm in PAIRS["truncated"]
    scoring = Scoring(args.temperature, use_kept=arm == "mask") if truncated else None
    truncation = {"top_p": args.top_p, "top_k": args.top_k} if truncated else {}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()

    async def evaluate(step: int) -> float:
        path = out / f"eval_s{step:03d}.jsonl"
        return await demo.evaluate(demo.at_version(config, step), held_out, path, args.max_new_tokens)

    evals = {0: await evaluate(0)}
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        tasks = rng.sample(train_pool, min(args.tasks_per_step, len(train_pool)))
        path = out / f"rollouts_s{step:03d}.jsonl"
        seeded = demo.at_version(config, step - 1)
        seeded["sampling"] = {**seeded["sampling"], **truncation, "seed": step_seed(args.seed, step)}
        await arollout(seeded, tasks, path)
        records = list(read_records(path))
        collect_s = time.perf_counter() - t0
        train_rows, drift, skipped = rows_of(arm, records, stack)
        if not train_rows:
            raise SystemExit(f"{arm} step {step}: nothing to train on ({skipped})")
        t1 = time.perf_counter()
        stats = ppo_step(model, optimizer, train_rows, max_grad_norm=args.max_grad_norm, scoring=scoring)
        train_s = time.perf_counter() - t1
        if not (math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])):
            raise SystemExit(f"{arm} step {step}: the loss is {stats['loss']}, the gradient norm {stats['grad_norm']}")
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
            "statuses": dict(Counter(r.status for r in records)),
            "skipped": skipped,
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
    return {"arm": arm, "eval_0": evals[0], "rows": rows, "wall_s": time.perf_counter() - started}


# --- both arms --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=Path("runs/train_ab"), help="output directory")
    parser.add_argument(
        "--pair", choices=tuple(PAIRS), default="drift",
        help="drift: recorded ids (tito) vs a text stack's (text); truncated: top-p/top-k sampling, the trainer "
        "renormalising over the recorded kept sets (mask) or over the whole vocabulary (full)",
    )  # fmt: skip
    parser.add_argument("--arm", choices=ARMS, help="run one arm in this process (default: both, in parallel)")
    parser.add_argument("--serial", action="store_true", help="run the two arms one after the other")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one A/B per seed, one after the other")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # set per run from --seeds
    parser.add_argument("--train-tasks", type=int, default=64, help="size of the training task pool")
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=8, help="held-out tasks (half word problems), greedy")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per model call")
    parser.add_argument("--top-p", type=float, default=0.9, help="the truncated pair's top_p")
    parser.add_argument("--top-k", type=int, default=50, help="the truncated pair's top_k")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per arm")
    parser.add_argument("--model-dir", default=None, help="a SmolLM2-135M-Instruct folder (default: built offline)")
    return parser.parse_args(argv)


def without_option(argv: Sequence[str], name: str) -> list[str]:
    """``argv`` less ``name`` and its values (``--seeds 0 1`` or ``--seeds=0``)."""
    kept: list[str] = []
    skipping = False
    for arg in argv:
        if arg == name or arg.startswith(name + "="):
            skipping = arg == name
            continue
        if skipping and not arg.startswith("--"):
            continue
        skipping = False
        kept.append(arg)
    return kept


def run_both(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """Each arm in its own process (in parallel unless ``--serial``); their results, read back."""
    base = [a for a in argv if a != "--serial"]
    seed_out = args.out / f"seed{args.seed}"
    command = [sys.executable, __file__, *base, "--out", str(seed_out), "--seed", str(args.seed)]
    procs = []
    arms = PAIRS[args.pair]
    for arm in arms:
        procs.append(subprocess.Popen([*command, "--arm", arm]))
        if args.serial and procs[-1].wait():
            break
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"an arm failed (exit codes {dict(zip(arms, codes, strict=False))})")
    return {arm: json.loads((seed_out / arm / "result.json").read_text()) for arm in arms}


def main(argv: Sequence[str] | None = None) -> int:
    """One arm (``--arm``), or both for every seed, then the JSON, the plot and the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.arm and args.arm not in PAIRS[args.pair]:
        raise SystemExit(f"--arm {args.arm} is not an arm of --pair {args.pair} {PAIRS[args.pair]}")
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
