"""A slime custom generate function: a Strands agent with a tool, rolled out token-in/token-out by tito.

    --custom-generate-function-path examples.slime.generate_with_tito.generate

Do not pass --apply-chat-template to slime: tito renders the chat template itself.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

from tito_core.trainers.slime import run_agent
from tito_sglang.slime import backend_from_slime_args


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers and + - * / ( )."""
    if set(expression) - set("0123456789+-*/(). "):
        return "Error: only numbers and + - * / ( ) are allowed"
    return str(eval(expression))


@cache
def tokenizer_for(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    async def run(model: Any) -> None:
        agent = Agent(
            model=model,
            tools=[calculator],
            system_prompt="Solve the problem. Use the calculator for arithmetic.",
            callback_handler=None,
            conversation_manager=NullConversationManager(),
        )
        await agent.invoke_async(sample.prompt)

    status = getattr(type(sample), "Status", None)
    return await run_agent(
        sample,
        sampling_params,
        backend=backend_from_slime_args(args),
        tokenizer=tokenizer_for(args.hf_checkpoint),
        run=run,
        status_enum=status,
    )
