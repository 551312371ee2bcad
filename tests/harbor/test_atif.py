"""`tito export --to atif` of Harbor rollouts, validated by harbor's own ATIF ``Trajectory`` model: the steps, the
exact token ids and logprobs of every call, and the verifier's reward."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tito_core import Trajectory, rollout
from tito_core.cli import main
from tito_core.runner import read_records

from ..runner.helpers import tokenizer_dir
from .helpers import DATASET, harbor_config, script

pytest.importorskip("harbor", reason="the harbor package (Python 3.12+): run `nox -s harbor`")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed: `nox -s harbor`")
def test_the_atif_export_validates_with_harbors_models_and_keeps_the_tokens(tmp_path: Path) -> None:
    from harbor.models.trajectories import Trajectory as AtifTrajectory

    out, atif = tmp_path / "out.jsonl", tmp_path / "atif.jsonl"
    rollout(harbor_config(script("shell_agent.py"), dataset=DATASET / "fix-add"), None, out)
    assert main(["export", "--to", "atif", str(out), "-o", str(atif), "--tokenizer", tokenizer_dir()]) == 0
    (line,) = atif.read_text().splitlines()
    parsed = AtifTrajectory.model_validate(json.loads(line))  # harbor's own validation (step ids, agent-only fields)
    (record,) = read_records(out)
    traj = Trajectory.from_record(record.trajectory)
    agent_steps = [s for s in parsed.steps if s.source == "agent"]
    assert parsed.schema_version == "ATIF-v1.7" and parsed.session_id == "fix-add:0"
    assert len(agent_steps) == len(traj.turns) == 2 and [s.source for s in parsed.steps] == ["user", "agent"] * 2
    for step, turn in zip(agent_steps, traj.turns, strict=True):
        out_at = turn.prompt_start + turn.prompt_len
        assert step.metrics is not None
        assert step.metrics.prompt_token_ids == traj.token_ids[:out_at]
        assert step.metrics.completion_token_ids == traj.token_ids[out_at : out_at + turn.output_len]
        assert step.metrics.logprobs == traj.logprobs[out_at : out_at + turn.output_len]
    assert "sed -i" in str(agent_steps[0].message) and "fix it" in str(parsed.steps[0].message).lower()
    assert parsed.extra is not None and parsed.extra["tito"]["reward"] == 1.0
