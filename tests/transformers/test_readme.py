"""The README runs as written: its Python blocks and the demo (its first command), on the real SmolLM2 model.

Each runs in a fresh interpreter, as a user would run it. A block that starts with ``# needs a running
server`` is the only kind not executed (the config-file example points at a vLLM server).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tito_core.trajectory import Trajectory

README = Path(__file__).resolve().parents[2] / "README.md"
NEEDS_SERVER = "# needs a running server"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _python_blocks() -> list[str]:
    return BLOCK.findall(README.read_text(encoding="utf-8"))


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False)


def test_readme_blocks_are_run_except_the_server_ones() -> None:
    blocks = _python_blocks()
    runnable = [b for b in blocks if not b.startswith(NEEDS_SERVER)]
    assert len(runnable) >= 1 and len(blocks) - len(runnable) <= 1
    assert "asyncio.run(" in runnable[0] and ".reset()" in runnable[0] and "max_new_tokens" in runnable[0]


@pytest.mark.parametrize("index", range(sum(not b.startswith(NEEDS_SERVER) for b in _python_blocks())))
def test_readme_python_block_runs(index: int, tmp_path: Path) -> None:
    block = [b for b in _python_blocks() if not b.startswith(NEEDS_SERVER)][index]
    script = tmp_path / "block.py"
    script.write_text(block, encoding="utf-8")
    done = _run([sys.executable, str(script)], tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    if "asyncio.run(" in block:
        lines = [line for line in done.stdout.splitlines() if "model calls," in line]
        assert len(lines) == 4, done.stdout
        assert sum(line.startswith("completed") for line in lines) >= 1, done.stdout


def test_demo_runs_a_forced_tool_call_on_smollm2(tmp_path: Path) -> None:
    out = tmp_path / "trajectory.json"
    done = _run([sys.executable, "-m", "tito_core.demo", "--out", str(out)], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "calls multiply(a=" in done.stdout
    assert "tool_use (forced)" in done.stdout
    assert f"trajectory saved to {out.resolve()}" in done.stdout.replace("\n", "")
    assert "model: SmolLM2-135M-Instruct" in done.stdout and "smollm2-135m-instruct" in done.stdout.replace("\n", "")
    traj = Trajectory.from_json(out.read_bytes())
    assert traj.status == "completed" and traj.turns[0].constrained and not traj.turns[-1].constrained
    assert len(traj.logprobs) == len(traj.token_ids) == len(traj.loss_mask)
