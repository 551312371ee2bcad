"""The gateway's benchmark client: the workload's agent as a client of ``tito serve``, on one of its fronts.

``gateway_client.py TOKENIZER_DIR [FRONT]``: ``chat`` (chat completions, the default), ``responses`` (the Responses
API, the whole input replayed each call as the Agents SDK sends it), ``messages`` (Anthropic Messages) or ``gemini``
(Google's Gemini API, ``generateContent``).

Speaks ``client.py``'s command protocol (one JSON command per stdin line, one ``RESULT <json>`` line back), so
``run.py``'s helpers drive it beside the ``tito`` and ``peer`` workers. A rollout is what any OpenAI agent does:
``POST /rollouts``, then chat calls on the rollout's ``base_url`` with the growing message list (the system and user
prompts and the ``lookup`` tool of ``workload.py``; each assistant message replayed as the gateway returned it, each
tool call answered with the tool's text), until an answer without tool calls; then ``POST /rollouts/<id>/finish``.

The client is a bare aiohttp session posting the JSON the ``openai`` SDK would post: the SDK (httpx, pydantic
models) costs the client ~1-2 ms per call on this machine, more than the +1 ms the gateway itself may add, and the
figure wanted is the gateway's own. The client's JSON encode and decode time is measured per call and reported.

Commands (``url``: the fake engine, for its handler times; ``gateway``: the gateway's base URL; both kept for
the next commands, so ``{"op": "connect", "gateway": URL}`` first lets ``run.py``'s ``latency_rows`` drive it):
    ``latency``: as ``client.py``; per call the POST wall time, the engine's handler time, the gateway's own
    ``Gateway.call`` time (``gateway_server.py``'s ``/_bench/times``) and the client's JSON time.
    ``throughput``: as ``client.py`` (C lanes, at least R rollouts, event-loop lag).
    ``faults``: ``rollouts`` rollouts at once, each ending at its first error answer (the gateway's OpenAI error
    JSON) or its answer; returns per rollout the HTTP statuses seen and the status of the record ``finish`` wrote.
    ``tasks``: the rollouts of ``task_ids`` (each opened with its ``task_id``), ``concurrency`` at a time, each to
    its end, its first error answer or its worker's loss (the connection broken); per rollout what the client saw
    (``benchmarks/gateway_10k.py`` checks it against the records).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
import warnings
from array import array
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from client import loop_lag, server_times
from workload import SYSTEM_PROMPT, USER_PROMPT, Workload, tool_blob

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look up a query in the knowledge base.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "what to look up."}},
            "required": ["query"],
        },
    },
}


RESPONSES_TOOL = {"type": "function", **LOOKUP["function"]}
MESSAGES_TOOL = {
    "name": "lookup",
    "description": LOOKUP["function"]["description"],
    "input_schema": LOOKUP["function"]["parameters"],
}
GEMINI_TOOL = {"functionDeclarations": [{"name": "lookup", "description": LOOKUP["function"]["description"],
                                         "parametersJsonSchema": LOOKUP["function"]["parameters"]}]}  # fmt: skip


class Chat:
    """The agent's conversation as chat-completions messages (the OpenAI SDK's JSON)."""

    path = "/chat/completions"

    def __init__(self) -> None:
        self.messages: list[Any] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": USER_PROMPT},
        ]
        self.calls: list[Any] = []

    def request(self) -> dict[str, Any]:
        """The next call's request body."""
        return {"model": "tito", "messages": self.messages, "tools": [LOOKUP]}

    def answered(self, answer: Any) -> list[str]:
        """Keep the answer; the queries of its tool calls."""
        message = {k: v for k, v in answer["choices"][0]["message"].items() if v is not None}
        self.messages.append(message)
        self.calls = message.get("tool_calls") or []
        return [json.loads(call["function"]["arguments"])["query"] for call in self.calls]

    def results(self, texts: list[str]) -> None:
        """Answer the last tool calls with ``texts``."""
        for call, text in zip(self.calls, texts, strict=True):
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})


class Responses:
    """The conversation as Responses API input items, replayed whole (``store: false``, as the Agents SDK does)."""

    path = "/responses"

    def __init__(self) -> None:
        self.items: list[Any] = [{"role": "user", "content": USER_PROMPT}]
        self.calls: list[Any] = []

    def request(self) -> dict[str, Any]:
        """The next call's request body."""
        return {"model": "tito", "instructions": SYSTEM_PROMPT, "input": self.items, "tools": [RESPONSES_TOOL],
                "store": False}  # fmt: skip

    def answered(self, answer: Any) -> list[str]:
        """Keep the answer; the queries of its tool calls."""
        self.items += answer["output"]
        self.calls = [item for item in answer["output"] if item["type"] == "function_call"]
        return [json.loads(call["arguments"])["query"] for call in self.calls]

    def results(self, texts: list[str]) -> None:
        """Answer the last tool calls with ``texts``."""
        for call, text in zip(self.calls, texts, strict=True):
            self.items.append({"type": "function_call_output", "call_id": call["call_id"], "output": text})


class Messages:
    """The conversation as Anthropic Messages (the anthropic SDK's JSON)."""

    path = "/messages"

    def __init__(self) -> None:
        self.messages: list[Any] = [{"role": "user", "content": USER_PROMPT}]
        self.uses: list[Any] = []

    def request(self) -> dict[str, Any]:
        """The next call's request body."""
        return {"model": "tito", "system": SYSTEM_PROMPT, "messages": self.messages, "tools": [MESSAGES_TOOL],
                "max_tokens": 4096}  # fmt: skip

    def answered(self, answer: Any) -> list[str]:
        """Keep the answer; the queries of its tool calls."""
        self.messages.append({"role": "assistant", "content": answer["content"]})
        self.uses = [block for block in answer["content"] if block["type"] == "tool_use"]
        return [use["input"]["query"] for use in self.uses]

    def results(self, texts: list[str]) -> None:
        """Answer the last tool calls with ``texts``."""
        blocks = [
            {"type": "tool_result", "tool_use_id": use["id"], "content": text}
            for use, text in zip(self.uses, texts, strict=True)
        ]
        self.messages.append({"role": "user", "content": blocks})


class Gemini:
    """The conversation as Gemini contents (the google-genai SDK's JSON; the call ids sent back, as Gemini CLI does)."""

    path = "/models/tito:generateContent"  # under the rollout's /v1: the Python SDK's default API version

    def __init__(self) -> None:
        self.contents: list[Any] = [{"role": "user", "parts": [{"text": USER_PROMPT}]}]
        self.calls: list[Any] = []

    def request(self) -> dict[str, Any]:
        """The next call's request body."""
        return {"systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]}, "contents": self.contents,
                "tools": [GEMINI_TOOL]}  # fmt: skip

    def answered(self, answer: Any) -> list[str]:
        """Keep the answer; the queries of its function calls."""
        content = answer["candidates"][0]["content"]
        self.contents.append(content)
        self.calls = [part["functionCall"] for part in content["parts"] if "functionCall" in part]
        return [call["args"]["query"] for call in self.calls]

    def results(self, texts: list[str]) -> None:
        """Answer the last function calls with ``texts``."""
        parts = [
            {"functionResponse": {"id": call["id"], "name": call["name"], "response": {"output": text}}}
            for call, text in zip(self.calls, texts, strict=True)
        ]
        self.contents.append({"role": "user", "parts": parts})


FRONTS: dict[str, Callable[[], Any]] = {"chat": Chat, "responses": Responses, "messages": Messages, "gemini": Gemini}


class CallFailed(Exception):
    """The gateway answered a chat call with an error (its OpenAI error JSON)."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status


class GatewayClient:
    """Runs the workload's agent against the gateway (one shared aiohttp session)."""

    def __init__(self, tokenizer_dir: str, front: str = "chat") -> None:
        from transformers import AutoTokenizer

        if front not in FRONTS:
            raise SystemExit(f"front must be one of {sorted(FRONTS)}, not {front!r}")
        self.front = front

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.url = ""  # the fake engine
        self.gateway = ""
        self.session: Any = None
        self._blobs: dict[Workload, str] = {}

    def connect(self, url: str, gateway: str) -> None:
        """Remember the engine and the gateway (each when given)."""
        self.url, self.gateway = url or self.url, gateway or self.gateway

    async def _post(self, url: str, payload: Any, json_time: list[float], token: str = "") -> tuple[int, bytes, Any]:
        if self.session is None:  # one session for the worker's life, made on its event loop
            import aiohttp

            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
            self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=900))
        started = time.perf_counter()
        data = json.dumps(payload).encode()
        encoded = time.perf_counter()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        async with self.session.post(url, data=data, headers=headers) as answer:
            body = await answer.read()
            status = answer.status
        received = time.perf_counter()
        parsed = json.loads(body) if status < 400 else None
        json_time.append(encoded - started + time.perf_counter() - received)
        return status, body, parsed

    async def rollout(self, workload: Workload, row: dict[str, Any], task_id: str = "") -> dict[str, Any]:
        """One agent rollout through the gateway; per call figures appended to ``row``; returns the record."""
        blob = self._blobs.get(workload)
        if blob is None:
            blob = self._blobs[workload] = tool_blob(self.tokenizer, workload)
        scratch: list[float] = []
        status, body, opened = await self._post(
            f"{self.gateway}/rollouts", {"task_id": task_id} if task_id else {}, scratch
        )
        if status != 201:
            raise CallFailed(status, body)
        base, token = opened["base_url"], opened["token"]
        if "opened" in row:
            row["opened"] = opened
        conversation = FRONTS[self.front]()
        try:
            for _ in range(workload.calls + 2):
                request = conversation.request()
                sent, started = time.monotonic(), time.perf_counter()
                status, body, answer = await self._post(f"{base}{conversation.path}", request, row["json"], token)
                row["stream"].append(time.perf_counter() - started)
                row["statuses"].append(status)
                if status != 200:
                    raise CallFailed(status, body)
                if "calls" in row:  # the ``tasks`` command: when it was sent and answered, what it answered
                    tito = answer["tito"]
                    row["calls"].append([sent, time.monotonic(), output_digest(tito["output_ids"]), tito["branch"],
                                         tito["turn"]])  # fmt: skip
                queries = conversation.answered(answer)
                if not queries:
                    break
                conversation.results([f"Result for {query}: {blob}" for query in queries])
            row["finishing"] = True  # every call answered: what fails now is the finish
        finally:  # every rollout is finished, failed ones included: the gateway writes its record
            finish = f"{base.removesuffix('/v1')}/finish"  # on the rollout's own address (a worker's, with workers)
            status, body, record = await self._post(finish, {}, scratch, token)
            if status != 200:
                raise CallFailed(status, body)
        return dict(record)

    def drain(self) -> tuple[list[float], list[float]]:
        """The engine's handler times and the gateway's chat times since the last drain."""
        chat: list[float] = []
        try:
            with urllib.request.urlopen(self.gateway + "/_bench/times", timeout=30) as answer:
                chat = json.loads(answer.read())
        except urllib.error.HTTPError:  # `tito serve` itself (benchmarks/gateway_scale.py): no such route
            pass
        return server_times(self.url), chat

    async def latency(self, workload: Workload, repeats: int, warmup: bool = True) -> dict[str, Any]:
        """The ``latency`` command (rows shaped as ``client.py``'s, plus ``chat`` and ``json``)."""
        if warmup:
            await self.rollout(workload, _row())
        self.drain()
        rows = []
        for _ in range(repeats):
            row = _row()
            started = time.perf_counter()
            record = await self.rollout(workload, row)
            row["wall"] = time.perf_counter() - started
            row["server"], row["chat"] = self.drain()
            if len(row["server"]) != workload.calls or len(row["stream"]) != workload.calls:
                raise RuntimeError(f"gateway: {len(row['stream'])} calls, {len(row['server'])} engine calls")
            if record["status"] != "completed":
                raise RuntimeError(f"gateway: a clean rollout ended {record['status']}: {record['status_reason']}")
            row["tokens"] = record["tokens"]["total"]
            rows.append(row)
        return {"rows": rows}

    async def throughput(self, workload: Workload, concurrency: int, rollouts: int = 0) -> dict[str, Any]:
        """The ``throughput`` command: ``concurrency`` lanes, each running its share of ``rollouts`` in turn."""
        await self.rollout(workload, _row())  # warm-up
        self.drain()
        gc.collect()
        per_lane = max(1, -(-rollouts // concurrency))
        times: list[float] = []  # every call's POST wall time

        async def lane() -> None:
            for _ in range(per_lane):
                row = _row()
                await self.rollout(workload, row)
                times.extend(row["stream"])

        lags: list[float] = [0.0]
        monitor = asyncio.ensure_future(loop_lag(lags))
        started = time.perf_counter()
        try:
            await asyncio.gather(*(lane() for _ in range(concurrency)))
        finally:
            monitor.cancel()
        wall = time.perf_counter() - started
        server, _chat = self.drain()
        times.sort()
        p50, p99 = (1e3 * times[min(len(times) - 1, int(q * len(times)))] for q in (0.5, 0.99))
        return {"wall": wall, "calls": concurrency * per_lane * workload.calls, "server": sum(server), "lag": max(lags),
                "p50_ms": p50, "p99_ms": p99, "mean_ms": 1e3 * sum(times) / len(times)}  # fmt: skip

    async def faults(self, workload: Workload, rollouts: int) -> dict[str, Any]:
        """The ``faults`` command: ``rollouts`` rollouts at once, each to its end or its first error answer."""

        async def one(index: int) -> dict[str, Any]:
            row = _row()
            try:
                record = await self.rollout(workload, row, task_id=f"fault-{index}")
                return {"task_id": f"fault-{index}", "statuses": row["statuses"], "record_status": record["status"]}
            except CallFailed as exc:
                return {"task_id": f"fault-{index}", "statuses": row["statuses"], "error": str(exc)}

        started = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(rollouts)))
        return {"wall": time.perf_counter() - started, "rollouts": done}

    async def tasks(self, workload: Workload, task_ids: list[str], concurrency: int) -> dict[str, Any]:
        """The ``tasks`` command: each rollout's ``[task_id, rollout_id, worker, outcome, ended, calls]``.

        ``outcome``: ``finished`` (answered to its end, then finished), ``error <status>`` (a call answered an
        error; then finished), ``open <status or error>`` (the door did not open it), ``lost <error>`` (the
        connection to its worker broke during a call), ``lost at finish <error>`` (at the finish, every call
        answered). ``worker``: the worker's address; ``ended``: when the client was done with it;
        ``calls``: per call answered 200, ``[sent, answered]``, the output ids' digest, its branch and turn (times
        are ``time.monotonic()``, one clock for every process of this machine).
        """
        import aiohttp

        queue = deque(task_ids)
        done: list[list[Any]] = []

        async def lane() -> None:
            while queue:
                task = queue.popleft()
                row = {**_row(), "calls": [], "opened": {}}
                try:
                    await self.rollout(workload, row, task_id=task)
                    outcome = "finished"
                except CallFailed as exc:
                    outcome = f"error {exc.status}" if row["opened"] else f"open {exc.status}"
                except aiohttp.ClientError as exc:
                    at = "lost at finish" if row.get("finishing") else "lost" if row["opened"] else "open"
                    outcome = f"{at} {type(exc).__name__}: {str(exc)[:120]}"
                opened = row["opened"]
                worker = str(opened.get("base_url", "")).split("/rollouts/")[0]
                done.append([task, opened.get("id", ""), worker, outcome, time.monotonic(), row["calls"]])

        started = time.perf_counter()
        try:
            await asyncio.gather(*(lane() for _ in range(max(1, concurrency))))
        finally:  # its connections closed: the gateway's processes are left with none of this run's
            await self.aclose()
        return {"wall": time.perf_counter() - started, "rollouts": done}

    async def aclose(self) -> None:
        """Close the HTTP session (the next request makes a new one)."""
        if self.session is not None:
            await self.session.close()
            self.session = None


def output_digest(ids: list[int]) -> str:
    """A short digest of an output's ids (the same in the client and the checker)."""
    return hashlib.sha1(array("i", ids).tobytes()).hexdigest()[:20]


def _row() -> dict[str, Any]:
    return {"stream": [], "statuses": [], "json": [], "tool": 0.0, "tokenizer": 0.0, "bytes": 0, "tokens": 0}


def main() -> None:
    """Serve commands from stdin until EOF."""
    client = GatewayClient(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "chat")
    loop = asyncio.new_event_loop()
    print("READY", flush=True)
    handlers: dict[str, Callable[[dict[str, Any]], Any]] = {
        "latency": lambda c: client.latency(Workload(**c["workload"]), int(c["repeats"]), bool(c.get("warmup", True))),
        "throughput": lambda c: client.throughput(
            Workload(**c["workload"]), int(c["concurrency"]), int(c.get("rollouts", 0))
        ),
        "connect": lambda c: asyncio.sleep(0, {}),
        "faults": lambda c: client.faults(Workload(**c["workload"]), int(c["rollouts"])),
        "tasks": lambda c: client.tasks(Workload(**c["workload"]), list(c["task_ids"]), int(c["concurrency"])),
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        command = json.loads(line)
        try:
            client.connect(command.get("url", ""), command.get("gateway", ""))
            result = loop.run_until_complete(handlers[command["op"]](command))
            print("RESULT " + json.dumps(result), flush=True)
        except Exception as exc:  # reported to the runner, which decides
            print("ERROR " + json.dumps(f"{type(exc).__name__}: {exc}"), flush=True)
    loop.run_until_complete(client.aclose())
    loop.close()


if __name__ == "__main__":
    main()
