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

import os
from pathlib import Path
from typing import Any

import pytest

from .harness import check_tool_loop, run_cli

CLAUDE = os.environ.get("TITO_CLAUDE", "")
pytestmark = pytest.mark.skipif(
    not (CLAUDE and Path(CLAUDE).exists()), reason="Claude Code not installed: run `nox -s harnesses`"
)
CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "echo $((20 + 22))", "description": "Add"}}\n</tool_call>'
)


async def test_claude_code_records_its_tool_loop_on_one_branch(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    def launch(rollout: Any) -> tuple[list[str], dict[str, str]]:
        env = {
            **os.environ,
            "HOME": str(tmp_path),  # Claude Code keeps its settings and sessions under ~/.claude
            "ANTHROPIC_BASE_URL": rollout.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": rollout.token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no telemetry, no update checks: offline
        }
        return [CLAUDE, "-p", "What is 20 + 22? Use Bash.", "--model", "tito", "--allowedTools", "Bash"], env

    traj, out, err, code = await run_cli(qwen3_tokenizer, [CALL, "The answer is 42."], tmp_path, launch)
    assert code == 0, (out + err)[-3000:]
    assert "The answer is 42." in out
    check_tool_loop(traj, qwen3_tokenizer, out + err, "42")
