"""mini-swe-agent (PyPI, bash through LiteLLM) on the example Harbor tasks, each rollout in its own sandbox, on the
scripted model: it solves the solvable tasks (the verifier's reward 1), the unsolvable one gets 0, and every call is
recorded. The nox session ``harbor`` installs it (``TITO_MINI``: its ``mini`` executable)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tito_core import rollout
from tito_core.runner import read_records

from .helpers import harbor_config, mini_solver

MINI = os.environ.get("TITO_MINI", "")
pytest.importorskip("harbor", reason="the harbor package (Python 3.12+): run `nox -s harbor`")
pytestmark = pytest.mark.skipif(
    not (MINI and Path(MINI).exists()), reason="mini-swe-agent not installed: run `nox -s harbor`"
)
AGENT = Path(__file__).parents[2] / "examples" / "coding_tasks" / "mini_swe.py"


def test_mini_swe_agent_solves_the_solvable_tasks_in_its_sandbox(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    agent = {"env": {"TITO_MINI": MINI}}
    rollout_config = harbor_config([sys.executable, str(AGENT)], agent=agent, model=mini_solver, group_size=1)
    summary = rollout(rollout_config, None, out)
    records = {r.task_id: r for r in read_records(out)}
    assert summary.written == 3
    assert {task: r.reward for task, r in records.items()} == {"fix-add": 1.0, "write-greeting": 1.0, "impossible": 0.0}
    for record in records.values():
        # the task's command, then the submission: two calls recorded; the submission is a tool call no result
        # answers, so the record says so (and the verifier ran all the same)
        assert record.tokens.model_calls == 2, record.status_reason
        assert record.status == "aborted" and "unanswered" in (record.status_reason or "")
