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
}
"""The shell command the scripted model runs for each example task (known by the file its instruction names)."""


def solver(request: GenerateRequest) -> str:
    """The scripted model: the first call of a rollout runs its task's command, the next one ends the turn."""
    text = load_tokenizer(tokenizer_dir()).decode(list(request.input_ids))
    if "<tool_response>" in text or "PROBE " in text:
        return "Done."
    command = next(cmd for path, cmd in COMMANDS.items() if path in text)
    return call("bash", command=command)


def harbor_config(agent: list[str], *, dataset: Path = DATASET, **rollout: Any) -> dict[str, Any]:
    """A config mapping on the scripted backend running ``agent`` on a Harbor dataset."""
    tok = tokenizer_dir()
    return {
        "backend": "scripted",
        "tokenizer": tok,
        "backend_options": {"tokenizer": load_tokenizer(tok), "replies": [solver] * 1000},
        "rollout": {"concurrency": 4, "tasks": {"harbor": str(dataset)}, **rollout,
                    "agent": {"command": agent, "timeout_s": 300, **rollout.pop("agent", {})}},  # fmt: skip
    }


def script(name: str) -> list[str]:
    return [sys.executable, str(AGENTS / name)]
