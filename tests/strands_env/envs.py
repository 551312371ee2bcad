"""A small strands-env environment (an adder with one tool, an exact-answer reward) and a scripted engine for it.

Importable by path (``tests.strands_env.envs:...``) so ``tito rollout`` configs can name it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from strands import tool
from strands_env.core import Environment, RewardFunction, RewardResult, RolloutResult, Task

from tito_core.backend import GenerateRequest
from tito_core.integrations.strands_env import EnvironmentAdapter
from tito_testing.tokenizers import load_qwen_tokenizer

SYSTEM = "You add numbers with the add tool."


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class AddTask(Task):
    """A strands-env task subclass with a declared field, to check that the reward gets it back."""

    operands: list[int]


class ExactAnswer(RewardFunction[AddTask]):
    """1.0 when the final answer is the ground truth; keeps what it was given for the tests."""

    def __init__(self) -> None:
        self.seen: list[tuple[AddTask, RolloutResult]] = []

    async def compute(self, task: AddTask, result: RolloutResult) -> RewardResult:
        self.seen.append((task, result))
        text = (result.final_response or "").strip()
        return RewardResult(reward=1.0 if text == str(task.ground_truth) else 0.0, info={"text": text})


class AddEnv(Environment[AddTask]):
    """One tool, the reward of its constructor."""

    def get_tools(self) -> list[Any]:
        return [add]


class SetupEnv(AddEnv):
    """An environment with per-task setup, which tito rollout cannot reproduce."""

    async def reset(self, _task: AddTask) -> None:
        return None


def task(n: int, *, truth: int | None = None) -> AddTask:
    """``What is n + 10?`` with the right ground truth unless ``truth`` says otherwise."""
    return AddTask(id=f"add{n}", message=f"What is {n} + 10?", ground_truth=truth if truth is not None else n + 10,
                   operands=[n, 10])  # fmt: skip


def adder_reply(request: GenerateRequest) -> str:
    """The engine: a call to ``add`` for the last question, then the tool's result as the answer."""
    text = load_qwen_tokenizer("qwen3").decode(list(request.input_ids))
    results = re.findall(r"<tool_response>\s*(.*?)\s*</tool_response>", text, re.S)
    if results:
        return results[-1]
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1]
    return "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": int(a), "b": int(b)}}) + "\n</tool_call>"


def looping_reply(request: GenerateRequest) -> str:
    """An engine that never stops calling the tool."""
    return "<tool_call>\n" + json.dumps({"name": "add", "arguments": {"a": 1, "b": 1}}) + "\n</tool_call>"


REWARD = ExactAnswer()
env = EnvironmentAdapter(AddEnv, reward_fn=REWARD, system_prompt=SYSTEM)
limited = EnvironmentAdapter(AddEnv, reward_fn=REWARD, system_prompt=SYSTEM, max_tool_iters=2)


def boxed_reply(request: GenerateRequest) -> str:
    """An engine that boxes the sum of the last question."""
    text = load_qwen_tokenizer("qwen3").decode(list(request.input_ids))
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1]
    return f"The sum is \\boxed{{{int(a) + int(b)}}}."


def math_env() -> EnvironmentAdapter:
    """strands-env's own MathEnv (its MathVerifyReward, its system prompt), imported only when named."""
    from strands_env.environments.math import MathEnv

    return EnvironmentAdapter(MathEnv)


math = math_env()
