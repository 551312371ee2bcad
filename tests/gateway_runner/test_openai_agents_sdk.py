"""The second framework: the OpenAI Agents SDK example (examples/openai_agents_rollout) run by `tito rollout`.

The SDK's own OpenAI client talks to the runner's gateway; the model is the scripted backend. The records hold
the SDK's tool-call turns with the tool's real result in the next prompt, the example's rewards, a crashing agent's
failed record (the SDK raising on a call to a tool it does not have) and a timeout (a tool that never returns).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import msgspec
import pytest
from pydantic import BaseModel

from tito_core import Trajectory, arollout, rollout
from tito_core.config import load_config
from tito_core.runner import read_records
from tito_core.tokenizers import load_tokenizer

from ..runner.helpers import call, tokenizer_dir
from .helpers import EXAMPLE, HOUR, SkippingLoop, adds_then_answers, agent_config, run_skipping, script, until

pytest.importorskip("agents", reason="the OpenAI Agents SDK (openai-agents) is installed by the nox session `agents`")


def _model(request: object) -> str:
    """``adds_then_answers``, except that a request to multiply calls a tool the agent does not have."""
    text = load_tokenizer(tokenizer_dir()).decode(list(request.input_ids))  # type: ignore[attr-defined]
    if "Multiply" in text:
        return call("multiply", a=3, b=4)
    return adds_then_answers(request)  # type: ignore[arg-type]


def test_the_example_agent_gives_tool_turns_rewards_and_a_crash_record(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE))  # the example's reward.py, as its tito.toml names it
    example = load_config(EXAMPLE / "tito.toml")
    agent = msgspec.structs.replace(example.rollout.agent, command=[sys.executable, str(EXAMPLE / "agent.py")])
    scripted = agent_config({"command": ["unused"]}, [_model] * 100)
    config = msgspec.structs.replace(
        example,
        backend="scripted",
        tokenizer=scripted["tokenizer"],
        backend_options=scripted["backend_options"],
        rollout=msgspec.structs.replace(example.rollout, agent=agent, group_size=1, concurrency=4),
    )
    tasks = [line for line in (EXAMPLE / "tasks.jsonl").read_text().splitlines()]
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("\n".join([*tasks, '{"id": "mul", "prompt": "Multiply 3 by 4.", "answer": "12"}']) + "\n")
    out = tmp_path / "out.jsonl"
    summary = rollout(config, dataset, out)
    assert summary.statuses == {"completed": 3, "failed": 1}
    records = {r.task_id: r for r in read_records(out)}
    tokenizer = load_tokenizer(tokenizer_dir())
    for task_id, (a, b) in {"add-0": (17, 25), "add-1": (130, 7), "add-2": (9, 91)}.items():
        record = records[task_id]
        assert (record.status, record.reward) == ("completed", 1.0)
        assert (record.tokens.model_calls, record.tokens.tool_calls) == (2, 1)
        traj = Trajectory.from_record(record.trajectory)
        first, second = traj.turns
        assert first.tool_calls == 1 and second.tool_calls == 0
        prompt = tokenizer.decode(traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_len])
        assert f"<tool_response>\n{a + b}\n</tool_response>" in prompt  # the SDK ran the tool; its result came back
        system = tokenizer.decode(traj.token_ids[: traj.prompt_length])
        assert "Use the add tool for every sum" in system and '"name": "add"' in system
    crashed = records["mul"]
    assert crashed.status == "failed" and crashed.reward == 0.0 and crashed.tokens.model_calls == 1
    assert crashed.status_reason is not None
    assert crashed.status_reason.startswith("AgentExited: the agent exited with code 1; stderr tail: ")
    assert "multiply" in crashed.status_reason.splitlines()[-1]  # the SDK's own error, last in its traceback


def test_an_sdk_agent_stuck_in_a_tool_times_out(tmp_path: Path) -> None:
    """The limit runs out once the agent is in its tool (its one model call recorded), however long the SDK took to
    import: the test's clock jumps over the hour."""
    out, in_tool = tmp_path / "out.jsonl", tmp_path / "in_tool"
    agent = {"command": script("agents_sdk_hanging_tool.py"), "timeout_s": HOUR, "env": {"IN_TOOL_FILE": str(in_tool)}}
    cfg = agent_config(agent, [call("fetch", url="https://example.com")] * 10)

    async def main(loop: SkippingLoop) -> None:
        run = asyncio.ensure_future(arollout(cfg, _fetch(), out))
        await until(in_tool.exists, run, "the agent entered its tool")
        loop.skip(HOUR)
        async with asyncio.timeout(300):  # a hang guard (the clock runs on from here)
            await run

    run_skipping(main)
    (record,) = read_records(out)
    assert (record.status, record.status_reason) == ("aborted", f"timed out after {HOUR} s")
    assert record.tokens.model_calls == 1 and Trajectory.from_record(record.trajectory).turns[0].tool_calls == 1


def _fetch() -> list[dict[str, str]]:
    return [{"id": "fetch", "prompt": "Fetch example.com."}]


class Sum(BaseModel):
    total: int


async def test_the_sdk_default_model_with_an_output_type_gets_the_structured_answer(tmp_path: Path) -> None:
    """The Agents SDK on its default model (the Responses API) with ``output_type``: it asks for
    ``text.format`` json_schema, the engine decodes under the schema's grammar, the SDK parses the answer; one
    branch, the tool's result in the second prompt."""
    from agents import Agent, Runner, function_tool, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    from tito_core.config import TitoConfig
    from tito_core.gateway import Gateway
    from tito_testing.scripted import ScriptedBackend
    from tito_testing.tokenizers import load_qwen_tokenizer

    class GrammarBackend(ScriptedBackend):
        supports_grammar = True  # the script follows the grammar

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    tokenizer = load_qwen_tokenizer("qwen3")
    backend = GrammarBackend(tokenizer, [call("add", a=17, b=25), '{"total": 42}'])
    config = TitoConfig(backend="scripted", tokenizer=str(tokenizer_dir()), tool_parser="hermes")
    gateway = Gateway(config, tokenizer=tokenizer, backend=backend)
    await gateway.start()
    try:
        rollout = gateway.open()
        set_tracing_disabled(True)
        set_default_openai_client(AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0))
        agent = Agent(name="calc", instructions="Use the tool.", tools=[add], model="tito", output_type=Sum)
        result = await Runner.run(agent, "What is 17 + 25?", max_turns=4)
        traj = await gateway.take(rollout.id)
    finally:
        await gateway.close()
    assert result.final_output == Sum(total=42)
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2
    assert all(r.grammar is not None for r in backend.requests)  # the answer's schema (or a call) constrained both
    assert traj.turns[1].constrained
