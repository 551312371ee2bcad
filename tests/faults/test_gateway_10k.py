"""The 10,000-rollout run at 200 rollouts: `benchmarks/gateway_10k.py`, the shipping `tito serve --workers 2`.

The script runs 200 rollouts x 4 calls through the worker processes on the fast fake SGLang server at 10 % engine
faults, SIGKILLs a worker once a fifth of the calls are answered and updates the weights (pause, relabel, resume)
at two fifths, each point read from the engine's count of answers; then it runs the same command again on the
output. Its checks (`benchmarks/gateway_10k_checks.py`) fail it: every rollout has exactly one record; every
recorded output is one clean engine answer to the very prompt recorded before it, and every 200 the client got is
its turn's output in the record; the killed worker's open rollouts are `failed`, "gateway worker lost"; every turn
is labelled with the weight version that generated it, calls answered before the pause with the old one and calls
sent after the resume with the new; the rerun writes nothing twice and changes no byte written; the supervisor's
memory and file descriptors are back. Here, on top of its exit status, the figures that show each of those
happened. Worker processes, not Ray: this session has no Ray (`nox -s ray` runs the script on Ray actors).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROLLOUTS = 200
GUARD_S = 1200  # a hang guard only: the script waits on events, never on a clock


def test_200_rollouts_with_faults_a_killed_worker_and_a_weight_update_lose_nothing(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "gateway_10k.py"), "--rollouts", str(ROLLOUTS), "--no-ray",
            "--concurrency", "64", "--clients", "1", "--output", str(tmp_path / "out.jsonl"),
            "--json", str(report_path)]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=GUARD_S, env=env, cwd=ROOT)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    report = json.loads(report_path.read_text())
    run, rerun = report["passes"]
    assert run["chaos"] and run["problems"] == [] and rerun["problems"] == [] and report["file"]["problems"] == []
    assert run["to_run"] == ROLLOUTS and run["records"] == ROLLOUTS  # one record each
    assert sum(n for kind, n in run["engine_requests"].items() if kind != "ok") > 0  # faults were injected
    assert run["lost_worker_rollouts"] > 0 and run["client_outcomes"].get("lost", 0) > 0  # the kill hit rollouts
    assert run.get("held", 0) > 0  # calls waited on the paused engine
    assert run["calls_by_update"]["before"] > 0 and run["calls_by_update"]["after"] > 0  # the update was mid-run
    assert rerun["to_run"] == 0 and rerun["records"] == 0 and report["file"]["records"] == ROLLOUTS  # nothing twice
