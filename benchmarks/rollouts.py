"""Benchmark of the rollout runner: rollouts/s and output tokens/s of ``tito_core.rollout`` on the fast fake server.

    python benchmarks/rollouts.py [--concurrency 64,512] [--rollouts-per-lane 4] [--size 1000] [--calls 4]
                                  [--gc tuned,default]

For each concurrency level it runs ``concurrency x rollouts-per-lane`` rollouts (tasks x group size) through
the runner into a fresh JSONL file, then the same rollouts as a bare loop (one Strands agent and TitoModel
per rollout under a semaphore, nothing written): the difference per rollout is the runner's own overhead
(datasets, routing, limits, records, stats), measured on a machine where the client is the bottleneck.
Each level runs once per ``rollout.gc`` setting (``--gc``); the bare loop runs under the same setting.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from strands import tool

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import fake_server
from workload import SYSTEM_PROMPT, USER_PROMPT, Workload


@tool
def lookup(query: str) -> str:
    """Look up a query in the knowledge base.

    Args:
        query: what to look up.
    """
    return f"Result for {query}: " + " ".join(f"fact{i}" for i in range(40))


def _config(url: str, tokenizer: str, concurrency: int, group_size: int, gc: str) -> dict[str, Any]:
    return {
        "backend": "sglang",
        "tokenizer": tokenizer,
        "backend_options": {"base_url": url, "session": "off"},  # the fake server has no sessions: no probe
        "rollout": {
            "group_size": group_size,
            "concurrency": concurrency,
            "system_prompt": SYSTEM_PROMPT,
            "tools": ["rollouts:lookup"],
            "gc": gc,
        },
    }


async def _bare(url: str, tokenizer: str, rollouts: int, concurrency: int, gc: str) -> tuple[float, int]:
    """The same rollouts without the runner (under the same ``rollout.gc``): wall seconds and output tokens."""
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager

    from tito_core import TitoModel, get_backend, load_tokenizer
    from tito_core.runner.collector import collector_for_rollouts

    tok = load_tokenizer(tokenizer)
    backend = get_backend("sglang", base_url=url, session="off")
    gate = asyncio.Semaphore(concurrency)
    output = 0

    async def one() -> None:
        nonlocal output
        async with gate:
            model = TitoModel(backend, tok)
            agent = Agent(
                model=model,
                tools=[lookup],
                system_prompt=SYSTEM_PROMPT,
                callback_handler=None,
                conversation_manager=NullConversationManager(),
            )
            await agent.invoke_async(USER_PROMPT)
            output += sum(model.reset().loss_mask)

    started = time.perf_counter()
    with collector_for_rollouts(gc):  # type: ignore[arg-type]
        await asyncio.gather(*(one() for _ in range(rollouts)))
    wall = time.perf_counter() - started
    await backend.aclose()
    return wall, output


def main() -> None:
    """Measure each concurrency level and print one row per level."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="64,512")
    parser.add_argument("--rollouts-per-lane", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--size", type=int, default=1000, help="final trajectory tokens (about)")
    parser.add_argument("--calls", type=int, default=4, help="model calls per rollout")
    parser.add_argument("--gc", default="tuned,default", help="rollout.gc settings to measure (comma-separated)")
    args = parser.parse_args()

    from tito_core import rollout
    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer = str(qwen_tokenizer_dir("qwen3"))
    with fake_server(tokenizer, Workload.for_size(args.size, args.calls)) as url:
        print(f"workload: {args.calls} model calls per rollout, ~{args.size} tokens; fake SGLang server at {url}")
        print(
            f"{'concurrency':>11} {'gc':>8} {'rollouts':>8} {'runner r/s':>10} {'out tok/s':>10} {'bare r/s':>9} "
            f"{'overhead':>12}"
        )
        for level in [int(c) for c in args.concurrency.split(",") if c]:
            rollouts = level * args.rollouts_per_lane
            tasks = [{"id": str(i), "prompt": USER_PROMPT} for i in range(rollouts // args.group_size)]
            for gc in [g for g in args.gc.split(",") if g]:
                with tempfile.TemporaryDirectory() as tmp:
                    config = _config(url, tokenizer, level, args.group_size, gc)
                    summary = rollout(config, tasks, Path(tmp) / "r.jsonl")
                bare_wall, _ = asyncio.run(_bare(url, tokenizer, summary.written, level, gc))
                overhead_ms = 1000 * (summary.wall_s - bare_wall) / summary.written
                print(
                    f"{level:>11} {gc:>8} {summary.written:>8} {summary.rollouts_per_s:>10.1f} "
                    f"{summary.output_tokens_per_s:>10,.0f} {summary.written / bare_wall:>9.1f} {overhead_ms:>9.2f} ms"
                )
                if summary.statuses != {"completed": summary.written}:
                    print(f"  statuses: {summary.statuses}")


if __name__ == "__main__":
    main()
