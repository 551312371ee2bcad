"""Why one client makes more garbage-collector work than another under concurrency: collections and survivors.

Under many concurrent rollouts a client's calls per second follow its garbage-collector work, and that work
follows not what a call allocates but what it keeps alive across an ``await`` where other rollouts run: an
object allocated before such an await and freed after it dies once the generation-0 count has been reset by a
collection, so it adds one to the count and nothing takes it back. Two clients making the same allocations can
so differ in collections per call at 64 rollouts while being equal at one. This script measures both sides:

* **collections**: generation 0/1/2 collections per model call at concurrency 1 and ``--concurrency``
  (``--repeats`` throughput runs of ``--throughput-rollouts`` rollouts each, after a warm-up);
* **survivors** (one rollout at a time, collector off): the tracked objects alive at each engine request that
  were allocated since the previous call ended (``per call``), and those alive at a rollout's last request that
  were allocated since the rollout began (``per rollout``), counted by where they were allocated (``tracemalloc``:
  the innermost frame in the implementation's own package, else in Strands, else the innermost frame).

Each implementation runs in its own interpreter (the peer, strands-sglang, needs ``--peer-python``) against one
fake SGLang server (``fake_sglang.py``). Diagnostic figures, not a benchmark with a target.

Usage:
    python benchmarks/gc_survivors.py --peer-python /path/to/py312-venv/bin/python
    python benchmarks/gc_survivors.py --impls tito --size 300 --concurrency 2 --throughput-rollouts 2 --rollouts 1
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

OWN_PACKAGES = {"tito": ("tito_core", "tito_sglang"), "peer": ("strands_sglang",), "noop": ()}


def origin(obj: object, own: tuple[str, ...]) -> str:
    """Where ``obj`` was allocated: ``file:line`` of the innermost frame in ``own``, else in Strands, else any."""
    traceback = tracemalloc.get_object_traceback(obj)
    if traceback is None:
        return "(no tracemalloc trace)"
    frames = list(traceback)  # oldest first
    for marks in (own, ("strands/",)):
        for frame in reversed(frames):
            if marks and any(mark in frame.filename for mark in marks):
                return f"{frame.filename.split('site-packages/')[-1].split('src/')[-1]}:{frame.lineno}"
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}"


async def collections_per_call(client: Any, workload: Any, concurrency: int, rollouts: int, repeats: int) -> dict:
    """Collections per model call, by generation, over ``repeats`` throughput runs."""
    counts = [0, 0, 0]
    calls = 0
    for _ in range(repeats):
        run = await client.throughput(workload, concurrency, rollouts)
        counts = [total + n for total, n in zip(counts, run["collections"], strict=True)]
        calls += run["calls"]
    return {f"gen{g}": counts[g] / calls for g in range(3)} | {"calls": calls}


async def survivors(client: Any, workload: Any, impl: str, rollouts: int, top: int) -> dict:
    """Objects alive at each engine request (collector off), by origin: since the last call, since the rollout.

    ``gc.freeze()`` marks what is old: at the end of each call for the per-call count (``rollouts`` rollouts), at
    the start of each rollout for the per-rollout count at its last request (``rollouts`` more).
    """
    import aiohttp
    import client as bench

    own = OWN_PACKAGES[impl]
    state = {"mode": "", "call": 0}
    found: dict[str, collections.Counter[str]] = {"call": collections.Counter(), "rollout": collections.Counter()}
    counted = {"call": 0, "rollout": 0}
    request = aiohttp.ClientSession._request

    async def census(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        mode = state["mode"]
        if mode and method == "POST":
            state["call"] += 1
            if mode == "call" or state["call"] == workload.calls:
                gc.collect()
                found[mode].update(origin(obj, own) for obj in gc.get_objects())  # the frozen ones are not listed
                counted[mode] += 1
        return await request(self, method, *args, **kwargs)

    timed = bench.timed_stream

    def freezing(model: Any, timings: Any) -> None:
        timed(model, timings)
        inner = model.stream

        async def stream(*args: Any, **kwargs: Any) -> Any:
            async for event in inner(*args, **kwargs):
                yield event
            if state["mode"] == "call":  # what is alive now is this call's, not the next one's
                gc.collect()
                gc.freeze()

        model.stream = stream

    aiohttp.ClientSession._request = census
    bench.timed_stream = freezing
    gc.disable()
    tracemalloc.start(25)
    try:
        for mode in ("call", "rollout"):
            for _ in range(rollouts):
                gc.collect()
                gc.freeze()
                state.update(mode=mode, call=0)
                await client.rollout(workload, bench.Timings(cpu=False))
                state["mode"] = ""
                gc.unfreeze()
    finally:
        tracemalloc.stop()
        gc.enable()
        aiohttp.ClientSession._request = request
        bench.timed_stream = timed
    calls, done = max(1, counted["call"]), max(1, counted["rollout"])
    return {
        "per_call": sum(found["call"].values()) / calls,
        "per_rollout": sum(found["rollout"].values()) / done,
        "per_call_by_origin": {k: v / calls for k, v in found["call"].most_common(top)},
        "per_rollout_by_origin": {k: v / done for k, v in found["rollout"].most_common(top)},
    }


async def child(impl: str, url: str, tokenizer_dir: str, options: dict[str, Any]) -> dict[str, Any]:
    """One implementation's figures (run in its own interpreter)."""
    from client import Client
    from workload import Workload

    workload = Workload.for_size(options["size"])
    client = Client(impl, tokenizer_dir)
    client.connect(url)
    try:
        report: dict[str, Any] = {"impl": impl}
        await client.throughput(workload, options["concurrency"], options["throughput_rollouts"])  # warm-up
        for concurrency in (1, options["concurrency"]):
            rollouts = options["throughput_rollouts"] if concurrency > 1 else max(16, options["rollouts"])
            report[f"collections_x{concurrency}"] = await collections_per_call(
                client, workload, concurrency, rollouts, options["repeats"]
            )
        if impl != "noop":
            report["survivors"] = await survivors(client, workload, impl, options["rollouts"], options["top"])
        return report
    finally:
        await client.aclose()


def show(report: dict[str, Any]) -> None:
    """Print one implementation's figures."""
    print(f"== {report['impl']}")
    for key, row in report.items():
        if key.startswith("collections_"):
            figures = " ".join(f"{g} {row[g]:.4f}" for g in ("gen0", "gen1", "gen2"))
            print(f"  collections per call at {key.split('_x')[1]} rollouts: {figures} ({row['calls']} calls)")
    found = report.get("survivors")
    if found:
        print(f"  alive at the request: {found['per_call']:.1f} per call, {found['per_rollout']:.1f} per rollout")
        for title, key in (("per call", "per_call_by_origin"), ("per rollout", "per_rollout_by_origin")):
            print(f"  by origin, {title}:")
            for where, n in found[key].items():
                print(f"    {n:7.1f}  {where}")


def main() -> None:
    """Run each implementation in its own interpreter against one fake server."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="tito,peer,noop", help="comma-separated: tito, peer, noop")
    parser.add_argument("--peer-python", default="", help="an interpreter with strands-sglang (Python >= 3.12)")
    parser.add_argument("--size", type=int, default=1000, help="trajectory tokens per rollout")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--throughput-rollouts", type=int, default=256, help="rollouts per throughput run")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per concurrency")
    parser.add_argument("--rollouts", type=int, default=5, help="rollouts in the survivors count")
    parser.add_argument("--top", type=int, default=25, help="origins listed")
    parser.add_argument("--json", default="", help="also write the figures here")
    parser.add_argument("--child", nargs=3, metavar=("IMPL", "URL", "TOKENIZER_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    names = ("size", "concurrency", "throughput_rollouts", "repeats", "rollouts", "top")
    options = {name: getattr(args, name) for name in names}
    if args.child:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        print("RESULT " + json.dumps(asyncio.run(child(*args.child, options))), flush=True)
        return

    import run
    from workload import Workload

    from tito_testing.tokenizers import qwen_tokenizer_dir

    impls = [impl for impl in args.impls.split(",") if impl]
    unknown = set(impls) - set(OWN_PACKAGES)
    if unknown:
        parser.error(f"unknown implementations {sorted(unknown)}; known: {sorted(OWN_PACKAGES)}")
    if "peer" in impls and not args.peer_python:
        parser.error("the peer needs --peer-python (or leave it out of --impls)")
    tokenizer_dir = str(qwen_tokenizer_dir("qwen3"))
    reports = []
    with run.fake_server(tokenizer_dir, Workload.for_size(args.size)) as url:
        for impl in impls:
            python = args.peer_python if impl == "peer" else sys.executable
            argv = [python, __file__, "--child", impl, url, tokenizer_dir, *_forwarded(options)]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if done.returncode or not lines:
                sys.exit(f"{impl} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
            reports.append(json.loads(lines[-1][len("RESULT ") :]))
            show(reports[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(reports, indent=1))


def _forwarded(options: dict[str, Any]) -> list[str]:
    return [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]


if __name__ == "__main__":
    main()
