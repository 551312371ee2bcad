"""``tito audit``: the mismatch ledger of a rollout file (:mod:`tito_core.analysis.audit`) on the command line.

    tito audit rollouts.jsonl --model DIR [--sample 200] [--json report.json] [--plot report.png] [--max-kl 1e-3]
    tito audit rollouts.jsonl --config tito.toml        # the config's engine scores (or its embedded model)
    tito audit rollouts.jsonl --config tito.toml --drift   # also: what a text stack would have trained on

Exits 1 when the free turns' k3 KL is above ``--max-kl``, or no free-turn token was scored (a CI gate that has
nothing to check fails), 2 on an error. Every error of the arguments or the records (a malformed line, an empty
file, an output that cannot be written, ``--plot`` without matplotlib, records the model cannot score) is found
before any model loads.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
from pathlib import Path
from typing import Any

import msgspec

from ..errors import ConfigError

__all__ = ["add_audit_command", "run_audit"]

DTYPES = ("float32", "bfloat16", "float16")
PLOT_TYPES = (".png", ".svg", ".pdf")


def add_audit_command(commands: Any) -> None:
    """Add ``tito audit`` to the ``tito`` parser's subcommands."""
    audit = commands.add_parser(
        "audit",
        help="re-score a rollout file's recorded tokens and report the logprob mismatch",
        description="Re-score every trained token of a rollout file with an independent forward pass and report "
        "mean / max |Δlogprob|, the k3 KL estimate and importance-ratio quantiles, by turn, branch, lineage, weight "
        "version, engine, finish reason, constrained vs free turns and images.",
    )
    audit.add_argument("records", help="a rollout file (.jsonl, .parquet) of `tito rollout` or `tito serve`")
    scorer = audit.add_mutually_exclusive_group(required=True)
    scorer.add_argument("--model", help="score with this model directory (Hugging Face, through tito-transformers)")
    scorer.add_argument(
        "--config",
        help="score with the config's engine (its score route), or its embedded model (backend_options.model_path)",
    )
    audit.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="the --model weights' dtype (default float32)"
    )
    audit.add_argument("--sample", type=int, metavar="N", help="audit N records drawn at random (seeded)")
    audit.add_argument("--seed", type=int, default=0, help="the --sample draw's seed")
    audit.add_argument("--json", dest="json_out", metavar="OUT", help="write the whole report as JSON")
    audit.add_argument(
        "--per-token", action="store_true",
        help="also write each scored token's Δlogprob into the --json report (`tito view --audit` draws them)",
    )  # fmt: skip
    audit.add_argument("--plot", metavar="OUT.png", help="draw |Δ|, k3 and the ratio quantiles per turn (matplotlib)")
    audit.add_argument(
        "--max-kl", type=float, metavar="X", help="exit 1 when the free turns' k3 KL estimate is above X"
    )
    audit.add_argument(
        "--drift",
        action="store_true",
        help="also rebuild each rollout as a text stack would (messages, re-rendered, re-tokenized) and report "
        "how its ids and loss mask differ from the recorded ones (needs --config: the template, parser, tools)",
    )
    audit.add_argument("--examples", type=int, default=3, help="differing spans to show per --drift category")


def run_audit(args: argparse.Namespace) -> int:
    """Run ``tito audit``; returns the exit status."""
    from rich.console import Console

    from ..analysis.audit import audit
    from ..records import read_rollout_file

    _check_options(args)
    rollouts = read_rollout_file(args.records)
    for note in rollouts.notes():
        print(f"tito audit: {note}", file=sys.stderr)
    records = rollouts.records
    if not records:
        raise ConfigError(f"{args.records}: no rollout records in it: nothing to audit")
    if args.sample is not None and args.sample < len(records):
        records = random.Random(args.seed).sample(records, args.sample)
    report, drift = asyncio.run(_audit(records, args, Console(stderr=True), audit))
    out = Console(width=None if sys.stdout.isatty() else 120)  # a pipe: wide enough for the tables
    _print(report, out)
    if drift is not None:
        _print_drift(drift, out)
    if args.json_out:
        data = msgspec.json.decode(report.to_json())
        if drift is not None:
            data["drift"] = msgspec.to_builtins(drift)
        Path(args.json_out).write_bytes(msgspec.json.encode(data) + b"\n")
    if args.plot:
        plot_report(report, args.plot)
    free_kl = report.free.k3
    if args.max_kl is not None and report.free.tokens == 0:
        print("tito audit: no free-turn token was scored: --max-kl has nothing to check", file=sys.stderr)
        return 1
    if args.max_kl is not None and free_kl > args.max_kl:
        print(
            f"tito audit: free turns' k3 KL {free_kl:.3g} is above --max-kl {args.max_kl:g}",
            file=sys.stderr,
        )
        return 1
    return 0


def _check_options(args: argparse.Namespace) -> None:
    """The options' errors, found before the records are read or a model loads."""
    if args.max_kl is not None and not (args.max_kl >= 0 and math.isfinite(args.max_kl)):
        raise ConfigError(f"--max-kl must be a non-negative number, got {args.max_kl}")
    if args.sample is not None and args.sample <= 0:
        raise ConfigError(f"--sample must be positive, got {args.sample}")
    if args.examples < 0:
        raise ConfigError(f"--examples must be 0 or more, got {args.examples}")
    if args.per_token and not args.json_out:
        raise ConfigError("--per-token writes into the --json report: give --json OUT")
    if args.drift and not args.config:
        raise ConfigError("--drift needs --config: the chat template, tool parser and tools the rollouts ran with")
    if args.json_out:
        _check_writable("--json", args.json_out)
    if args.plot:
        if Path(args.plot).suffix.lower() not in PLOT_TYPES:
            raise ConfigError(f"--plot {args.plot}: name a {', '.join(PLOT_TYPES)} file")
        _check_writable("--plot", args.plot)
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f'--plot needs matplotlib: pip install "tito-core[plot]" ({exc})') from None


def _check_writable(option: str, path: str) -> None:
    """``path`` can be written: its folder exists and is writable, and it is not a folder itself."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise ConfigError(f"{option} {path}: a folder, not a file to write")
    if not folder.is_dir():
        raise ConfigError(f"{option} {path}: its folder {str(folder)!r} does not exist")
    if not os.access(target if target.exists() else folder, os.W_OK):
        raise ConfigError(f"{option} {path}: not writable")


async def _audit(records: list[Any], args: argparse.Namespace, console: Any, audit: Any) -> tuple[Any, Any]:
    """The logprob report, and the drift report with ``--drift`` (else None)."""
    from rich.progress import Progress

    from ..runner.run import prepare_config

    config, base_dir = await prepare_config(args.config, {}) if args.config else (None, None)
    scorer, closing = await _scorer(args, config, records)
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("scoring", total=len(records))
            report = await audit(records, scorer, progress=lambda n: progress.update(task, completed=n),
                                 per_token=args.per_token)  # fmt: skip
    finally:
        if closing is not None:
            await closing()
    drift = await asyncio.to_thread(_drift, records, config, base_dir, args.examples) if args.drift else None
    return report, drift


def _drift(records: list[Any], config: Any, base_dir: Any, examples: int) -> Any:
    from ..analysis.drift.ledger import DriftLedger
    from ..conversation import tool_specs_to_chat
    from ..runner.worker import import_object

    setup = config.model_setup()
    specs = [import_object(path, search=base_dir).tool_spec for path in config.rollout.tools]
    ledger = DriftLedger(setup.renderer, setup.tool_parser, tools=tool_specs_to_chat(specs), tool_specs=specs,
                         examples=examples)  # fmt: skip
    for record in records:
        ledger.add(record)
    return ledger.report()


async def _scorer(args: argparse.Namespace, config: Any, records: list[Any]) -> tuple[Any, Any]:
    """The scorer, and what closes it (a backend built from the config), or None.

    The records are checked against it first (:func:`~tito_core.analysis.audit.check_scorable`), before a model loads.
    """
    from ..analysis.audit import BackendScorer, TransformersScorer, check_scorable, model_facts

    model_path, dtype, what = args.model, args.dtype, "--model"
    if model_path is None:
        model_path, what = config.backend_options.get("model_path"), f"{args.config}: backend_options.model_path"
        dtype = config.backend_options.get("dtype") or args.dtype
    if model_path:  # a model directory (an embedded model: the trainer's forward pass on its directory)
        facts = model_facts(model_path, what)
        check_scorable(records, scorer=f"the {facts.model_type} model at {model_path}", vocab_size=facts.vocab_size,
                       images=facts.vision)  # fmt: skip
        return await asyncio.to_thread(TransformersScorer, model_path, dtype=dtype), None
    url = config.backend_options.get("base_url")
    engine = f"the {config.backend} engine at {url}" if url else f"the {config.backend} engine"
    check_scorable(records, scorer=f"{engine}'s score route", vocab_size=None, images=False)
    backend = config.create_backend()
    return BackendScorer(backend, engine if url else None), backend.aclose


def _cells(stats: Any) -> list[str]:
    def fmt(x: float) -> str:
        return "-" if isinstance(x, float) and math.isnan(x) else f"{x:.3g}"

    return [str(stats.tokens)] + [
        fmt(getattr(stats, name))
        for name in ("mean_abs", "max_abs", "k3", "mean_diff", "ratio_p1", "ratio_p50", "ratio_p99")
    ]


_HEAD = ("tokens", "mean |Δ|", "max |Δ|", "k3 KL", "mean Δ", "ratio p1", "p50", "p99")


def _print(report: Any, console: Any) -> None:
    from rich.table import Table

    console.print(f"[bold]tito audit[/bold]: {report.records} records, {report.branches} branches")
    console.print(f"scored by {report.scorer}")
    console.print("Δ = re-scored - recorded logprob of each trained token; k3 = mean(exp(Δ) - 1 - Δ); ratio = exp(Δ)")
    table = Table("selection", *_HEAD, title="overall")
    for name in ("all", "free", "constrained"):
        table.add_row(name, *_cells(getattr(report, name)))
    if report.kept_sets is not None and report.kept_sets_full_vocabulary is not None:
        table.add_row("kept sets, with the mask", *_cells(report.kept_sets))
        table.add_row("kept sets, full vocabulary", *_cells(report.kept_sets_full_vocabulary))
    console.print(table)
    for axis, values in report.by.items():
        if len(values) < 2 and axis not in ("turn", "weight_version"):
            continue  # one value: the overall row says it
        table = Table(axis, *_HEAD, title=f"by {axis.replace('_', ' ')}")
        for value, stats in values.items():
            table.add_row(value, *_cells(stats))
        console.print(table)
    if report.skipped:
        console.print("not scored: " + "; ".join(f"{why}: {n}" for why, n in report.skipped.items()))


def _print_drift(drift: Any, console: Any) -> None:
    from rich.table import Table

    from ..analysis.drift import DRIFT_CATEGORIES

    console.print(
        f"[bold]drift[/bold]: re-rendered as a text stack, {drift.different_ids} of {drift.compared} rollouts get "
        f"different ids ({drift.different_before_the_end} before their last recorded token); "
        f"{drift.mask_mismatch} have loss-mask positions that no longer line up"
    )
    table = Table("category", "rollouts", "spans", "same text, other ids", title="differing spans")
    for category in DRIFT_CATEGORIES:
        table.add_row(category, *(str(counts.get(category, 0)) for counts in (
            drift.rollouts_by_category, drift.spans_by_category, drift.same_text_spans_by_category)))  # fmt: skip
    console.print(table)
    mask = drift.mask
    console.print(
        f"mask: {mask.get('trained_tokens', 0)} trained tokens recorded; {mask.get('mask_raw_mismatch', 0)} positions "
        f"disagree position by position; {mask.get('trained_lost', 0)} trained tokens the re-render changed or "
        f"dropped; {mask.get('trained_added', 0)} tokens it would train on that the model never sampled"
    )
    for category, spans in drift.examples.items():
        for span in spans:
            console.print(
                f"  {category} @ {span['rollout']} turn {span['turn']} ({span['where']}): "
                f"{span['recorded_text']!r} -> {span['rerendered_text']!r}",
                markup=False,
            )
    if drift.skipped:
        console.print(f"not compared: {drift.skipped}", markup=False)


def plot_report(report: Any, path: str) -> None:
    """Per turn index, mean and max |Δ|, k3, and the importance-ratio quantiles, as an image (matplotlib).

    Free turns and constrained (forced) turns are drawn apart, a row each: a forced turn's recorded logprobs are
    post-grammar, and mixed in they would make a healthy run look broken.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(f'--plot needs matplotlib: pip install "tito-core[plot]" ({exc})') from exc
    rows = [(name, report.by.get(axis, {})) for name, axis in (("free turns", "free_turn"),
                                                                ("constrained turns", "constrained_turn"))]  # fmt: skip
    rows = [(name, turns) for name, turns in rows if turns] or [("free turns", {})]
    fig, axes = plt.subplots(len(rows), 2, figsize=(10, 3.4 * len(rows)), squeeze=False)
    for (name, turns), (gaps, ratios) in zip(rows, axes, strict=True):
        xs = [int(turn) for turn in turns]
        gaps.plot(xs, [s.mean_abs for s in turns.values()], "o-", label="mean |Δ|")
        gaps.plot(xs, [s.max_abs for s in turns.values()], "s--", label="max |Δ|")
        gaps.plot(xs, [s.k3 for s in turns.values()], "^:", label="k3 KL")
        gaps.set_yscale("symlog", linthresh=1e-6)
        gaps.set_title(f"{name}: recorded vs re-scored logprobs")
        for stat, style in (("ratio_p1", "v-"), ("ratio_p50", "o-"), ("ratio_p99", "^-")):
            ratios.plot(xs, [getattr(s, stat) for s in turns.values()], style, label=stat.replace("ratio_", ""))
        ratios.axhline(1.0, color="grey", linewidth=0.8)
        ratios.set_yscale("log")
        ratios.set_title(f"{name}: importance ratio exp(Δ)")
        for ax in (gaps, ratios):
            ax.set_xticks(xs)
            ax.set_xlabel("turn")
            if xs:
                ax.legend(fontsize=8)
    fig.suptitle(f"{report.records} records; free k3 {report.free.k3:.3g}; constrained turns are post-grammar",
                 fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
