"""Builders of the agent-runner tests: configs on the scripted backend, a scripted model that calls ``add`` once
and then answers, callable agents and a reward; an event loop whose clock a test moves forward."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from tests.runner.helpers import call, tokenizer_dir, tool_turns
from tito_core.backend import GenerateRequest
from tito_core.tokenizers import load_tokenizer

T = TypeVar("T")

AGENTS = Path(__file__).parent / "agents"
EXAMPLE = Path(__file__).parents[2] / "examples" / "openai_agents_rollout"


def adds_then_answers(request: GenerateRequest) -> str:
    """The model: the first call of a rollout asks ``add(2, N)`` for the question "What is 2 + N?", the next answers
    with the tool's result (read back from the prompt)."""
    tokenizer = load_tokenizer(tokenizer_dir())
    text = tokenizer.decode(list(request.input_ids))
    if not tool_turns(request, tokenizer):
        a, b = re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1]
        return call("add", a=int(a), b=int(b))
    result = re.findall(r"<tool_response>\s*(-?\d+)\s*</tool_response>", text)[-1]
    return f"The answer is {result}."


def agent_config(agent: dict[str, Any], replies: Any = None, **rollout: Any) -> dict[str, Any]:
    """A config mapping on the scripted backend with ``[rollout.agent] = agent``."""
    tok = tokenizer_dir()
    return {
        "backend": "scripted",
        "tokenizer": tok,
        "backend_options": {"tokenizer": load_tokenizer(tok), "replies": replies or [adds_then_answers] * 1000},
        "rollout": {"concurrency": 4, **rollout, "agent": agent},
    }


def script(name: str) -> list[str]:
    """The command running one of the test agents with this interpreter."""
    return [sys.executable, str(AGENTS / name)]


def add_tasks(n: int, **metadata: Any) -> list[dict[str, Any]]:
    return [
        {"id": f"t{i}", "prompt": f"What is 2 + {i}?", "answer": str(2 + i), "metadata": dict(metadata)}
        for i in range(n)
    ]


def number_reward(sample: Any) -> float:
    return 1.0 if str(sample.task.answer) in re.findall(r"-?\d+", sample.text) else 0.0


async def aiohttp_agent(task: Any, base_url: str, api_key: str) -> str:
    """A callable agent: one tool round with aiohttp, then the answer (its rollout's token as the api key). It sets
    no time limit of its own (aiohttp's default is 5 minutes): the runner's is the one a test runs out."""
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        for _ in range(3):
            async with session.post(
                base_url + "/chat/completions",
                json={"model": "tito", "messages": messages, "tools": [tool]},
                headers={"Authorization": f"Bearer {api_key}"},
            ) as response:
                response.raise_for_status()
                message = (await response.json())["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return str(message["content"])
            for c in message["tool_calls"]:
                args = json.loads(c["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": str(args["a"] + args["b"])})
    raise RuntimeError("no answer")


async def marks_its_stop_agent(task: Any, base_url: str, api_key: str) -> str:
    """:func:`aiohttp_agent`, which creates the file ``task.metadata["stopped"]`` when it is cancelled (stopped by
    its time limit)."""
    try:
        return await aiohttp_agent(task, base_url, api_key)
    except asyncio.CancelledError:
        Path(task.metadata["stopped"]).touch()
        raise


async def raising_agent(task: Any, base_url: str, api_key: str) -> str:
    raise LookupError(f"no such tool for {task.id}")


async def waiting_agent(task: Any, base_url: str, api_key: str) -> str:
    await asyncio.Event().wait()
    return ""


def sync_agent(task: Any, base_url: str, api_key: str) -> str:
    return ""


async def two_argument_agent(task: Any, base_url: str) -> str:  # the old shape: no token to reach its rollout
    return ""


def exactly_four(sample: Any) -> float:
    return 1.0 if sample.text == "4" else 0.0


def echo_text(sample: Any) -> float:
    """1.0 when the agent printed "hi", its task id and the task's ``metadata.cwd``."""
    return 1.0 if sample.text == f"hi {sample.task.id} {sample.task.metadata['cwd']}" else 0.0


HOUR = 3600
"""A rollout's time limit in the tests that end it: no machine is that slow, and the test's clock jumps over it
(:class:`SkippingLoop`) once the agent is where the limit must find it."""


class SkippingLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock a test moves forward: :meth:`skip` makes every timer (``asyncio.timeout``,
    ``asyncio.sleep``) due that many seconds earlier. A time limit then runs out when the test has seen what must
    happen before it, however slow the machine, through the runner's own ``asyncio.timeout``.

    Every other timer on the loop due within the skipped span fires too: the agents of these tests run in processes
    of their own, or set no time limit of theirs (:func:`aiohttp_agent`); the gateway's idle sweep reads
    ``time.monotonic``, which a skip does not move."""

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0.0

    def time(self) -> float:
        return super().time() + self.skipped

    def skip(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward (from a coroutine on this loop: its next turn runs the timers due)."""
        self.skipped += seconds


def run_skipping(main: Callable[[SkippingLoop], Coroutine[Any, Any, T]]) -> T:
    """Run ``main(loop)`` to its end on a :class:`SkippingLoop`."""
    with asyncio.Runner(loop_factory=SkippingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, SkippingLoop)
        return runner.run(main(loop))


async def until(seen: Callable[[], bool], run: asyncio.Future[Any], what: str) -> None:
    """Poll ``seen`` every 20 ms until it holds; fail if ``run`` ends first or after 300 s (a hang guard on the
    wall clock, which :meth:`SkippingLoop.skip` does not move)."""
    deadline = time.monotonic() + 300
    while not seen():
        if run.done():
            run.result()  # its error, if it raised
            raise AssertionError(f"the run ended before {what}")
        assert time.monotonic() < deadline, f"{what}: not within 300 s"
        await asyncio.sleep(0.02)
