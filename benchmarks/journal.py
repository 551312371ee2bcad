"""What a gateway worker's write-ahead journal costs per model call, by trajectory size, with and without fsync.

A rollout of ``--calls`` calls grows to about each ``--sizes`` tokens, logprobs on every output token, in one of two
shapes: **workload** (the first prompt, then per call a tool result and an output of equal size, as ``workload.py``
shapes them: each call adds about an eighth of the trajectory) and **1k per call** (the first call brings it near
the size, each later call adds 1,000 tokens: a long agent's turn; sizes of 16k tokens and more). After each call the
journal line is appended (``Journal.answered``, what a worker does before it answers). Reported per size: the last
call's line (the trajectory at its full size) and the mean over the rollout's calls, the median of ``--repeats``
rollouts, in ms; the bytes the rollout's lines took; and the supervisor's side, the record rebuilt from the journal
(``lost_records``).

Usage: ``python benchmarks/journal.py [--sizes 1000,32000,137000] [--fsync] [--dir DIR]`` (``--dir``: where the
journal files go, on the disk to measure; a temporary folder by default). It imports ``tito_core`` from wherever it
is installed, so the same script measures two trees (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tito_core.gateway.journal import Journal, lost_records
from tito_core.trajectory import Trajectory, Turn, Usage

BASE_TOKENS = 330


class _Core:
    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory


class _Rollout:
    """What the journal reads of a gateway rollout."""

    def __init__(self, rollout_id: str) -> None:
        self.id = rollout_id
        self.task_id = rollout_id
        self.sample = 0
        self.group = 0
        self.started = time.time()
        self.metadata: dict[str, Any] = {}
        self.tool_calls = 0
        self.core = _Core(Trajectory(rollout_id))


def _call(traj: Trajectory, index: int, prompt: int, output: int) -> None:
    """Record one call: ``prompt`` new prompt tokens, ``output`` generated ones with float32-exact logprobs."""
    start = len(traj)
    traj.append("prompt", [(start + i) % 150000 for i in range(prompt)], turn=index)
    lps = [-(((start + i) * 7919) % 65536) / 4096 for i in range(output)]
    traj.append("output", [(start + prompt + i) % 150000 for i in range(output)], lps, turn=index)
    usage = Usage(prompt_tokens=start + prompt, completion_tokens=output)
    turn = Turn(index=index, rid=f"r{index}", prompt_start=start, prompt_len=prompt, output_len=output,
                finish_reason="stop", stop_reason="tool_use", usage=usage)  # fmt: skip
    traj.add_turn(turn)


def measure(size: int, calls: int, repeats: int, folder: Path, fsync: bool, per_call: int) -> dict[str, float]:
    """Per-call journal cost of rollouts growing to about ``size`` tokens (medians over ``repeats``).

    ``per_call``: the tokens each call after the first adds (half prompt, half output); 0: the workload's shape.
    """
    per = per_call // 2 if per_call else max(10, (size - BASE_TOKENS) // (2 * calls - 1))
    first = max(BASE_TOKENS, size - per * (2 * calls - 1)) if per_call else BASE_TOKENS
    last, mean, recover, written, tokens = [], [], [], [], 0
    for repeat in range(repeats):
        path = folder / f"journal-{size}-{repeat}.jsonl"
        journal = Journal(path, fsync=fsync)
        rollout = _Rollout(f"ro-{size}-{repeat}")
        journal.opened(rollout, "http://127.0.0.1:1")
        times = []
        for index in range(calls):
            _call(rollout.core.trajectory, index, first if index == 0 else per, per)
            started = time.perf_counter()
            journal.answered(rollout)
            times.append(time.perf_counter() - started)
        journal.close()
        tokens = len(rollout.core.trajectory)
        written.append(path.stat().st_size)
        started = time.perf_counter()
        (record,) = lost_records(path, set(), "gateway worker lost: benchmark")
        recover.append(time.perf_counter() - started)
        if record.trajectory.token_ids != rollout.core.trajectory.token_ids:
            raise SystemExit(f"size {size}: the journal gave back other tokens than the rollout's")
        path.unlink()
        last.append(times[-1])
        mean.append(sum(times) / len(times))
    return {
        "tokens": tokens,
        "last_ms": 1e3 * statistics.median(last),
        "mean_ms": 1e3 * statistics.median(mean),
        "bytes": statistics.median(written),
        "recover_ms": 1e3 * statistics.median(recover),
    }


def main() -> None:
    """Print one row per size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,32000,137000", help="trajectory sizes, tokens, comma separated")
    parser.add_argument("--calls", type=int, default=8, help="model calls per rollout")
    parser.add_argument("--repeats", type=int, default=7, help="rollouts per size (the median is reported)")
    parser.add_argument("--fsync", action="store_true", help="sync each journal line to the disk")
    parser.add_argument("--dir", default="", help="where the journal files go (default: a temporary folder)")
    args = parser.parse_args()
    import tito_core

    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="tito-journal-", dir=args.dir or None) as tmp:
        rows = [
            (shape, measure(size, args.calls, args.repeats, Path(tmp), args.fsync, per_call))
            for shape, per_call in (("workload", 0), ("1k per call", 1000))
            for size in sizes
            if size >= 2 * per_call * args.calls  # 1k per call: only where the first call is the larger part
        ]
    load = os.getloadavg()
    print(
        f"gateway journal per call, tito_core from {Path(tito_core.__file__).parent}, fsync {args.fsync}, "
        f"python {platform.python_version()}, {os.cpu_count()} cpus, load average {load[0]:.2f}"
    )
    print("| shape | tokens | last call ms | mean per call ms | journal bytes per rollout | recovery ms |")
    print("|---|---|---|---|---|---|")
    for shape, row in rows:
        print(f"| {shape} | {row['tokens']:,} | {row['last_ms']:.3f} | {row['mean_ms']:.3f} | {row['bytes']:,.0f} | "
              f"{row['recover_ms']:.1f} |")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
