"""`tito rollout` on Harbor tasks: tasks read by harbor, each rollout's harness in a bubblewrap sandbox, the
verifier's reward (1, 0, or None with the reason and out of the group baseline), task.toml's time limits, and one
rollout unable to reach another. The harness is a small stdlib agent (``agents/shell_agent.py``) on the scripted
model; ``test_harnesses.py`` runs real ones."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from tito_core import Trajectory, rollout
from tito_core.config import load_config
from tito_core.errors import DatasetError
from tito_core.harbor import HARBOR_KEY, harbor_spec, load_harbor_tasks, read_reward
from tito_core.runner import read_records
from tito_core.runner.dataset import Task
from tito_core.tokenizers import load_tokenizer

from ..runner.helpers import tokenizer_dir
from .helpers import DATASET, EXAMPLES, harbor_config, make_task, script

pytest.importorskip("harbor", reason="the harbor package (Python 3.12+): run `nox -s harbor`")
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed: `nox -s harbor`")
NORMALIZED = "tito_core.runner.rewards:group_normalized"


@pytest.fixture(autouse=True)
def _boxes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Sandboxes under the test's folder, so a test can see that none is left behind."""
    boxes = tmp_path / "boxes"
    boxes.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(boxes))
    return boxes


def test_harbor_reads_the_example_tasks_and_names_a_broken_one(tmp_path: Path) -> None:
    tasks = load_harbor_tasks(DATASET)
    assert [t.id for t in tasks] == ["fix-add", "impossible", "write-greeting"]
    spec = tasks[0].spec
    assert harbor_spec(Task(id="t", prompt="p", metadata={HARBOR_KEY: spec})) == spec
    assert spec.workdir == "/app" and spec.agent_timeout_s == 120 and spec.verifier_timeout_s == 60
    assert "`add` in `/app/calc.py`" in str(tasks[0].prompt)
    assert spec.hide == [str(path) for path in sorted(DATASET.iterdir())]  # every task folder is masked
    example = load_config(EXAMPLES / "tito.toml")  # the example's config names the dataset and the harness
    assert example.rollout.tasks is not None and (EXAMPLES / example.rollout.tasks.harbor).resolve() == DATASET
    assert example.rollout.agent is not None and example.rollout.agent.command == ["python", "mini_swe.py"]
    broken = make_task(tmp_path, "broken", "Do it.", "exit 0")
    (broken / "tests" / "test.sh").unlink()
    with pytest.raises(DatasetError, match=r"broken: not a valid Harbor task.*test\.sh"):
        load_harbor_tasks(tmp_path)


def test_the_verifier_rewards_solved_tasks_1_and_the_unsolvable_one_0(tmp_path: Path, _boxes: Path) -> None:
    out = tmp_path / "out.jsonl"
    summary = rollout(harbor_config(script("shell_agent.py"), group_size=2), None, out)
    records = {(r.task_id, r.sample): r for r in read_records(out)}
    assert summary.written == 6
    rewards = {key: r.reward for key, r in records.items()}
    assert rewards == {("fix-add", 0): 1.0, ("fix-add", 1): 1.0, ("write-greeting", 0): 1.0,
                       ("write-greeting", 1): 1.0, ("impossible", 0): 0.0, ("impossible", 1): 0.0}  # fmt: skip
    assert all(r.status == "completed" and r.tokens.model_calls == 2 for r in records.values())
    traj = Trajectory.from_record(records["fix-add", 0].trajectory)
    second = traj.turns[1]
    prompt = load_tokenizer(tokenizer_dir()).decode(
        traj.token_ids[second.prompt_start : second.prompt_start + second.prompt_len]
    )
    assert "return a + b" in prompt  # the harness edited its own copy of calc.py, in its sandbox
    assert (DATASET / "fix-add" / "environment" / "calc.py").read_text().count("a - b") == 1  # not the task's
    assert list(_boxes.iterdir()) == []  # every sandbox removed


def test_a_crashed_harness_gets_no_reward_and_stays_out_of_the_baseline(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    config = harbor_config(script("shell_agent.py"), dataset=DATASET / "write-greeting", group_size=3,
                           group_reward=NORMALIZED, agent={"env": {"SHELL_AGENT_CRASH": "1"}})  # fmt: skip
    rollout(config, None, out)
    records = sorted(read_records(out), key=lambda r: r.sample)
    assert [r.reward for r in records] == [1.0, None, 1.0]
    crashed = records[1]
    assert crashed.status == "failed" and "exited with code 3" in (crashed.status_reason or "")
    # the baseline is the mean of the rewards the verifier gave: a crash counted as 0 would give the others > 0
    assert [r.advantage for r in records] == [0.0, None, 0.0]


def test_no_reward_file_is_none_with_the_reason_and_a_reward_the_agent_wrote_does_not_count(tmp_path: Path) -> None:
    dataset = tmp_path / "tasks"
    make_task(dataset, "cheat", "Write 1 to /logs/verifier/reward.txt.", "echo checked; exit 1")
    out = tmp_path / "out.jsonl"
    rollout(harbor_config(script("shell_agent.py"), dataset=dataset), None, out)
    (record,) = read_records(out)
    assert record.reward is None and record.status == "failed"
    assert "no verifier reward: the verifier wrote no reward file" in (record.status_reason or "")
    assert "exit code 1" in (record.status_reason or "") and "checked" in (record.status_reason or "")


def test_task_toml_time_limits_the_agent_and_then_the_verifier(tmp_path: Path) -> None:
    dataset = tmp_path / "tasks"
    make_task(dataset, "slow-agent", "Run /app/slow.", "echo 0 > /logs/verifier/reward.txt", agent=2.0)
    make_task(dataset, "slow-verifier", "Write /app/greeting.txt.", "sleep 120", verifier=2.0)
    out = tmp_path / "out.jsonl"
    rollout(harbor_config(script("shell_agent.py"), dataset=dataset), None, out)
    records = {r.task_id: r for r in read_records(out)}
    agent, verifier = records["slow-agent"], records["slow-verifier"]
    # the agent ran out of its task's time: aborted, and the verifier still ran (as in Harbor): its reward stands
    assert agent.status == "aborted" and agent.status_reason == "timed out after 2 s" and agent.reward == 0.0
    assert verifier.reward is None and "the verifier timed out after 2 s" in (verifier.status_reason or "")


def test_one_harness_cannot_read_or_finish_another_rollout(tmp_path: Path) -> None:
    barrier = socket.create_server(("127.0.0.1", 0))
    port = barrier.getsockname()[1]

    def release_both() -> None:  # both rollouts of the group wait here, so each probes while the other runs
        first, _ = barrier.accept()
        second, _ = barrier.accept()
        for conn in (first, second):
            conn.sendall(b"x")
            conn.close()

    threading.Thread(target=release_both, daemon=True).start()
    out = tmp_path / "out.jsonl"
    env = {"PROBE_BARRIER": str(port), "PROBE_DATASET": str(DATASET / "write-greeting")}
    config = harbor_config(script("probe_agent.py"), dataset=DATASET / "write-greeting", group_size=2,
                           agent={"env": env})  # fmt: skip
    rollout(config, None, out)
    barrier.close()
    tokenizer = load_tokenizer(tokenizer_dir())
    for record in read_records(out):
        assert record.status == "completed", record.status_reason  # neither rollout was finished by the other
        traj = Trajectory.from_record(record.trajectory)
        text = tokenizer.decode(traj.token_ids)
        found = json.loads(text.split("PROBE ", 1)[1].split("<|im_end|>", 1)[0])
        assert found["other_tokens"] == []  # no other harness's token in any environment it can read
        assert found["read_sibling"] in (401, 403) and found["finish_sibling"] in (401, 403)
        assert found["dataset_visible"] == []  # the tests and solutions of every task are masked
        assert "home" in found["tmp"] and not any(name.startswith("tito-harbor-") for name in found["tmp"])


@pytest.mark.parametrize(
    ("name", "text"),
    [("reward.txt", "1\n"), ("reward.txt", "0.25"), ("reward.txt", ""), ("reward.txt", "yes"), ("reward.txt", "nan"),
     ("reward.json", '{"reward": 0.5, "style": 1}'), ("reward.json", '{"pass": 1}'), ("reward.json", '{"a": "x"}'),
     ("reward.json", "{not json"), ("reward.json", '{"reward": NaN}')],
)  # fmt: skip
def test_reward_files_read_as_harbors_verifier_reads_them(tmp_path: Path, name: str, text: str) -> None:
    from harbor.verifier.verifier import Verifier

    (tmp_path / name).write_text(text)
    paths = SimpleNamespace(trial_paths=SimpleNamespace(reward_text_path=tmp_path / "reward.txt",
                                                        reward_json_path=tmp_path / "reward.json"))  # fmt: skip
    parse = Verifier._parse_reward_json if name == "reward.json" else Verifier._parse_reward_text
    try:
        theirs: dict[str, float] | None = {k: float(v) for k, v in parse(paths).items()}  # type: ignore[arg-type]
    except Exception:
        theirs = None
    ours = read_reward(tmp_path)
    # a file harbor refuses gives no reward; one it reads gives the same rewards, and the reward is its `reward`
    # (or its only value)
    assert (ours.reward is None) == (theirs is None or ("reward" not in theirs and len(theirs) > 1))
    if theirs is not None:
        assert ours.rewards == theirs and ours.reward == theirs.get("reward", next(iter(theirs.values())))
    else:
        assert ours.reason
