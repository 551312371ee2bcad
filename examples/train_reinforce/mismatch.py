"""The sampler/trainer mismatch of recorded rollouts, measured.

For every rollout of a rollout file (JSONL or Parquet records from ``tito rollout``):

1. **Logprobs.** The trainer's side: one teacher-forced forward pass of the recorded ``token_ids`` with the
   same weights (Hugging Face model, float32, CPU), ``log_softmax`` read at each trained token (loss mask 1),
   compared with the logprobs the engine recorded: mean / max ``|new - old|`` and the k3 estimate of
   KL(sampler || trainer), over all trained tokens, tool-call tokens, and forced (constrained) vs free turns.
2. **Retokenization drift.** The same rollout the way a text-based stack would feed a trainer: the final
   conversation as messages (outputs parsed by the same tool parser, tool results read back from the
   prompts), re-rendered with the same chat template and tokenized again. How many rollouts get different
   ids, where (:data:`tito_core.drift.DriftCategory`), and how many loss-mask positions no longer line up.

    python examples/train_reinforce/mismatch.py ROLLOUTS.jsonl --config examples/arithmetic/tito.toml \
        --json mismatch.json

``--collect TASKS.jsonl`` first runs the rollouts into ROLLOUTS (the config's settings, with
``--forced-tool-calls``, ``--temperature``, ``--group-size``, ``--tasks`` applied), then measures them.
The model defaults to the config's ``backend_options.model_path`` (after its ``prepare`` hook); ``--model``
scores with another directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tito_core.conversation import tool_specs_to_chat
from tito_core.drift import (
    DRIFT_CATEGORIES,
    compare_ids,
    logprob_gap,
    output_regions,
    text_stack_messages,
    text_stack_view,
)
from tito_core.errors import TitoError
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.runner import read_records, rollout
from tito_core.runner.run import prepare_config
from tito_core.runner.worker import import_object
from tito_core.tokenizers import load_tokenizer
from tito_core.trajectory import Trajectory

SELECTIONS = (
    ("all", "every trained token"),
    ("free", "unconstrained turns"),
    ("forced", "constrained (forced) turns"),
    ("tool_call", "tool-call tokens, all turns"),
    ("tool_call_free", "tool-call tokens, unconstrained turns"),
    ("tool_call_forced", "tool-call tokens, constrained turns"),
    ("text_free", "other tokens, unconstrained turns"),
    ("free_vs_tempered", "unconstrained turns: recorded vs the temperature-scaled policy"),
)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rollouts", help="rollout file (.jsonl or .parquet) from `tito rollout`")
    parser.add_argument("--config", required=True, help="the tito config the rollouts ran with (TOML)")
    parser.add_argument("--model", help="model directory to score with (default: backend_options.model_path)")
    parser.add_argument("--json", dest="json_out", help="write the full report (per rollout, spans) here")
    parser.add_argument("--limit", type=int, help="measure at most this many rollouts")
    parser.add_argument("--examples", type=int, default=3, help="differing spans to print per category")
    parser.add_argument(
        "--tiny-qwen3",
        action="store_true",
        help="run and score on the tiny random Qwen3 of tito_testing with Qwen3's own template (think blocks)",
    )
    collect = parser.add_argument_group("collect the rollouts first")
    collect.add_argument("--collect", metavar="TASKS", help="run these tasks into ROLLOUTS before measuring")
    collect.add_argument("--tasks", type=int, help="only the first N tasks")
    collect.add_argument("--group-size", type=int, help="rollouts per task")
    collect.add_argument("--forced-tool-calls", type=int, help="rollout.forced_tool_calls")
    collect.add_argument(
        "--temperature", type=float, help="sampling temperature (without --collect: the one the rollouts used)"
    )
    collect.add_argument("--max-new-tokens", type=int, help="sampling max_new_tokens")
    return parser.parse_args(argv)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Config keys the command line replaces (for collecting, and the sampling settings measured against)."""
    from tito_core.config import load_config

    overrides: dict[str, Any] = {"group_size": args.group_size, "forced_tool_calls": args.forced_tool_calls}
    sampling = dict(load_config(args.config).sampling)
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.max_new_tokens is not None:
        sampling["max_new_tokens"] = args.max_new_tokens
    overrides["sampling"] = sampling
    if args.tiny_qwen3:
        from tito_testing.tiny_model import build_tiny_qwen3

        model_dir = build_tiny_qwen3()
        options = dict(load_config(args.config).backend_options)
        overrides["tokenizer"] = str(model_dir)
        overrides["backend_options"] = {**options, "model_path": str(model_dir), "dtype": "float32"}
        overrides["chat_template"] = (model_dir / "chat_template.jinja").read_text()
    return overrides


def _collect(args: argparse.Namespace) -> dict[str, Any]:
    rows = [json.loads(line) for line in Path(args.collect).read_text().splitlines() if line.strip()]
    if args.tasks is not None:
        rows = rows[: args.tasks]
    started = time.perf_counter()
    summary = rollout(args.config, rows, args.rollouts, **_overrides(args))
    return {"tasks": len(rows), "wall_s": round(time.perf_counter() - started, 1), "summary": str(summary)}


def _logprobs_mode(backend: str, options: dict[str, Any]) -> str:
    """Which logprobs the engine recorded, as far as the config says."""
    if backend == "transformers":
        return str(options.get("logprobs_mode", "raw"))
    return f"{backend}: the server's setting (vLLM default raw; SGLang follows the sampling params)"


def _fmt(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{x:.2e}" if abs(x) < 1e-2 and x != 0 else f"{x:.4f}"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every rollout of ``args.rollouts``; returns the JSON report."""
    from tito_transformers.scoring import load_model, token_logprobs_at

    config, base_dir = asyncio.run(prepare_config(args.config, _overrides(args)))
    temperature = float(config.sampling.get("temperature", 1.0))
    if config.tokenizer is None:
        raise SystemExit("the config sets no tokenizer")
    model_path = args.model or config.backend_options.get("model_path")
    if not model_path:
        raise SystemExit("no model: give --model, or a config with backend_options.model_path")
    tokenizer = load_tokenizer(config.tokenizer)
    renderer = ChatRenderer(
        tokenizer,
        chat_template=config.chat_template,
        template_kwargs=config.chat_template_kwargs,
        escape_special_text=config.escape_special_text,
    )
    parser = get_tool_parser(config.tool_parser, **config.tool_parser_options)
    tool_objects = [import_object(path, search=base_dir) for path in config.rollout.tools]
    specs = [obj.tool_spec for obj in tool_objects]
    chat_tools = tool_specs_to_chat(specs)
    model = load_model(str(model_path))

    pairs: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in SELECTIONS}
    per_rollout: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    examples: dict[str, list[dict[str, Any]]] = {c: [] for c in DRIFT_CATEGORIES}
    cat_rollouts: Counter[str] = Counter()
    cat_spans: Counter[str] = Counter()
    cat_same_text: Counter[str] = Counter()
    where_spans: Counter[str] = Counter()
    mask_totals: Counter[str] = Counter()
    compared = different = different_inside = mask_differs = 0
    turns_total = turns_forced = 0
    started = time.perf_counter()
    for n, record in enumerate(read_records(args.rollouts)):
        if args.limit is not None and n >= args.limit:
            break
        key = f"{record.task_id}:{record.sample}"
        traj = Trajectory.from_record(record.trajectory)
        if not any(seg.kind == "output" for seg in traj.segments):
            skipped.append({"rollout": key, "why": f"no output ({record.status}: {record.status_reason})"})
            continue
        ids, mask, old = traj.token_ids, traj.loss_mask, traj.logprobs
        in_call, in_think = output_regions(traj, renderer, parser)
        constrained_turns = {t.index for t in traj.turns if t.constrained}
        turns_total += len(traj.turns)
        turns_forced += len(constrained_turns)
        turn_of = [0] * len(ids)
        for seg in traj.segments:
            turn_of[seg.start : seg.end] = [seg.turn] * seg.length
        new, tempered = token_logprobs_at(model, ids, (1.0, temperature if temperature > 0 else 1.0))
        mine: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in SELECTIONS}
        for i, (m, o, w) in enumerate(zip(mask, old, new, strict=True)):
            if not m or o is None or w is None:
                continue
            forced = turn_of[i] in constrained_turns
            t = tempered[i]
            if not forced and t is not None and temperature not in (0.0, 1.0):
                mine["free_vs_tempered"].append((o, t))
            chosen = ["all", "forced" if forced else "free"]
            if in_call[i]:
                chosen += ["tool_call", "tool_call_forced" if forced else "tool_call_free"]
            elif not forced:
                chosen.append("text_free")
            for name in chosen:
                mine[name].append((o, w))
        for name, values in mine.items():
            pairs[name].extend(values)
        row: dict[str, Any] = {
            "rollout": key,
            "status": record.status,
            "tokens": len(ids),
            "trained": sum(mask),
            "turns": len(traj.turns),
            "constrained_turns": sorted(constrained_turns),
            "logprobs": {name: logprob_gap(values).as_dict() for name, values in mine.items()},
        }
        try:
            messages = text_stack_messages(traj, renderer, parser, tools=chat_tools, tool_specs=specs)
            view = text_stack_view(messages, renderer, tools=chat_tools)
        except TitoError as exc:
            row["drift"] = {"error": str(exc)}
            skipped.append({"rollout": key, "why": f"text stack not rebuilt: {exc}"})
            per_rollout.append(row)
            continue
        comparison = compare_ids(traj, view, renderer, in_call=in_call, in_think=in_think)
        compared += 1
        different += not comparison.same_ids
        different_inside += any(span.where != "end" for span in comparison.spans)
        mask_differs += comparison.mask_raw_mismatch > 0
        for name in ("mask_raw_mismatch", "mask_aligned_mismatch", "trained_lost", "trained_added"):
            mask_totals[name] += getattr(comparison, name)
        mask_totals["trained_tokens"] += sum(mask)
        for category in comparison.by_category:
            cat_rollouts[category] += 1
        for span in comparison.spans:
            cat_spans[span.category] += 1
            cat_same_text[span.category] += span.same_text
            where_spans[span.where] += 1
            if len(examples[span.category]) < args.examples:
                examples[span.category].append({"rollout": key, **span.as_dict()})
        row["drift"] = comparison.as_dict()
        per_rollout.append(row)
    measured = len(per_rollout)
    report = {
        "command": " ".join(["python", *sys.argv]),
        "rollouts_file": str(args.rollouts),
        "model": str(model_path),
        "tokenizer": str(config.tokenizer),
        "tool_parser": config.tool_parser,
        "sampling": dict(config.sampling),
        "logprobs_mode": _logprobs_mode(config.backend, config.backend_options),
        "forced_tool_calls": config.rollout.forced_tool_calls,
        "turns": {"total": turns_total, "constrained": turns_forced},
        "measured_rollouts": measured,
        "skipped": skipped,
        "scoring": "teacher-forced forward pass, float32, log_softmax at each loss-mask-1 token",
        "k3": "mean of exp(r) - 1 - r, r = logp_trainer - logp_recorded: estimates KL(sampler || trainer)",
        "logprobs": {name: logprob_gap(values).as_dict() for name, values in pairs.items()},
        "drift": {
            "compared_rollouts": compared,
            "rollouts_with_different_ids": different,
            "rollouts_with_different_ids_before_the_end": different_inside,
            "rollouts_with_mask_mismatch": mask_differs,
            "rollouts_by_category": dict(cat_rollouts),
            "spans_by_category": dict(cat_spans),
            "same_text_spans_by_category": dict(cat_same_text),
            "spans_by_where": dict(where_spans),
            "mask": dict(mask_totals),
            "examples": examples,
        },
        "measure_s": round(time.perf_counter() - started, 1),
        "per_rollout": per_rollout,
    }
    return report


def print_report(report: dict[str, Any]) -> None:
    """The report's headline figures as Markdown tables."""
    print(f"# Mismatch of {report['measured_rollouts']} rollouts ({report['rollouts_file']})")
    print(f"model {report['model']}, sampling {report['sampling']}, logprobs_mode {report['logprobs_mode']}")
    turns = report["turns"]
    print(f"model calls {turns['total']}, of them constrained (forced tool call) {turns['constrained']}")
    print(f"k3: {report['k3']}\n")
    print("| tokens | n | mean abs diff | max abs diff | k3 KL | mean signed diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, label in SELECTIONS:
        gap = report["logprobs"][name]
        cells = [_fmt(gap[k]) for k in ("mean_abs", "max_abs", "k3", "mean_diff")]
        print(f"| {label} | {gap['tokens']} | " + " | ".join(cells) + " |")
    drift = report["drift"]
    mask = drift["mask"]
    print(
        f"\nRe-rendered as a text stack: {drift['rollouts_with_different_ids']} of {drift['compared_rollouts']} "
        f"rollouts get different ids ({drift['rollouts_with_different_ids_before_the_end']} before their last "
        f"recorded token); {drift['rollouts_with_mask_mismatch']} have loss-mask positions that no longer line up.\n"
    )
    print("| category | rollouts | spans | of which same text, other ids |")
    print("| --- | --- | --- | --- |")
    for category in DRIFT_CATEGORIES:
        print(
            f"| {category} | {drift['rollouts_by_category'].get(category, 0)} | "
            f"{drift['spans_by_category'].get(category, 0)} | {drift['same_text_spans_by_category'].get(category, 0)} |"
        )
    print(f"\nspans by where (recorded side): {drift['spans_by_where']}")
    print(
        f"mask: {mask.get('trained_tokens', 0)} trained tokens recorded; positions that disagree position by "
        f"position {mask.get('mask_raw_mismatch', 0)}; aligned tokens with a different mask "
        f"{mask.get('mask_aligned_mismatch', 0)}; trained tokens the re-render changed or dropped "
        f"{mask.get('trained_lost', 0)}; tokens the text stack would train on that the model never sampled "
        f"{mask.get('trained_added', 0)}"
    )
    for category, spans in drift["examples"].items():
        for span in spans:
            print(
                f"  {category} @ {span['rollout']} turn {span['turn']} ({span['where']}): "
                f"{span['recorded_text']!r} -> {span['rerendered_text']!r}"
            )
    if report["skipped"]:
        print(f"\nskipped: {report['skipped']}")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    collected = _collect(args) if args.collect else None
    report = measure(args)
    if collected is not None:
        report["collected"] = collected
    print_report(report)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
        print(f"\nwrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
