"""Codex CLI (``@openai/codex``, npm), a coding harness that speaks only the Responses API, through the gateway.

``codex exec`` runs with a model provider whose base URL is a gateway rollout's and whose key is its token; the
model is the scripted backend: a call to Codex's own ``exec_command`` tool, then an answer. Codex runs the command
itself, sends its output back, and both calls must be recorded on one branch with the command's output in the
second prompt. The nox session ``harnesses`` installs the CLI (``TITO_CODEX``: its executable).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from tito_core.config import TitoConfig
from tito_core.gateway import Gateway
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import qwen_tokenizer_dir

CODEX = os.environ.get("TITO_CODEX", "")
pytestmark = pytest.mark.skipif(
    not (CODEX and Path(CODEX).exists()), reason="Codex CLI not installed: run `nox -s harnesses`"
)
CALL = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo $((20 + 22))"}}\n</tool_call>'


async def test_codex_exec_records_its_tool_loop_on_one_branch(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, [CALL, "The answer is 42."])
    config = TitoConfig(backend="scripted", tokenizer=str(qwen_tokenizer_dir("qwen3")), tool_parser="hermes")
    gateway = Gateway(config, tokenizer=qwen3_tokenizer, backend=backend)
    await gateway.start()
    try:
        rollout = gateway.open(task_id="codex")
        provider = f'{{name="tito", base_url="{rollout.base_url}", env_key="TITO_TOKEN", wire_api="responses"}}'
        command = [
            CODEX, "exec", "--skip-git-repo-check", "-m", "tito", "-c", 'model_provider="tito"',
            "-c", f"model_providers.tito={provider}",
            # Codex's hosted web search and its sub-agent and goal tools are not function tools: off
            "--disable", "multi_agent", "--disable", "goals", "-c", 'web_search="disabled"',
            "What is 20 + 22? Use the shell.",
        ]  # fmt: skip
        home = tmp_path / "codex-home"
        home.mkdir()
        env = {**os.environ, "CODEX_HOME": str(home), "TITO_TOKEN": rollout.token}
        process = await asyncio.create_subprocess_exec(
            *command, env=env, cwd=tmp_path, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(process.communicate(), timeout=300)
        traj = await gateway.take(rollout.id)
    finally:
        await gateway.close()
    said = out.decode() + err.decode()
    assert process.returncode == 0, said[-3000:]
    assert "The answer is 42." in said
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2, (traj.branches, said[-2000:])
    assert traj.status == "completed", traj.status_reason
    second = traj.turns[1]
    prompt = qwen3_tokenizer.decode(traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_len])
    assert "42" in prompt.split("<tool_response>", 1)[-1]  # the command Codex ran, its output sent back
