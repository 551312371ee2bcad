"""One benchmark client (``tito``, ``peer`` = strands-sglang, or ``noop``) serving commands from the runner.

``tito-httpx`` is tito sending through ``httpx.AsyncHTTPTransport`` (httpcore) instead of its own
connection pool, for comparison; ``tito-before`` is tito from another source tree (``run.py --baseline``, put
first on ``PYTHONPATH``), to compare a change with what it replaces in the same run; ``tito-sessions`` is tito
with ``session="on"`` (the fake server keeps sessions as SGLang does: only new ids are sent). Runs in the
interpreter that has the implementation installed (the peer needs Python >= 3.12), reads one
JSON command per line on stdin and answers one ``RESULT <json>`` line on stdout. Every command runs on
the same event loop, so shared HTTP clients stay warm between commands.

Commands:
    ``{"op": "latency", "workload": {...}, "repeats": R, "warmup": true, "url": URL}``: a warm-up
    rollout (unless ``warmup`` is false), then R rollouts one after the other; per model call the
    ``stream()`` wall time (first event requested to last event consumed by Strands, so it includes
    Strands' handling of the events) and the server's handler time; per rollout the ``invoke_async``
    wall time, the tool time, the tokenizer time and the bytes the stored trajectory takes.
    ``{"op": "throughput", "workload": {...}, "concurrency": C, "rollouts": R, "url": URL}``: C rollouts at
    once from this process (one model and agent each, one shared HTTP client), each of the C lanes starting
    its next rollout as the last ends until at least R have run (C when R is smaller); wall time, model
    calls, the largest event-loop lag (how late a 10 ms timer fired) while they ran, the process's CPU time
    (every thread; the server runs in its own process) and the garbage collector's collections per generation:
    figures that a busy machine moves far less than wall time.
    ``{"op": "profile", "workload": {...}, "repeats": R, "url": URL, "out": PATH, "concurrency": C}``: R rollouts
    under cProfile (after a warm-up), C at once (1 when absent); the stats go to ``PATH`` (``.pstats``) and the
    top 30 by own time to ``PATH`` + ``.txt``.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import sys
import time
import types
import urllib.request
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import (
    SYSTEM_PROMPT,
    USER_PROMPT,
    Workload,
    reasoning_text,
    tool_blob,
    tool_query,
)

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")


# -------------------------------------------------------------------------------------------- memory
_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.CodeType)


def deep_size(root: object) -> int:
    """Bytes held by ``root`` and everything it references (each object once; classes and code excluded)."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _SKIP):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


# ---------------------------------------------------------------------------------------- the server
def server_times(url: str) -> list[float]:
    """Handler times the fake server recorded since the last call (and clears them)."""
    with urllib.request.urlopen(url + "/stats", timeout=30) as answer:
        times: list[float] = json.loads(answer.read())
    return times


# --------------------------------------------------------------------------------------- the clients
class Timings:
    """What one rollout measured.

    ``cpu=False`` leaves out the per-call CPU time, which means nothing with other rollouts in the process (calls/s
    runs, profiles).
    """

    def __init__(self, cpu: bool = True) -> None:
        self.cpu = cpu
        self.stream: list[float] = []
        self.stream_cpu: list[float] = []
        self.tool: list[float] = []


def timed_stream(model: Any, timings: Timings) -> None:
    """Wrap ``model.stream`` (on the instance) to record each call's wall time and the process's CPU time in it.

    The CPU time is meaningful with one rollout at a time (the server runs in another process).
    """
    inner = model.stream

    async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        cpu = time.process_time() if timings.cpu else 0.0
        started = time.perf_counter()
        async for event in inner(*args, **kwargs):
            yield event
        timings.stream.append(time.perf_counter() - started)
        if timings.cpu:
            timings.stream_cpu.append(time.process_time() - cpu)

    model.stream = stream


def make_tool(blob: str, timings: Timings) -> Any:
    """The agent's one tool, returning ``blob``."""
    from strands import tool

    @tool
    def lookup(query: str) -> str:
        """Look up a query in the knowledge base.

        Args:
            query: what to look up.
        """
        started = time.perf_counter()
        out = f"Result for {query}: {blob}"
        timings.tool.append(time.perf_counter() - started)
        return out

    return lookup


def noop_events(tokenizer: Any, workload: Workload) -> list[list[dict[str, Any]]]:
    """The Strands events a token-in/token-out model emits for each turn of the workload, without tokens."""
    turns: list[list[dict[str, Any]]] = []
    for turn in range(workload.calls):
        events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
        events.append(
            {"contentBlockDelta": {"delta": {"reasoningContent": {"text": reasoning_text(tokenizer, workload, turn)}}}}
        )
        events.append({"contentBlockStop": {}})
        if turn < workload.calls - 1:
            events.append(
                {"contentBlockStart": {"start": {"toolUse": {"name": "lookup", "toolUseId": f"call-{turn}"}}}}
            )
            events.append(
                {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps({"query": tool_query(turn)})}}}}
            )
            events.append({"contentBlockStop": {}})
            stop = "tool_use"
        else:
            events.append({"contentBlockDelta": {"delta": {"text": "The answer is 42."}}})
            events.append({"contentBlockStop": {}})
            stop = "end_turn"
        events.append({"messageStop": {"stopReason": stop}})
        events.append(
            {
                "metadata": {
                    "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
                    "metrics": {"latencyMs": 0},
                }
            }
        )
        turns.append(events)
    return turns


def noop_model_class() -> type:
    """A Strands model that answers canned events: Strands' own per-call cost, the floor."""
    from strands.models.model import Model

    class NoopModel(Model):
        def __init__(self, turns: list[list[dict[str, Any]]]) -> None:
            self.turns = turns
            self.config: dict[str, Any] = {}

        def update_config(self, **model_config: Any) -> None:
            self.config.update(model_config)

        def get_config(self) -> dict[str, Any]:
            return self.config

        async def stream(
            self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kwargs: Any
        ) -> AsyncIterator[Any]:
            turn = sum(1 for message in messages if message["role"] == "assistant")
            for event in self.turns[min(turn, len(self.turns) - 1)]:
                yield dict(event)

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return NoopModel


class Client:
    """Builds agents for one implementation; keeps the shared HTTP client for the worker's lifetime."""

    def __init__(self, impl: str, tokenizer_dir: str) -> None:
        from transformers import AutoTokenizer

        self.impl = impl
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.tokenizer_seconds = 0.0
        if impl.startswith("tito"):  # tito calls the Rust backend itself (maybe on worker threads)
            try:
                import tito_core.render.renderer as tito_chat

                codec_name = "rust_codec"
            except ImportError:  # a --baseline tree from before the renderer left chat.py
                import tito_core.chat as tito_chat  # type: ignore[no-redef]

                codec_name = "_rust_codec"
            self._time_method(tito_chat.ChatRenderer, "_tokenizer_encode")
            self._time_method(tito_chat.ChatRenderer, "_tokenizer_decode")
            rust_codec = getattr(tito_chat, codec_name)

            def timed_codec(tokenizer: Any) -> tuple[Any, Any]:
                return tuple(self._timed(f) if f is not None else None for f in rust_codec(tokenizer))  # type: ignore[return-value]

            setattr(tito_chat, codec_name, timed_codec)
        else:
            self._time_method(self.tokenizer, "encode")
            self._time_method(self.tokenizer, "decode")
        self.url: str | None = None
        self.shared: Any = None
        self._noop_cache: dict[Workload, list[list[dict[str, Any]]]] = {}
        self._blob_cache: dict[Workload, str] = {}

    def _time_method(self, owner: Any, name: str) -> None:
        """Count the time spent in ``owner.<name>`` (tokenizing new text, detokenizing output)."""
        setattr(owner, name, self._timed(getattr(owner, name)))

    def _timed(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        """``inner``, adding its wall time to ``tokenizer_seconds`` (on whatever thread it runs)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.tokenizer_seconds += time.perf_counter() - started

        return timed

    def blob(self, workload: Workload) -> str:
        """The tool's answer for the workload (cached)."""
        if workload not in self._blob_cache:
            self._blob_cache[workload] = tool_blob(self.tokenizer, workload)
        return self._blob_cache[workload]

    def connect(self, url: str) -> None:
        """Create the shared HTTP client for the server at ``url`` (once)."""
        if self.url == url:
            return
        self.url = url
        if self.impl.startswith("tito"):
            from tito_sglang import SGLangBackend

            transport = None
            if self.impl == "tito-httpx":
                import httpx

                transport = httpx.AsyncHTTPTransport(
                    limits=httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
                )
            # "off": every call sends the whole trajectory, as strands-sglang does; "tito-sessions" keeps each
            # rollout in a (fake) SGLang session and sends only the new ids.
            session = "on" if self.impl == "tito-sessions" else "off"
            self.shared = SGLangBackend(url, timeout=600.0, transport=transport, session=session)
        elif self.impl == "peer":
            from strands_sglang import SGLangClient

            self.shared = SGLangClient(url, max_retries=0, timeout=600.0)

    def model(self, workload: Workload) -> Any:
        """A fresh model for one rollout (sharing the HTTP client)."""
        if self.impl.startswith("tito"):
            from tito_core import TitoModel

            return TitoModel(self.shared, self.tokenizer, tool_parser="hermes")
        if self.impl == "peer":
            from strands_sglang import SGLangModel
            from strands_sglang.tool_parsers import HermesToolParser

            return SGLangModel(client=self.shared, tokenizer=self.tokenizer, tool_parser=HermesToolParser())
        if workload not in self._noop_cache:
            self._noop_cache[workload] = noop_events(self.tokenizer, workload)
        return noop_model_class()(self._noop_cache[workload])

    def stored(self, model: Any) -> tuple[int, int]:
        """(bytes held by the stored trajectory, its token count)."""
        if self.impl.startswith("tito"):
            traj = model.trajectory
            return deep_size(traj), len(traj)
        if self.impl == "peer":
            return deep_size(model.rollout), len(model.rollout.token_ids)
        return 0, 0

    async def rollout(self, workload: Workload, timings: Timings) -> tuple[float, Any]:
        """One agent rollout; returns its ``invoke_async`` wall time and the model."""
        from strands import Agent
        from strands.agent.conversation_manager import NullConversationManager

        model = self.model(workload)
        timed_stream(model, timings)
        agent = Agent(
            model=model,
            tools=[make_tool(self.blob(workload), timings)],
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            system_prompt=SYSTEM_PROMPT,
        )
        started = time.perf_counter()
        result = await agent.invoke_async(USER_PROMPT)
        wall = time.perf_counter() - started
        if result.stop_reason != "end_turn" or len(timings.stream) != workload.calls:
            raise RuntimeError(
                f"{self.impl}: rollout ended with {result.stop_reason} after {len(timings.stream)} calls"
            )
        return wall, model

    async def settle(self) -> None:
        """Close the SGLang sessions of finished rollouts now (tito with sessions).

        Otherwise they close whenever their models are collected: a burst of ``/close_session`` in a later
        measurement (at one rollout after 512: 38 calls/s instead of ~260).
        """
        sessions = getattr(self.shared, "sessions", None) if self.impl.startswith("tito") else None
        if sessions is not None:
            await sessions.aclose()

    async def latency(self, workload: Workload, repeats: int, warmup: bool = True) -> dict[str, Any]:
        """The ``latency`` command."""
        if warmup:
            await self.rollout(workload, Timings())
            await self.settle()
        self.drain()
        rows = []
        for _ in range(repeats):
            timings = Timings()
            self.tokenizer_seconds = 0.0
            wall, model = await self.rollout(workload, timings)
            tokenizer = self.tokenizer_seconds
            server = self.drain() or [0.0] * workload.calls
            if len(server) != workload.calls:
                raise RuntimeError(f"{self.impl}: {len(server)} server calls for {workload.calls} model calls")
            size, tokens = self.stored(model)
            rows.append(
                {
                    "wall": wall,
                    "stream": timings.stream,
                    "stream_cpu": timings.stream_cpu,
                    "server": server,
                    "tool": sum(timings.tool),
                    "tokenizer": tokenizer,
                    "bytes": size,
                    "tokens": tokens,
                }
            )
            del model
            await self.settle()  # after the row's figures: the close is not one of the calls timed
        return {"rows": rows}

    async def throughput(self, workload: Workload, concurrency: int, rollouts: int = 0) -> dict[str, Any]:
        """The ``throughput`` command: ``concurrency`` lanes, each running its share of ``rollouts`` in turn."""
        await self.rollout(workload, Timings())  # warm-up
        await self.settle()
        self.drain()
        gc.collect()
        per_lane = max(1, -(-rollouts // concurrency))

        async def lane() -> None:
            for _ in range(per_lane):
                await self.rollout(workload, Timings(cpu=False))

        lags: list[float] = [0.0]
        monitor = asyncio.ensure_future(loop_lag(lags))
        collections = [stats["collections"] for stats in gc.get_stats()]
        collector = GcTimer()
        cpu = time.process_time()
        started = time.perf_counter()
        try:
            with collector:
                await asyncio.gather(*(lane() for _ in range(concurrency)))
                await self.settle()  # closing the rollouts' sessions is part of their cost
        finally:
            monitor.cancel()
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu
        collections = [stats["collections"] - before for stats, before in zip(gc.get_stats(), collections, strict=True)]
        server = self.drain()
        calls = concurrency * per_lane * workload.calls
        return {
            "wall": wall,
            "calls": calls,
            "server": sum(server),
            "lag": max(lags),
            "cpu": cpu,
            "collections": collections,  # per generation, 0 to 2
            "gc_cpu": collector.seconds,
        }

    async def profile(self, workload: Workload, repeats: int, out: str, concurrency: int = 1) -> dict[str, Any]:
        """The ``profile`` command: ``repeats`` rollouts, ``concurrency`` at once, under cProfile (to ``out``)."""
        await self.rollout(workload, Timings())  # warm-up
        await self.settle()
        gc.collect()
        per_lane = max(1, -(-repeats // concurrency))

        async def lane() -> None:
            for _ in range(per_lane):
                await self.rollout(workload, Timings(cpu=False))

        profiler = cProfile.Profile()
        profiler.enable()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        await self.settle()
        profiler.disable()
        self.drain()
        profiler.dump_stats(out)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        Path(out + ".txt").write_text(text.getvalue())
        return {"pstats": out, "text": out + ".txt", "calls": concurrency * per_lane * workload.calls}

    async def aclose(self) -> None:
        """Close the shared HTTP client (no "Unclosed client session" warning at exit)."""
        close = getattr(self.shared, "aclose", None) or getattr(self.shared, "close", None)
        if close is not None:
            done = close()
            if asyncio.iscoroutine(done):
                await done

    def drain(self) -> list[float]:
        """The server's handler times since the last drain."""
        return server_times(self.url) if self.url and self.impl != "noop" else []


class GcTimer:
    """While entered, adds up the CPU time the garbage collector takes (every generation) in ``seconds``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


LAG_TICK = 0.01


async def loop_lag(lags: list[float]) -> None:
    """Append how late each 10 ms sleep wakes up (the event loop's lag) until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(LAG_TICK)
        lags.append(loop.time() - started - LAG_TICK)


def main() -> None:
    """Serve commands from stdin until EOF."""
    impl, tokenizer_dir = sys.argv[1], sys.argv[2]
    client = Client(impl, tokenizer_dir)
    loop = asyncio.new_event_loop()
    print("READY", flush=True)
    handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
        "latency": lambda c: client.latency(Workload(**c["workload"]), int(c["repeats"]), bool(c.get("warmup", True))),
        "throughput": lambda c: client.throughput(
            Workload(**c["workload"]), int(c["concurrency"]), int(c.get("rollouts", 0))
        ),
        "profile": lambda c: client.profile(
            Workload(**c["workload"]), int(c["repeats"]), str(c["out"]), int(c.get("concurrency", 1))
        ),
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        try:
            if command.get("url"):
                client.connect(command["url"])
            result = loop.run_until_complete(handlers[command["op"]](command))
            print("RESULT " + json.dumps(result), flush=True)
        except Exception as exc:  # reported to the runner, which decides
            print("ERROR " + json.dumps(f"{type(exc).__name__}: {exc}"), flush=True)
    loop.run_until_complete(client.aclose())
    loop.close()


if __name__ == "__main__":
    main()
