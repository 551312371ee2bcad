"""An OpenAI Agents SDK agent whose one tool never returns: the runner's time limit must end it.

Entering the tool, it creates the file ``$IN_TOOL_FILE``: the test's signal that its one model call is recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI


@function_tool
async def fetch(url: str) -> str:
    """Fetch a page (this one never answers).

    Args:
        url: The page.
    """
    Path(os.environ["IN_TOOL_FILE"]).touch()
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
