"""A Strands agent with a calculator tool, rolled out by tito on the scripted backend (real Qwen3 ids)."""

from __future__ import annotations

import json
from typing import Any

from strands import Agent, tool

from tests.helpers import agent_for
from tito_core import TitoModel, Trajectory
from tito_testing.scripted import ScriptedBackend

SYSTEM = "Solve the problem. Use the calculator for arithmetic."


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers and + - * / ( )."""
    if set(expression) - set("0123456789+-*/(). "):
        return "Error: only numbers and + - * / ( ) are allowed"
    return str(eval(expression))


def call(expression: str) -> str:
    """The Hermes tool call Qwen3 emits for the calculator."""
    return (
        "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expression": expression}}) + "\n</tool_call>"
    )


def new_agent(model: TitoModel) -> Agent:
    return agent_for(model, [calculator], system_prompt=SYSTEM)


WEIGHT_VERSION = "7"
"""The weight version the scripted engine reports for every output token of :func:`solve`."""


async def solve(tokenizer: Any, question: str, expression: str, answer: str) -> Trajectory:
    """One rollout: a calculator call, then ``answer``; returns the closed trajectory."""
    replies = [call(expression), f"The answer is {answer}."]
    model = TitoModel(ScriptedBackend(tokenizer, replies, weight_version=WEIGHT_VERSION), tokenizer)
    await new_agent(model).invoke_async(question)
    return model.reset()


def tool_tokens(traj: Trajectory) -> int:
    """How many tokens after the first prompt are not model output (tool results and template glue)."""
    mask = traj.loss_mask[traj.prompt_length :]
    return len(mask) - sum(mask)
