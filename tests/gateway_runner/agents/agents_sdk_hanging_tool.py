"""An OpenAI Agents SDK agent whose one tool never returns: the runner's time limit must end it."""

from __future__ import annotations

import asyncio
import json
import os

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


@function_tool
async def fetch(url: str) -> str:
    """Fetch a page (this one never answers).

    Args:
        url: The page.
    """
    await asyncio.Event().wait()
    return ""


async def main() -> None:
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="tito", openai_client=AsyncOpenAI(max_retries=0))
    agent = Agent(name="fetcher", instructions="Fetch what you are asked for.", tools=[fetch], model=model)
    result = await Runner.run(agent, json.loads(os.environ["TITO_TASK"])["prompt"])
    print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
