"""The set-ups that failed on their first call through the gateway, each with its real framework, on the scripted
backend: pydantic-ai with ``system_prompt`` plus ``instructions`` and an output-validator retry, and LangChain's
``ChatOpenAI`` with two ``SystemMessage``s and ``with_structured_output``. Each records one branch."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel

from tito_core.config import TitoConfig
from tito_core.gateway import Gateway
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import load_qwen_tokenizer

from ..runner.helpers import call, tokenizer_dir


class GrammarBackend(ScriptedBackend):
    """A scripted backend that says it applies grammars (the script follows them)."""

    supports_grammar = True


class City(BaseModel):
    name: str
    population: int


@pytest.fixture
async def served() -> AsyncIterator[tuple[Gateway, GrammarBackend, Any]]:
    tokenizer = load_qwen_tokenizer("qwen3")
    backend = GrammarBackend(tokenizer, [])
    config = TitoConfig(backend="scripted", tokenizer=str(tokenizer_dir()), tool_parser="hermes")
    gateway = Gateway(config, tokenizer=tokenizer, backend=backend)
    await gateway.start()
    try:
        yield gateway, backend, tokenizer
    finally:
        await gateway.close()


async def test_pydantic_ai_system_prompt_instructions_and_an_output_validator_retry(served: Any) -> None:
    pydantic_ai = pytest.importorskip("pydantic_ai", reason="installed by the nox session `agents`")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    gateway, backend, tokenizer = served
    backend.add(call("add", a=2, b=3), "five", "The answer is 5.")
    rollout = gateway.open()
    model = OpenAIChatModel("tito", provider=OpenAIProvider(base_url=rollout.base_url, api_key=rollout.token))
    agent = pydantic_ai.Agent(model, system_prompt="You are terse.", instructions="Use the add tool for sums.")

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @agent.output_validator
    def has_digits(output: str) -> str:
        if not any(ch.isdigit() for ch in output):
            raise pydantic_ai.ModelRetry("Answer with the number in digits.")
        return output

    result = await agent.run("What is 2 + 3?")
    traj = await gateway.take(rollout.id)
    assert result.output == "The answer is 5."
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 3  # the call, "five", the retried answer
    first = tokenizer.decode(traj.token_ids[: traj.turns[0].prompt_start + traj.turns[0].prompt_len])
    assert "You are terse." in first and "Use the add tool for sums." in first
    last = traj.turns[2]
    retry = tokenizer.decode(traj.token_ids[last.prompt_start : last.prompt_start + last.prompt_len])
    assert "Answer with the number in digits." in retry  # the validator's feedback reached the model


async def test_langchain_two_system_messages_and_with_structured_output(served: Any) -> None:
    pytest.importorskip("langchain_openai", reason="installed by the nox session `agents`")
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    gateway, backend, tokenizer = served
    backend.add('{"name": "Paris", "population": 2102650}')
    rollout = gateway.open()
    chat = ChatOpenAI(model="tito", base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
    messages = [SystemMessage("You are a geographer."), SystemMessage("Answer in JSON."), HumanMessage("Largest?")]
    city = await chat.with_structured_output(City).ainvoke(messages)
    traj = await gateway.take(rollout.id)
    assert city == City(name="Paris", population=2102650)
    assert traj.branch == 0 and len(traj.turns) == 1 and traj.turns[0].constrained
    prompt = tokenizer.decode(backend.requests[0].input_ids)
    assert "<|im_start|>system\nYou are a geographer.\n\nAnswer in JSON.<|im_end|>" in prompt
