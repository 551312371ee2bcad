"""Gemini CLI (``@google/gemini-cli``, npm), a coding harness that speaks Google's Gemini API, through the gateway.

``gemini -p`` runs with ``GOOGLE_GEMINI_BASE_URL`` at a gateway rollout and the rollout's token as its
``GEMINI_API_KEY`` (sent as ``x-goog-api-key``); the model is the scripted backend: a call to Gemini CLI's own
``run_shell_command`` tool, then an answer. Gemini CLI runs the command, sends its output back as a
``functionResponse``, and both calls must be recorded on one branch with the output in the second prompt. It
streams (``streamGenerateContent?alt=sse``), declares its tools with ``parametersJsonSchema``, gives the calls its
own ids and signs them (``thoughtSignature``). ``--model`` is set, so no routing call is made; the settings file
picks the API-key sign-in (with ``GOOGLE_GEMINI_BASE_URL`` alone it picks a "gateway" sign-in that its own check
refuses: "Invalid auth method selected.") and turns off its usage statistics. The nox session ``harnesses``
installs the CLI (``TITO_GEMINI``: its executable).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import hermes_call

from .harness import check_tool_loop, run_cli

GEMINI = os.environ.get("TITO_GEMINI", "")
pytestmark = pytest.mark.skipif(
    not (GEMINI and Path(GEMINI).exists()), reason="Gemini CLI not installed: run `nox -s harnesses`"
)
# Gemini CLI refuses a command with a substitution ($((20 + 22))) as an injection
CALL = hermes_call("run_shell_command", {"command": "expr 20 + 22", "description": "Add"})
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
}


async def test_gemini_cli_records_its_tool_loop_on_one_branch(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    (home / ".gemini").mkdir(parents=True)
    work.mkdir()
    (home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))

    def launch(rollout: Any) -> tuple[list[str], dict[str, str]]:
        env = {
            **os.environ,
            "HOME": str(home),  # Gemini CLI keeps its settings and sessions under ~/.gemini
            "GOOGLE_GEMINI_BASE_URL": rollout.base_url.removesuffix("/v1"),
            "GEMINI_API_KEY": rollout.token,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",  # headless: no trust prompt for the working folder
            "TMPDIR": str(tmp_path),  # its error reports
        }
        return [GEMINI, "-p", "What is 20 + 22? Use the shell.", "--model", "tito", "--approval-mode", "yolo"], env

    traj, out, err, code = await run_cli(qwen3_tokenizer, [CALL, "The answer is 42."], work, launch)
    assert code == 0, (out + err)[-3000:]
    assert "The answer is 42." in out
    check_tool_loop(traj, qwen3_tokenizer, out + err, "42")
