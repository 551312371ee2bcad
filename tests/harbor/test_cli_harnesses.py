"""Codex CLI and Claude Code, unmodified, on the example Harbor tasks, each rollout in its own sandbox, on the
scripted model: each solves the solvable tasks (the verifier's reward 1) and gets 0 on the unsolvable one, with
both calls recorded. The nox session ``harbor`` installs them (``TITO_CODEX``, ``TITO_CLAUDE``: npm)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tito_core import rollout
from tito_core.backend import GenerateRequest
from tito_core.runner import read_records

from .helpers import AGENTS, claude_solver, codex_solver, harbor_config

pytest.importorskip("harbor", reason="the harbor package (Python 3.12+): run `nox -s harbor`")
CLIS = {"codex": ("TITO_CODEX", codex_solver), "claude": ("TITO_CLAUDE", claude_solver)}


@pytest.mark.parametrize("cli", sorted(CLIS))
def test_the_cli_solves_the_solvable_tasks_in_its_sandbox(cli: str, tmp_path: Path) -> None:
    variable, model = CLIS[cli]
    executable = os.environ.get(variable, "")
    if not (executable and Path(executable).exists()):
        pytest.skip(f"{cli} not installed ({variable}): run `nox -s harbor`")
    solve: Callable[[GenerateRequest], str] = model
    command = [sys.executable, str(AGENTS / "cli_agent.py"), cli]
    config = harbor_config(command, agent={"env": {variable: executable}}, model=solve)
    out = tmp_path / "out.jsonl"
    rollout(config, None, out)
    records = {r.task_id: r for r in read_records(out)}
    assert {task: r.reward for task, r in records.items()} == {
        "fix-add": 1.0,
        "write-greeting": 1.0,
        "impossible": 0.0,
    }, {task: r.status_reason for task, r in records.items()}
    assert all(r.status == "completed" and r.tokens.model_calls == 2 for r in records.values()), {
        task: (r.status, r.status_reason, r.tokens.model_calls) for task, r in records.items()
    }
