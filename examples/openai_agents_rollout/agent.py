"""An OpenAI Agents SDK agent with one function tool, run once per rollout by `tito rollout` through tito's gateway.

The runner starts this script with ``OPENAI_BASE_URL`` (the rollout's gateway URL), ``OPENAI_API_KEY`` (the rollout's
token) and ``TITO_TASK`` (the task as JSON) in its environment; the last line it prints is the answer the reward
function sees. Nothing here knows about tito: the SDK's own OpenAI client reads the two variables.

    pip install openai-agents
    tito rollout --config examples/openai_agents_rollout/tito.toml \
        --dataset examples/openai_agents_rollout/tasks.jsonl --output rollouts.jsonl
"""

from __future__ import annotations

import asyncio
import json
import os

from agents import Agent, Runner, function_tool, set_tracing_disabled


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def user_text(prompt: str | list[dict[str, str]]) -> str:
    """The task's question: its text, or the content of its last message."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


async def main() -> None:
    task = json.loads(os.environ["TITO_TASK"])
    set_tracing_disabled(True)  # the SDK would send traces to OpenAI's servers
    agent = Agent(
        name="calculator",
        instructions="Use the add tool for every sum, then answer with the number alone.",
        tools=[add],
        model="tito",  # the SDK's default: the Responses API, on the client that reads the two variables
    )
    result = await Runner.run(agent, user_text(task["prompt"]), max_turns=6)
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
