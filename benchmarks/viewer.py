"""`tito view` on large inputs: a 10,000-record file and a 100,000-token trajectory, drawn in Chromium.

Builds both files (Qwen3 tokenizer ids; two model calls per record; the long trajectory as 50 calls of 2,000
tokens), serves each with the viewer, and times in headless Chromium (Playwright, ``TITO_CHROMIUM``):

* the server reading the file (``FileSource``: every record, before it serves);
* the runs page: from navigation to the table drawn (the JSON of every row fetched, parsed, 200 rows drawn);
* the record page of the long trajectory: from navigation to its first tokens drawn (the whole record's JSON
  fetched, the turn blocks laid out, the chunks in view filled).

The targets (issue 37): each page within 2 s. ``nox -s bench_viewer`` runs it; ``nox -s browser`` at a tiny size.

    python benchmarks/viewer.py --records 10000 --tokens 100000 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--records", type=int, default=10_000, help="records in the many-records file")
    parser.add_argument("--tokens", type=int, default=100_000, help="tokens of the long trajectory")
    parser.add_argument("--repeats", type=int, default=3, help="page loads per measurement (the median is shown)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_viewer"), help="where the files are built")
    parser.add_argument("--chromium", default=None, help="the Chromium executable (default: TITO_CHROMIUM or Debian's)")
    return parser.parse_args(argv)


def _trajectory(rollout_id: str, turns: int, per_turn: int, rng: random.Random) -> Any:
    from tito_core.trajectory import Trajectory, Turn, Usage
    from tito_core.versions import VersionSpan

    traj = Trajectory(rollout_id)
    traj.append("prompt", [rng.randrange(200, 150_000) for _ in range(per_turn // 2)], turn=0)
    for k in range(turns):
        if k:
            traj.append("prompt", [rng.randrange(200, 150_000) for _ in range(per_turn // 4)], turn=k)
        start = len(traj)
        n = per_turn // 2
        traj.append(
            "output", [rng.randrange(200, 150_000) for _ in range(n)], [-rng.random() for _ in range(n)], turn=k
        )
        traj.add_turn(Turn(index=k, rid=f"r{k}", prompt_start=0, prompt_len=start, output_len=n, finish_reason="stop",
                           stop_reason="end_turn", usage=Usage(prompt_tokens=start, completion_tokens=n),
                           weight_versions=(VersionSpan(version=str(k % 3), start=0, end=n),)))  # fmt: skip
    return traj.close("completed")


def build(path: Path, records: int, turns: int, per_turn: int) -> Path:
    """A rollout file of ``records`` records of ``turns`` calls, ~``per_turn`` tokens per call."""
    from tito_core.records import open_writer, rollout_record

    if path.exists():
        return path
    rng = random.Random(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_writer(path) as writer:
        for n in range(records):
            task, sample = f"t{n // 8:05d}", n % 8
            traj = _trajectory(f"{task}:{sample}", turns, per_turn, rng)
            reward = float(rng.random() < 0.4)
            writer.write(rollout_record(traj, task_id=task, sample=sample, group=n // 8, reward=reward, server=None,
                                        started=0.0, wall_s=1.0, agent_s=1.0, tool_calls=turns - 1))  # fmt: skip
    return path


class Server:
    """The viewer of one file on a free loopback port, in a thread of its own (Playwright's sync API holds this one)."""

    def __init__(self, source: Any) -> None:
        self.source, self.url = source, ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        from aiohttp import web

        from tito_core.viewer import viewer_app

        runner = web.AppRunner(viewer_app(self.source), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    def __enter__(self) -> Server:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()


def page_time(browser: Any, url: str, drawn: str, repeats: int) -> float:
    """Median seconds from navigation to ``drawn`` (a function's source, true once the page is drawn)."""
    times = []
    for _ in range(repeats):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url)
        page.wait_for_function(drawn, timeout=120_000)
        times.append(page.evaluate("() => performance.now()") / 1000)
        page.close()
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    """Build, serve, measure, print one line per figure (and JSON on the last line)."""
    import os

    args = parse_args(argv)
    from playwright.sync_api import sync_playwright

    from tito_core.viewer import FileSource
    from tito_testing.tokenizers import load_qwen_tokenizer

    chromium = args.chromium or os.environ.get("TITO_CHROMIUM", "/usr/bin/chromium")
    tokenizer = load_qwen_tokenizer("qwen3")
    many = build(args.out / f"many-{args.records}.jsonl", args.records, 2, 200)
    long_turns = max(1, args.tokens // 2000)
    long = build(args.out / f"long-{args.tokens}.jsonl", 1, long_turns, args.tokens // long_turns * 4 // 3)
    figures: dict[str, float] = {}
    started = time.perf_counter()
    many_source = FileSource(many, tokenizer)
    figures["many_read_s"] = time.perf_counter() - started
    started = time.perf_counter()
    long_source = FileSource(long, tokenizer)
    figures["long_read_s"] = time.perf_counter() - started
    tokens = len(long_source.records[0].trajectory.token_ids)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        with Server(many_source) as server:
            figures["runs_page_s"] = page_time(browser, server.url + "/", "() => document.querySelectorAll('tr.run')"
                                               ".length > 0", args.repeats)  # fmt: skip
        with Server(long_source) as server:
            figures["record_page_s"] = page_time(browser, server.url + "/#/record/0", "() => document.querySelector("
                                                 "'.tokens .t')", args.repeats)  # fmt: skip
        browser.close()
    print(f"{args.records} records: read by the server in {figures['many_read_s']:.2f} s, runs page drawn in "
          f"{figures['runs_page_s']:.2f} s (target 2 s)")  # fmt: skip
    print(f"a {tokens}-token trajectory: read in {figures['long_read_s']:.2f} s, record page drawn in "
          f"{figures['record_page_s']:.2f} s (target 2 s)")  # fmt: skip
    print(json.dumps({"records": args.records, "tokens": tokens, **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
