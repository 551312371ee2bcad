"""The ``tito`` command's parser and its commands (the entry point, :func:`tito_core.cli.main`, loads this).

    tito rollout --config tito.toml --dataset tasks.jsonl --output rollouts.jsonl [--group-size 4 ...]
    tito rollout ... --executor ray [--address auto] --workers 8
    tito rollout ... --retry-failed --set sampling.temperature=0.5
    tito export --to slime|verl|trl|agl|areal|tree rollouts.jsonl -o out.jsonl [--branch-reward shared|last]
        [--max-staleness N --current-version V]
    tito inspect rollouts.jsonl [--id TASK_ID [--tokenizer DIR | --config tito.toml]]
    tito audit rollouts.jsonl --model DIR | --config tito.toml [--json OUT] [--plot OUT.png] [--max-kl X]
    tito serve --config tito.toml [--host 127.0.0.1] [--port 8100] [--output rollouts.jsonl] [--api-key KEY]
    tito demo

Errors found before any work (a bad config, dataset row, tokenizer or server) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, TitoError  # no Strands: cheap at start-up
from .audit import add_audit_command, run_audit
from .export import add_export_command, run_export
from .serve import add_serve_command, run_serve
from .view import add_view_command, decoding_tokenizer, run_view

__all__ = ["run"]

logger = logging.getLogger("tito")


def run(argv: Sequence[str] | None = None) -> int:
    """Run the ``tito`` command line; returns the exit status.

    Ctrl-C at any moment (start-up, a model call, a write) exits 130 with one line: a rollout's finished records
    are on disk and a rerun resumes.
    """
    args: argparse.Namespace | None = None
    try:
        parser = _parser()
        args, rest = parser.parse_known_args(argv)
        if args.command == "demo":
            from ..demo import main as demo_main

            return demo_main(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return _command(args)
    except KeyboardInterrupt:
        print(_interrupted(args), file=sys.stderr, flush=True)
        return 130


def _command(args: argparse.Namespace) -> int:
    try:
        if args.command == "rollout":
            return _rollout(args)
        if args.command == "export":
            return run_export(args)
        if args.command == "serve":
            return run_serve(args)
        if args.command == "audit":
            return run_audit(args)
        if args.command == "view":
            return run_view(args)
        return _inspect(args)
    except TitoError as exc:
        print(f"tito {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:  # a rollout file to export or inspect that is not there
        print(f"tito {args.command}: error: no such file: {exc.filename}", file=sys.stderr)
        return 2


def _interrupted(args: argparse.Namespace | None) -> str:
    """The one line a Ctrl-C prints."""
    if args is None:
        return "tito: interrupted"
    if args.command == "rollout":
        if Path(args.output).exists():
            return f"tito rollout: interrupted; finished rollouts are in {args.output}: rerun to resume"
        return "tito rollout: interrupted before any rollout was written"
    if args.command == "serve":
        return "tito serve: interrupted before serving"  # once serving, SIGINT is the gateway's: it writes and exits 0
    return f"tito {args.command}: interrupted"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tito", description="Token-in/token-out rollouts for Strands agents.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("rollout", help="run a dataset of tasks into a resumable rollout file")
    run.add_argument("--config", required=True, help="TOML config (model keys and a [rollout] table)")
    run.add_argument(
        "--dataset", help="tasks: .jsonl or .parquet rows with id, prompt, answer (default: [rollout.tasks] harbor)"
    )
    run.add_argument("-o", "--output", required=True, help="rollout file: .jsonl, or .parquet (a directory of parts)")
    run.add_argument("--group-size", type=int, help="rollouts per task")
    run.add_argument("--concurrency", type=int, help="most rollouts at once")
    run.add_argument("--timeout", type=float, dest="timeout_s", help="seconds per rollout")
    run.add_argument("--max-model-calls", type=int, help="model calls per rollout")
    run.add_argument("--max-tool-calls", type=int, help="tool calls per rollout")
    run.add_argument("--max-messages", type=int, help="messages per rollout")
    run.add_argument("--system-prompt", help="the agent's system prompt")
    run.add_argument("--reward", help="reward function, module:attribute")
    run.add_argument("--backend", help="backend name")
    run.add_argument("--tokenizer", help="tokenizer directory or name")
    run.add_argument(
        "--retry-failed",
        action="store_true",
        help="remove the output's failed records (with a group reward: their whole groups) and run them again",
    )
    run.add_argument("--server", action="append", dest="servers", metavar="URL", help="a server base URL (repeat)")
    run.add_argument(
        "--set",
        action="append",
        dest="settings",
        default=[],
        metavar="KEY=VALUE",
        help="any config key, dotted into tables, the value in TOML (repeat): --set sampling.temperature=0.5 "
        "--set rollout.forced_tool_calls=1 --set tool_parser=qwen_xml; the flags above win over it",
    )
    run.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help='where rollouts run: this process (default), or Ray actors (pip install "tito-core[ray]")',
    )
    run.add_argument("--address", help="with --executor ray: the Ray cluster to join (auto: this machine's)")
    run.add_argument("--workers", type=int, help="with --executor ray: worker actors (default 2)")
    output = run.add_mutually_exclusive_group()
    output.add_argument("--quiet", action="store_true", help="print nothing but errors")
    output.add_argument("--log-json", action="store_true", help="JSON lines on stderr instead of a progress bar")

    inspect = commands.add_parser("inspect", help="show a rollout file's records")
    inspect.add_argument("rollouts", help="the rollout file")
    inspect.add_argument("--id", dest="task_id", help="show the rollouts of this task in full")
    decode = inspect.add_mutually_exclusive_group()
    decode.add_argument("--tokenizer", help="decode the tokens as text with this tokenizer (else token ids)")
    decode.add_argument("--config", help="decode the tokens as text with this TOML config's tokenizer")

    add_export_command(commands)
    add_serve_command(commands)
    add_audit_command(commands)
    add_view_command(commands)

    commands.add_parser("demo", help="run the demo rollout (python -m tito_core.demo)", add_help=False)
    return parser


def _rollout(args: argparse.Namespace) -> int:
    from ..runner import JsonReporter, QuietReporter, RichReporter, rollout
    from ..runner.progress import Reporter

    reporter: Reporter
    if args.quiet:
        reporter = QuietReporter()
        _errors_only()
    elif args.log_json:
        reporter = JsonReporter()
        handler = logging.StreamHandler()
        handler.setFormatter(_JsonFormatter())
        handler.addFilter(_drop_truncation_notices)
        logging.basicConfig(level=logging.WARNING, handlers=[handler])
    else:
        from rich.logging import RichHandler

        reporter = RichReporter()
        rich_handler = RichHandler(show_path=False)
        rich_handler.addFilter(_drop_truncation_notices)
        logging.basicConfig(level=logging.WARNING, format="%(message)s", handlers=[rich_handler])
    overrides: dict[str, Any] = _settings(args.settings)
    flags: dict[str, Any] = {
        "group_size": args.group_size,
        "concurrency": args.concurrency,
        "timeout_s": args.timeout_s,
        "max_model_calls": args.max_model_calls,
        "max_tool_calls": args.max_tool_calls,
        "max_messages": args.max_messages,
        "system_prompt": args.system_prompt,
        "reward": args.reward,
        "backend": args.backend,
        "tokenizer": args.tokenizer,
        "backend_options": {"base_url": args.servers} if args.servers else None,
        "retry_failed": True if args.retry_failed else None,
    }
    overrides.update((key, value) for key, value in flags.items() if value is not None)
    executor = _executor(args)
    try:  # Ctrl-C: a KeyboardInterrupt for main, once the finished records are written
        summary = rollout(args.config, args.dataset, args.output, reporter=reporter, executor=executor, **overrides)
    finally:
        if executor is not None:
            executor.close()  # the Ray workers (and the local Ray, if this run started one)
    return 0 if summary.written + summary.dropped == summary.planned else 1  # stale ones dropped as configured


def _settings(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as config overrides: the value read as TOML, else taken as a plain string."""
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set sampling.temperature=0.5")
        try:
            settings[key] = tomllib.loads(f"value = {text}")["value"]
        except tomllib.TOMLDecodeError:
            settings[key] = text  # a bare word: tool_parser=qwen_xml
    return settings


def _executor(args: argparse.Namespace) -> Any:
    """None (the local executor) or a RayExecutor, from ``--executor``, ``--address`` and ``--workers``."""
    if args.executor == "local":
        if args.address is not None or args.workers is not None:
            raise ConfigError("--address and --workers go with --executor ray")
        return None
    from .._optional import ray

    ray()  # a clear error now, before the config and the servers are checked, when Ray is not installed
    from ..runner.ray_executor import RayExecutor

    return RayExecutor(2 if args.workers is None else args.workers, address=args.address)


def _errors_only() -> None:
    """``--quiet``: log errors only, ours and the libraries'.

    transformers writes its advice ("PyTorch was not found") through a handler of its own at import, whatever the
    root logger's level.
    """
    handler = logging.StreamHandler()
    handler.setLevel(logging.ERROR)  # a library logger with a level of its own still reaches the root's handlers
    handler.setFormatter(logging.Formatter("tito: %(message)s"))
    logging.basicConfig(level=logging.ERROR, handlers=[handler])
    if "transformers" in sys.modules:
        sys.modules["transformers"].logging.set_verbosity_error()
    else:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers first logs


def _drop_truncation_notices(record: logging.LogRecord) -> bool:
    """Strands warns once per tool call cut by the token limit; the record already says so (``truncated``)."""
    return not record.name.startswith("strands.event_loop._recover_message_on_max_tokens_reached")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"event": "log", "level": record.levelname.lower(), "message": record.getMessage()})


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..runner import read_records
    from ..runner.samples import generated_tokens

    console = Console()
    records = [r for r in read_records(args.rollouts) if args.task_id is None or r.task_id == args.task_id]
    if args.task_id is not None and not records:
        console.print(f"no rollout of task {args.task_id!r} in {args.rollouts}")
        return 1
    title = f"{args.rollouts}: {len(records)} rollouts"
    counts = generated_tokens(records)
    if counts.branches > counts.rollouts:
        title += (
            f", {counts.branches} branches: {counts.all_branches} tokens generated, "
            f"{counts.final_branch / max(counts.all_branches, 1):.0%} of them in the final branches"
        )
    if console.width >= _WIDE:
        console.print(_records_table(title, records))
    else:  # a narrow terminal: a table would wrap every cell one word per line
        console.print(title, style="bold")
        for r in records:
            _print_record(console, r)
    console.print(_file_versions(records), highlight=False)
    if args.task_id is not None:
        tokenizer = decoding_tokenizer(args)
        for r in records:
            _show_segments(console, r, tokenizer)
    return 0


_WIDE = 110
"""Terminals at least this wide show ``tito inspect``'s records as a table; narrower ones, one block each."""


def _record_cells(r: Any) -> dict[str, str]:
    return {
        "task": r.task_id,
        "sample": str(r.sample),
        "status": r.status,
        "reward": "-" if r.reward is None else f"{r.reward:.3f}",
        "tokens": str(r.tokens.total),
        "generated": str(r.tokens.output),
        "calls": str(r.tokens.model_calls),
        "branches": str(len(r.trajectory.branches) + 1),
        "versions": _versions(r),
        "reason": r.status_reason or "",
    }


def _records_table(title: str, records: Sequence[Any]) -> Any:
    """The records as a table whose short columns never wrap (the task id and the reason fold instead)."""
    from rich.table import Table

    table = Table(title=title)
    columns = ("task", "sample", "status", "reward", "tokens", "generated", "calls", "branches", "versions", "reason")
    for column in columns:
        if column == "reason":
            table.add_column(column, ratio=1, overflow="fold")
        elif column == "task":
            table.add_column(column, max_width=32, overflow="fold")
        else:
            table.add_column(column, no_wrap=True, justify="left" if column == "status" else "right")
    for r in records:
        table.add_row(*_record_cells(r).values())
    return table


def _print_record(console: Any, r: Any) -> None:
    """One record as a short block: its key and status, then its numbers, then the reason (folded to the width)."""
    cells = _record_cells(r)
    console.print(f"[bold]{cells['task']}[/bold] sample {cells['sample']}: {cells['status']}", highlight=False)
    numbers = (
        f"  reward {cells['reward']}  tokens {cells['tokens']} (generated {cells['generated']})  "
        f"calls {cells['calls']}  branches {cells['branches']}  versions {cells['versions']}"
    )
    console.print(numbers, highlight=False)
    if cells["reason"]:
        console.print(f"  {cells['reason']}", highlight=False, overflow="fold")


def _versions(record: Any) -> str:
    """A record's weight-version range: ``3``, ``2..3``, or ``-`` when unknown."""
    low, high = record.weight_version_min, record.weight_version_max
    if low is None or high is None:
        return "-"
    return low if low == high else f"{low}..{high}"


def _file_versions(records: Sequence[Any]) -> str:
    """The line under ``tito inspect``'s table: the weight-version range of the records, and how many are stale."""
    from ..versions import version_range

    versions = [v for r in records for v in (r.weight_version_min, r.weight_version_max) if v is not None]
    span = version_range(versions)
    known = sum(1 for r in records if r.weight_version_min is not None)
    if span is None:
        line = "weight versions: none reported"
    else:
        text = span[0] if span[0] == span[1] else f"{span[0]}..{span[1]}"
        line = f"weight versions: {text} ({known} of {len(records)} rollouts report versions)"
    stale = sum(1 for r in records if r.stale)
    if stale:
        line += f"; {stale} marked stale"
    return line


def _show_segments(console: Any, record: Any, tokenizer: Any) -> None:
    """Each segment as text (or token ids): generated tokens (loss 1) in bold green, the rest dim."""
    from rich.text import Text

    from .branches import branch_lines

    traj = record.trajectory
    console.rule(f"{record.task_id} sample {record.sample}: {record.status}")
    if traj.branches or traj.label:
        for line in branch_lines(traj):
            console.print(Text(line, style="cyan"))
        console.print(Text(f"[the segments of branch {traj.branch}, the last call's]", style="italic"))
    for i, span in enumerate(traj.media):
        grid = "x".join(map(str, span.grid_thw)) if span.grid_thw else "-"
        size = f"{span.size[0]}x{span.size[1]} " if span.size is not None else ""
        console.print(
            Text(
                f"[{span.kind} {i}: tokens {span.start}-{span.end} ({span.length}), {size}{span.format}, grid {grid}, "
                f"sha256 {span.sha256[:12]}]",
                style="italic cyan",
            )
        )
    for seg in traj.segments:
        ids = traj.token_ids[seg.start : seg.end]
        if tokenizer is not None:
            shown = tokenizer.decode(ids, skip_special_tokens=False)
        else:
            shown = " ".join(map(str, ids[:24])) + (" ..." if len(ids) > 24 else "")
        style = "bold green" if seg.kind == "output" else "dim"
        console.print(Text(f"[turn {seg.turn} {seg.kind}, {seg.end - seg.start} tokens]", style="italic"))
        console.print(Text(shown, style=style))
