"""The A/B's command line: its options, the presets that bundle them, and the arms a run trains.

``--preset NAME`` makes a preset's values the defaults, so any flag given on the command line overrides them
(:func:`parse_args`); :func:`check_args` refuses options that do not fit together, saying what to do instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DESCRIPTION = "Does TITO change learning? Two training runs from one seed, differing only in what the trainer gets."

PAIRS = {"drift": ("tito", "text"), "truncated": ("mask", "full")}
"""The arm pairs: recorded ids vs a text stack's; under top-p/top-k, the kept sets used by the trainer vs not."""
TIS_ARM = "+tis"
"""With ``--tis-ab``, each arm runs twice: as itself (no TIS) and as ``<arm>+tis`` (TIS at ``--tis``)."""

PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-gpu": {
        # the decisive run (docs/training-ab.md): Qwen3 with its thinking template, full fine-tuning on one GPU,
        # sampling on SGLang with top-p/top-k, one step stale, two epochs of four minibatches, TIS on and off
        "pair": "truncated",
        "steps": 100,
        "seeds": [0, 1, 2],
        "device": "cuda",
        "lora_rank": 0,
        "lr": 1e-6,
        "train_tasks": 512,
        "tasks_per_step": 8,
        "group_size": 8,
        "eval_tasks": 64,
        "eval_every": 10,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 50,
        "max_new_tokens": 1024,
        "forced_tool_calls": 0,
        "thinking": True,
        "branches": "leaves",
        "old": "trainer",
        "tis": 2.0,
        "tis_ab": True,
        "ppo_epochs": 2,
        "minibatches": 4,
        "staleness": 1,
        "serial": True,
        "threads": 4,
    },
}
"""Named bundles of options (``--preset NAME``); a flag given on the command line overrides the preset's value."""
REQUIRED = {"qwen3-gpu": ("model_dir", "engine_url")}
"""What a preset cannot guess: a local model folder, the engine's URL."""


# --- arms ---------------------------------------------------------------------------------------------


def base_arm(arm: str) -> str:
    """The pair's arm an arm name runs (``mask+tis`` runs ``mask`` with TIS)."""
    return arm.removesuffix(TIS_ARM)


def arms_of(args: argparse.Namespace) -> list[str]:
    """The arms of a run: the pair's two, or with ``--tis-ab`` each of them without and with TIS."""
    arms = PAIRS[args.pair]
    return [name for arm in arms for name in (arm, arm + TIS_ARM)] if args.tis_ab else list(arms)


def tis_of(args: argparse.Namespace, arm: str) -> float | None:
    """The TIS cap ``arm`` trains with (None: no TIS)."""
    cap: float | None = args.tis
    return None if args.tis_ab and not arm.endswith(TIS_ARM) else cap


def engine_url_of(args: argparse.Namespace, arm: str) -> str:
    """The engine ``arm`` samples on: the only ``--engine-url``, or the arm's own (one per arm, in arm order)."""
    urls: list[str] = args.engine_url
    return urls[0] if len(urls) == 1 else urls[arms_of(args).index(arm)]


# --- the command line -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line (its defaults: the CPU A/B of docs/training-ab.md)."""
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument(
        "--preset", choices=tuple(PRESETS),
        help="a named bundle of the options below (flags given on the command line override its values): "
        "qwen3-gpu, the decisive run of docs/training-ab.md",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs/train_ab"), help="output directory")
    parser.add_argument(
        "--pair", choices=tuple(PAIRS), default="drift",
        help="drift: recorded ids (tito) vs a text stack's (text); truncated: top-p/top-k sampling, the trainer "
        "renormalising over the recorded kept sets (mask) or over the whole vocabulary (full)",
    )  # fmt: skip
    parser.add_argument("--arm", help="run one arm in this process (default: every arm, in parallel)")
    parser.add_argument("--serial", action="store_true", help="run the arms one after the other")
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
    parser.add_argument("--lora-rank", type=int, default=8, help="0: train every weight (full fine-tuning)")
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per arm")
    parser.add_argument("--model-dir", default=None, help="a local model folder (default: SmolLM2-135M-Instruct, built "
                        "offline); with --engine-url, the model the server was started with")  # fmt: skip
    parser.add_argument("--device", default="cpu", help="where the trainer runs (cuda needs --engine-url)")
    parser.add_argument("--reward", default=None, help="the reward's import path (default: arith:reward)")
    parser.add_argument("--forced-tool-calls", type=int, default=None, help="model calls forced to call a tool "
                        "(default: the demo's 1; a model that calls tools on its own needs 0)")  # fmt: skip
    parser.add_argument(
        "--branches", choices=("final", "leaves"), default="final",
        help="a tito arm's rows: the rollout's final branch, or one per leaf of its token tree (each token trained "
        "once)",
    )  # fmt: skip
    group = parser.add_argument_group("off-policy training (train_ab_step)")
    group.add_argument("--old", choices=("behaviour", "trainer"), default="behaviour", help="what the ratio divides "
                       "by: the recorded logprobs, or the trainer's own at the start of each batch")  # fmt: skip
    group.add_argument(
        "--tis", type=float, default=None, metavar="C",
        help="truncated importance sampling: weight each token's loss by min(pi_old(trainer) / pi_behaviour, C) "
        "(needs --old trainer; off by default)",
    )  # fmt: skip
    group.add_argument("--tis-ab", action="store_true", help="run each arm without and with TIS (arms <arm>+tis)")
    group.add_argument("--ppo-epochs", type=int, default=1, help="passes over each batch")
    group.add_argument("--minibatches", type=int, default=1, help="updates per pass (whole groups per minibatch)")
    group = parser.add_argument_group("sampling on an engine (train_ab_engine)")
    group.add_argument("--engine-url", nargs="+", default=None, help="SGLang server(s) serving --model-dir: one "
                       "(arms then run one after the other) or one per arm")  # fmt: skip
    group.add_argument("--staleness", type=int, default=0, metavar="K",
                       help="sample each step with the weights K steps older than the trainer's")  # fmt: skip
    group.add_argument("--checkpoint-dir", default=None, help="where pushed weights are written (default: "
                       "<out>/<arm>/weights; a tmpfs such as /dev/shm is fastest)")  # fmt: skip
    group.add_argument("--probe-tolerance", type=float, default=0.05, help="mean nats the engine's logprobs of the "
                       "weight probe may differ from the trainer's after a push")  # fmt: skip
    group.add_argument("--engine-timeout", type=float, default=900.0, help="seconds one engine request may take")
    group.add_argument("--no-thinking", dest="thinking", action="store_false",
                       help="render the chat template with enable_thinking false")  # fmt: skip
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line; ``--preset NAME`` sets that preset's values as the defaults the other flags override."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.preset is not None:
        parser.set_defaults(**PRESETS[args.preset])
        args = parser.parse_args(argv)
    return args


def check_args(args: argparse.Namespace) -> None:
    """Refuse options that do not fit together, each with what to do instead."""
    missing = [f"--{name.replace('_', '-')}" for name in REQUIRED.get(args.preset or "", ()) if not getattr(args, name)]
    if missing:
        raise SystemExit(f"--preset {args.preset} needs {' and '.join(missing)} (a local model folder; the URL of an "
                         "SGLang server started on it): see docs/training-ab.md, 'The decisive run'")  # fmt: skip
    arms = arms_of(args)
    if args.arm and args.arm not in arms:
        raise SystemExit(f"--arm {args.arm} is not an arm of --pair {args.pair} {tuple(arms)}")
    if args.tis is not None and args.tis <= 0:
        raise SystemExit(f"--tis must be a positive cap, got {args.tis}")
    if args.tis is not None and args.old != "trainer":
        raise SystemExit("--tis weighs each token by min(pi_old(trainer) / pi_behaviour, C): it needs --old trainer")
    if args.tis_ab and args.tis is None:
        raise SystemExit("--tis-ab runs each arm without and with TIS: give the cap with --tis C")
    if args.ppo_epochs < 1 or args.minibatches < 1 or args.staleness < 0:
        raise SystemExit("--ppo-epochs and --minibatches must be at least 1, --staleness at least 0")
    if not args.engine_url:
        for flag, used in (("--staleness", args.staleness), ("--device cuda", args.device != "cpu")):
            if used:
                raise SystemExit(f"{flag} needs --engine-url: the embedded backend samples with the live weights "
                                 "on the CPU")  # fmt: skip
    elif len(args.engine_url) not in (1, len(arms)):
        raise SystemExit(f"--engine-url takes one server, or one per arm ({len(arms)}: {', '.join(arms)}), "
                         f"not {len(args.engine_url)}")  # fmt: skip


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
