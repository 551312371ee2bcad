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


AGENT = (
    '<tool_call>\n{"name": "Agent", "arguments": {"description": "Add two numbers", "prompt": "Add 20 and 22 with Bash'
    ' and report the sum.", "subagent_type": "general-purpose", "run_in_background": false}}\n</tool_call>'
)


async def test_claude_code_with_a_sub_agent_records_one_branch_per_lineage(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    """Claude Code's ``Agent`` tool runs a sub-agent with a system prompt of its own, between two parent calls:
    parent (Agent call), sub-agent (Bash call), sub-agent (answer), parent (answer). The record keeps two
    lineages of two turns each, the parent's second call on the parent's branch (issue 48), not four branches."""

    def launch(rollout: Any) -> tuple[list[str], dict[str, str]]:
        env = {
            **os.environ,
            "HOME": str(tmp_path),
            "ANTHROPIC_BASE_URL": rollout.base_url.removesuffix("/v1"),
            "ANTHROPIC_API_KEY": rollout.token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        argv = [CLAUDE, "-p", "Ask a sub-agent to add 20 and 22.", "--model", "tito", "--allowedTools", "Bash", "Agent"]
        return argv, env

    replies = [AGENT, CALL, "The sum is 42.", "The answer is 42."]
    traj, out, err, code = await run_cli(qwen3_tokenizer, replies, tmp_path, launch)
    assert code == 0, (out + err)[-3000:]
    assert "The answer is 42." in out
    lineages = {0: traj, **{b.branch: b for b in traj.branches}}
    assert traj.branch == 0 and sorted(lineages) == [0, 1], [(b.branch, len(b.turns)) for b in traj.branches]

    def prompt(branch: Any, turn: int) -> str:
        t = branch.turns[turn]
        return str(qwen3_tokenizer.decode(branch.token_ids[t.prompt_start : t.prompt_start + t.prompt_len]))

    parent, sub = lineages[0], lineages[1]
    assert [len(parent.turns), len(sub.turns)] == [2, 2]
    assert parent.status == sub.status == "completed", (parent.status_reason, sub.status_reason)
    assert "cc_is_subagent=true" not in prompt(parent, 0) and "cc_is_subagent=true" in prompt(sub, 0)
    assert "Add 20 and 22 with Bash" in prompt(sub, 0)  # the sub-agent's task, from the parent's Agent call
    assert "42" in prompt(sub, 1).split("<tool_response>", 1)[-1]  # its Bash output
    assert "The sum is 42." in prompt(parent, 1)  # the sub-agent's answer handed back to the parent
