"""The ``tito`` command: a thin layer over the library.

    tito rollout --config tito.toml --dataset tasks.jsonl --output rollouts.jsonl [--group-size 4 ...]
    tito rollout ... --executor ray [--address auto] --workers 8
    tito rollout ... --retry-failed --set sampling.temperature=0.5
    tito export --to slime|verl|trl|agl rollouts.jsonl out.jsonl
    tito inspect rollouts.jsonl [--id TASK_ID [--tokenizer DIR | --config tito.toml]]
    tito demo

Errors found before any work (a bad config, dataset row, tokenizer or server) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tomllib
from collections.abc import Callable, Sequence
from typing import Any

from .errors import ConfigError, TitoError

__all__ = ["main"]

logger = logging.getLogger("tito")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tito`` command line; returns the exit status."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        if args.command == "rollout":
            return _rollout(args)
        if args.command == "export":
            return _export(args)
        return _inspect(args)
    except TitoError as exc:
        print(f"tito {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tito", description="Token-in/token-out rollouts for Strands agents.")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("rollout", help="run a dataset of tasks into a resumable rollout file")
    run.add_argument("--config", required=True, help="TOML config (model keys and a [rollout] table)")
    run.add_argument("--dataset", required=True, help="tasks: .jsonl or .parquet rows with id, prompt, answer")
    run.add_argument("--output", required=True, help="rollout file: .jsonl, or .parquet (a directory of parts)")
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

    export = commands.add_parser("export", help="convert a rollout file to a trainer's format (JSON lines)")
    export.add_argument(
        "--to",
        required=True,
        choices=["slime", "verl", "trl", "agl"],
        help="the trainer format (agl: Agent Lightning v1 model_request events)",
    )
    export.add_argument("rollouts", help="the rollout file")
    export.add_argument("out", help="the output file (JSON lines, one rollout each)")

    inspect = commands.add_parser("inspect", help="show a rollout file's records")
    inspect.add_argument("rollouts", help="the rollout file")
    inspect.add_argument("--id", dest="task_id", help="show the rollouts of this task in full")
    decode = inspect.add_mutually_exclusive_group()
    decode.add_argument("--tokenizer", help="decode the tokens as text with this tokenizer (else token ids)")
    decode.add_argument("--config", help="decode the tokens as text with this TOML config's tokenizer")

    commands.add_parser("demo", help="run the demo rollout (python -m tito_core.demo)", add_help=False)
    return parser


def _rollout(args: argparse.Namespace) -> int:
    from .runner import JsonReporter, QuietReporter, RichReporter, rollout
    from .runner.progress import Reporter

    reporter: Reporter
    if args.quiet:
        reporter = QuietReporter()
        logging.basicConfig(level=logging.ERROR, format="tito: %(message)s")
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
    try:
        summary = rollout(args.config, args.dataset, args.output, reporter=reporter, executor=executor, **overrides)
    except KeyboardInterrupt:
        print(f"tito rollout: interrupted; finished rollouts are in {args.output}: rerun to resume", file=sys.stderr)
        return 130
    finally:
        if executor is not None:
            executor.close()  # the Ray workers (and the local Ray, if this run started one)
    return 0 if summary.written == summary.planned else 1


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
    from .runner._optional import ray

    ray()  # a clear error now, before the config and the servers are checked, when Ray is not installed
    from .runner.ray_executor import RayExecutor

    return RayExecutor(2 if args.workers is None else args.workers, address=args.address)


def _drop_truncation_notices(record: logging.LogRecord) -> bool:
    """Strands warns once per tool call cut by the token limit; the record already says so (``truncated``)."""
    return not record.name.startswith("strands.event_loop._recover_message_on_max_tokens_reached")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"event": "log", "level": record.levelname.lower(), "message": record.getMessage()})


def _export(args: argparse.Namespace) -> int:
    from . import export
    from .runner import RolloutRecord, read_records
    from .trainers.agentlightning import model_request_events
    from .trajectory import Trajectory

    converters: dict[str, Callable[[Trajectory, RolloutRecord], dict[str, Any]]] = {
        "slime": lambda traj, _: export.to_slime(traj),
        "verl": lambda traj, record: export.to_verl(traj, metrics=_verl_metrics(record)),
        "trl": lambda traj, _: export.to_trl(traj),
        "agl": lambda traj, _: {"rollout_id": traj.rollout_id, "model_request_events": model_request_events(traj)},
    }
    convert = converters[args.to]
    count = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for record in read_records(args.rollouts):
            fields = convert(Trajectory.from_record(record.trajectory), record)
            fields.update(task_id=record.task_id, sample=record.sample, group=record.group, reward=record.reward)
            if record.advantage is not None:
                fields["advantage"] = record.advantage
            out.write(json.dumps(fields) + "\n")
            count += 1
    print(f"tito export: {count} rollouts as {args.to} -> {args.out}", file=sys.stderr)
    return 0


def _verl_metrics(record: Any) -> dict[str, float]:
    """The ``AgentLoopMetrics`` of verl from a record's timings, where they map.

    The record times the whole agent loop (``agent_s``: model calls and tools together). A rollout that called
    no tool spent it in model calls (generation, with prompt rendering): ``generate_sequences = agent_s``,
    ``tool_calls = 0``. With tool calls the two cannot be told apart, and verl's defaults stay.
    """
    if record.tokens.tool_calls == 0:
        return {"generate_sequences": record.timings.agent_s, "tool_calls": 0.0}
    return {}


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .runner import read_records

    console = Console()
    records = [r for r in read_records(args.rollouts) if args.task_id is None or r.task_id == args.task_id]
    if args.task_id is not None and not records:
        console.print(f"no rollout of task {args.task_id!r} in {args.rollouts}")
        return 1
    table = Table(title=f"{args.rollouts}: {len(records)} rollouts")
    columns = ("task", "sample", "status", "reward", "tokens", "generated", "calls", "branches", "versions", "reason")
    for column in columns:
        table.add_column(column)
    for r in records:
        table.add_row(
            r.task_id,
            str(r.sample),
            r.status,
            "-" if r.reward is None else f"{r.reward:.3f}",
            str(r.tokens.total),
            str(r.tokens.output),
            str(r.tokens.model_calls),
            str(len(r.trajectory.branches) + 1),
            _versions(r),
            r.status_reason or "",
        )
    console.print(table)
    if args.task_id is not None:
        tokenizer = _inspect_tokenizer(args)
        for r in records:
            _show_segments(console, r, tokenizer)
    return 0


def _versions(record: Any) -> str:
    """A record's weight-version range: ``3``, ``2..3``, or ``-`` when unknown."""
    low, high = record.weight_version_min, record.weight_version_max
    if low is None or high is None:
        return "-"
    return low if low == high else f"{low}..{high}"


def _inspect_tokenizer(args: argparse.Namespace) -> Any:
    """The tokenizer of ``--tokenizer``, or of ``--config``'s ``tokenizer`` (loaded as the runner does); or None.

    A config without ``tokenizer`` whose ``prepare`` hook sets it (the arithmetic example) has the hook run.
    """
    from .tokenizers import load_tokenizer

    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    if not args.config:
        return None
    import asyncio

    from .config import load_config
    from .runner.run import prepare_config

    config = load_config(args.config)
    if config.tokenizer is None and config.rollout.prepare:
        config, _ = asyncio.run(prepare_config(args.config, {}))
    if config.tokenizer is None:
        raise ConfigError(f"{args.config}: no `tokenizer` to decode with (give --tokenizer)")
    return load_tokenizer(config.tokenizer)


def _show_segments(console: Any, record: Any, tokenizer: Any) -> None:
    """Each segment as text (or token ids): generated tokens (loss 1) in bold green, the rest dim."""
    from rich.text import Text

    traj = record.trajectory
    console.rule(f"{record.task_id} sample {record.sample}: {record.status}")
    for seg in traj.segments:
        ids = traj.token_ids[seg.start : seg.end]
        if tokenizer is not None:
            shown = tokenizer.decode(ids, skip_special_tokens=False)
        else:
            shown = " ".join(map(str, ids[:24])) + (" ..." if len(ids) > 24 else "")
        style = "bold green" if seg.kind == "output" else "dim"
        console.print(Text(f"[turn {seg.turn} {seg.kind}, {seg.end - seg.start} tokens]", style="italic"))
        console.print(Text(shown, style=style))


if __name__ == "__main__":
    raise SystemExit(main())
