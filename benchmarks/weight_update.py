"""Benchmark of the weight-update handshake's client side: ``weight_update`` with rollouts in flight.

    python benchmarks/weight_update.py [--rollouts 256] [--updates 20] [--size 1000] [--calls 4]

``--rollouts`` agents (the bench workload, ``--calls`` model calls each) run on one SGLang backend against the
fast fake server while the driver runs ``async with weight_update([backend], version=n)`` every 50 ms: pause,
an empty block, relabel, resume (three requests the server acknowledges at once, so what is timed is tito's and
the HTTP client's side, on an event loop busy with the rollouts). Reports the handshake's wall time (median and
max) and the rollouts' throughput with and without the updates.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rollouts import lookup
from run import fake_server
from workload import SYSTEM_PROMPT, USER_PROMPT, Workload


async def _run(url: str, tokenizer: str, rollouts: int, updates: int) -> tuple[float, list[float]]:
    """Wall seconds of ``rollouts`` agents, and the handshake times (seconds) taken meanwhile."""
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager

    from tito_core import TitoModel, get_backend, load_tokenizer, weight_update

    tok = load_tokenizer(tokenizer)
    backend = get_backend("sglang", base_url=url, session="off")

    async def one() -> None:
        model = TitoModel(backend, tok)
        agent = Agent(model=model, tools=[lookup], system_prompt=SYSTEM_PROMPT, callback_handler=None,
                      conversation_manager=NullConversationManager())  # fmt: skip
        await agent.invoke_async(USER_PROMPT)
        model.reset()

    times: list[float] = []
    started = time.perf_counter()
    work = asyncio.gather(*(one() for _ in range(rollouts)))
    for version in range(1, updates + 1):
        if work.done() and rollouts:
            break
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        async with weight_update([backend], version=version):
            pass
        times.append(time.perf_counter() - t0)
    await work
    wall = time.perf_counter() - started
    await backend.aclose()
    return wall, times


def main() -> None:
    """Run the rollouts without updates, then with them, and print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=256)
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--size", type=int, default=1000, help="final trajectory tokens (about)")
    parser.add_argument("--calls", type=int, default=8, help="model calls per rollout")
    args = parser.parse_args()

    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer = str(qwen_tokenizer_dir("qwen3"))
    with fake_server(tokenizer, Workload.for_size(args.size, args.calls)) as url:
        _, idle = asyncio.run(_run(url, tokenizer, 0, args.updates))
        plain, _ = asyncio.run(_run(url, tokenizer, args.rollouts, 0))
        wall, times = asyncio.run(_run(url, tokenizer, args.rollouts, args.updates))
    print(f"weight update with {args.rollouts} rollouts in flight ({args.calls} calls, ~{args.size} tokens each):")
    print(
        f"  {len(times)} handshakes (pause, relabel, resume): median {1000 * statistics.median(times):.1f} ms, "
        f"max {1000 * max(times):.1f} ms (on an idle loop: median {1000 * statistics.median(idle):.2f} ms); "
        f"the rollouts took {wall:.2f} s with them, {plain:.2f} s without"
    )


if __name__ == "__main__":
    main()
