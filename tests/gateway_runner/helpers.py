"""Builders of the agent-runner tests: configs on the scripted backend, a scripted model that calls ``add`` once
and then answers, callable agents and a reward."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.runner.helpers import call, tokenizer_dir, tool_turns
from tito_core.backend import GenerateRequest
from tito_core.tokenizers import load_tokenizer

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
    """A callable agent: one tool round with aiohttp, then the answer (its rollout's token as the api key)."""
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    async with aiohttp.ClientSession() as session:
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
