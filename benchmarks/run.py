"""tito against strands-sglang, side by side in one run, against one fast fake SGLang server.

What runs (every process on 127.0.0.1, stopped at the end):

* the fake server (``fake_sglang.py``), a separate process;
* three long-lived client workers (``client.py``), each in the interpreter that has its implementation:
  ``noop`` (a Strands model answering canned events: Strands' own per-call cost, the floor), ``tito``
  (``TitoModel`` + ``SGLangBackend``) and ``peer`` (strands-sglang's ``SGLangModel`` + ``SGLangClient``,
  which needs Python >= 3.12 and runs from its own virtual environment, ``--peer-python``).

For every size, the workers run the same Strands agent (one tool, ``calls`` model calls) with the same
offline Qwen3 tokenizer, a warm-up rollout, then ``--repeats`` rollouts; then model calls/s with C
concurrent rollouts from one process (at least ``--min-rollouts`` per run: below that, each of the C lanes
runs several rollouts in turn), the median of ``--throughput-repeats`` runs (in rotating order) and the
largest event-loop lag of those runs, with the client process's CPU time and garbage-collector work per call
(figures a busy machine moves far less than calls/s). See docs/performance.md for the definitions and a run.

Usage:
    python benchmarks/run.py --peer-python /path/to/py312-venv/bin/python
    python benchmarks/run.py --no-peer --sizes 1000,8000 --repeats 3 --concurrency 1,64
    python benchmarks/run.py --no-peer --profile 128000     # cProfile of tito at 137k, under --results
    python benchmarks/run.py --peer-python PY --profile 1000 --profile-impl peer --profile-concurrency 64 --repeats 128
    python benchmarks/run.py --baseline /tmp/main           # also tito from another tree ("tito (before)")
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from workload import SIZES, Workload  # noqa: E402

IMPLS = ("noop", "tito", "tito-sessions", "tito-before", "tito-httpx", "peer")
NAMES = {
    "noop": "no-op floor",
    "tito": "tito",
    "tito-sessions": "tito, SGLang sessions",
    "tito-before": "tito (before)",
    "tito-httpx": "tito through httpx",
    "peer": "strands-sglang",
}
READY_TIMEOUT = 180.0
COMMAND_TIMEOUT = 900.0


# ------------------------------------------------------------------------------------------ processes
class Worker:
    """A child process spoken to with one JSON line per command (bounded waits, never a hang)."""

    def __init__(
        self, name: str, argv: list[str], ready: str, timeout: float = READY_TIMEOUT, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        self._pending = b""
        self.first = self.read_line(ready, timeout)

    def read_line(self, prefix: str, timeout: float) -> str:
        """The next stdout line starting with ``prefix`` (other lines are skipped)."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno()
        while True:
            while b"\n" in self._pending:
                line, self._pending = self._pending.split(b"\n", 1)
                text = line.decode(errors="replace")
                if text.startswith(prefix) or text.startswith("ERROR "):
                    if text.startswith("ERROR "):
                        raise RuntimeError(f"{self.name}: {json.loads(text[6:])}")
                    return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.name}: no {prefix!r} line within {timeout:.0f} s")
            readable, _, _ = select.select([fd], [], [], left)
            if readable:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"{self.name} exited with {self.process.wait(10)}")
                self._pending += chunk

    def call(self, command: dict[str, Any], timeout: float = COMMAND_TIMEOUT) -> dict[str, Any]:
        """Send one command and return its result."""
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps(command) + "\n").encode())
        self.process.stdin.flush()
        result: dict[str, Any] = json.loads(self.read_line("RESULT ", timeout)[len("RESULT ") :])
        return result

    def close_pipes(self) -> None:
        """Close this side of the worker's pipes (once it has exited)."""
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    def stop(self) -> None:
        """Close stdin (the worker exits at EOF); terminate it if it does not."""
        if self.process.poll() is None:
            try:
                if self.process.stdin is not None:
                    self.process.stdin.close()
                self.process.wait(timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                self.terminate(timeout=10)
                return
        self.close_pipes()

    def terminate(self, timeout: float = 15.0, kill_timeout: float = 10.0) -> None:
        """SIGTERM the process if it runs, wait up to ``timeout`` s, then SIGKILL it; close the pipes."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=kill_timeout)
        self.close_pipes()


def post_json(url: str, payload: Any) -> None:
    """POST a JSON body, wait for the answer."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=120) as answer:
        answer.read()


@contextlib.contextmanager
def fake_server(tokenizer_dir: str, workload: Workload) -> Iterator[str]:
    """The fast fake SGLang server (``fake_sglang.py``) in its own process, set to ``workload``; yields its URL."""
    server = Worker(
        "fake server", [sys.executable, str(HERE / "fake_sglang.py"), "--tokenizer", tokenizer_dir], "PORT "
    )
    try:
        url = f"http://127.0.0.1:{int(server.first.split()[1])}"
        post_json(url + "/configure", workload.as_dict())
        yield url
    finally:
        server.terminate()


# ------------------------------------------------------------------------------------------ figures
def median(values: list[float]) -> float:
    """Median (nan when empty)."""
    return statistics.median(values) if values else float("nan")


def summarize_latency(result: dict[str, Any], calls: int) -> dict[str, float]:
    """Per-call figures (ms) of one implementation at one size."""
    rows = result["rows"]
    per_call = [1e3 * (s - v) for row in rows for s, v in zip(row["stream"], row["server"], strict=True)]
    last = [1e3 * (row["stream"][-1] - row["server"][-1]) for row in rows]
    total = [1e3 * (row["wall"] - sum(row["server"]) - row["tool"]) / calls for row in rows]
    outside = [1e3 * (row["wall"] - sum(row["stream"]) - row["tool"]) / calls for row in rows]
    server = [1e3 * sum(row["server"]) / calls for row in rows]
    cpu = [1e3 * c for row in rows for c in row.get("stream_cpu", [])]
    tokenizer = [1e3 * row["tokenizer"] / calls for row in rows]
    tokens = rows[-1]["tokens"]
    return {
        "client_ms": median(per_call),
        "client_last_ms": median(last),
        "client_cpu_ms": median(cpu),
        "total_ms": median(total),
        "strands_outside_ms": median(outside),
        "server_ms": median(server),
        "tokenizer_ms": median(tokenizer),
        "tokens": float(tokens),
        "bytes_per_token": rows[-1]["bytes"] / tokens if tokens else float("nan"),
    }


def fmt(value: float | None, digits: int = 2) -> str:
    """A number for the table ('-' when absent)."""
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    """A / b when both exist."""
    if a is None or b is None or not b or a != a or b != b:
        return None
    return a / b


# ------------------------------------------------------------------------------------------ the run
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start everything, measure, stop everything; return the raw and summarized figures."""
    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer_dir = str(qwen_tokenizer_dir("qwen3"))
    sizes = [int(s) for s in args.sizes.split(",") if s]
    conc_sizes = [int(s) for s in args.concurrency_sizes.split(",") if s]
    levels = [int(c) for c in args.concurrency.split(",") if c]
    lag_levels = [int(c) for c in args.lag_concurrency.split(",") if c]
    lag_sizes = [int(s) for s in args.lag_sizes.split(",") if s]
    impls = [
        i
        for i in IMPLS
        if (i != "peer" or args.peer_python)
        and (i != "tito-httpx" or args.httpx_transport)
        and (i != "tito-before" or args.baseline)
    ]
    if args.profile:
        impls = [args.profile_impl]
    report: dict[str, Any] = {"latency": {}, "throughput": {}, "notes": []}

    stack = contextlib.ExitStack()  # the client workers, stopped before the server
    server = Worker(
        "fake server", [sys.executable, str(HERE / "fake_sglang.py"), "--tokenizer", tokenizer_dir], "PORT "
    )
    try:
        url = f"http://127.0.0.1:{int(server.first.split()[1])}"
        workers = stack.enter_context(client_workers(impls, tokenizer_dir, args.peer_python, args.baseline))
        if args.profile:
            report["profile"] = profile(workers[args.profile_impl], url, args)
            return report
        for size in sizes:
            workload = Workload.for_size(size, args.calls)
            post_json(url + "/configure", workload.as_dict())
            print(f"  latency {SIZES.get(size, size)}: {', '.join(impls)} ...", file=sys.stderr, flush=True)
            rows = latency_rows(workers, url, workload, args.repeats)
            for impl in impls:
                report["latency"].setdefault(str(size), {})[impl] = summarize_latency(
                    {"rows": rows[impl]}, workload.calls
                )
        plan = [(size, levels, impls) for size in conc_sizes]
        # strands-sglang's client fails 1,000 rollouts at once (connection timeouts): the lag runs leave it out
        plan += [
            (size, lag_levels, [i for i in impls if i not in ("peer", "tito-sessions")])
            for size in lag_sizes
            if lag_levels
        ]
        for size, size_levels, size_impls in plan:
            workload = Workload.for_size(size, args.calls)
            post_json(url + "/configure", workload.as_dict())
            for level in size_levels:
                if level * size > args.max_concurrent_tokens:
                    report["notes"].append(
                        f"skipped {level} concurrent rollouts at {SIZES.get(size, size)}: over "
                        f"--max-concurrent-tokens={args.max_concurrent_tokens:.0f}"
                    )
                    continue
                runs: dict[str, list[dict[str, Any]]] = {impl: [] for impl in size_impls}
                for repeat in range(args.throughput_repeats):
                    # the order rotates, as for the latency rows: a slow moment hits every implementation alike
                    shift = repeat % len(size_impls)
                    for impl in size_impls[shift:] + size_impls[:shift]:
                        print(
                            f"  calls/s {SIZES.get(size, size)} x{level} {impl} ({repeat + 1}) ...",
                            file=sys.stderr,
                            flush=True,
                        )
                        runs[impl].append(
                            workers[impl].call(
                                {
                                    "op": "throughput",
                                    "workload": workload.as_dict(),
                                    "concurrency": level,
                                    "rollouts": args.min_rollouts,
                                    "url": url,
                                }
                            )
                        )
                for impl, raws in runs.items():
                    rates = [raw["calls"] / raw["wall"] for raw in raws]
                    report["throughput"].setdefault(str(size), {}).setdefault(str(level), {})[impl] = {
                        "calls_per_s": median(rates),
                        "runs_calls_per_s": rates,
                        "wall_s": median([raw["wall"] for raw in raws]),
                        "server_s": median([raw["server"] for raw in raws]),
                        "lag_ms": 1e3 * max(raw.get("lag", float("nan")) for raw in raws),
                        # the client process's CPU time and gen-0 collections per model call (all runs together)
                        "cpu_ms_per_call": 1e3 * sum(raw["cpu"] for raw in raws) / sum(raw["calls"] for raw in raws),
                        "gc0_per_call": sum(raw["collections"][0] for raw in raws) / sum(raw["calls"] for raw in raws),
                        "gc_ms_per_call": 1e3
                        * sum(raw.get("gc_cpu", 0.0) for raw in raws)
                        / sum(raw["calls"] for raw in raws),
                    }
    finally:
        stack.close()
        server.terminate()
    return report


@contextlib.contextmanager
def client_workers(
    impls: list[str], tokenizer_dir: str, peer_python: str = "", baseline: str = ""
) -> Iterator[dict[str, Worker]]:
    """One long-lived ``client.py`` worker per implementation (the peer in ``peer_python``); all stopped at the end."""
    workers: dict[str, Worker] = {}
    try:
        for impl in impls:
            python = peer_python if impl == "peer" else sys.executable
            argv = [python, str(HERE / "client.py"), impl, tokenizer_dir]
            workers[impl] = Worker(impl, argv, "READY", env=worker_env(impl, baseline))
        yield workers
    finally:
        for worker in workers.values():
            worker.stop()


def latency_rows(workers: dict[str, Worker], url: str, workload: Workload, repeats: int) -> dict[str, list[Any]]:
    """A warm-up rollout per worker, then ``repeats`` timed rollouts each: the per-rollout rows of ``client.py``."""
    impls = list(workers)
    rows: dict[str, list[Any]] = {impl: [] for impl in impls}
    base = {"op": "latency", "workload": workload.as_dict(), "url": url}
    for impl in impls:  # warm-up rollouts
        workers[impl].call({**base, "repeats": 0, "warmup": True})
    for repeat in range(repeats):
        # One rollout per implementation in turn, the order rotating, so that a slow moment of a
        # shared machine hits every implementation alike.
        shift = repeat % len(impls)
        for impl in impls[shift:] + impls[:shift]:
            rows[impl] += workers[impl].call({**base, "repeats": 1, "warmup": False})["rows"]
    return rows


def worker_env(impl: str, baseline: str) -> dict[str, str] | None:
    """The environment of a worker: ``tito-before`` imports tito from the ``baseline`` tree first."""
    if impl != "tito-before":
        return None
    packages = Path(baseline).resolve() / "packages"
    paths = [str(packages / name / "src") for name in ("tito-core", "tito-sglang", "tito-vllm")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}


def profile(worker: Worker, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Profile (cProfile) ``--profile-impl``'s rollouts at ``--profile`` tokens, ``--profile-concurrency`` at once.

    Writes a ``.pstats`` and its top 30 under ``--results``.
    """
    size = int(args.profile)
    workload = Workload.for_size(size, args.calls)
    post_json(url + "/configure", workload.as_dict())
    results = Path(args.results).resolve()
    results.mkdir(parents=True, exist_ok=True)
    at_once = f"-x{args.profile_concurrency}" if args.profile_concurrency > 1 else ""
    out = results / f"profile-{args.profile_impl}-{SIZES.get(size, size)}{at_once}.pstats"
    command = {
        "op": "profile",
        "workload": workload.as_dict(),
        "repeats": args.repeats,
        "url": url,
        "out": str(out),
        "concurrency": args.profile_concurrency,
    }
    return worker.call(command)


def headline(report: dict[str, Any]) -> dict[str, float | None]:
    """The issue-20 figures of the last line (see docs/performance.md)."""
    lat, thr = report["latency"], report["throughput"]
    per_call = [ratio(by["peer"]["client_ms"], by["tito"]["client_ms"]) for by in lat.values() if "peer" in by]
    calls = [
        ratio(by["tito"]["calls_per_s"], by["peer"]["calls_per_s"])
        for levels in thr.values()
        for level, by in levels.items()
        if "peer" in by and int(level) in MAIN_LEVELS
    ]

    def own(size: str) -> float | None:
        by = lat.get(size, {})
        if "tito" not in by or "noop" not in by:
            return None
        return float(by["tito"]["total_ms"] - by["noop"]["total_ms"] - by["tito"]["tokenizer_ms"])

    at34 = thr.get("32000", {}).get("64", {})
    lags = [levels["1000"]["tito"]["lag_ms"] for levels in thr.values() if "tito" in levels.get("1000", {})]
    return {
        "per_call_ratio_min": min((r for r in per_call if r is not None), default=None),
        "calls_ratio_min": min((r for r in calls if r is not None), default=None),
        "own_ms_1k": own("1000"),
        "own_ms_137k": own("128000"),
        "floor_share_34k": ratio(at34.get("tito", {}).get("calls_per_s"), at34.get("noop", {}).get("calls_per_s")),
        "loop_lag_ms_1000": max(lags, default=None),
    }


MAIN_LEVELS = (1, 64, 512)
"""The concurrency levels of the calls/s comparison (1,000 is run for the event-loop lag)."""


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    """The tables and the last line."""
    lines: list[str] = []
    peer = bool(args.peer_python)
    lines.append(
        "| size | tokens | strands-sglang client ms/call | tito client ms/call | peer / tito | "
        "tokenizer ms/call (peer / tito) | no-op floor ms/call | tito ms/call above floor | "
        "strands-sglang ms/call above floor | tito bytes/token | strands-sglang bytes/token |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for size, by_impl in report["latency"].items():
        tito, noop, other = by_impl.get("tito"), by_impl.get("noop"), by_impl.get("peer")
        floor = noop["total_ms"] if noop else None
        lines.append(
            f"| {SIZES.get(int(size), size)} | {int(tito['tokens']) if tito else '-'} | "
            f"{fmt(other['client_ms']) if other else '-'} | {fmt(tito['client_ms']) if tito else '-'} | "
            f"{fmt(ratio(other['client_ms'], tito['client_ms']) if other and tito else None, 1)} | "
            f"{fmt(other['tokenizer_ms']) if other else '-'} / {fmt(tito['tokenizer_ms']) if tito else '-'} | "
            f"{fmt(floor)} | "
            f"{fmt(tito['total_ms'] - floor if tito and floor is not None else None)} | "
            f"{fmt(other['total_ms'] - floor if other and floor is not None else None)} | "
            f"{fmt(tito['bytes_per_token'], 1) if tito else '-'} | "
            f"{fmt(other['bytes_per_token'], 1) if other else '-'} |"
        )
    lines.append("")
    lines.append(
        "| size | implementation | client ms/call | client CPU ms/call | last call | tokenizer ms/call | "
        "whole loop ms/call | above floor | server handler ms/call | bytes/token |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for size, by_impl in report["latency"].items():
        floor = by_impl["noop"]["total_ms"] if "noop" in by_impl else None
        for impl, row in by_impl.items():
            lines.append(
                f"| {SIZES.get(int(size), size)} | {NAMES.get(impl, impl)} | {fmt(row['client_ms'])} | "
                f"{fmt(row.get('client_cpu_ms'))} | {fmt(row['client_last_ms'])} | {fmt(row['tokenizer_ms'])} | "
                f"{fmt(row['total_ms'])} | "
                f"{fmt(row['total_ms'] - floor if floor is not None else None)} | {fmt(row['server_ms'])} | "
                f"{fmt(row['bytes_per_token'], 1)} |"
            )
    lines.append("")
    extra = any("tito-httpx" in by for lv in report["throughput"].values() for by in lv.values())
    before = any("tito-before" in by for lv in report["throughput"].values() for by in lv.values())
    sessions = any("tito-sessions" in by for lv in report["throughput"].values() for by in lv.values())
    lines.append(
        "| size | concurrent rollouts | no-op floor calls/s | tito calls/s | strands-sglang calls/s | tito / peer |"
        + (" tito (before) calls/s |" if before else "")
        + (" tito, SGLang sessions calls/s |" if sessions else "")
        + (" tito through httpx calls/s |" if extra else "")
        + " max loop lag ms (floor / tito / peer"
        + (" / before" if before else "")
        + ") |"
    )
    lines.append("|---|---|---|---|---|---|---|" + ("---|" * (before + sessions + extra)))
    for size, by_level in report["throughput"].items():
        for level, by_impl in by_level.items():
            get = {impl: by_impl[impl]["calls_per_s"] for impl in by_impl}
            lag = {impl: by_impl[impl].get("lag_ms") for impl in by_impl}
            lines.append(
                f"| {SIZES.get(int(size), size)} | {level} | {fmt(get.get('noop'), 0)} | {fmt(get.get('tito'), 0)} | "
                f"{fmt(get.get('peer'), 0)} | {fmt(ratio(get.get('tito'), get.get('peer')), 1)} |"
                + (f" {fmt(get.get('tito-before'), 0)} |" if before else "")
                + (f" {fmt(get.get('tito-sessions'), 0)} |" if sessions else "")
                + (f" {fmt(get.get('tito-httpx'), 0)} |" if extra else "")
                + f" {fmt(lag.get('noop'), 0)} / {fmt(lag.get('tito'), 0)} / {fmt(lag.get('peer'), 0)}"
                + (f" / {fmt(lag.get('tito-before'), 0)}" if before else "")
                + " |"
            )
    lines.append("")
    present = {impl for lv in report["throughput"].values() for by in lv.values() for impl in by}
    order = [impl for impl in ("noop", "tito", "peer", "tito-before", "tito-sessions", "tito-httpx") if impl in present]
    lines.append(
        "| size | concurrent rollouts | client CPU ms/call ("
        + " / ".join(NAMES[impl] for impl in order)
        + ") | of it in the garbage collector | gen-0 collections per call |"
    )
    lines.append("|---|---|---|---|---|")
    for size, by_level in report["throughput"].items():
        for level, by_impl in by_level.items():
            cpu = " / ".join(fmt(by_impl.get(impl, {}).get("cpu_ms_per_call")) for impl in order)
            gc_ms = " / ".join(fmt(by_impl.get(impl, {}).get("gc_ms_per_call"), 3) for impl in order)
            gcs = " / ".join(fmt(by_impl.get(impl, {}).get("gc0_per_call")) for impl in order)
            lines.append(f"| {SIZES.get(int(size), size)} | {level} | {cpu} | {gc_ms} | {gcs} |")
    lines.extend(f"note: {note}" for note in report["notes"])
    if not peer:
        lines.append("note: strands-sglang was not measured (no Python >= 3.12 interpreter / --no-peer)")
    lat34 = report["latency"].get("32000", {})
    thr64: dict[str, Any] = next((by[str(64)] for by in report["throughput"].values() if str(64) in by), {})
    per_call = ratio(lat34.get("peer", {}).get("client_ms"), lat34.get("tito", {}).get("client_ms"))
    calls = ratio(thr64.get("tito", {}).get("calls_per_s"), thr64.get("peer", {}).get("calls_per_s"))
    share = lat34["tito"]["total_ms"] - lat34["noop"]["total_ms"] if "tito" in lat34 and "noop" in lat34 else None
    head = headline(report)
    lines.append("")
    lines.append(
        f"ratio_vs_strands_sglang_per_call_34k={fmt(per_call)} ratio_vs_strands_sglang_calls_per_s_64={fmt(calls)} "
        f"tito_share_over_floor_34k={fmt(share)} " + " ".join(f"{key}={fmt(value)}" for key, value in head.items())
    )
    return "\n".join(lines)


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", default="", help="python of a venv with strands-sglang (Python >= 3.12)")
    parser.add_argument("--no-peer", action="store_true", help="measure tito and the floor only")
    parser.add_argument("--sizes", default="1000,8000,32000,128000", help="target trajectory sizes (tokens)")
    parser.add_argument("--calls", type=int, default=8, help="model calls per rollout")
    parser.add_argument("--repeats", type=int, default=7, help="timed rollouts per size (after one warm-up)")
    parser.add_argument("--concurrency", default="1,64,512", help="concurrent rollouts for calls/s")
    parser.add_argument(
        "--throughput-repeats",
        type=int,
        default=3,
        help="runs per calls/s figure (its median; a single run at 512 rollouts varies by +-12 %%)",
    )
    parser.add_argument(
        "--min-rollouts",
        type=int,
        default=32,
        help="rollouts per calls/s run at least (below this concurrency each lane runs several in turn)",
    )
    parser.add_argument("--concurrency-sizes", default="1000,8000,32000", help="sizes for the calls/s runs")
    parser.add_argument("--lag-concurrency", default="1000", help="extra concurrency levels for the event-loop lag")
    parser.add_argument("--lag-sizes", default="1000", help="sizes of the --lag-concurrency runs")
    parser.add_argument("--profile", default="", help="only profile tito (cProfile) at this size, e.g. 128000")
    parser.add_argument("--profile-impl", default="tito", choices=IMPLS, help="the client --profile profiles")
    parser.add_argument(
        "--profile-concurrency", type=int, default=1, help="--profile: rollouts at once (--repeats in all, at least)"
    )
    parser.add_argument("--results", default=str(HERE / "results"), help="where --profile writes its files")
    parser.add_argument("--baseline", default="", help="a source tree whose tito also runs, as 'tito (before)'")
    parser.add_argument(
        "--max-concurrent-tokens", type=float, default=20e6, help="skip calls/s runs holding more tokens at once"
    )
    parser.add_argument(
        "--httpx-transport",
        action="store_true",
        help="also run tito sending through an httpx transport (httpcore) instead of its own connection pool",
    )
    parser.add_argument("--json", default="", help="also write the figures as JSON here")
    args = parser.parse_args()
    if args.no_peer:
        args.peer_python = ""
    elif not args.peer_python:
        print("note: no --peer-python given: strands-sglang is not measured", file=sys.stderr)

    started = time.monotonic()
    report = run(args)
    report["environment"] = {
        "python": platform.python_version(),
        "peer_python": args.peer_python,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "seconds": time.monotonic() - started,
    }
    if args.profile:
        print(Path(report["profile"]["text"]).read_text())
        print(f"profile: {report['profile']['pstats']} ({report['profile']['calls']} model calls)")
        return
    text = render(report, args)
    header = (
        f"tito vs strands-sglang, fake SGLang server, Qwen3 tokenizer; python {platform.python_version()}, "
        f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f} at the end, "
        f"{report['environment']['seconds']:.0f} s, {args.repeats} repeats, {args.calls} calls per rollout, "
        f"calls/s the median of {args.throughput_repeats} runs"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    print(header)
    print(text)


if __name__ == "__main__":
    main()
