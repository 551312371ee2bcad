"""Builders of the runner tests: a scripted-backend config, tools, rewards and small datasets."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import aiohttp

from tests.helpers import add as add  # the runner suite's configs name it tests.runner.helpers:add
from tito_core.backend import GenerateRequest
from tito_core.tokenizers import load_tokenizer
from tito_testing.tokenizers import qwen_tokenizer_dir

IM_END = "<|im_end|>"


def tokenizer_dir() -> str:
    return str(qwen_tokenizer_dir("qwen3"))


def tool_turns(request: GenerateRequest, tokenizer: Any) -> int:
    """How many tool results the prompt holds (the Qwen3 template wraps each in <tool_response>)."""
    return list(request.input_ids).count(tokenizer.convert_tokens_to_ids("<tool_response>"))


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def config(replies: Any, **rollout: Any) -> dict[str, Any]:
    """A config mapping on the scripted backend; ``replies`` is the backend's script (shared by all rollouts)."""
    tok = tokenizer_dir()
    return {
        "backend": "scripted",
        "tokenizer": tok,
        # the loaded tokenizer (cached per process), not its path: ScriptedBackend would load a path every run
        "backend_options": {"tokenizer": load_tokenizer(tok), "replies": replies},
        "rollout": {"concurrency": 4, **rollout},
    }


def answer_with(text: str, n: int = 1000) -> list[Any]:
    return [text] * n


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tasks(n: int) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "prompt": f"What is 2 + {i}?", "answer": str(2 + i)} for i in range(n)]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def contains_answer(sample: Any) -> float:
    return 1.0 if str(sample.task.answer) in sample.text else 0.0


async def async_length(sample: Any) -> float:
    await asyncio.sleep(0)
    return float(len(sample.text))


def sample_index(sample: Any) -> float:
    return float(sample.sample)


def raises_on_t1(sample: Any) -> float:
    if sample.task.id == "t1":
        raise ZeroDivisionError("boom")
    return 1.0


def raises_on_t1_sample_1(sample: Any) -> float:
    if (sample.task.id, sample.sample) == ("t1", 1):
        raise ZeroDivisionError("boom")
    return float(sample.sample)


PREPARED: list[str] = []


def prepare_records_call() -> None:
    PREPARED.append("called")


def group_fails(rewards: list[float | None]) -> list[float | None]:
    raise RuntimeError("group boom")


REWARD_THREADS: list[str] = []


def thread_reward(sample: Any) -> float:
    """Notes the thread it runs in."""
    REWARD_THREADS.append(threading.current_thread().name)
    return 1.0


async def async_thread_reward(sample: Any) -> float:
    """Notes the thread it runs in (the event loop's)."""
    REWARD_THREADS.append(threading.current_thread().name)
    return 1.0


def trained_once(traj: Any) -> int:
    """Check that ``training_branches`` trains every token generated in any branch exactly once; return the count.

    Counted independently of the exporters: the output segments of each branch past its shared prefix.
    """
    from tito_core.export import training_branches

    generated = sum(
        seg.length for b in traj.all_branches for seg in b.segments if seg.kind == "output" and seg.start >= b.fork_at
    )
    trained = sum(sum(s.trajectory.loss_mask[s.prompt_length :]) for s in training_branches(traj))
    assert trained == generated
    return generated


async def gc_threshold(sample: Any) -> float:
    """The collector's young-generation threshold while the rollout's reward runs."""
    return float(gc.get_threshold()[0])


def per_turn(sample: Any) -> Any:
    """One reward per model call: 0.5 for a call that asked for a tool, 1.0 for the answer (t1: as a mapping)."""
    rewards = [0.5 if turn.tool_calls else 1.0 for turn in sample.trajectory.turns]
    return {"turns": rewards, "total": 10.0} if sample.task.id == "t1" else rewards


def one_turn_short(sample: Any) -> Any:
    return [1.0] * (len(sample.trajectory.turns) - 1)


# ------------------------------------------------------------------------- agents through gateway workers
def served_by(request: GenerateRequest) -> str:
    """A scripted reply naming the process that generated it: a gateway worker's pid."""
    return f"served by {os.getpid()}"


def pid_of(answer: str) -> int:
    """The pid a :func:`served_by` reply names."""
    return int(re.findall(r"served by (\d+)", answer)[-1])


async def chat(session: aiohttp.ClientSession, base_url: str, token: str, messages: list[dict[str, Any]]) -> str:
    """One chat call on a rollout's endpoint; the answer is appended to ``messages`` and returned."""
    body = {"model": "m", "messages": messages}
    headers = {"Authorization": f"Bearer {token}"}
    async with session.post(f"{base_url}/chat/completions", json=body, headers=headers) as answer:
        answer.raise_for_status()
        content = str((await answer.json())["choices"][0]["message"]["content"])
    messages.append({"role": "assistant", "content": content})
    return content


class Hold:
    """Where :func:`held_agent` waits after its first call: ``arrived`` (task id, the pid that served it) until
    ``release`` is set; ``all_in`` is set once ``expected`` agents arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived: list[tuple[str, int]] = []
        self.all_in = asyncio.Event()
        self.release = asyncio.Event()


HOLD = Hold(0)


async def two_calls_agent(task: Any, base_url: str, api_key: str) -> str:
    """A callable agent: a call, then another after a user turn (held at :data:`HOLD` in between); a task with
    ``metadata.fail`` raises after its first call. Its answer is the last reply."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    async with aiohttp.ClientSession() as session:
        first = await chat(session, base_url, api_key, messages)
        if task.metadata.get("fail"):
            raise LookupError(f"no such tool for {task.id}")
        if task.metadata.get("hold"):
            HOLD.arrived.append((task.id, pid_of(first)))
            if len(HOLD.arrived) == HOLD.expected:
                HOLD.all_in.set()
            await HOLD.release.wait()
        messages.append({"role": "user", "content": "and again"})
        return await chat(session, base_url, api_key, messages)
