"""The `tito` command's exit status on the embedded backend: what the run chose, never an abort at exit.

A daemon thread still inside torch when the interpreter finalizes aborts the process ("terminate called without an
active exception", exit 134) after every record was written. Each test here leaves such a thread on purpose (a
reward that starts one, a prepare hook that Ctrl-C abandons mid-computation) and checks the command exits with its
own status: tito_core.clean_exit ends such a process without the finalization.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tito_core.runner import read_records
from tito_testing.tokenizers import qwen_tokenizer_dir

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "arithmetic"

# A thread that stays in torch until the process ends: a matmul loop.
_TORCH_THREAD = """
import threading

import torch


def spin():
    x = torch.randn(512, 512)
    started.set()
    while True:
        x @ x


started = threading.Event()


def start_torch_thread():
    threading.Thread(target=spin, name="left-in-torch", daemon=True).start()
    started.wait()
"""

_REWARD_LEAVING_A_THREAD = (
    _TORCH_THREAD
    + """

def reward(sample):
    if not started.is_set():
        start_torch_thread()
    return 1.0
"""
)

_PREPARE_INTERRUPTED = """
import os
import signal

import torch


def prepare():  # a model build (torch on this thread) that Ctrl-C abandons
    x = torch.randn(512, 512)
    os.kill(os.getpid(), signal.SIGINT)
    while True:
        x @ x
"""


def _command(tiny_model_dir: Path, tmp_path: Path, out: Path, *extra: str) -> list[str]:
    (tmp_path / "one.jsonl").write_text((EXAMPLE / "tasks.jsonl").read_text().splitlines()[0] + "\n")
    model = {"model_path": str(tiny_model_dir), "dtype": "bfloat16", "num_threads": 1}
    options = ", ".join(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in model.items())
    return [
        sys.executable, "-m", "tito_core.cli", "rollout",
        "--config", str(EXAMPLE / "tito.toml"), "--dataset", str(tmp_path / "one.jsonl"), "--output", str(out),
        "--quiet", "--set", 'rollout.prepare=""', "--set", f'tokenizer="{qwen_tokenizer_dir("qwen3")}"',
        "--set", f"backend_options={{{options}}}", "--set", "sampling.max_new_tokens=8",
        *extra,
    ]  # fmt: skip


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env=env, timeout=600, check=False,  # a guard, not a check
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's Ctrl-C finds it
    )  # fmt: skip


def test_the_example_on_the_command_line_exits_0_with_every_record(tiny_model_dir: Path, tmp_path: Path) -> None:
    for attempt in range(3):
        out = tmp_path / f"run{attempt}.jsonl"
        done = _run(_command(tiny_model_dir, tmp_path, out), tmp_path)
        assert done.returncode == 0, done.stderr
        assert sorted(r.sample for r in read_records(out)) == [0, 1, 2, 3]


def test_a_thread_left_in_torch_at_exit_does_not_abort_a_finished_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "leaving.py").write_text(_REWARD_LEAVING_A_THREAD)
    out = tmp_path / "out.jsonl"
    done = _run(_command(tiny_model_dir, tmp_path, out, "--reward", "leaving:reward"), tmp_path)
    assert done.returncode == 0, done.stderr  # 134 before: "terminate called without an active exception"
    assert "terminate called" not in done.stderr
    assert sorted((r.sample, r.reward) for r in read_records(out)) == [(s, 1.0) for s in range(4)]


def test_ctrl_c_while_a_prepare_hook_runs_torch_exits_130_with_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "building.py").write_text(_PREPARE_INTERRUPTED)
    out = tmp_path / "out.jsonl"
    command = [*_command(tiny_model_dir, tmp_path, out), "--set", 'rollout.prepare="building:prepare"']
    done = _run(command, tmp_path)
    assert done.returncode == 130, done.stderr  # 134 before: the hook's thread was in torch at finalization
    assert done.stderr.splitlines() == ["tito rollout: interrupted before any rollout was written"]
    assert not out.exists() or not out.read_bytes()
