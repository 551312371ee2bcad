"""The gateway past one process: ``tito serve`` against ``tito serve --workers N``, in the shape of Miles #1660.

Rows (each through the shipping command, ``python -m tito_core.cli serve``, on the fake SGLang server, the chat
completions client of ``gateway_client.py`` opening rollouts on the front address and calling each rollout's
``base_url``, a rollout file written, so the workers' journals run):

* **sessions**: ``--scale-sessions`` sessions at once x ``--scale-turns`` turns each (Miles: 32 x 50), one rollout
  per session: turns/s, mean and p99 latency per turn;
* **rollouts**: ``--scale-rollouts`` rollouts at once x 4 calls (1,000 x 4).

For each of: one process (``tito serve``, no supervisor), then ``--workers N`` for each N of ``--scale-workers``.
Every record written is counted: a run whose output does not hold one record per rollout fails the script.

Usage (alone): ``python benchmarks/gateway_scale.py --scale-workers 1,2``; ``benchmarks/gateway.py --scale-workers``
runs it after the other figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import Worker, fmt, post_json  # noqa: E402
from workload import Workload  # noqa: E402

CLI = "import sys; from tito_core.cli import main; sys.exit(main())"


@contextlib.contextmanager
def served(
    engine: str, tokenizer_dir: str, output: Path, workers: int, *, ray: str | None = None,
    exits: list[int] | None = None, urls: list[str] | None = None,
) -> Iterator[tuple[str, list[int]]]:  # fmt: skip
    """``tito serve`` (``workers`` 0: one process; else ``--workers N``, as Ray actors with ``ray``) before ``engine``.

    Yields the front address and the pids of its processes (the supervisor's first); the workers' addresses are
    appended to ``urls``. SIGTERM (the drain) at the end, after which its exit status is appended to ``exits``.
    """
    config = output.with_suffix(".toml")
    config.write_text(
        f'backend = "sglang"\ntokenizer = {json.dumps(tokenizer_dir)}\ntool_parser = "hermes"\n'
        f'[backend_options]\nbase_url = {json.dumps(engine)}\nsession = "off"\ntimeout = 600.0\n'
    )
    argv = [sys.executable, "-c", CLI, "serve", "--config", str(config), "--port", "0", "-o", str(output)]
    argv += ["--workers", str(workers)] if workers else []
    argv += ["--ray", ray] if ray else []
    server = Worker("tito serve", argv, "tito serve: serving on ")
    pids = [server.process.pid]
    for _ in range(workers):
        line = server.read_line("tito serve: worker ", 120)  # "tito serve: worker I on URL (pid P)"
        pids.append(int(line.rsplit("pid ", 1)[1].rstrip(")")))
        if urls is not None:
            urls.append(line.split(" on ", 1)[1].split()[0])
    try:
        yield server.first.rsplit(" ", 1)[1], pids
    finally:
        server.terminate(timeout=120)
        if exits is not None:
            exits.append(server.process.returncode)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (from /proc); the client's warm-up rollout included."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def scale_run(client: Worker, engine: str, tokenizer_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every row: per shape (one process, then each worker count), sessions and rollouts."""
    from tito_core.records import read_records

    shapes = [0, *[int(n) for n in args.scale_workers.split(",") if n]]
    runs = {
        "sessions": (Workload.for_size(args.scale_session_size, args.scale_turns), args.scale_sessions),
        "rollouts": (Workload.for_size(1000, 4), args.scale_rollouts),
    }
    report: dict[str, Any] = {}
    for kind, (workload, count) in runs.items():
        if not count:
            continue
        post_json(engine + "/configure", workload.as_dict())
        for workers in shapes:
            label = "one process" if not workers else f"{workers} workers"
            print(f"  scale {kind} {count} x {workload.calls}: {label} ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="tito-scale-") as tmp:
                output = Path(tmp) / "rollouts.jsonl"
                with served(engine, tokenizer_dir, output, workers) as (front, pids):
                    cpu, front_cpu = cpu_seconds(pids), cpu_seconds(pids[:1])
                    command = {"op": "throughput", "workload": workload.as_dict(), "concurrency": count,
                               "rollouts": count, "url": engine, "gateway": front}  # fmt: skip
                    raw = client.call(command)
                    cpu, front_cpu = cpu_seconds(pids) - cpu, cpu_seconds(pids[:1]) - front_cpu
                records = len(list(read_records(output)))
            if records != count + 1:  # and the client's warm-up rollout
                raise SystemExit(f"scale {kind} {label}: {records} records for {count + 1} rollouts")
            report.setdefault(kind, {})[label] = {
                "calls": raw["calls"],
                "calls_per_s": raw["calls"] / raw["wall"],
                "mean_ms": raw["mean_ms"],
                "p99_ms": raw["p99_ms"],
                "gateway_cpu_s": cpu,
                "supervisor_cpu_s": front_cpu if workers else 0.0,
                "records": records,
            }
    return report


def render_scale(report: dict[str, Any]) -> list[str]:
    """The table of :func:`scale_run`'s rows."""
    lines = ["", "| shape | gateway processes | calls | turns/s | mean ms | p99 ms | gateway CPU ms per call (of it "
             "the supervisor's) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for kind, by in report.items():
        for label, row in by.items():
            lines.append(
                f"| {kind} | {label} | {row['calls']} | {fmt(row['calls_per_s'], 0)} | {fmt(row['mean_ms'])} | "
                f"{fmt(row['p99_ms'])} | {fmt(1e3 * row['gateway_cpu_s'] / row['calls'])} "
                f"({fmt(1e3 * row['supervisor_cpu_s'] / row['calls'])}) |"
            )
    return lines


def add_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """This module's options (``benchmarks/gateway.py`` takes them too)."""
    parser.add_argument("--scale-workers", default="", help="worker counts to compare with one process, e.g. 1,2")
    parser.add_argument("--scale-sessions", type=int, default=32, help="sessions at once (Miles #1660: 32)")
    parser.add_argument("--scale-turns", type=int, default=50, help="turns per session (Miles #1660: 50)")
    parser.add_argument("--scale-session-size", type=int, default=2000, help="a session's final tokens, about")
    parser.add_argument("--scale-rollouts", type=int, default=1000, help="rollouts at once x 4 calls (0: none)")


def main() -> None:
    """Run the scale rows alone: the fake server, one gateway client, each shape in turn."""
    from tito_testing.tokenizers import qwen_tokenizer_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_scale_arguments(parser)
    parser.add_argument("--json", default="", help="also write the figures as JSON here")
    args = parser.parse_args()
    tokenizer_dir = str(qwen_tokenizer_dir("qwen3"))
    started = time.monotonic()
    load_before = os.getloadavg()
    engine_argv = [sys.executable, str(HERE / "fake_sglang.py"), "--tokenizer", tokenizer_dir]
    engine = Worker("fake server", engine_argv, "PORT ")
    client = Worker("gateway client", [sys.executable, str(HERE / "gateway_client.py"), tokenizer_dir], "READY")
    try:
        url = f"http://127.0.0.1:{int(engine.first.split()[1])}"
        report = scale_run(client, url, tokenizer_dir, args)
    finally:
        client.stop()
        engine.process.terminate()
        engine.process.wait(timeout=30)
        engine.close_pipes()
    load = os.getloadavg()
    print(
        f"gateway scale-out, fake SGLang server, python {platform.python_version()}, {os.cpu_count()} cpus, load "
        f"average {load_before[0]:.2f} before, {load[0]:.2f} / {load[1]:.2f} at the end, "
        f"{time.monotonic() - started:.0f} s"
    )
    print("\n".join(render_scale(report)))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
