"""The ``tito`` command: rollout (progress, JSON logs, errors), a real kill and a rerun, export, inspect, demo."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tito_core.cli import main
from tito_core.runner import read_records
from tito_core.runner.rewards import group_normalized
from tito_core.trajectory import Trajectory

from .helpers import lines, tasks, tokenizer_dir, write_jsonl

_GATE = """
import asyncio
from pathlib import Path

_rewarded = 0


async def reward(sample):
    global _rewarded
    _rewarded += 1
    if _rewarded > {open_for}:  # held until the test releases it: the run cannot end before the test acts
        while not Path({release!r}).exists():
            await asyncio.sleep(0.005)
    return {body}
"""


def _gated_reward(tmp_path: Path, module: str, body: str, *, open_for: int | None) -> None:
    """Write ``<module>.py`` with an async ``reward`` returning ``body``. With ``open_for``, only the first
    ``open_for`` rewards of a process return; the others wait until :func:`_release` (async, so the event
    loop, its SIGINT handling included, runs on while they wait)."""
    limit = 10**9 if open_for is None else open_for
    text = _GATE.format(open_for=limit, release=str(tmp_path / "release"), body=body)
    (tmp_path / f"{module}.py").write_text(text)


def _release(tmp_path: Path) -> None:
    """Let every gated reward (this run's and any rerun's) return."""
    (tmp_path / "release").touch()


def _toml(tmp_path: Path, *, gate: int | None = None, extra: str = "") -> Path:
    tok = json.dumps(tokenizer_dir())
    _gated_reward(tmp_path, "rewards", "1.0 if str(sample.task.answer) in sample.text else 0.0", open_for=gate)
    path = tmp_path / "tito.toml"
    path.write_text(
        f'backend = "scripted"\ntokenizer = {tok}\n'
        f"[backend_options]\ntokenizer = {tok}\nreplies = {json.dumps(['The answer is 4.'] * 500)}\n"
        f'[rollout]\ngroup_size = 2\nconcurrency = 2\nreward = "rewards:reward"\n{extra}'
    )
    return path


def _run(tmp_path: Path, *args: str, **kwargs: Any) -> list[str]:
    return ["rollout", "--config", str(_toml(tmp_path, **kwargs)), "--dataset", str(tmp_path / "t.jsonl"), *args]


def test_rollout_shows_progress_and_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(3))
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"))) == 0
    err = capsys.readouterr().err
    assert "tito rollout" in err and "completed 6" in err and "6 of 6" in err
    assert "mean 0.333" in err  # one task of three is 2 + 2
    assert len(lines(tmp_path / "out.jsonl")) == 6 and "whole file" not in err
    write_jsonl(tmp_path / "t.jsonl", tasks(4))
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"))) == 0
    err = capsys.readouterr().err
    assert "2 of 2 (skipped 6" in err and "whole file" in err and "8 records: completed 8; reward mean 0.250" in err


def test_flags_override_the_config_and_log_json_prints_events(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(2))
    args = _run(tmp_path, "--output", str(tmp_path / "out.jsonl"), "--group-size", "3", "--log-json")
    assert main(args) == 0
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [e["event"] for e in events] == ["start"] + ["rollout"] * 6 + ["summary"]
    assert events[-1]["written"] == 6 and events[-1]["statuses"] == {"completed": 6}


def test_quiet_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(1))
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"), "--quiet")) == 0
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


def test_errors_before_any_work_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "t.jsonl", [{"id": "a"}])
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"))) == 2
    assert "tito rollout: error:" in capsys.readouterr().err
    write_jsonl(tmp_path / "t.jsonl", tasks(1))
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"), extra="concurency = 3\n")) == 2
    assert "unknown key `rollout.concurency`; did you mean `concurrency`?" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_killed_run_loses_no_written_rollout_and_a_rerun_completes_it(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(40))
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "tito_core.cli", *_run(tmp_path, "--output", str(out), "--quiet", gate=6)]
    proc = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE)
    _wait_for_lines(proc, out, 6)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = out.read_bytes()
    whole = killed[: killed.rfind(b"\n") + 1]
    assert 6 <= whole.count(b"\n") < 80
    _release(tmp_path)
    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=300, check=False)
    assert rerun.returncode == 0, rerun.stderr
    final = out.read_bytes()
    assert final.startswith(whole)  # nothing written before the kill was lost or rewritten
    keys = [(r["task_id"], r["sample"]) for r in lines(out)]
    assert len(keys) == len(set(keys)) == 80


def _wait_for_lines(proc: subprocess.Popen[Any], out: Path, count: int) -> None:
    """Wait until ``out`` has ``count`` lines; fail with what the run printed if it ends or takes 10 minutes."""
    deadline = time.monotonic() + 600  # a guard against a hung run, not a speed check
    while not out.exists() or out.read_bytes().count(b"\n") < count:
        seen = out.read_bytes().count(b"\n") if out.exists() else "no"
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) with {seen} lines of {count}: {_stderr(proc)}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run wrote {seen} lines of {count} in 10 minutes: {_stderr(proc)}")
        time.sleep(0.01)


def _stderr(proc: subprocess.Popen[Any]) -> str:
    return str(proc.communicate()[1] or "") if proc.stderr else ""


@pytest.mark.parametrize("name", ["out.jsonl", "out.parquet"])
def test_a_second_run_on_a_live_output_is_refused_naming_the_pid(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    write_jsonl(tmp_path / "t.jsonl", tasks(40))
    out = tmp_path / name
    command = [sys.executable, "-m", "tito_core.cli", *_run(tmp_path, "--output", str(out), "--quiet", gate=0)]
    first = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        lock = tmp_path / f"{name}.lock"
        deadline = time.monotonic() + 300  # a guard against a hang: the first run's start-up, beside heavy work
        while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            time.sleep(0.01)
        assert lock.exists() and lock.read_text().strip(), "the first run took no lock in 300 s"
        # the second run's prepare hook (which runs before any model is built or server asked) leaves a mark
        (tmp_path / "marking.py").write_text(
            f"from pathlib import Path\n\n\ndef prepare():\n    Path({str(tmp_path / 'prepared')!r}).touch()\n"
        )
        marked = [*command, "--set", 'rollout.prepare="marking:prepare"']
        # a guard against a hang only: beside heavy work a second run's start-up alone took 51 s
        second = subprocess.run(marked, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
        assert not (tmp_path / "prepared").exists()  # refused at once: before any model or server
        assert second.returncode == 2, second.stderr
        assert f"{out} is being written by process {first.pid}" in second.stderr
        assert first.poll() is None  # the first run goes on
        os.kill(first.pid, signal.SIGKILL)  # the kernel releases the lock with the process
        first.wait()
        assert lock.exists()  # left behind by the kill: harmless
        _release(tmp_path)
        rerun = subprocess.run(marked, cwd=tmp_path, capture_output=True, timeout=300, check=False)
        assert rerun.returncode == 0, rerun.stderr
        assert (tmp_path / "prepared").exists()  # the mark works: a run that is not refused leaves it
        keys = [r.key for r in read_records(out)]
        assert len(keys) == len(set(keys)) == 80
        assert not lock.exists()  # a run that ends normally deletes its lock file
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_kill_inside_a_group_loses_no_finished_rollout_and_the_rerun_completes_the_group(tmp_path: Path) -> None:
    _gated_reward(tmp_path, "graded", "float(sample.sample * sample.sample)", open_for=2)
    extra = 'group_reward = "tito_core.runner.rewards:group_normalized"\n'
    write_jsonl(tmp_path / "t.jsonl", tasks(1))
    out = tmp_path / "out.jsonl"
    args = _run(tmp_path, "--output", str(out), "--quiet", "--group-size", "4", "--concurrency", "1",
                "--reward", "graded:reward", extra=extra)  # fmt: skip
    command = [sys.executable, "-m", "tito_core.cli", *args]
    proc = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE)
    _wait_for_lines(proc, out, 2)
    os.kill(proc.pid, signal.SIGKILL)  # between two samples of the group (the third one's reward is held)
    proc.wait()
    killed = [r for r in read_records(out)]
    assert 2 <= len(killed) < 4  # the finished samples are on disk before their group is done
    assert all(r.status == "completed" and r.advantage is None for r in killed)
    _release(tmp_path)
    rerun = subprocess.run(command, cwd=tmp_path, capture_output=True, timeout=300, check=False)
    assert rerun.returncode == 0, rerun.stderr
    records = sorted(read_records(out), key=lambda r: r.sample)
    assert [r.sample for r in records] == [0, 1, 2, 3] and [r.reward for r in records] == [0.0, 1.0, 4.0, 9.0]
    assert [r.advantage for r in records] == pytest.approx(group_normalized([0.0, 1.0, 4.0, 9.0]))
    assert {(r.key, r.timings.started) for r in killed} <= {(r.key, r.timings.started) for r in records}


def test_retry_failed_flag_reruns_failed_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(2))
    out = tmp_path / "out.jsonl"
    assert main(_run(tmp_path, "--output", str(out), "--quiet")) == 0
    rows = lines(out)
    rows[1].update(status="failed", status_reason="server lost")
    write_jsonl(out, rows)
    assert main(_run(tmp_path, "--output", str(out), "--log-json", "--retry-failed")) == 0
    summary = json.loads(capsys.readouterr().err.splitlines()[-1])
    assert (summary["skipped"], summary["written"]) == (3, 1)
    assert sorted((r["task_id"], r["sample"], r["status"]) for r in lines(out)) == [
        (f"t{i}", s, "completed") for i in range(2) for s in range(2)
    ]


def test_export_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(2))
    out = tmp_path / "out.jsonl"
    assert main(_run(tmp_path, "--output", str(out), "--quiet")) == 0
    assert main(["export", "--to", "trl", str(out), str(tmp_path / "trl.jsonl")]) == 0
    exported = lines(tmp_path / "trl.jsonl")
    assert len(exported) == 4
    for row in exported:
        assert len(row["completion_ids"]) == len(row["env_mask"]) == len(row["logprobs"]) and sum(row["env_mask"]) > 0
        assert row["task_id"] in ("t0", "t1") and row["reward"] in (0.0, 1.0)
    assert main(["export", "--to", "verl", str(out), str(tmp_path / "verl.jsonl")]) == 0
    timings = {(r.task_id, r.sample): r.timings for r in read_records(out)}
    for row in lines(tmp_path / "verl.jsonl"):  # no tool calls: the agent loop's time was all generation
        agent_s = timings[(row["task_id"], row["sample"])].agent_s
        assert row["metrics"] == {"generate_sequences": agent_s, "tool_calls": 0.0, "num_preempted": -1} and agent_s > 0
    assert main(["export", "--to", "slime", str(out), str(tmp_path / "slime.jsonl")]) == 0
    assert {r["status"] for r in lines(tmp_path / "slime.jsonl")} == {"COMPLETED"}
    assert main(["export", "--to", "agl", str(out), str(tmp_path / "agl.jsonl")]) == 0
    records = {(r.task_id, r.sample): r for r in read_records(out)}
    for row in lines(tmp_path / "agl.jsonl"):
        traj = Trajectory.from_record(records[(row["task_id"], row["sample"])].trajectory)
        events = row["model_request_events"]
        assert len(events) == len(traj.turns) and row["rollout_id"] == traj.rollout_id
        for event, turn in zip(events, traj.turns, strict=True):
            start = turn.output_start
            assert event["response"]["prompt_token_ids"] == traj.token_ids[:start]
            assert event["response"]["choices"][0]["token_ids"] == traj.token_ids[start : start + turn.output_len]
    capsys.readouterr()
    assert main(["inspect", str(out), "--id", "t1", "--tokenizer", tokenizer_dir()]) == 0
    shown = capsys.readouterr().out
    assert ": 2 rollouts" in shown and "t1 sample 0: completed" in shown and "t0 sample" not in shown
    assert "completed" in shown and "The answer is 4.<|im_end|>" in shown  # the model's output, decoded
    assert main(["inspect", str(out), "--id", "nope"]) == 1
    assert main(["inspect", str(out), "--id", "t1", "--config", str(tmp_path / "tito.toml")]) == 0
    assert "The answer is 4.<|im_end|>" in capsys.readouterr().out  # the config's tokenizer decodes it
    (tmp_path / "bare.toml").write_text('backend = "scripted"\n')
    assert main(["inspect", str(out), "--id", "t1", "--config", str(tmp_path / "bare.toml")]) == 2
    assert "bare.toml: no `tokenizer`" in capsys.readouterr().err
    (tmp_path / "prep.py").write_text(f"def prepare():\n    return {{'tokenizer': {tokenizer_dir()!r}}}\n")
    (tmp_path / "prepared.toml").write_text('backend = "scripted"\n[rollout]\nprepare = "prep:prepare"\n')
    assert main(["inspect", str(out), "--id", "t1", "--config", str(tmp_path / "prepared.toml")]) == 0
    assert "The answer is 4.<|im_end|>" in capsys.readouterr().out  # the prepare hook named the tokenizer


def test_export_to_areal_rows_and_to_prefix_trees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(2))
    out = tmp_path / "out.jsonl"
    assert main(_run(tmp_path, "--output", str(out), "--quiet")) == 0
    assert main(["export", "--to", "areal", str(out), str(tmp_path / "areal.jsonl")]) == 0
    rows = lines(tmp_path / "areal.jsonl")
    assert len(rows) == 4
    for row in rows:
        assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["logprobs"]) == len(row["versions"])
        assert sum(row["loss_mask"]) > 0 and row["reward"] in (0.0, 1.0)
    capsys.readouterr()
    assert main(["export", "--to", "tree", str(out), "-o", str(tmp_path / "tree.jsonl")]) == 0
    (tree,) = lines(tmp_path / "tree.jsonl")  # four rollouts of two tasks: one tree, each shared prefix once
    flat = sum(len(r["input_ids"]) for r in rows)
    assert len(tree["input_ids"]) < flat and len(tree["packed"]["loss_mask"]) == flat
    assert tree["sequence_ids"] == [0, 1, 2, 3] and tree["max_tokens"] == 32768
    for k, row in enumerate(rows):
        at = [i for n in tree["nodes"] if k in n["sequence_ids"] for i in range(n["start"], n["end"] + 1)]
        assert [tree["input_ids"][i] for i in at] == row["input_ids"]
        assert tree["rows"][k]["task_id"] == row["task_id"] and tree["rows"][k]["reward"] == row["reward"]
    assert f"4 training rows in 1 trees (shared branch reward), {len(tree['input_ids'])} tokens for {flat}" in (
        capsys.readouterr().err
    )
    assert main(["export", "--to", "tree", "--max-tokens", "100", str(out), "-o", str(tmp_path / "bad.jsonl")]) == 2
    assert "max_tokens must be a positive multiple of 128" in capsys.readouterr().err


def test_export_and_inspect_of_a_missing_file_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.jsonl")
    assert main(["export", "--to", "trl", missing, "-o", str(tmp_path / "trl.jsonl")]) == 2
    assert f"tito export: error: no such file: {missing}" in capsys.readouterr().err
    assert main(["inspect", missing]) == 2
    assert f"tito inspect: error: no such file: {missing}" in capsys.readouterr().err
    assert main(["export", "--to", "trl", missing]) == 2
    assert "no output file: give it after the rollout file or as -o/--output" in capsys.readouterr().err


def test_inspect_fits_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(3))
    out = tmp_path / "out.jsonl"
    assert main(_run(tmp_path, "-o", str(out), "--quiet")) == 0  # -o is --output
    rows = lines(out)
    rows[0].update(status="failed", status_reason="BackendConnectionError: " + "the server went away " * 12)
    write_jsonl(out, rows)
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["inspect", str(out)]) == 0
    narrow = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in narrow) <= 80
    assert "t0 sample 0: failed" in narrow and "t2 sample 1: completed" in narrow
    assert any("reward 0.000  tokens" in line and "branches 1" in line for line in narrow)
    assert " ".join(line.strip() for line in narrow).count("the server went away") == 12  # wrapped, not cut
    monkeypatch.setenv("COLUMNS", "140")
    assert main(["inspect", str(out)]) == 0
    wide = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in wide) <= 140
    rows_shown = [line.split("│")[1:-1] for line in wide if line.startswith("│ t")]
    assert len(rows_shown) == 6  # one line per record: no short cell wrapped
    assert [cells[2].strip() for cells in rows_shown[:2]] == ["failed", "completed"]
    assert sum("the server went away" in line for line in wide) > 1  # only the reason wraps


def test_demo_delegates_to_the_demo_module(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str] | None = None) -> int:
        seen.append(list(argv or []))
        return 7

    monkeypatch.setattr("tito_core.demo.main", fake_main)
    assert main(["demo", "--json", "x.json"]) == 7
    assert seen == [["--json", "x.json"]]


def test_scripted_demo_shows_the_model_the_conversation_and_the_saved_trajectory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.json"
    assert main(["demo", "--scripted", "--out", str(out)]) == 0
    shown = capsys.readouterr().out.replace("\n", "")
    assert "model: scripted replies" in shown and "calls multiply(a=12, b=7)" in shown
    assert "model calls    2: tool_use, end_turn" in shown and f"trajectory saved to {out.resolve()}" in shown
    traj = Trajectory.from_json(out.read_bytes())
    assert traj.status == "completed" and [t.stop_reason for t in traj.turns] == ["tool_use", "end_turn"]


def test_scripted_demo_without_tito_testing_names_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("tito_testing", "tito_testing.scripted", "tito_testing.tokenizers"):
        monkeypatch.setitem(sys.modules, name, None)  # as if tito-testing were not installed
    with pytest.raises(SystemExit, match=r"needs tito-testing .*: pip install tito-testing"):
        main(["demo", "--scripted", "--out", str(tmp_path / "demo.json")])
    assert not (tmp_path / "demo.json").exists()


# Ctrl-C at each point is sent by the run itself, when it reaches that point: no test timing decides where it lands.
# The driver sends it from an audit hook (an import, a file opened) before it runs the command.
_SIGINT_AT_EVENT = """
import os, signal, sys

event, match = sys.argv[1], sys.argv[2]
fired = []


def hook(name, args):
    if not fired and name == event and str(args[0]).endswith(match):
        fired.append(name)
        os.kill(os.getpid(), signal.SIGINT)


sys.addaudithook(hook)
if os.environ.get("TITO_TEST_RUN_MODULE"):  # as `python -m tito_core.cli` runs it
    import runpy

    sys.argv = ["tito", *sys.argv[3:]]
    runpy.run_module("tito_core.cli", run_name="__main__", alter_sys=True)
from tito_core.cli import main  # as the `tito` console script runs it

raise SystemExit(main(sys.argv[3:]))
"""

_SIGINT_IN_REWARD = """
import asyncio, os, signal

_calls = 0


async def reward(sample):
    global _calls
    _calls += 1
    if _calls == {at}:
        os.kill(os.getpid(), signal.SIGINT)
        if {hold}:  # the rollout is still running when the signal is handled
            await asyncio.Event().wait()
    return 1.0
"""

_SIGINT_IN_PREPARE = """
import os, signal, threading


def prepare():  # a synchronous hook (run on a thread) that never returns: a model build Ctrl-C must not wait for
    os.kill(os.getpid(), signal.SIGINT)
    threading.Event().wait()
"""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("point", "written"),
    [
        ("importing the commands", None),  # the first import after the entry point took over Ctrl-C
        ("python -m, importing asyncio", None),
        ("importing the audit command", None),
        ("importing strands", None),
        ("loading the tokenizer", None),
        ("a prepare hook that never returns", None),
        ("the first rollout", (0, 1)),  # the other lane's rollout may finish: it is kept
        ("writing the third record", (3, 6)),
        ("mid-run, the fifth rollout held", (4, 5)),
    ],
)
def test_ctrl_c_at_any_point_exits_130_with_one_line_and_keeps_what_was_written(
    tmp_path: Path, point: str, written: tuple[int, int] | None
) -> None:
    """Each point stopped a run late or printed a traceback before: start-up Ctrl-C raised out of an import (the
    first three: before the entry point took over Ctrl-C ahead of the commands' imports, exit -2), a
    run waited for the thread loading its tokenizer or running its prepare hook, and a lane of an in-process
    backend ran on to the end of the dataset before the cancellation reached it."""
    write_jsonl(tmp_path / "t.jsonl", tasks(40))
    out = tmp_path / "out.jsonl"
    args = _run(tmp_path, "--output", str(out), "--quiet")
    driver = [sys.executable, "-m", "tito_core.cli"]
    env = {**os.environ, "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}  # "PyTorch was not found" where torch is not
    if point == "importing the commands":
        driver = [sys.executable, "-c", _SIGINT_AT_EVENT, "import", "tito_core.cli.commands"]
    elif point == "python -m, importing asyncio":
        driver = [sys.executable, "-c", _SIGINT_AT_EVENT, "import", "asyncio"]
        env["TITO_TEST_RUN_MODULE"] = "1"
    elif point == "importing the audit command":
        driver = [sys.executable, "-c", _SIGINT_AT_EVENT, "import", "tito_core.cli.audit"]
    elif point == "importing strands":
        driver = [sys.executable, "-c", _SIGINT_AT_EVENT, "import", "strands"]
    elif point == "loading the tokenizer":
        driver = [sys.executable, "-c", _SIGINT_AT_EVENT, "open", "tokenizer.json"]
    elif point == "a prepare hook that never returns":
        (tmp_path / "hanging.py").write_text(_SIGINT_IN_PREPARE)
        args += ["--set", 'rollout.prepare="hanging:prepare"']
    else:
        at, hold = {"the first rollout": (1, True), "writing the third record": (3, False)}.get(point, (5, True))
        (tmp_path / "signalling.py").write_text(_SIGINT_IN_REWARD.format(at=at, hold=hold))
        args += ["--reward", "signalling:reward"]
    # SIGINT at its default in the child: a test run started in the background (CI, nohup) inherits it ignored, and
    # Python then never raises KeyboardInterrupt (Ctrl-C ignored is what such a parent asked for)
    proc = subprocess.Popen([*driver, *args], cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_default_sigint)  # fmt: skip
    try:
        _, err = proc.communicate(timeout=300)  # a guard against a hang, not a speed check
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"still running 300 s after Ctrl-C at {point}: {proc.communicate()[1]}")
    assert proc.returncode == 130, err
    assert len(err.splitlines()) == 1 and err.startswith("tito rollout: interrupted"), err
    if written is None:
        assert not out.exists() or not out.read_bytes(), err
        return
    data = out.read_bytes()
    assert data.endswith(b"\n") or not data  # no torn line
    assert written[0] <= len(lines(out)) <= written[1], err
    if data:
        assert "rerun to resume" in err


def test_ray_flags_need_the_ray_executor_and_ray_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(1))
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"), "--workers", "2")) == 2
    assert "--address and --workers go with --executor ray" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"), "--executor", "ray")) == 2
    assert 'pip install "tito-core[ray]"' in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_the_summary_lists_the_first_groups_and_states_the_spread_over_all() -> None:
    from rich.console import Console

    from tito_core.runner.progress import summary_table
    from tito_core.runner.summary import GroupStats, RunSummary

    groups = [GroupStats(task_id=f"t{i}", rollouts=2, reward_mean=0.5, reward_std=0.5 * (i % 2)) for i in range(25)]
    summary = RunSummary(
        output="out.jsonl", planned=50, skipped=0, written=50, statuses={"completed": 50}, reward_mean=0.5,
        reward_std=0.5, groups=groups, total_tokens=1, output_tokens=1, wall_s=1.0, rollouts_per_s=50.0,
        output_tokens_per_s=1.0, servers={},
    )  # fmt: skip
    console = Console(record=True, width=120)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "│ t19 " in text and "│ t20 " not in text and "… 5 more groups" in text
    assert "25 groups: per-group reward std mean 0.240; 13 with equal rewards" in text


def test_strands_truncation_notices_stay_out_of_the_progress_output() -> None:
    from tito_core.cli.commands import _drop_truncation_notices

    def record(name: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, "replacing with error message", None, None)

    assert not _drop_truncation_notices(record("strands.event_loop._recover_message_on_max_tokens_reached"))
    assert _drop_truncation_notices(record("strands.event_loop.event_loop"))
    assert _drop_truncation_notices(record("tito"))


def test_set_overrides_any_config_key_dotted_into_tables(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(2))
    out = tmp_path / "out.jsonl"
    sets = ["--set", "sampling.max_new_tokens=2", "--set", "rollout.group_size=1", "--set", "tool_parser=qwen_xml"]
    assert main(_run(tmp_path, "--output", str(out), "--quiet", *sets)) == 0
    records = lines(out)
    assert len(records) == 2  # rollout.group_size=1 replaced the file's 2
    assert all(r["status"] == "truncated" and r["tokens"]["output"] == 2 for r in records)  # sampling.max_new_tokens
    out.unlink()
    assert main(_run(tmp_path, "--output", str(out), "--quiet", *sets, "--group-size", "3")) == 0
    assert len(lines(out)) == 6  # a flag wins over --set
    capsys.readouterr()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("sampling", "expected KEY=VALUE"),
        ("tool_parser.name=x", "'tool_parser' is not a table"),
        ("sampling.temprature=1", "temperature"),
        ("rollout.group_sise=1", "group_sise"),
    ],
)
def test_bad_set_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, message: str
) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(1))
    assert main(_run(tmp_path, "--output", str(tmp_path / "out.jsonl"), "--quiet", "--set", setting)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_export_and_inspect_carry_the_weight_versions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_jsonl(tmp_path / "t.jsonl", tasks(1))
    out = tmp_path / "out.jsonl"
    path = _toml(tmp_path)
    path.write_text(path.read_text().replace("[backend_options]\n", '[backend_options]\nweight_version = "5"\n'))
    assert (
        main(
            ["rollout", "--config", str(path), "--dataset", str(tmp_path / "t.jsonl"), "--output", str(out), "--quiet"]
        )
        == 0
    )
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "200")  # the whole table, no header cut short
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out.replace("┃", "│")  # the header's rule is heavier
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in shown.splitlines()]
    header, *values = [row for row in rows if row]
    assert [dict(zip(header, row, strict=True))["versions"] for row in values] == ["5", "5"]
    exports = {}
    for trainer in ("trl", "verl", "slime", "agl"):
        assert main(["export", "--to", trainer, str(out), str(tmp_path / f"{trainer}.jsonl")]) == 0
        exports[trainer] = lines(tmp_path / f"{trainer}.jsonl")[0]
    trl = exports["trl"]
    assert trl["weight_versions"] == ["5" if m else None for m in trl["env_mask"]]
    assert exports["verl"]["extra_fields"] == {"min_global_steps": 5, "max_global_steps": 5}
    assert exports["slime"]["weight_versions"] == ["5"]  # one model call
    (event,) = exports["agl"]["model_request_events"]
    n = len(event["response"]["choices"][0]["token_ids"])
    assert event["model_version"] == 5
    assert event["response"]["choices"][0]["weight_versions"] == [{"version": "5", "start": 0, "end": n}]


def test_quiet_prints_nothing_when_a_loop_limit_ends_a_rollout(tmp_path: Path) -> None:
    """Strands logs the limiter's LoopLimitError as an error; the record says why the rollout ended, so --quiet
    prints nothing (a real process: logging is set up as the command sets it up)."""
    (tmp_path / "tools.py").write_text(
        'from strands import tool\n\n\n@tool\ndef add(a: int, b: int) -> str:\n    """Add.\n\n    Args:\n'
        '        a: One.\n        b: Two.\n    """\n    return str(a + b)\n'
    )
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call>'
    tok = json.dumps(tokenizer_dir())
    (tmp_path / "tito.toml").write_text(
        f'backend = "scripted"\ntokenizer = {tok}\ntool_parser = "hermes"\n'
        f"[backend_options]\ntokenizer = {tok}\nreplies = {json.dumps([call] * 4)}\n"
        '[rollout]\ngroup_size = 1\ntools = ["tools:add"]\nmax_model_calls = 1\n'
    )
    write_jsonl(tmp_path / "t.jsonl", tasks(1))
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "tito_core.cli", "rollout", "--config", str(tmp_path / "tito.toml"),
               "--dataset", str(tmp_path / "t.jsonl"), "--output", str(out), "--quiet"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    statuses = {record["status_reason"] for record in lines(out)}
    assert statuses == {"loop limit: max_model_calls=1 reached"}
