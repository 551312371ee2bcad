"""`tito rollout` with a `[rollout.agent]`: agents of any framework, as processes or callables, through the gateway.

Each test runs the real runner on the scripted backend (in process); command agents are real processes speaking
HTTP to the runner's gateway.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tito_core import Trajectory, arollout, rollout
from tito_core.errors import ConfigError
from tito_core.runner import read_records
from tito_core.runner.agent_process import AgentExited, answer_line
from tito_core.tokenizers import load_tokenizer
from tito_testing.gate import FileGate

from ..runner.helpers import answer_with, lines, tokenizer_dir
from .helpers import HOUR, SkippingLoop, add_tasks, agent_config, run_skipping, script, until

HELPERS = "tests.gateway_runner.helpers"
REWARD = f"{HELPERS}:number_reward"


def _trajectories(out: Path) -> dict[tuple[str, int], Trajectory]:
    return {r.key: Trajectory.from_record(r.trajectory) for r in read_records(out)}


def test_an_openai_sdk_script_runs_per_rollout_with_groups_rewards_and_resume(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    cfg = agent_config(
        {"command": script("openai_sdk_agent.py"), "timeout_s": 300},
        group_size=2,
        reward=REWARD,
        group_reward="tito_core.runner.rewards:group_normalized",
    )
    summary = rollout(cfg, add_tasks(3), out)
    assert summary.written == 6 and summary.statuses == {"completed": 6}
    records = [r for r in lines(out) if r.get("kind") != "advantages"]
    assert {(r["task_id"], r["sample"]) for r in records} == {(f"t{i}", s) for i in range(3) for s in range(2)}
    tokenizer = load_tokenizer(tokenizer_dir())
    for key, traj in _trajectories(out).items():
        record = next(r for r in read_records(out) if r.key == key)
        assert record.reward == 1.0 and record.advantage == 0.0  # the answer line "The answer is N." holds N
        assert traj.rollout_id == f"{key[0]}:{key[1]}" and traj.status == "completed"
        first, second = traj.turns
        assert (record.tokens.model_calls, record.tokens.tool_calls) == (2, 1)
        assert first.tool_calls == 1 and second.tool_calls == 0
        outputs = [tokenizer.decode(traj.token_ids[s.start : s.end]) for s in traj.segments if s.kind == "output"]
        assert '"name": "add"' in outputs[0] and outputs[1].startswith(f"The answer is {2 + int(key[0][1:])}.")
        assert sum(traj.loss_mask) == record.tokens.output > 0
    again = rollout(cfg, add_tasks(3), out)  # resume: every rollout is there already
    assert again.written == 0 and len([r for r in lines(out) if r.get("kind") != "advantages"]) == 6


def test_an_anthropic_sdk_script_records_its_tool_loop_through_the_messages_api(tmp_path: Path) -> None:
    pytest.importorskip("anthropic", reason="the anthropic SDK is installed by the nox session `agents`")
    out = tmp_path / "out.jsonl"
    cfg = agent_config({"command": script("anthropic_sdk_agent.py"), "timeout_s": 300}, reward=REWARD)
    summary = rollout(cfg, add_tasks(2), out)
    assert summary.statuses == {"completed": 2}
    tokenizer = load_tokenizer(tokenizer_dir())
    for key, traj in _trajectories(out).items():
        record = next(r for r in read_records(out) if r.key == key)
        assert record.reward == 1.0 and (record.tokens.model_calls, record.tokens.tool_calls) == (2, 1)
        assert traj.branch == 0 and not traj.branches  # the replayed blocks matched the replies: no fork
        first, second = traj.turns
        prompt = tokenizer.decode(traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_len])
        assert f"<tool_response>\n{2 + int(key[0][1:])}\n</tool_response>" in prompt  # the tool's result
        assert "Use the add tool for every sum." in tokenizer.decode(traj.token_ids[: traj.prompt_length])


def test_a_crashing_agent_gives_a_failed_record_with_its_exit_code_and_stderr_tail(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rollout(agent_config({"command": script("misbehaving.py")}, answer_with("4")), add_tasks(1, mode="crash"), out)
    (record,) = read_records(out)
    assert record.status == "failed" and record.status_reason is not None
    assert "AgentExited: the agent exited with code 3; stderr tail:" in record.status_reason
    assert record.status_reason.endswith("Traceback: the tool server is gone\nfatal: boom")
    assert len(record.status_reason) < 2100  # the tail, not the 120 kB the agent wrote
    traj = Trajectory.from_record(record.trajectory)
    assert traj.status == "failed" and traj.status_reason == record.status_reason
    assert len(traj.turns) == 1  # the call it made before crashing is recorded as the engine answered it


def test_an_agent_past_its_time_limit_is_killed_with_its_process_group(tmp_path: Path) -> None:
    out, pid_file = tmp_path / "out.jsonl", tmp_path / "child.pid"
    agent = {"command": script("misbehaving.py"), "timeout_s": HOUR, "env": {"PID_FILE": str(pid_file)}}
    cfg = agent_config(agent, answer_with("4"))

    async def main(loop: SkippingLoop) -> tuple[int, int]:
        run = asyncio.ensure_future(arollout(cfg, add_tasks(1, mode="hang"), out))
        await until(pid_file.exists, run, "the agent made its call and started its child")
        agent_pid, child_pid = map(int, pid_file.read_text().split())
        assert _alive(agent_pid) and _alive(child_pid)
        loop.skip(HOUR)  # the limit runs out now, through the runner's own asyncio.timeout
        async with asyncio.timeout(300):  # a hang guard (the clock runs on from here)
            await run
        return agent_pid, child_pid

    agent_pid, child_pid = run_skipping(main)
    (record,) = read_records(out)
    assert (record.status, record.status_reason) == ("aborted", f"timed out after {HOUR} s")
    assert record.tokens.model_calls == 1
    assert not _alive(agent_pid) and not _alive(child_pid)  # the child it started in its group is gone too


async def test_a_cancelled_run_kills_its_agents_process_groups(tmp_path: Path) -> None:
    out, pid_file = tmp_path / "out.jsonl", tmp_path / "child.pid"
    agent = {"command": script("misbehaving.py"), "env": {"PID_FILE": str(pid_file)}}
    run = asyncio.create_task(arollout(agent_config(agent, answer_with("4")), add_tasks(1, mode="hang"), out))
    async with asyncio.timeout(300):  # a hang guard: the agent writes the file after its model call
        while not pid_file.exists():
            await asyncio.sleep(0.05)
    agent_pid, child_pid = map(int, pid_file.read_text().split())
    assert _alive(agent_pid) and _alive(child_pid)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not _alive(agent_pid) and not _alive(child_pid)
    assert list(read_records(out)) == []  # a cancelled rollout is in flight, not recorded


def test_a_flood_on_both_pipes_never_stalls_the_agent_and_its_last_line_is_the_answer(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    cfg = agent_config({"command": script("misbehaving.py")}, answer_with("4"), reward=f"{HELPERS}:exactly_four")
    rollout(cfg, add_tasks(1, mode="flood"), out)
    (record,) = read_records(out)
    assert (record.status, record.reward) == ("completed", 1.0)


def test_a_command_runs_in_the_config_files_directory_with_its_env(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(
        "import json, os\nprint(os.environ['GREETING'], json.loads(os.environ['TITO_TASK'])['id'], os.getcwd())\n"
    )
    (tmp_path / "tito.toml").write_text(
        f'backend = "scripted"\ntokenizer = "{tokenizer_dir()}"\n'
        f'backend_options = {{ tokenizer = "{tokenizer_dir()}" }}\n'
        f'[rollout]\nreward = "{HELPERS}:echo_text"\n'
        f'[rollout.agent]\ncommand = ["{sys.executable}", "agent.py"]\nenv = {{ GREETING = "hi" }}\n'
    )
    rollout(tmp_path / "tito.toml", add_tasks(1, cwd=str(tmp_path)), tmp_path / "out.jsonl")
    (record,) = read_records(tmp_path / "out.jsonl")
    assert record.reward == 1.0  # echo_text checked "hi t0 <tmp_path>"
    assert record.status == "failed" and record.tokens.model_calls == 0  # it never called the model
    assert record.status_reason == "the rollout ended without any model call: it holds no output"


@pytest.mark.parametrize(
    ("agent", "status", "reason", "reward"),
    [
        ({"callable": f"{HELPERS}:aiohttp_agent"}, "completed", None, 1.0),
        ({"callable": f"{HELPERS}:raising_agent"}, "failed", "LookupError: no such tool for t0", 0.0),
        ({"callable": f"{HELPERS}:waiting_agent", "timeout_s": 0.2}, "aborted", "timed out after 0.2 s", 0.0),
    ],
)
def test_a_callable_agent(
    tmp_path: Path, agent: dict[str, Any], status: str, reason: str | None, reward: float
) -> None:
    out = tmp_path / "out.jsonl"
    rollout(agent_config(agent, reward=REWARD), add_tasks(1), out)
    (record,) = read_records(out)
    assert (record.status, record.status_reason, record.reward) == (status, reason, reward)
    assert record.tokens.model_calls == (2 if status == "completed" else 0)


def test_a_call_in_flight_when_the_time_limit_hits_is_recorded_then_the_rollout_times_out(tmp_path: Path) -> None:
    out, stopped, gate = tmp_path / "out.jsonl", tmp_path / "stopped", FileGate(tmp_path / "gate")
    cfg = agent_config({"callable": f"{HELPERS}:marks_its_stop_agent", "timeout_s": HOUR})
    cfg["backend_options"]["gate"] = str(gate.path)  # the engine holds the call until the test opens the gate

    async def main(loop: SkippingLoop) -> None:
        run = asyncio.ensure_future(arollout(cfg, add_tasks(1, stopped=str(stopped)), out))
        await until(lambda: gate.arrived() == 1, run, "the call reached the engine")
        loop.skip(HOUR)
        await until(stopped.exists, run, "the time limit stopped the agent")
        gate.open()  # the engine answers after the agent was stopped
        async with asyncio.timeout(300):  # a hang guard
            await run

    run_skipping(main)
    (record,) = read_records(out)
    assert (record.status, record.status_reason) == ("aborted", f"timed out after {HOUR} s")
    assert record.tokens.model_calls == 1 and record.tokens.output > 0  # the engine's answer, as it gave it


@pytest.mark.parametrize(
    ("rollout_table", "message"),
    [
        ({"agent": {"command": ["python"], "callable": "a:b"}}, "exactly one of `command`"),
        ({"agent": {}}, "exactly one of `command`"),
        ({"agent": {"command": "python agent.py"}}, "must be a list of strings"),
        ({"agent": {"command": []}}, "non-empty list"),
        ({"agent": {"command": ["python"], "timeout": 3}}, "unknown key `rollout.agent.timeout`; did you mean"),
        ({"agent": {"command": ["python"], "timeout_s": 0}}, "`rollout.agent.timeout_s` must be positive"),
        ({"agent": {"callable": "mod:fn", "env": {"A": "1"}}}, "`rollout.agent.env` is for a `command` agent"),
        ({"agent": {"callable": "no_module_path"}}, "import path"),
        ({"tools": ["x:y"], "agent": {"command": ["python"]}}, "`rollout.tools` is for Strands rollouts"),
        ({"max_model_calls": 3, "agent": {"command": ["python"]}}, "`rollout.max_model_calls` is for Strands"),
        ({"agent": {"command": ["no-such-program-here"]}}, "the program 'no-such-program-here' is not found"),
        (
            {"agent": {"callable": f"{HELPERS}:sync_agent"}},
            "must be an `async def agent(task, base_url, api_key) -> str`",
        ),
        ({"agent": {"callable": f"{HELPERS}:two_argument_agent"}}, "cannot take three arguments"),
        ({"agent": {"callable": f"{HELPERS}:nothing"}}, "has no attribute 'nothing'"),
    ],
)
def test_a_bad_agent_table_is_refused_before_any_rollout(
    tmp_path: Path, rollout_table: dict[str, Any], message: str
) -> None:
    cfg = agent_config({}, answer_with("4"))
    cfg["rollout"] = rollout_table
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rollout(cfg, add_tasks(1), tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_answer_line_and_exit_messages() -> None:
    assert answer_line("log\n  42  \n\n \n") == "42"
    assert answer_line("\n\n") == answer_line("") == ""
    assert str(AgentExited(2, "")) == "the agent exited with code 2; its stderr was empty"
    killed = AgentExited(-signal.SIGKILL, "x")
    assert str(killed) == "the agent was killed by SIGKILL (exit code -9); stderr tail: x" and killed.code == -9


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for a parent that does not reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
