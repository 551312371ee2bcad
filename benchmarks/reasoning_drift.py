"""Retokenization drift where it is largest: a template that drops past reasoning (Qwen3's). The mismatch alone.

A Strands agent on the embedded backend asks several questions in one conversation (the tiny random Qwen3 of
``tito_testing`` with Qwen3's own chat template). Every answer is reasoning then text, the shape forced by a
regex (the random model writes no think block on its own). Qwen3's template renders the reasoning of an
assistant turn only after the last user question: a text stack that re-renders the finished conversation drops
the think block of every earlier answer, tokens the model generated and tito trains on. For each conversation:

* the drift (:func:`tito_core.analysis.drift.compare_ids`): trained tokens changed or dropped, tokens added;
* what it does to the logprobs a trainer computes: one plain forward pass over tito's ids and one over the text
  stack's, compared on the trained tokens present in both (aligned): mean / max |delta| and the k3 estimate
  of KL(the context the model sampled in || the text stack's), by answer (earlier ones lose their reasoning).

    python benchmarks/reasoning_drift.py --conversations 16 --questions 3 --json reasoning_drift.json
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ANSWER = r"<think>\n[a-z]{2,8}( [a-z]{2,8}){3,7}\n</think>\n\n[a-z]{2,8}( [a-z]{2,8}){1,5}"
QUESTIONS = ("What is 2 + 3?", "And times four?", "Now minus seven?", "Halve it.", "Add one hundred.")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--conversations", type=int, default=16)
    parser.add_argument("--questions", type=int, default=3, help=f"per conversation, at most {len(QUESTIONS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    return parser.parse_args(argv)


def conversation(config: Any, questions: Sequence[str], seed: int) -> Any:
    """One multi-question Strands conversation on a fresh TitoModel; its trajectory."""
    from strands import Agent

    model = config.create_model()
    model.update_config(sampling={"temperature": 1.0, "max_new_tokens": 64, "seed": seed, "extra": {"regex": ANSWER}})
    agent = Agent(model=model, system_prompt="You are a calculator.", callback_handler=None)
    for question in questions:
        agent(question)
    return model.trajectory


def aligned_deltas(traj: Any, view: Any, tito_lps: Sequence[float | None], text_lps: Sequence[float | None]) -> Any:
    """Per answer: ``logp(text stack's context) - logp(tito's)`` for tokens tito trains on present on both sides.

    Whether the text stack's own mask keeps such a token is left aside (the earlier answers' render changes, so
    a stack that diffs renders, as :func:`~tito_core.analysis.drift.text_stack_view` does, masks none of them; one that
    marks assistant text in the final render keeps their text): this is what its trainer computes for them.
    """
    matcher = difflib.SequenceMatcher(a=traj.token_ids, b=view.ids, autojunk=False)
    turn_of = [-1] * len(traj.token_ids)
    for turn in traj.turns:
        turn_of[turn.output_start : turn.output_start + turn.output_len] = [turn.index] * turn.output_len
    deltas: dict[int, list[float]] = defaultdict(list)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            a, b = block.a + k, block.b + k
            if a and b and traj.loss_mask[a]:
                deltas[turn_of[a]].append(text_lps[b] - tito_lps[a])  # type: ignore[operator]
    return deltas


def stats(deltas: Sequence[float]) -> dict[str, Any]:
    """Mean and max |delta| and the k3 estimate (mean of exp(d) - 1 - d) over ``deltas``."""
    if not deltas:
        return {"tokens": 0, "mean_abs": None, "max_abs": None, "k3": None}
    return {
        "tokens": len(deltas),
        "mean_abs": sum(abs(d) for d in deltas) / len(deltas),
        "max_abs": max(abs(d) for d in deltas),
        "k3": sum(math.expm1(d) - d for d in deltas) / len(deltas),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the conversations, measure, print and (``--json``) write the figures."""
    args = parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from tito_core.analysis.drift import compare_ids, text_stack_messages, text_stack_view
    from tito_core.config import load_config
    from tito_testing.tiny_model import build_tiny_qwen3
    from tito_transformers.scoring import token_logprobs

    torch.set_num_threads(1)
    model_dir = str(build_tiny_qwen3())
    config = load_config({"backend": "transformers", "tokenizer": model_dir, "tool_parser": "hermes",
                          "backend_options": {"model_path": model_dir, "num_threads": 1}})  # fmt: skip
    setup = config.model_setup()
    scorer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    questions = QUESTIONS[: args.questions]
    started = time.perf_counter()
    totals: dict[str, int] = defaultdict(int)
    by_answer: dict[int, list[float]] = defaultdict(list)
    think_spans = conversations_with_think = 0
    for n in range(args.conversations):
        traj = conversation(config, questions, seed=args.seed * 1000 + n)
        if len(traj.turns) != len(questions) or any(t.finish_reason != "stop" for t in traj.turns):
            totals["skipped (an answer did not finish)"] += 1
            continue
        view = text_stack_view(text_stack_messages(traj, setup.renderer, setup.tool_parser), setup.renderer)
        comparison = compare_ids(traj, view, setup.renderer)
        totals["conversations"] += 1
        totals["different_ids"] += not comparison.same_ids
        totals["trained"] += sum(traj.loss_mask)
        totals["changed_or_dropped"] += comparison.trained_lost
        totals["added"] += comparison.trained_added
        totals["text_stack_trained"] += sum(view.loss_mask)
        spans = [s for s in comparison.spans if s.category == "think"]
        think_spans += len(spans)
        conversations_with_think += bool(spans)
        tito_lps = token_logprobs(scorer, traj.token_ids)
        text_lps = token_logprobs(scorer, view.ids)
        for answer, deltas in aligned_deltas(traj, view, tito_lps, text_lps).items():
            by_answer[answer].extend(deltas)
    last = len(questions) - 1
    result = {
        "model": "tiny random Qwen3 (tito_testing), Qwen3 chat template",
        "questions": len(questions),
        **totals,
        "changed_share": totals["changed_or_dropped"] / totals["trained"] if totals["trained"] else None,
        "think_spans": think_spans,
        "conversations_with_think_spans": conversations_with_think,
        "earlier_answers": stats([d for a, ds in by_answer.items() if a != last for d in ds]),
        "last_answer": stats(by_answer.get(last, [])),
        "by_answer": {str(a): stats(ds) for a, ds in sorted(by_answer.items())},
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if totals["conversations"] else 1


if __name__ == "__main__":
    sys.exit(main())
