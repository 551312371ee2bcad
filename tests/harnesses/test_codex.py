"""Codex CLI (``@openai/codex``, npm), a coding harness that speaks only the Responses API, through the gateway.

``codex exec`` runs with a model provider whose base URL is a gateway rollout's and whose key is its token; the
model is the scripted backend: a call to Codex's own ``exec_command`` tool, then an answer. Codex runs the command
itself, sends its output back, and both calls must be recorded on one branch with the command's output in the
second prompt. The nox session ``harnesses`` installs the CLI (``TITO_CODEX``: its executable).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .harness import check_tool_loop, run_cli

CODEX = os.environ.get("TITO_CODEX", "")
pytestmark = pytest.mark.skipif(
    not (CODEX and Path(CODEX).exists()), reason="Codex CLI not installed: run `nox -s harnesses`"
)
CALL = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo $((20 + 22))"}}\n</tool_call>'


def codex(tmp_path: Path, *options: str) -> Any:
    """A launcher of ``codex exec`` (with ``options``) against a rollout, its home in ``tmp_path``."""
    home = tmp_path / "codex-home"
    home.mkdir()

    def launch(rollout: Any) -> tuple[list[str], dict[str, str]]:
        provider = f'{{name="tito", base_url="{rollout.base_url}", env_key="TITO_TOKEN", wire_api="responses"}}'
        command = [
            CODEX, "exec", "--skip-git-repo-check", "-m", "tito", "-c", 'model_provider="tito"',
            "-c", f"model_providers.tito={provider}",
            # Codex's hosted web search and its sub-agent and goal tools are not function tools: off
            "--disable", "multi_agent", "--disable", "goals", "-c", 'web_search="disabled"',
            # Codex's own sandbox runs commands through bubblewrap once `bwrap` is installed (the harbor session
            # installs it) and then needs its codex-linux-sandbox helper, which the npm package does not put on
            # PATH: "bwrap: execvp codex-linux-sandbox". This test is about the gateway, not Codex's sandbox.
            "--dangerously-bypass-approvals-and-sandbox", *options,
            "What is 20 + 22? Use the shell.",
        ]  # fmt: skip
        return command, {**os.environ, "CODEX_HOME": str(home), "TITO_TOKEN": rollout.token}

    return launch


async def test_codex_exec_records_its_tool_loop_on_one_branch(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    traj, out, err, code = await run_cli(qwen3_tokenizer, [CALL, "The answer is 42."], tmp_path, codex(tmp_path))
    assert code == 0, (out + err)[-3000:]
    assert "The answer is 42." in out + err
    check_tool_loop(traj, qwen3_tokenizer, out + err, "42")


async def test_codex_auto_compaction_records_a_continuation_linked_to_its_summary_call(
    qwen3_tokenizer: Any, tmp_path: Path
) -> None:
    """Codex compacts once its context passes ``model_auto_compact_token_limit``: a summary call (its history, a
    compaction prompt, no tools), then a new, shorter prompt holding the summary. The continuation is recorded as
    a ``compaction`` branch whose ``compacted_from`` names the summary call (issue 48, item 3), found from tokens:
    the summary's output ids are in the new prompt."""
    summary = "Summary: the user asked for 20 + 22 and the shell printed 42."
    replies = [CALL, summary, "The answer is 42."]
    launch = codex(tmp_path, "-c", "model_auto_compact_token_limit=3000")
    traj, out, err, code = await run_cli(qwen3_tokenizer, replies, tmp_path, launch)
    assert code == 0, (out + err)[-3000:]
    assert "The answer is 42." in out + err
    branches = {b.branch: b for b in traj.all_branches}
    assert traj.fork_kind == "compaction" and traj.compacted_from is not None, [
        (b.branch, b.fork_kind, b.fork_reason) for b in traj.all_branches
    ]
    source = branches[traj.compacted_from.branch]
    call = source.turns[traj.compacted_from.turn]
    at = call.prompt_start + call.prompt_len
    assert qwen3_tokenizer.decode(source.token_ids[at : at + call.output_len]).startswith(summary)
    first = traj.turns[0]
    assert summary in qwen3_tokenizer.decode(traj.token_ids[: first.prompt_start + first.prompt_len])
    assert traj.status == "completed" and len(branches) == 3  # the first call, the summary call, the continuation
