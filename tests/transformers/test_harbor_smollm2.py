"""SmolLM2-135M, the embedded backend, as the model behind a coding harness on a Harbor task: the whole path on a
real model. It does not solve the task (the point is that everything runs and records): its calls are recorded
and the task's verifier, run in the rollout's sandbox, gives 0.

The harness is the small stdlib agent of ``tests/harbor`` (chat completions with one ``bash`` tool), its first call
forced to a tool call (SmolLM2 writes none unforced). The task is ``examples/coding_tasks/tasks/fix-add``, its
:class:`~tito_core.harbor.HarborSpec` built here as ``load_harbor_tasks`` builds it from ``task.toml``: the
``harbor`` package that reads task folders needs Python 3.12, this session runs 3.11 (``nox -s harbor`` checks the
reading). Needs ``bwrap`` (this session installs Debian's bubblewrap where it can).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tito_core import Trajectory, rollout
from tito_core.harbor import HarborSpec
from tito_core.harbor.tasks import HARBOR_KEY
from tito_core.runner import Task, read_records

from ..harbor.helpers import DATASET, script

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed (apt-get install)")


def test_smollm2_behind_a_harness_on_a_harbor_task_records_its_calls_and_the_verifiers_zero(tmp_path: Path) -> None:
    from tito_transformers.models import build_smollm2
    from tito_transformers.templates import smollm2_tools

    model_dir = str(build_smollm2())
    folder = DATASET / "fix-add"
    spec = HarborSpec(task_dir=str(folder), agent_timeout_s=120, verifier_timeout_s=60, hide=[str(folder)])
    task = Task(id="fix-add", prompt=(folder / "instruction.md").read_text(), metadata={HARBOR_KEY: spec})
    config = {
        "backend": "transformers",
        "tokenizer": model_dir,
        "tool_parser": "hermes",
        "chat_template": smollm2_tools(),
        "backend_options": {"model_path": model_dir, "num_threads": 1},
        "sampling": {"temperature": 0.0, "max_new_tokens": 48},
        "rollout": {
            "agent": {"command": script("shell_agent.py"), "env": {"SHELL_AGENT_TOOL_CHOICE": "required"}},
        },
    }
    out = tmp_path / "out.jsonl"
    rollout(config, [task], out)
    (record,) = read_records(out)
    traj = Trajectory.from_record(record.trajectory)
    assert record.tokens.model_calls >= 1 and record.tokens.output > 0, record.status_reason
    assert traj.turns[0].constrained and traj.turns[0].tool_calls == 1  # the forced bash call, recorded as such
    assert record.reward == 0.0, record.status_reason  # the verifier ran in the sandbox: `add` still subtracts
    assert "return a - b" in (folder / "environment" / "calc.py").read_text()  # the task's own files untouched
