"""`tito rollout --executor ray` end to end, on the scripted backend (a TOML config of plain values)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tito_core.cli import main
from tito_core.runner import read_records

from ..runner.helpers import tasks, write_jsonl
from ..runner.test_cli import _run


def test_rollout_on_ray_writes_the_file_and_a_rerun_skips_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ray_cluster: Any
) -> None:
    # one worker: the suite's shared executor holds one of the cluster's two CPUs
    write_jsonl(tmp_path / "t.jsonl", tasks(3))
    out = tmp_path / "out.jsonl"
    assert main(_run(tmp_path, "--output", str(out), "--executor", "ray", "--workers", "1", "--log-json")) == 0
    events = [line for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert '"written":6' in events[-1] and '"statuses":{"completed":6}' in events[-1]
    records = list(read_records(out))
    assert sorted(r.key for r in records) == [(f"t{i}", s) for i in range(3) for s in range(2)]
    assert sum(r.reward or 0.0 for r in records) == 2.0  # the reward module next to the config, on the worker
    assert main(_run(tmp_path, "--output", str(out), "--executor", "ray", "--workers", "1", "--quiet")) == 0
    assert len(list(read_records(out))) == 6
