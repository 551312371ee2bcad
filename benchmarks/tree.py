"""Training on prefix trees against flat rows: tokens processed and forward+backward time (issue 48, item 5).

Rollouts recorded by the rollout core on the scripted backend (:mod:`tito_testing.rollout_trees`), exported as
training rows (one per lineage leaf, :func:`tito_core.export.to_areal`) and packed into one prefix tree
(:func:`tito_core.export.pack_trees`). For each case, one forward and backward of the policy-gradient loss over the
tree (each shared prefix once, the tree attention mask; :mod:`tito_testing.tree_training`) against one per flat row,
on the same model in float32, and the relative difference of their losses and gradients. Cases: a GRPO group of 8
on one short prompt, the parent/sub-agent rollout, a rollout with a retried call and an edited history, and the
group of 8 with prompts of each ``--prompt-tokens``.

The default model is the tiny random Qwen3 (2 layers, hidden size 64, 2 heads; built offline), so that a 16k-token
prompt fits on a CPU; ``--model smollm2`` runs SmolLM2-135M. ``nox -s bench`` runs it; ``bench_smoke`` (in
``tests_transformers``) at a tiny size. Not a test: the figures go in docs/exports.md.

    python benchmarks/tree.py --prompt-tokens 2048 16384 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--model", default="tiny", help="tiny (random Qwen3) or smollm2")
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[2048, 16384], help="the group's prompt sizes")
    parser.add_argument("--group", type=int, default=8, help="rollouts in a group")
    parser.add_argument("--reply-words", type=int, default=48, help="extra words in each group reply")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per case and layout (the median is shown)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    return parser.parse_args(argv)


def _model(name: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name == "tiny":
        from tito_testing.tiny_model import build_tiny_qwen3

        path = build_tiny_qwen3()
    elif name == "smollm2":
        from tito_transformers.models import build_smollm2

        path = build_smollm2()
    else:
        raise SystemExit(f"unknown model {name!r}: tiny or smollm2")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="sdpa")
    return AutoTokenizer.from_pretrained(str(path)), model


def _cases(tok: Any, args: argparse.Namespace) -> dict[str, list[Any]]:
    from tito_testing.rollout_trees import record_group, record_sub_agent, record_tree

    cases = {
        f"group of {args.group}, short prompt": record_group(tok, args.group, reply_words=args.reply_words),
        "parent and sub-agent": [record_sub_agent(tok)],
        "retry and edited history": [record_tree(tok)],
    }
    for size in args.prompt_tokens:
        prompt = " ".join(["word"] * size)  # about one token a word
        cases[f"group of {args.group}, {size} prompt"] = record_group(
            tok, args.group, prompt=prompt, reply_words=args.reply_words
        )
    return cases


def _timed(model: Any, logprobs: Callable[[], list[Any]], rows: list[dict[str, Any]]) -> tuple[float, Any, Any]:
    import torch

    from tito_testing.tree_training import policy_loss

    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    loss = policy_loss(logprobs(), rows)
    loss.backward()
    elapsed = time.perf_counter() - started
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return elapsed, loss.detach(), grad


def _case(model: Any, name: str, trajectories: list[Any], repeats: int) -> dict[str, Any]:
    """One case: its rows, their tree, and the timed forward+backward passes over each."""
    import torch

    from tito_core.export import pack_trees, to_areal, training_branches
    from tito_testing.tree_training import flat_logprobs, tree_logprobs, tree_mask

    rows = [to_areal(s) for traj in trajectories for s in training_branches(traj)]
    for k, row in enumerate(rows):
        row["advantage"] = 1.0 - 0.25 * k
    flat_tokens = sum(len(r["input_ids"]) for r in rows)
    (tree,) = pack_trees(rows, max_tokens=-(-flat_tokens // 128) * 128)  # one tree holds them all
    started = time.perf_counter()
    tree_mask(tree, torch.float32)
    mask_s = time.perf_counter() - started
    on_tree, on_rows = (lambda: tree_logprobs(model, [tree], rows)), (lambda: flat_logprobs(model, rows))
    _timed(model, on_tree, rows), _timed(model, on_rows, rows)  # warm-up, untimed
    tree_runs = [_timed(model, on_tree, rows) for _ in range(repeats)]
    flat_runs = [_timed(model, on_rows, rows) for _ in range(repeats)]
    (_, tree_loss, tree_grad), (_, flat_loss, flat_grad) = tree_runs[-1], flat_runs[-1]
    return {
        "case": name,
        "rows": len(rows),
        "prompt": min(r["loss_mask"].index(1) for r in rows if 1 in r["loss_mask"]),
        "flat_tokens": flat_tokens,
        "tree_tokens": tree.num_tokens,
        "flat_s": statistics.median(t for t, _, _ in flat_runs),
        "tree_s": statistics.median(t for t, _, _ in tree_runs),
        "mask_s": mask_s,
        "loss_diff": float(abs(tree_loss - flat_loss) / abs(flat_loss)),
        "grad_diff": float((tree_grad - flat_grad).norm() / flat_grad.norm()),
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure every case; one result dict per case."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    tok, model = _model(args.model)
    results = []
    for name, trajectories in _cases(tok, args).items():
        results.append(_case(model, name, trajectories, args.repeats))
        print(_line(results[-1]), flush=True)
    return results


HEADER = (
    "| case | rows | shortest prompt | tokens flat | tokens tree | flat fwd+bwd (s) | tree fwd+bwd (s) | of which "
    "mask (s) | speed-up | loss / grad rel. diff |\n|---|---|---|---|---|---|---|---|---|---|"
)


def _line(r: dict[str, Any]) -> str:
    return (
        f"| {r['case']} | {r['rows']} | {r['prompt']} | {r['flat_tokens']} | {r['tree_tokens']} "
        f"({r['flat_tokens'] / r['tree_tokens']:.1f}x fewer) | {r['flat_s']:.3f} | {r['tree_s']:.3f} | "
        f"{r['mask_s']:.3f} | {r['flat_s'] / r['tree_s']:.1f}x | {r['loss_diff']:.1e} / {r['grad_diff']:.1e} |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its table (markdown)."""
    args = parse_args(argv)
    print(f"model: {args.model}, float32, {args.repeats} timed runs each after one warm-up (median)")
    print(HEADER, flush=True)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
