"""Claude Code (``@anthropic-ai/claude-code``, npm: the CLI the Claude Agent SDK drives), a coding harness that
speaks the Anthropic Messages API, through the gateway.

``claude -p`` runs with ``ANTHROPIC_BASE_URL`` at a gateway rollout and the rollout's token as its key; the model
is the scripted backend: a call to Claude Code's own ``Bash`` tool, then an answer. Claude Code runs the command,
sends its output back as a ``tool_result``, and both calls must be recorded on one branch with the output in the
second prompt. It sends what real Claude Code sends: system blocks with cache control, a system message in the
history, ``thinking``, ``output_config`` and ``context_management``. The nox session ``harnesses`` installs the CLI
(``TITO_CLAUDE``: its executable).
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

CLAUDE = os.environ.get("TITO_CLAUDE", "")
pytestmark = pytest.mark.skipif(
    not (CLAUDE and Path(CLAUDE).exists()), reason="Claude Code not installed: run `nox -s harnesses`"
)
CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo $((20 + 22))", "description": "Add"}}\n</tool_call>'
)


async def test_claude_code_records_its_tool_loop_on_one_branch(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    backend = ScriptedBackend(qwen3_tokenizer, [CALL, "The answer is 42."])
    config = TitoConfig(backend="scripted", tokenizer=str(qwen_tokenizer_dir("qwen3")), tool_parser="hermes")
    gateway = Gateway(config, tokenizer=qwen3_tokenizer, backend=backend)
    await gateway.start()
    try:
        rollout = gateway.open(task_id="claude-code")
        env = {
            **os.environ,
            "HOME": str(tmp_path),  # Claude Code keeps its settings and sessions under ~/.claude
            "ANTHROPIC_BASE_URL": rollout.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": rollout.token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, no update checks: offline
        }
        command = [CLAUDE, "-p", "What is 20 + 22? Use Bash.", "--model", "tito", "--allowedTools", "Bash"]
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
    assert "The answer is 42." in out.decode()
    assert traj.branch == 0 and not traj.branches and len(traj.turns) == 2, (traj.branches, said[-2000:])
    assert traj.status == "completed", traj.status_reason
    second = traj.turns[1]
    prompt = qwen3_tokenizer.decode(traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_len])
    assert "42" in prompt.split("<tool_response>", 1)[-1]  # the command Claude Code ran, its output sent back
