"""Builders of the Harbor tests: the example dataset, a scripted model that solves it with shell commands, configs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tito_core.backend import GenerateRequest
from tito_core.tokenizers import load_tokenizer

from ..runner.helpers import call, tokenizer_dir

EXAMPLES = Path(__file__).parents[2] / "examples" / "coding_tasks"
DATASET = EXAMPLES / "tasks"
AGENTS = Path(__file__).parent / "agents"

COMMANDS = {
    "/app/calc.py": "sed -i 's/a - b/a + b/' calc.py && cat calc.py",
    "/app/greeting.txt": "echo 'hello from tito' > greeting.txt",
    "/app/answer.txt": "echo yes > answer.txt",
    "/logs/verifier/reward.txt": "echo 1 > /logs/verifier/reward.txt",
    "/app/slow": "sleep 120",
}
"""The shell command the scripted model runs for each example task (known by the file its instruction names)."""


def solver(request: GenerateRequest, *, tool: str = "bash", arg: str = "command", **more: str) -> str:
    """The scripted model: the first call of a rollout runs its task's command with the harness's shell tool
    (``tool``, its command argument ``arg``), the next one ends the turn."""
    text = load_tokenizer(tokenizer_dir()).decode(list(request.input_ids))
    if "<tool_response>" in text or "PROBE " in text:
        return "Done."
    command = next(cmd for path, cmd in COMMANDS.items() if path in text)
    return call(tool, **{arg: command}, **more)


def codex_solver(request: GenerateRequest) -> str:
    """The scripted model for Codex CLI: its ``exec_command`` tool."""
    return solver(request, tool="exec_command", arg="cmd")


def claude_solver(request: GenerateRequest) -> str:
    """The scripted model for Claude Code: its ``Bash`` tool."""
    return solver(request, tool="Bash", description="Run it")


SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""mini-swe-agent's submission: the command whose first output line ends its run."""


def mini_solver(request: GenerateRequest) -> str:
    """The scripted model for mini-swe-agent: its task's command, then the submission."""
    text = load_tokenizer(tokenizer_dir()).decode(list(request.input_ids))
    if "<tool_response>" in text:
        return call("bash", command=SUBMIT)
    return solver(request)


def harbor_config(
    command: list[str],
    *,
    dataset: Path = DATASET,
    agent: dict[str, Any] | None = None,
    model: Any = solver,
    **rollout: Any,
) -> dict[str, Any]:
    """A config mapping on the scripted backend running ``command`` on a Harbor dataset (``agent``: more of
    ``[rollout.agent]``)."""
    tok = tokenizer_dir()
    return {
        "backend": "scripted",
        "tokenizer": tok,
        "backend_options": {"tokenizer": load_tokenizer(tok), "replies": [model] * 1000},
        "rollout": {
            "concurrency": 4,
            "tasks": {"harbor": str(dataset)},
            **rollout,
            "agent": {"command": command, "timeout_s": 300, **(agent or {})},
        },
    }


def make_task(root: Path, name: str, instruction: str, test_sh: str, **limits: float) -> Path:
    """A Harbor task folder ``root/name`` with this instruction and verifier (``agent`` / ``verifier`` timeouts)."""
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text(instruction)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh + "\n")
    tables = "".join(f"[{key}]\ntimeout_sec = {value}\n" for key, value in limits.items())
    (task / "task.toml").write_text('schema_version = "1.4"\n' + tables)
    return task


def script(name: str) -> list[str]:
    return [sys.executable, str(AGENTS / name)]
