"""mini-swe-agent (PyPI, bash through LiteLLM), an SWE-style harness, run by `tito rollout` as a `[rollout.agent]`
command on the scripted backend: its bash tool call, the command's output, and its submission are recorded on one
branch. The nox session ``harnesses`` installs it (``TITO_MINI``: its ``mini`` executable).

The scripted model, not SmolLM2: mini-swe-agent runs whatever bash the model writes in the working directory,
with no sandbox on this machine, so the commands here are the script's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tito_core import Trajectory, rollout
from tito_core.runner import read_records
from tito_core.tokenizers import load_tokenizer

from ..gateway_runner.helpers import agent_config
from ..runner.helpers import call, tokenizer_dir

MINI = os.environ.get("TITO_MINI", "")
pytestmark = pytest.mark.skipif(
    not (MINI and Path(MINI).exists()), reason="mini-swe-agent not installed: run `nox -s harnesses`"
)
AGENT = Path(__file__).parents[2] / "examples" / "coding_tasks" / "mini_swe.py"


def test_mini_swe_agent_records_its_bash_loop_and_submission_on_one_branch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replies = [call("bash", command="echo $((20 + 22)) > answer.txt && cat answer.txt"),
               call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt")]  # fmt: skip
    agent = {"command": [sys.executable, str(AGENT)], "timeout_s": 300}
    config = agent_config(agent, replies, reward="tests.gateway_runner.helpers:number_reward")
    tasks = [{"id": "sum", "prompt": "Write the sum of 20 and 22 to answer.txt and submit it.", "answer": "42"}]
    out = tmp_path / "out.jsonl"
    monkeypatch.chdir(tmp_path)  # the agent runs in the config's directory: for a mapping, the current one
    summary = rollout(config, tasks, out)
    (record,) = read_records(out)
    traj = Trajectory.from_record(record.trajectory)
    assert summary.written == 1 and record.tokens.model_calls == 2, (record.status, record.status_reason)
    assert traj.branch == 0 and not traj.branches  # mini replays each answer as returned: no fork
    assert record.reward == 1.0  # mini's submission (its answer line) holds 42
    second = traj.turns[1]
    prompt = load_tokenizer(tokenizer_dir()).decode(
        traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_len]
    )
    assert "42" in prompt.split("<tool_response>", 1)[-1]  # the command's output went back as the tool's result
    # its last call is the submission, a tool call no result answers: the record says so
    assert record.status == "aborted" and "unanswered" in (record.status_reason or "")
