"""The gateway (``tito serve``) against ``TitoModel`` direct and strands-sglang, in one run, on run.py's fake server.

What runs (every process on 127.0.0.1, stopped at the end):

* the fake SGLang server (``fake_sglang.py``) with run.py's workload (``workload.py``: one tool, 8 calls);
* the gateway in its own process (``gateway_server.py``: the gateway's own app, as ``tito serve`` serves it);
* client workers: ``tito`` (``client.py``: ``TitoModel`` + ``SGLangBackend`` in a Strands agent), ``peer``
  (strands-sglang, with ``--peer-python``) and ``gateway`` (``gateway_client.py``: the same agent as an OpenAI
  chat-completions client of the gateway, a bare aiohttp session posting the SDK's JSON).

Figures (docs/performance.md, "Gateway"):

* per call at 1k and 34k: each client's time per model call minus the engine's handler time (the gateway path:
  the client's POST, so HTTP both ways, the gateway and its engine call; direct: ``stream()``); the gateway's own
  ``Gateway.call`` time minus the engine's, and the client's JSON time; ``gateway - direct`` is the overhead;
* calls/s at 64 concurrent rollouts through one gateway process against ``TitoModel`` direct from one process
  (median of ``--throughput-repeats`` runs, order rotating);
* with ``--scale-workers 1,2``, ``tito serve`` against ``tito serve --workers N`` (``gateway_scale.py``: 32 sessions
  x 50 turns as Miles #1660 measured, 1,000 rollouts x 4 calls);
* 1,000 concurrent rollouts at 10 % engine faults through one gateway writing its rollout file: every rollout
  has a record with a terminal status, and every recorded output is exactly one clean engine answer to the
  prompt recorded before it (the fault suite's ``check_trajectory``, on the fake server's log); a failure of that
  check fails the script.

Usage:
    python benchmarks/gateway.py --peer-python /path/to/py312-venv/bin/python
    python benchmarks/gateway.py --no-peer --sizes 300 --calls 2 --repeats 1 --fault-rollouts 20   # smoke
    python benchmarks/gateway.py --no-peer --profile-gateway /tmp/gw   # cProfile of the gateway process
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gateway_scale import add_scale_arguments, render_scale, scale_run  # noqa: E402
from run import Worker, fmt, latency_rows, median, post_json, ratio, summarize_latency  # noqa: E402
from workload import SIZES, Workload  # noqa: E402

NAMES = {"tito": "TitoModel direct", "peer": "strands-sglang", "gateway": "gateway (aiohttp client)"}
TERMINAL = ("completed", "truncated", "aborted", "failed")
CLEAN_LOGPROB = -0.25  # every logprob of the fake server's clean answers


@contextlib.contextmanager
def gateway_process(engine: str, tokenizer_dir: str, output: str = "", profile: str = "") -> Iterator[str]:
    """The gateway in its own process in front of ``engine``; yields its base URL; SIGTERM at the end."""
    argv = [sys.executable, str(HERE / "gateway_server.py"), "--engine", engine, "--tokenizer", tokenizer_dir]
    argv += ["--output", output] if output else []
    argv += ["--profile", profile] if profile else []
    server = Worker("gateway", argv, "PORT ")
    try:
        url = f"http://127.0.0.1:{int(server.first.split()[1])}"
        PIDS[url] = server.process.pid
        yield url
    finally:
        server.process.send_signal(signal.SIGTERM)  # the gateway's shutdown: open rollouts written aborted
        try:
            server.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=10)
        server.close_pipes()


PIDS: dict[str, int] = {}  # the gateway process of each base URL


def process_usage(pid: int) -> dict[str, float]:
    """A process's resident memory (MiB) and open file descriptors, from /proc."""
    with open(f"/proc/{pid}/status") as status:
        rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return {"rss_mb": rss_kb / 1024, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def get_json(url: str) -> Any:
    """GET a JSON answer."""
    with urllib.request.urlopen(url, timeout=120) as answer:
        return json.loads(answer.read())


# ------------------------------------------------------------------------------------------ the check
def check_records(records: list[Any], log: list[list[Any]], answers: dict[str, list[int]]) -> list[str]:
    """Problems with the gateway's records (empty: none), as the fault suite's ``check_trajectory`` checks them.

    Every branch has a terminal status (with a reason unless ``completed``); every recorded output is, per request
    id, exactly one clean answer of the engine (its ids, its logprobs) to the very prompt recorded before it.
    """
    by_rid: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for rid, kind, digest, turn in log:
        by_rid[rid].append((kind, digest, turn))
    problems: list[str] = []
    for record in records:
        traj = record.trajectory
        for branch in [*traj.branches, traj]:
            where = f"{record.task_id} branch {branch.branch}"
            if branch.status not in TERMINAL:
                problems.append(f"{where}: status {branch.status!r}")
            elif branch.status != "completed" and not branch.status_reason:
                problems.append(f"{where}: status {branch.status!r} without a reason")
            ids, lps = branch.token_ids, branch.logprobs
            for turn in branch.turns:
                at = turn.output_start
                for rid in (turn.rid, *turn.continued_rids):
                    clean = [(digest, t) for kind, digest, t in by_rid.get(rid, []) if kind == "ok"]
                    if len(clean) != 1:
                        problems.append(f"{where}: turn {turn.index} rid {rid} has {len(clean)} clean answers")
                        break
                    digest, answered = clean[0]
                    out = answers[str(answered)]
                    if hashlib.sha1(array("i", ids[:at]).tobytes()).hexdigest() != digest:
                        problems.append(f"{where}: turn {turn.index}: the engine consumed another prompt")
                    if ids[at : at + len(out)] != out or lps[at : at + len(out)] != [CLEAN_LOGPROB] * len(out):
                        problems.append(f"{where}: turn {turn.index}: the output is not the engine's answer")
                    at += len(out)
                if at != turn.output_start + turn.output_len:
                    problems.append(f"{where}: turn {turn.index} holds tokens no clean answer sent")
    return problems


def fault_run(
    worker: Worker, url: str, tokenizer_dir: str, workload: Workload, args: argparse.Namespace
) -> dict[str, Any]:
    """``--fault-rollouts`` rollouts at once through a fresh gateway writing a rollout file, at ``--fault-rate``."""
    from tito_core.records import read_records

    post_json(url + "/configure", workload.as_dict())
    post_json(url + "/faults", {"rate": args.fault_rate, "seed": args.fault_seed})
    with tempfile.TemporaryDirectory(prefix="tito-gwbench-") as tmp:
        output = str(Path(tmp) / "rollouts.jsonl")
        with gateway_process(url, tokenizer_dir, output=output) as gateway:
            result = worker.call({"op": "faults", "workload": workload.as_dict(), "rollouts": args.fault_rollouts,
                                  "url": url, "gateway": gateway})  # fmt: skip
        records = list(read_records(output))  # after the gateway's shutdown: everything it wrote
    logged = get_json(url + "/log")
    post_json(url + "/faults", {"rate": 0.0})  # no more faults (and a fresh log)
    problems = check_records(records, logged["log"], logged["answers"])
    by_task = {record.task_id: record for record in records}
    statuses: dict[str, int] = defaultdict(int)
    for rollout in result["rollouts"]:
        record = by_task.get(rollout["task_id"])
        if record is None:
            problems.append(f"{rollout['task_id']}: no record written")
            continue
        statuses[record.status] += 1
        if "error" in rollout and record.status == "completed":
            problems.append(f"{rollout['task_id']}: the client got an error, the record says completed")
        if "error" not in rollout and record.status != "completed":
            problems.append(f"{rollout['task_id']}: answered to the end, the record says {record.status}")
    faults: dict[str, int] = defaultdict(int)
    for _rid, kind, _digest, _turn in logged["log"]:
        faults[kind] += 1
    http: dict[str, int] = defaultdict(int)
    for rollout in result["rollouts"]:
        for status in rollout["statuses"]:
            http[str(status)] += 1
    return {
        "rollouts": len(result["rollouts"]),
        "records": len(records),
        "wall_s": result["wall"],
        "statuses": dict(statuses),
        "engine_requests": dict(faults),
        "client_http_statuses": dict(http),
        "problems": problems,
    }


# ------------------------------------------------------------------------------------------ the run
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start everything, measure, stop everything; return the figures."""
    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer_dir = str(qwen_tokenizer_dir("qwen3"))
    fronts = [f"gateway-{front}" for front in args.fronts.split(",") if front and front != "chat"]
    impls = ["tito", "gateway", *fronts] + (["peer"] if args.peer_python else [])
    report: dict[str, Any] = {"latency": {}, "gateway_parts": {}, "throughput": {}, "faults": None}
    with contextlib.ExitStack() as stack:
        server = Worker("fake server", [sys.executable, str(HERE / "fake_sglang.py"), "--tokenizer", tokenizer_dir],
                        "PORT ")  # fmt: skip
        stack.callback(server.terminate)
        url = f"http://127.0.0.1:{int(server.first.split()[1])}"
        profile = args.profile_gateway + ".pstats" if args.profile_gateway else ""
        gateway = stack.enter_context(gateway_process(url, tokenizer_dir, profile=profile))
        workers: dict[str, Worker] = {}
        for impl in impls:
            if impl.startswith("gateway"):
                front = impl.partition("-")[2] or "chat"
                argv = [sys.executable, str(HERE / "gateway_client.py"), tokenizer_dir, front]
            else:
                argv = [args.peer_python if impl == "peer" else sys.executable, str(HERE / "client.py"), impl,
                        tokenizer_dir]  # fmt: skip
            workers[impl] = Worker(impl, argv, "READY")
            stack.callback(workers[impl].stop)
        for impl in impls:
            if impl.startswith("gateway"):
                workers[impl].call({"op": "connect", "url": url, "gateway": gateway})
        for size in [int(s) for s in args.sizes.split(",") if s]:
            workload = Workload.for_size(size, args.calls)
            post_json(url + "/configure", workload.as_dict())
            print(f"  latency {SIZES.get(size, size)}: {', '.join(impls)} ...", file=sys.stderr, flush=True)
            rows = latency_rows(workers, url, workload, args.repeats)
            report["latency"][str(size)] = {
                impl: summarize_latency({"rows": rows[impl]}, workload.calls) for impl in impls
            }
            gw = rows["gateway"]
            report["latency"][str(size)]["gateway"]["tokens"] = float(gw[-1]["tokens"])
            report["gateway_parts"][str(size)] = {
                "chat_ms": median([1e3 * (c - s) for r in gw for c, s in zip(r["chat"], r["server"], strict=True)]),
                "json_ms": median([1e3 * j for r in gw for j in r["json"]]),
            }
        impls = [impl for impl in impls if impl not in fronts]  # calls/s and faults: chat completions
        for size in [int(s) for s in args.concurrency_sizes.split(",") if s]:
            workload = Workload.for_size(size, args.calls)
            post_json(url + "/configure", workload.as_dict())
            for level in [int(c) for c in args.concurrency.split(",") if c]:
                runs: dict[str, list[float]] = {impl: [] for impl in impls}
                before = process_usage(PIDS[gateway])
                tails: list[tuple[float, float]] = []
                for repeat in range(args.throughput_repeats):
                    shift = repeat % len(impls)
                    for impl in impls[shift:] + impls[:shift]:
                        label = f"{SIZES.get(size, size)} x{level} {impl} ({repeat + 1})"
                        print(f"  calls/s {label} ...", file=sys.stderr, flush=True)
                        command = {"op": "throughput", "workload": workload.as_dict(), "concurrency": level,
                                   "rollouts": args.min_rollouts, "url": url}  # fmt: skip
                        raw = workers[impl].call(command)
                        runs[impl].append(raw["calls"] / raw["wall"])
                        if impl == "gateway":
                            tails.append((raw["p50_ms"], raw["p99_ms"]))
                by = report["throughput"].setdefault(str(size), {})[str(level)] = {
                    impl: {"calls_per_s": median(rates), "runs": rates} for impl, rates in runs.items()
                }
                by["gateway"]["p50_ms"] = median([p50 for p50, _ in tails])
                by["gateway"]["p99_ms"] = median([p99 for _, p99 in tails])
                after = process_usage(PIDS[gateway])
                time.sleep(5)  # the engine-side connections close after 2 s idle; the clients' stay while they live
                by["gateway"]["process"] = {"before": before, "after": after, "after_5s": process_usage(PIDS[gateway])}
        if args.fault_rollouts:
            print(f"  faults: {args.fault_rollouts} rollouts at once ...", file=sys.stderr, flush=True)
            workload = Workload.for_size(args.fault_size, args.calls)
            report["faults"] = fault_run(workers["gateway"], url, tokenizer_dir, workload, args)
        if args.scale_workers:  # `tito serve` vs `--workers N`: Miles #1660's shape, and 1,000 rollouts (last)
            report["scale"] = scale_run(workers["gateway"], url, tokenizer_dir, args)
    if args.profile_gateway:
        report["profile"] = profile
    return report


def render(report: dict[str, Any]) -> str:
    """The tables and the last line."""
    lines = [
        "| size | tokens (direct / gateway) | TitoModel direct ms/call | gateway ms/call | gateway - direct | "
        "strands-sglang ms/call | gateway - strands-sglang | Gateway.call ms/call | client JSON ms/call |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, by in report["latency"].items():
        tito, gw, peer = by["tito"], by["gateway"], by.get("peer")
        parts = report["gateway_parts"][size]
        lines.append(
            f"| {SIZES.get(int(size), size)} | {int(tito['tokens'])} / {int(gw['tokens'])} | "
            f"{fmt(tito['client_ms'])} | {fmt(gw['client_ms'])} | {fmt(gw['client_ms'] - tito['client_ms'])} | "
            f"{fmt(peer['client_ms']) if peer else '-'} | "
            f"{fmt(gw['client_ms'] - peer['client_ms']) if peer else '-'} | "
            f"{fmt(parts['chat_ms'])} | {fmt(parts['json_ms'])} |"
        )
    fronts = sorted({impl for by in report["latency"].values() for impl in by if impl.startswith("gateway-")})
    if fronts:
        lines += ["", "| size | front | ms/call | front - direct | front - chat completions |", "|---|---|---|---|---|"]
        for size, by in report["latency"].items():
            for front in fronts:
                ms = by[front]["client_ms"]
                lines.append(
                    f"| {SIZES.get(int(size), size)} | {front.partition('-')[2]} | {fmt(ms)} | "
                    f"{fmt(ms - by['tito']['client_ms'])} | {fmt(ms - by['gateway']['client_ms'])} |"
                )
    lines += ["", "| size | concurrent rollouts | TitoModel direct calls/s | gateway calls/s | gateway / direct | "
              "gateway p50 / p99 ms per call | gateway RSS MiB, fds before -> after | strands-sglang calls/s |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for size, by_level in report["throughput"].items():
        for level, by in by_level.items():
            tito, gw = by["tito"]["calls_per_s"], by["gateway"]["calls_per_s"]
            peer = by.get("peer", {}).get("calls_per_s")
            use = by["gateway"]["process"]
            b, a, later = use["before"], use["after"], use["after_5s"]
            lines.append(
                f"| {SIZES.get(int(size), size)} | {level} | {fmt(tito, 0)} | {fmt(gw, 0)} | "
                f"{fmt(ratio(gw, tito))} | {fmt(by['gateway']['p50_ms'])} / {fmt(by['gateway']['p99_ms'])} | "
                f"{b['rss_mb']:.0f}, {b['fds']:.0f} -> {a['rss_mb']:.0f}, {a['fds']:.0f} (5 s later "
                f"{later['rss_mb']:.0f}, {later['fds']:.0f}) | {fmt(peer, 0)} |"
            )
    faults = report["faults"]
    if faults is not None:
        lines += [
            "",
            f"faults: {faults['rollouts']} rollouts at once, {faults['records']} records written in "
            f"{faults['wall_s']:.1f} s; record statuses {json.dumps(faults['statuses'])}; engine requests "
            f"{json.dumps(faults['engine_requests'])}; client HTTP statuses "
            f"{json.dumps(faults['client_http_statuses'])}; problems: {len(faults['problems'])}",
            *[f"  {problem}" for problem in faults["problems"][:20]],
        ]
    if report.get("scale"):
        lines += render_scale(report["scale"])
    lat1k = report["latency"].get("1000", {})
    thr = next((by["64"] for by in report["throughput"].values() if "64" in by), {})
    overhead = lat1k["gateway"]["client_ms"] - lat1k["tito"]["client_ms"] if lat1k else None
    calls = ratio(thr.get("gateway", {}).get("calls_per_s"), thr.get("tito", {}).get("calls_per_s"))
    lines += [
        "",
        f"gateway_overhead_ms_1k={fmt(overhead)} (target <= 1) gateway_calls_ratio_64={fmt(calls)} (target >= 0.8) "
        f"fault_problems={len(faults['problems']) if faults else '-'}",
    ]
    return "\n".join(lines)


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer-python", default="", help="python of a venv with strands-sglang (Python >= 3.12)")
    parser.add_argument("--no-peer", action="store_true", help="leave strands-sglang out")
    parser.add_argument("--sizes", default="1000,32000", help="target trajectory sizes for the per-call figures")
    parser.add_argument("--calls", type=int, default=8, help="model calls per rollout")
    parser.add_argument("--repeats", type=int, default=7, help="timed rollouts per size and client (after a warm-up)")
    parser.add_argument("--fronts", default="chat,responses,messages,gemini", help="the gateway's fronts for ms/call")
    parser.add_argument("--concurrency", default="64", help="concurrent rollouts for calls/s")
    parser.add_argument("--concurrency-sizes", default="1000", help="sizes for the calls/s runs")
    parser.add_argument("--throughput-repeats", type=int, default=3, help="runs per calls/s figure (the median)")
    parser.add_argument("--min-rollouts", type=int, default=128, help="rollouts per calls/s run at least")
    parser.add_argument("--fault-rollouts", type=int, default=1000, help="rollouts at once in the fault run (0: none)")
    parser.add_argument("--fault-rate", type=float, default=0.1, help="share of engine requests that misbehave")
    parser.add_argument("--fault-seed", type=int, default=7)
    parser.add_argument("--fault-size", type=int, default=1000, help="trajectory size of the fault run")
    parser.add_argument("--profile-gateway", default="", help="cProfile the gateway process: PATH.pstats + .txt")
    parser.add_argument("--json", default="", help="also write the figures as JSON here")
    add_scale_arguments(parser)
    args = parser.parse_args()
    if args.no_peer:
        args.peer_python = ""
    started = time.monotonic()
    report = run(args)
    load = os.getloadavg()
    print(
        f"gateway vs TitoModel direct vs strands-sglang, fake SGLang server, Qwen3 tokenizer; python "
        f"{platform.python_version()}, {os.cpu_count()} cpus, load average {load[0]:.2f} / {load[1]:.2f} at the end, "
        f"{time.monotonic() - started:.0f} s, {args.repeats} repeats, {args.calls} calls per rollout, calls/s the "
        f"median of {args.throughput_repeats} runs"
    )
    print(render(report))
    if args.profile_gateway:
        print(f"gateway profile: {report['profile']} (+ .txt)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if report["faults"] is not None and report["faults"]["problems"]:
        sys.exit(f"the fault run found {len(report['faults']['problems'])} problems (see above)")


if __name__ == "__main__":
    main()
