"""``tito export``: a rollout file converted to a trainer's format (JSON lines), an ATIF file or prefix trees.

Usage: ``tito export --to FORMAT rollouts.jsonl -o out.jsonl``, with ``--branch-reward``, ``--max-staleness`` /
``--current-version``, ``--baseline``, ``--reward-superseded``, ``--kept-sets`` and ``--max-tokens``
(docs/exports.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import ConfigError

__all__ = ["add_export_command", "run_export"]


def add_export_command(commands: Any) -> None:
    """Add ``tito export`` to the ``tito`` command's subparsers."""
    export = commands.add_parser("export", help="convert a rollout file to a trainer's format (JSON lines)")
    export.add_argument(
        "--to",
        required=True,
        choices=["slime", "verl", "trl", "agl", "areal", "tree", "atif"],
        help="the trainer format (agl: Agent Lightning v1 model_request events; areal: rows of AReaL's batch dict; "
        "tree: those rows packed into prefix trees, each shared prefix once, in AReaL's tree-training layout; "
        "atif: one ATIF trajectory per rollout, for Harbor's tools)",
    )
    export.add_argument("--tokenizer", help="with --to atif: the tokenizer that decodes the messages' text")
    export.add_argument("rollouts", help="the rollout file")
    export.add_argument("out", nargs="?", help="the output file (or give it as -o/--output)")
    export.add_argument("-o", "--output", dest="output", help="the output file (JSON lines, one training branch each)")
    export.add_argument(
        "--branch-reward",
        choices=["shared", "last"],
        default="shared",
        help="a rollout whose history was rewritten has several branches: shared (default) makes each branch a "
        "sample with the episode's reward, each token trained in the branch that generated it; last keeps only "
        "the final branch",
    )
    export.add_argument(
        "--max-staleness",
        type=int,
        help="leave out rollouts whose oldest token is more than N weight versions behind --current-version "
        "(docs/async.md)",
    )
    export.add_argument("--current-version", help="the trainer's current weight version, for --max-staleness")
    export.add_argument(
        "--reward-superseded",
        action="store_true",
        help="give a retried call's superseded attempt the rollout's reward too (default: none unless rewarded)",
    )
    export.add_argument(
        "--baseline",
        choices=["rollouts", "branches"],
        help="recompute each row's advantage, GRPO's (reward - mean) / std, the baseline over the group's rollouts or "
        "over all its rows (default: the record's advantage)",
    )
    export.add_argument(
        "--kept-sets",
        choices=["trainer", "tito"],
        default="trainer",
        help="where the kept sets of truncated sampling go: the trainer's own fields where it has them (slime's "
        "rollout_top_p_token_ids/offsets), else tito's layout (trainer, default); tito: tito's layout "
        "(sampling_mask_ids/offsets/missing) for every format, also for a slime row that trains a token without "
        "a kept set",
    )
    export.add_argument(
        "--max-tokens",
        type=int,
        default=32768,
        help="with --to tree: the most tokens in one tree (AReaL's max_tokens_per_mb, a multiple of 128)",
    )


def run_export(args: argparse.Namespace) -> int:
    """``tito export``: a rollout file in a trainer's format."""
    from ..runner import read_records
    from ..runner.samples import training_rows

    if args.out is not None and args.output is not None and args.out != args.output:
        raise ConfigError(f"two output files given: {args.out!r} and -o {args.output!r}")
    target = args.output or args.out
    if target is None:
        raise ConfigError("no output file: give it after the rollout file or as -o/--output")
    if args.max_staleness is not None and args.current_version is None:
        raise ConfigError("--max-staleness needs --current-version: staleness is counted from the current version")
    if args.max_staleness is not None and args.max_staleness < 0:
        raise ConfigError(f"--max-staleness must be >= 0, got {args.max_staleness}")
    if args.to == "atif":
        return _export_atif(args, target)
    if args.to == "tree":
        return _export_trees(args, target)
    rollouts = branches = 0
    last = None
    rows = training_rows(
        read_records(args.rollouts),
        args.to,
        branch_reward=args.branch_reward,
        current_version=args.current_version,
        max_staleness=args.max_staleness,
        reward_superseded=args.reward_superseded,
        baseline=args.baseline,
        kept_sets=args.kept_sets,
    )
    with open(target, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
            branches += 1
            if (row["task_id"], row["sample"]) != last:
                rollouts += 1
                last = (row["task_id"], row["sample"])
    print(
        f"tito export: {rollouts} rollouts, {branches} training samples ({args.branch_reward} branch reward) "
        f"as {args.to} -> {target}",
        file=sys.stderr,
    )
    return 0


def _export_atif(args: argparse.Namespace, target: str) -> int:
    from ..export.atif import to_atif
    from ..runner import read_records
    from ..tokenizers import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    count = 0
    with open(target, "w", encoding="utf-8") as out:
        for record in read_records(args.rollouts):
            out.write(json.dumps(to_atif(record, tokenizer)) + "\n")
            count += 1
    print(f"tito export: {count} rollouts as ATIF trajectories -> {target}", file=sys.stderr)
    return 0


def _export_trees(args: argparse.Namespace, target: str) -> int:
    import msgspec

    from ..runner import read_records
    from ..runner.samples import packed_trees

    trees = packed_trees(
        read_records(args.rollouts),
        max_tokens=args.max_tokens,
        branch_reward=args.branch_reward,
        current_version=args.current_version,
        max_staleness=args.max_staleness,
        reward_superseded=args.reward_superseded,
        baseline=args.baseline,
    )
    with open(target, "wb") as out:
        for tree in trees:
            out.write(msgspec.json.encode(tree) + b"\n")
    rows = sum(len(t.sequence_ids) for t in trees)
    flat = sum(len(t.packed["loss_mask"]) for t in trees)
    stored = sum(t.num_tokens for t in trees)
    print(
        f"tito export: {rows} training rows in {len(trees)} trees ({args.branch_reward} branch reward), "
        f"{stored} tokens for {flat} in the rows -> {target}",
        file=sys.stderr,
    )
    return 0
