"""10,000 rollouts through ``tito serve --workers N --ray``, with engine faults, a killed worker and a weight update.

What runs (every process on 127.0.0.1, stopped at the end):

* the fake SGLang server (``fake_sglang.py``) with 1k-token rollouts of ``--calls`` calls, answering each
  generation with its weight version, ``--fault-rate`` of them misbehaving as ``gateway.py``'s fault run injects
  them (HTTP 500 and 503, a positive logprob, an out-of-vocabulary id, the connection closed);
* a local Ray cluster this script starts (``--no-ray``, or Ray not installed: worker processes instead);
* ``tito serve --workers N --ray ADDRESS -o OUTPUT``, the shipping command;
* ``--clients`` load processes (``gateway_client.py``'s ``tasks``), ``--concurrency`` rollouts in flight in all,
  each rollout an agent of ``--calls`` chat completions opened with its ``task_id`` (``t0`` ... ``tN-1``).

Mid-run, driven by the engine's count of clean answers (never a clock): once it reaches a quarter of the calls the
run would make without faults, worker 0's process is SIGKILLed (a Ray actor's death); at half, the driver runs
``weight_update([engine], version="1")`` (pause in keep mode, relabel, resume) and holds the engine paused until
``--hold`` generations wait on it. A weight update is the engines' business: every worker's calls go to the same
engines, which hold them while paused and label each answer with the version that generated it, so nothing has to
reach the gateway's workers.

Checks (any failure fails the script, naming the rollout and what is wrong; ``gateway_10k_checks.py``):

* every rollout has exactly one record (sample 0: nothing written twice), with a terminal status, even one whose
  opening was under way on the killed worker;
* every recorded output is one clean engine answer to the very prompt recorded before it (the engine's log of
  prompt hashes, as ``gateway.py`` checks); every 200 the clients got is its turn's output in the record;
* a rollout answered to its end is ``completed``; one whose worker was killed under it is ``failed``, "gateway
  worker lost" (written from the worker's journal), and was on the killed worker;
* weight versions: every turn is labelled with the version the engine generated it under, the engine served the
  new version only after the relabel, calls answered before the pause was sent are labelled ``default``, calls sent
  after the resume ``1``;
* the rerun: the same command again on the same output (run by this script after the first pass) runs only the
  rollouts without a record (none, after a whole first pass; those a killed run left, after an interrupted one),
  writes none twice, and leaves the records already written byte for byte;
* the supervisor's resident memory and open file descriptors after the run are within ``--rss-tolerance-mb`` and
  ``--fd-tolerance`` of where they were before it, and the workers' journals are gone (each read, then deleted).

Usage:
    python benchmarks/gateway_10k.py                                  # 10,000 rollouts x 4 calls, 2 Ray workers
    python benchmarks/gateway_10k.py --rollouts 2000 --json /tmp/2k.json
    python benchmarks/gateway_10k.py --rollouts 200 --no-ray          # the test's size, worker processes
    python benchmarks/gateway_10k.py --output runs/10k.jsonl          # keep the output: the same command resumes it
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import signal
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gateway import get_json, process_usage  # noqa: E402
from gateway_10k_checks import (  # noqa: E402
    LOST,
    Seen,
    Update,
    one_record_per_task,
    outcomes_match,
    outputs_are_clean_answers,
    unique_keys,
    versions_match,
)
from gateway_scale import cpu_seconds, served  # noqa: E402
from run import Worker, post_json  # noqa: E402
from workload import Workload  # noqa: E402

MIN_CHAOS = 16
"""Fewer rollouts to run than this (a resumed run's leftovers): no worker is killed and no weight update is made."""
RUN_TIMEOUT = 6 * 3600.0  # hang guards only
POLL_S = 0.02


def _ray_address(args: argparse.Namespace) -> str | None:
    """Start a local Ray cluster for the workers (None: worker processes)."""
    if args.no_ray:
        return None
    try:
        import ray
    except ImportError:
        print("gateway_10k: Ray is not installed: worker processes instead (pip install 'tito-core[ray]')",
              file=sys.stderr)  # fmt: skip
        return None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    for attempt in range(1, 4):  # Ray gives its raylet 30 s to register: not always enough on a loaded machine
        try:
            ray.init(num_cpus=max(args.workers, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
                     object_store_memory=128 * 1024 * 1024)  # fmt: skip
            break
        except Exception as exc:
            ray.shutdown()
            if attempt == 3:
                raise
            print(f"gateway_10k: Ray did not start ({exc}); again", file=sys.stderr, flush=True)
    return str(ray.get_runtime_context().gcs_address)


def _progress(engine: str) -> dict[str, Any]:
    with urllib.request.urlopen(engine + "/progress", timeout=60) as answer:
        result: dict[str, Any] = json.loads(answer.read())
    return result


async def _until(engine: str, key: str, at_least: int, clients: asyncio.Future[Any]) -> bool:
    """Poll the engine until ``key`` reaches ``at_least``; False if the clients ended first."""
    async with asyncio.timeout(RUN_TIMEOUT):
        while not clients.done():
            if (await asyncio.to_thread(_progress, engine))[key] >= at_least:
                return True
            await asyncio.sleep(POLL_S)
    return False


async def _chaos(args: argparse.Namespace, engine: str, victim: int, todo: int, clients: asyncio.Future[Any],
                 started: float) -> dict[str, Any]:  # fmt: skip
    """Kill the victim at a fifth of the calls, update the weights at two fifths; what happened, and when."""
    from tito_core import get_backend, weight_update

    happened: dict[str, Any] = {}
    expected = todo * args.calls  # the clean answers of a run without faults
    if not await _until(engine, "clean", expected // 5, clients):
        return happened
    happened["victim_cpu_s"] = cpu_seconds([victim])
    os.kill(victim, signal.SIGKILL)
    happened["killed_at_s"] = time.monotonic() - started
    happened["killed_pid"] = victim
    if not await _until(engine, "clean", 2 * expected // 5, clients):
        return happened
    old = (await asyncio.to_thread(_progress, engine))["version"]
    new = str(int(old) + 1) if old.isdigit() else "1"  # a rerun on the same engine relabels once more
    backend = get_backend("sglang", base_url=engine, session="off")
    try:
        pause_sent = time.monotonic()
        async with weight_update([backend], version=new):
            paused = time.monotonic()
            await _until(engine, "held", args.hold, clients)  # calls arrive while paused: they wait for the resume
            happened["held"] = (await asyncio.to_thread(_progress, engine))["held"]
            unpausing = time.monotonic()
        resumed = time.monotonic()
    finally:
        await backend.aclose()
    happened["update"] = asdict(Update(old, new, pause_sent, resumed))
    happened["update_at_s"] = pause_sent - started
    happened["pause_ms"] = 1e3 * (paused - pause_sent)
    happened["paused_s"] = unpausing - paused
    happened["resume_ms"] = 1e3 * (resumed - unpausing)
    return happened


async def _sample_rss(pid: int, clients: asyncio.Future[Any], into: list[float]) -> None:
    """The process's resident memory (MiB) about once a second until the clients are done (a figure, not a wait)."""
    while not clients.done():
        into.append(process_usage(pid)["rss_mb"])
        await asyncio.wait([clients], timeout=1.0)


def _settled(pid: int, before: dict[str, float], fd_tolerance: int) -> tuple[dict[str, float], float]:
    """The supervisor's usage once its fds are back within the tolerance, or at the deadline; how long that took.

    Its pooled connections to the workers (the door's client session) close after aiohttp's 15 s keep-alive.
    """
    started = time.monotonic()
    while True:
        usage = process_usage(pid)
        if usage["fds"] <= before["fds"] + fd_tolerance or time.monotonic() - started > 120:
            return usage, time.monotonic() - started
        time.sleep(0.25)


def _records(output: Path) -> list[Any]:
    from tito_core.records import read_records

    return list(read_records(output)) if output.exists() else []


async def one_pass(args: argparse.Namespace, engine: str, tokenizer_dir: str, output: Path, ray: str | None,
                   clients: list[Worker]) -> dict[str, Any]:  # fmt: skip
    """Run the rollouts of ``t0`` ... ``tN-1`` that have no record in ``output`` yet; check them; the figures."""
    workload = Workload.for_size(args.size, args.calls)
    done = {record.task_id for record in _records(output)}
    size_before = output.stat().st_size if output.exists() else 0
    digest_before = _digest(output, size_before)
    todo = [f"t{i}" for i in range(args.rollouts) if f"t{i}" not in done]
    chaos = len(todo) >= MIN_CHAOS and not args.no_chaos
    post_json(engine + "/faults", {"rate": args.fault_rate, "seed": args.fault_seed})  # and a fresh log
    report: dict[str, Any] = {"already_recorded": len(done), "to_run": len(todo), "chaos": chaos}
    exits: list[int] = []
    urls: list[str] = []
    opened = time.monotonic()
    with served(engine, tokenizer_dir, output, args.workers, ray=ray, exits=exits, urls=urls) as (front, pids):
        report["startup_s"] = time.monotonic() - opened
        supervisor, workers = pids[0], pids[1:]
        usage_before = process_usage(supervisor)
        client_pids = [client.process.pid for client in clients]
        cpu_before = {pid: cpu_seconds([pid]) for pid in [*pids, *client_pids]}
        started = time.monotonic()
        share = max(1, args.concurrency // len(clients))
        command = {"op": "tasks", "workload": workload.as_dict(), "url": engine, "gateway": front,
                   "concurrency": share}  # fmt: skip
        calls = [
            asyncio.to_thread(client.call, {**command, "task_ids": todo[i :: len(clients)]}, RUN_TIMEOUT)
            for i, client in enumerate(clients)
        ]
        running = asyncio.ensure_future(asyncio.gather(*calls))
        rss: list[float] = []
        sampling = asyncio.ensure_future(_sample_rss(supervisor, running, rss))
        happened = await _chaos(args, engine, workers[0], len(todo), running, started) if chaos else {}
        results = await running
        await sampling
        report["load_s"] = time.monotonic() - started
        cpu = {pid: happened.get("victim_cpu_s") if pid == workers[0] and chaos else cpu_seconds([pid]) for pid in
               cpu_before}  # fmt: skip
        spent = {pid: (cpu[pid] or cpu_before[pid]) - cpu_before[pid] for pid in cpu_before}
        report["cpu_s"] = {
            "gateway": sum(spent[pid] for pid in pids),
            "supervisor": spent[supervisor],
            "clients": sum(spent[pid] for pid in client_pids),
        }
        usage_after, settle_s = await asyncio.to_thread(_settled, supervisor, usage_before, args.fd_tolerance)
        report["supervisor"] = {"before": usage_before, "after": usage_after, "fds_settled_s": settle_s,
                                "rss_mb_peak": max(rss, default=0.0), "rss_mb_by_second": rss}  # fmt: skip
        stopping = time.monotonic()
    report["drain_s"] = time.monotonic() - stopping
    report.update(happened)
    seen = {row.task: row for row in (Seen.parse(raw) for result in results for raw in result["rollouts"])}
    log = get_json(engine + "/log")
    records = _records(output)
    mine = [record for record in records if record.task_id in seen]
    update = Update(**happened["update"]) if "update" in happened else None
    problems = one_record_per_task(mine, seen)
    problems += outputs_are_clean_answers(mine, log)
    problems += outcomes_match(mine, seen, urls[0] if "killed_pid" in happened else "")
    version_problems, report["calls_by_update"] = versions_match(mine, log, seen, update)
    problems += version_problems
    problems += unique_keys(records)
    if _digest(output, size_before) != digest_before:
        problems.append(f"the first {size_before} bytes of {output} (the records written before) changed")
    problems += _usage_problems(args, report, exits)
    if chaos and update is None:
        problems.append(f"the run ended before the worker was killed and the weights updated: {happened}")
    journals = output.with_name(output.name + ".journal")
    if journals.exists():
        problems.append(f"{journals} is still there: {sorted(p.name for p in journals.iterdir())}")
    report.update(_figures(seen, mine, log))
    if chaos and not report["lost_worker_rollouts"]:
        problems.append("no rollout was lost with the killed worker (none was open on it?)")
    report["problems"] = problems
    return report


def _digest(path: Path, size: int) -> str:
    """SHA-256 of the first ``size`` bytes of ``path``."""
    digest = hashlib.sha256()
    if size:
        with path.open("rb") as file:
            left = size
            while left:
                chunk = file.read(min(left, 1 << 20))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
    return digest.hexdigest()


def _usage_problems(args: argparse.Namespace, report: dict[str, Any], exits: list[int]) -> list[str]:
    problems = []
    if exits != [0]:
        problems.append(f"tito serve exited with {exits} after SIGTERM, not 0")
    use = report["supervisor"]
    grew_mb = use["after"]["rss_mb"] - use["before"]["rss_mb"]
    if grew_mb > args.rss_tolerance_mb:
        problems.append(f"the supervisor's RSS grew by {grew_mb:.1f} MiB (tolerance {args.rss_tolerance_mb} MiB)")
    fds = use["after"]["fds"] - use["before"]["fds"]
    if fds > args.fd_tolerance:
        problems.append(f"the supervisor holds {fds:.0f} more open fds than before the run (tolerance "
                        f"{args.fd_tolerance}, after waiting {use['fds_settled_s']:.0f} s)")  # fmt: skip
    return problems


def _figures(seen: dict[str, Seen], records: list[Any], log: dict[str, Any]) -> dict[str, Any]:
    return {
        "client_outcomes": dict(Counter(row.outcome.split()[0] for row in seen.values())),
        "client_outcomes_detailed": dict(Counter(row.outcome for row in seen.values())),
        "calls_answered": sum(len(row.calls) for row in seen.values()),
        "records": len(records),
        "statuses": dict(Counter(record.status for record in records)),
        "lost_worker_rollouts": sum(1 for r in records if (r.status_reason or "").startswith(LOST)),
        "engine_requests": dict(Counter(kind for _rid, kind, _digest, _turn in log["log"])),
    }


# ------------------------------------------------------------------------------------------ the run
async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the engine, Ray and the clients; the first pass, then the rerun; stop everything."""
    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer_dir = str(qwen_tokenizer_dir("qwen3"))
    report: dict[str, Any] = {"passes": []}
    with contextlib.ExitStack() as stack:
        argv = [sys.executable, str(HERE / "fake_sglang.py"), "--tokenizer", tokenizer_dir]
        engine_worker = Worker("fake server", argv, "PORT ")
        stack.callback(engine_worker.terminate, timeout=60, kill_timeout=30)
        engine = f"http://127.0.0.1:{int(engine_worker.first.split()[1])}"
        workload = Workload.for_size(args.size, args.calls)
        post_json(engine + "/configure", {**workload.as_dict(), "weight_versions": True})
        ray = _ray_address(args)
        if ray is not None:
            import ray as ray_module

            stack.callback(ray_module.shutdown)
        report["workers_on"] = f"Ray actors ({ray})" if ray else "processes"
        clients = []
        for _ in range(args.clients):
            argv = [sys.executable, str(HERE / "gateway_client.py"), tokenizer_dir]
            clients.append(Worker("load client", argv, "READY"))
            stack.callback(clients[-1].stop)
        if args.output:
            output = Path(args.output)
            output.parent.mkdir(parents=True, exist_ok=True)
        else:
            output = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tito-10k-"))) / "rollouts.jsonl"
        report["output"] = str(output)
        for number in range(1 if args.no_rerun else 2):
            print(f"  pass {number + 1} ({'the run' if not number else 'the rerun'}) ...", file=sys.stderr, flush=True)
            report["passes"].append(await one_pass(args, engine, tokenizer_dir, output, ray, clients))
        records = _records(output)
        recorded = {record.task_id for record in records}
        missing = [f"t{i}" for i in range(args.rollouts) if f"t{i}" not in recorded]
        report["file"] = {"records": len(records), "missing": len(missing)}
        report["file"]["problems"] = unique_keys(records) + (
            [f"{len(missing)} rollouts have no record after the rerun: {missing[:10]}"] if missing and not
            args.no_rerun else []
        )  # fmt: skip
    return report


def render(report: dict[str, Any], args: argparse.Namespace) -> str:
    """The summary lines."""
    lines = []
    for number, one in enumerate(report["passes"], 1):
        name = "run" if number == 1 else "rerun"
        rate = one["calls_answered"] / one["load_s"] if one["load_s"] else 0.0
        cpu = one["cpu_s"]
        use = one["supervisor"]
        lines.append(
            f"{name}: {one['to_run']} rollouts to run ({one['already_recorded']} already recorded), "
            f"{one['records']} records {json.dumps(one['statuses'])}; {one['calls_answered']} calls answered in "
            f"{one['load_s']:.1f} s = {rate:.0f} calls/s; engine requests {json.dumps(one['engine_requests'])}; "
            f"client outcomes {json.dumps(one['client_outcomes'])}"
        )
        if one["chaos"]:
            lines.append(
                f"  worker killed (SIGKILL, pid {one.get('killed_pid')}) at {one.get('killed_at_s', 0):.1f} s: "
                f"{one['lost_worker_rollouts']} rollouts written failed, '{LOST}'; weight update at "
                f"{one.get('update_at_s', 0):.1f} s: pause {one.get('pause_ms', 0):.0f} ms, paused "
                f"{one.get('paused_s', 0):.2f} s with {one.get('held', 0)} calls held, resume "
                f"{one.get('resume_ms', 0):.0f} ms; calls answered before / during / sent after it "
                f"{one['calls_by_update']['before']} / {one['calls_by_update']['during']} / "
                f"{one['calls_by_update']['after']}"
            )
        lines.append(
            f"  times: tito serve ready in {one['startup_s']:.1f} s, load {one['load_s']:.1f} s, drain "
            f"{one['drain_s']:.1f} s; CPU s: gateway {cpu['gateway']:.1f} (supervisor {cpu['supervisor']:.1f}), "
            f"clients {cpu['clients']:.1f}; supervisor RSS {use['before']['rss_mb']:.0f} -> "
            f"{use['after']['rss_mb']:.0f} MiB (peak {use['rss_mb_peak']:.0f}), fds {use['before']['fds']:.0f} -> "
            f"{use['after']['fds']:.0f} (after {use['fds_settled_s']:.0f} s)"
        )
        lines += [f"  PROBLEM {problem}" for problem in one["problems"][:30]]
        if len(one["problems"]) > 30:
            lines.append(f"  ... and {len(one['problems']) - 30} more")
    whole = report["file"]
    lines.append(f"file: {whole['records']} records for {args.rollouts} rollouts; problems: {len(whole['problems'])}")
    lines += [f"  PROBLEM {problem}" for problem in whole["problems"][:30]]
    return "\n".join(lines)


def problems(report: dict[str, Any]) -> int:
    """How many problems the checks found."""
    return sum(len(one["problems"]) for one in report["passes"]) + len(report["file"]["problems"])


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000, help="rollouts in all (task ids t0 ... tN-1)")
    parser.add_argument("--calls", type=int, default=4, help="model calls per rollout")
    parser.add_argument("--size", type=int, default=1000, help="a rollout's final tokens, about")
    parser.add_argument("--concurrency", type=int, default=512, help="rollouts in flight, over all the clients")
    parser.add_argument("--clients", type=int, default=2, help="load client processes")
    parser.add_argument("--workers", type=int, default=2, help="gateway workers (tito serve --workers N)")
    parser.add_argument("--no-ray", action="store_true", help="worker processes rather than Ray actors")
    parser.add_argument("--fault-rate", type=float, default=0.1, help="share of engine requests that misbehave")
    parser.add_argument("--fault-seed", type=int, default=7)
    parser.add_argument("--hold", type=int, default=16, help="calls the paused engine holds before the resume")
    parser.add_argument("--no-chaos", action="store_true", help="no worker killed, no weight update")
    parser.add_argument("--no-rerun", action="store_true", help="do not run the same command again at the end")
    parser.add_argument("--output", default="", help="the rollout file (kept; default: a temporary one)")
    parser.add_argument("--rss-tolerance-mb", type=float, default=64.0, help="the supervisor's RSS growth allowed")
    parser.add_argument("--fd-tolerance", type=int, default=4, help="the supervisor's open fds growth allowed")
    parser.add_argument("--json", default="", help="also write the figures as JSON here")
    args = parser.parse_args()
    if args.workers < 2 and not args.no_chaos:
        parser.error("--workers must be 2 or more: one is killed mid-run (or --no-chaos)")
    if args.clients < 1 or args.concurrency < 1 or args.rollouts < 1:
        parser.error("--clients, --concurrency and --rollouts must be 1 or more")
    load_before = os.getloadavg()
    started = time.monotonic()
    report = asyncio.run(run(args))
    load = os.getloadavg()
    report["wall_s"] = time.monotonic() - started
    report["load_average"] = {"before": load_before[0], "end": load[0]}
    report["args"] = vars(args)
    print(
        f"gateway {args.rollouts:,} rollouts x {args.calls} calls, {args.workers} workers as {report['workers_on']}, "
        f"{args.clients} clients x {max(1, args.concurrency // args.clients)} in flight, fault rate {args.fault_rate}; "
        f"python {platform.python_version()}, {os.cpu_count()} cpus, load average {load_before[0]:.2f} before, "
        f"{load[0]:.2f} at the end; {report['wall_s']:.0f} s in all"
    )
    print(render(report, args))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    found = problems(report)
    if found:
        sys.exit(f"gateway_10k: the checks found {found} problems (see above)")
    print("gateway_10k: every check passed")


if __name__ == "__main__":
    main()
