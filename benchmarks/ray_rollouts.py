"""Benchmark of the Ray executor: rollouts/s of the local executor vs Ray with 1 and 2 workers, on the fake server.

    python benchmarks/ray_rollouts.py [--rollouts 512] [--concurrency 64] [--repeats 2] [--workers 1,2] [--gc tuned]

Needs ``pip install "tito-core[ray]"``. Starts the fast fake SGLang server (benchmarks/fake_sglang.py) and a local
Ray (``--num-cpus``, default: this machine's cores; a 128 MiB object store). Each configuration runs the same
tasks (``--rollouts`` rollouts, 4 model calls of ~1,000 tokens each) into a fresh JSONL file; ``rollout.concurrency``
is per worker (the local executor is one worker). The Ray workers are started and warmed up by a small run first
(their start, ~20 s on a busy 2-core machine, is paid once per executor and is not in the figures). The figure is
the run summary's rollouts/s (first rollout start to last record written, in the driver); the best of
``--repeats`` runs is printed, with every run's figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollouts import _config  # the runner benchmark's config: the fake server, the lookup tool
from run import fake_server
from workload import USER_PROMPT, Workload

HERE = Path(__file__).resolve().parent


def _measure(config: dict[str, Any], rollouts: int, executor: Any, repeats: int) -> list[float]:
    from tito_core import rollout

    group = config["rollout"]["group_size"]
    tasks = [{"id": str(i), "prompt": USER_PROMPT} for i in range(rollouts // group)]
    rates = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            summary = rollout(config, tasks, Path(tmp) / "r.jsonl", executor=executor)
        if summary.statuses != {"completed": summary.written} or summary.written != rollouts:
            raise RuntimeError(f"not every rollout completed: {summary.statuses}")
        rates.append(summary.rollouts_per_s)
    return rates


def main() -> None:
    """Measure each executor and print one row each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64, help="rollouts at once per worker")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", default="1,2", help="Ray worker counts to measure")
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--size", type=int, default=1000, help="final trajectory tokens (about)")
    parser.add_argument("--calls", type=int, default=4, help="model calls per rollout")
    parser.add_argument("--gc", default="tuned", help="rollout.gc of every run (the runner's default: tuned)")
    args = parser.parse_args()

    import ray

    from tito_core.runner import LocalExecutor
    from tito_core.runner.ray_executor import RayExecutor
    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer = str(qwen_tokenizer_dir("qwen3"))
    with fake_server(tokenizer, Workload.for_size(args.size, args.calls)) as url:
        ray.init(
            num_cpus=args.num_cpus,
            object_store_memory=128 * 1024 * 1024,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}},  # the workers import the `lookup` tool from here
        )
        try:
            config = _config(url, tokenizer, args.concurrency, 4, args.gc)
            print(
                f"{args.rollouts} rollouts of {args.calls} model calls (~{args.size} tokens) on the fake SGLang "
                "server; "
                f"concurrency {args.concurrency} per worker; {os.cpu_count()} cores, Ray num_cpus={args.num_cpus}"
            )
            print(f"{'executor':<16} {'rollouts/s':>10}   runs")
            rates = _measure(config, args.rollouts, LocalExecutor(args.concurrency), args.repeats)
            print(f"{'local':<16} {max(rates):>10.1f}   {', '.join(f'{r:.1f}' for r in rates)}", flush=True)
            for workers in [int(w) for w in args.workers.split(",") if w]:
                with RayExecutor(workers, concurrency=args.concurrency, num_cpus=args.num_cpus / workers) as executor:
                    _measure(config, 8 * workers, executor, 1)  # start and warm up the workers
                    rates = _measure(config, args.rollouts, executor, args.repeats)
                name = f"ray, {workers} worker{'s' if workers > 1 else ''}"
                print(f"{name:<16} {max(rates):>10.1f}   {', '.join(f'{r:.1f}' for r in rates)}", flush=True)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
