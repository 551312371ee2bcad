"""The runner on the scripted backend: records, statuses on every way out, rewards, limits, resume, Parquet."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tito_core import Trajectory, arollout, rollout
from tito_core.errors import BackendConnectionError, ConfigError, DatasetError, TitoError
from tito_core.plugins import BackendSpec, hookimpl, temporary_plugin
from tito_core.records import OutputLockedError, open_writer
from tito_core.runner import read_records, rollout_seed
from tito_core.runner.executor import Executor
from tito_core.runner.rewards import group_normalized
from tito_core.runner.run import failed_keys
from tito_core.runner.worker import RolloutWorker
from tito_core.tokenizers import load_tokenizer
from tito_testing.scripted import ScriptedBackend

from .helpers import PREPARED, answer_with, call, config, lines, tasks, tokenizer_dir, tool_turns, write_jsonl

REWARD = "tests.runner.helpers:contains_answer"


def test_every_task_runs_group_size_times_into_one_record_each(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    summary = rollout(config(answer_with("The answer is 4."), group_size=3, reward=REWARD), tasks(4), out)
    records = lines(out)
    assert len(records) == 12
    assert {(r["task_id"], r["sample"]) for r in records} == {(f"t{i}", s) for i in range(4) for s in range(3)}
    for r in records:
        assert set(r) >= {"task_id", "sample", "group", "status", "status_reason", "reward", "trajectory"}
        assert r["group"] == int(r["task_id"][1:])
        assert r["status"] == "completed" and r["status_reason"] is None
        assert r["reward"] == (1.0 if r["task_id"] == "t2" else 0.0)  # only 2 + 2 is 4
        traj = Trajectory.from_record(
            next(x for x in read_records(out) if x.key == (r["task_id"], r["sample"])).trajectory
        )
        assert traj.rollout_id == f"{r['task_id']}:{r['sample']}"
        assert r["tokens"]["output"] == sum(traj.loss_mask) > 0
        assert r["tokens"]["total"] == len(traj.token_ids) and r["tokens"]["model_calls"] == 1
        assert r["timings"]["wall_s"] >= r["timings"]["agent_s"] > 0
    assert summary.written == summary.planned == 12 and summary.statuses == {"completed": 12}
    assert summary.reward_mean == pytest.approx(3 / 12)
    assert {g.task_id: g.reward_mean for g in summary.groups}["t2"] == 1.0


def test_messages_prompt_sets_the_system_prompt_and_history(tmp_path: Path) -> None:
    rows = [
        {
            "id": "chat",
            "prompt": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "What is 2 + 2?"},
            ],
        }
    ]
    rollout(config(answer_with("4")), rows, tmp_path / "out.jsonl")
    (record,) = read_records(tmp_path / "out.jsonl")
    traj = Trajectory.from_record(record.trajectory)
    text = load_tokenizer(tokenizer_dir()).decode(traj.token_ids[: traj.prompt_length])
    assert "You are terse." in text and "Hello." in text and text.rstrip().endswith("assistant")


def _looping_tool_calls(request: Any) -> str:
    return call("add", a=1, b=tool_turns(request, load_tokenizer(tokenizer_dir())))


@pytest.mark.parametrize(
    ("limit", "reason", "model_calls"),
    [
        ({"max_model_calls": 3}, "max_model_calls=3 reached", 3),
        ({"max_tool_calls": 2}, "max_tool_calls=2 reached", 3),
        ({"max_messages": 4}, "5 messages exceed max_messages=4", 2),
    ],
)
def test_loop_limits_end_the_rollout_truncated_with_the_reason(
    tmp_path: Path, limit: dict[str, int], reason: str, model_calls: int
) -> None:
    cfg = config([_looping_tool_calls] * 100, tools=["tests.runner.helpers:add"], **limit)
    rollout(cfg, tasks(1), tmp_path / "out.jsonl")
    (record,) = read_records(tmp_path / "out.jsonl")
    assert record.status == "truncated" and record.status_reason is not None and reason in record.status_reason
    assert record.trajectory.status == "truncated"
    assert record.tokens.model_calls == model_calls == len(record.trajectory.turns)


def test_a_rollout_past_its_timeout_is_aborted_and_the_batch_goes_on(tmp_path: Path) -> None:
    cfg = config(answer_with("slow"), timeout_s=0.05)
    cfg["backend_options"]["delay"] = 0.5
    summary = rollout(cfg, tasks(3), tmp_path / "out.jsonl")
    records = list(read_records(tmp_path / "out.jsonl"))
    assert len(records) == 3 and summary.statuses == {"aborted": 3}
    assert all(r.status_reason == "timed out after 0.05 s" for r in records)


def _fails_for_t1(request: Any) -> Any:
    text = load_tokenizer(tokenizer_dir()).decode(list(request.input_ids))
    return None if "2 + 1?" in text else "The answer is 4."  # None: the scripted engine raises a BackendError


def test_one_failing_rollout_never_kills_the_batch(tmp_path: Path) -> None:
    summary = rollout(config([_fails_for_t1] * 10, group_size=2), tasks(3), tmp_path / "out.jsonl")
    by_task = {(r.task_id, r.sample): r for r in read_records(tmp_path / "out.jsonl")}
    assert len(by_task) == 6 and summary.statuses == {"completed": 4, "failed": 2}
    for sample in range(2):
        failed = by_task[("t1", sample)]
        assert failed.status == "failed" and "BackendError" in (failed.status_reason or "")
        assert failed.trajectory.status == "failed"


def test_a_raising_reward_marks_only_its_rollout(tmp_path: Path) -> None:
    cfg = config(answer_with("ok"), reward="tests.runner.helpers:raises_on_t1")
    rollout(cfg, tasks(3), tmp_path / "out.jsonl")
    records = {r.task_id: r for r in read_records(tmp_path / "out.jsonl")}
    assert records["t1"].status == "failed" and records["t1"].reward is None
    assert records["t1"].status_reason == "reward function raised ZeroDivisionError: boom"
    # the trajectory and its record never disagree (status_of decides both)
    assert (records["t1"].trajectory.status, records["t1"].trajectory.status_reason) == (
        "failed",
        "reward function raised ZeroDivisionError: boom",
    )
    assert [records[t].reward for t in ("t0", "t2")] == [1.0, 1.0]


def _call_then_answer(request: Any) -> str:
    first = tool_turns(request, load_tokenizer(tokenizer_dir())) == 0
    return call("add", a=1, b=2) if first else "The answer is 3."


def test_a_reward_per_turn_is_recorded_with_its_total(tmp_path: Path) -> None:
    cfg = config([_call_then_answer] * 10, tools=["tests.runner.helpers:add"], reward="tests.runner.helpers:per_turn")
    rollout(cfg, tasks(2), tmp_path / "out.jsonl")
    records = {r.task_id: r for r in read_records(tmp_path / "out.jsonl")}
    assert records["t0"].turn_rewards == [0.5, 1.0] and records["t0"].reward == 1.5  # a list: its sum
    assert records["t1"].turn_rewards == [0.5, 1.0] and records["t1"].reward == 10.0  # a mapping's own total
    assert all(len(r.turn_rewards or ()) == len(r.trajectory.turns) for r in records.values())


def test_per_turn_rewards_of_the_wrong_length_fail_the_rollout_with_the_reason(tmp_path: Path) -> None:
    cfg = config([_call_then_answer] * 10, tools=["tests.runner.helpers:add"],
                 reward="tests.runner.helpers:one_turn_short")  # fmt: skip
    rollout(cfg, tasks(1), tmp_path / "out.jsonl")
    (record,) = read_records(tmp_path / "out.jsonl")
    assert record.status == "failed" and record.reward is None and record.turn_rewards is None
    assert record.status_reason == (
        "reward function raised TurnRewardError: 1 per-turn rewards for a rollout of 2 model calls: give one per "
        "call (None for none)"
    )


def test_a_seeded_run_gives_each_rollout_its_own_seed_and_each_call_the_next(tmp_path: Path) -> None:
    seen: list[int | None] = []

    def reply(request: Any) -> str:
        seen.append(request.sampling.seed)
        return _call_then_answer(request)

    cfg = {**config([reply] * 20, tools=["tests.runner.helpers:add"], group_size=2), "sampling": {"seed": 5}}
    rollout(cfg, tasks(2), tmp_path / "a.jsonl")
    per_rollout = [rollout_seed(5, f"t{t}", s) for t in range(2) for s in range(2)]
    assert sorted(seen) == sorted(seed + call for seed in per_rollout for call in (0, 1))
    assert len(set(per_rollout)) == 4 and rollout_seed(6, "t0", 0) != per_rollout[0]
    first = list(seen)
    seen.clear()
    rollout(cfg, tasks(2), tmp_path / "b.jsonl")  # a rerun: the same seeds, whatever order the rollouts ran in
    assert sorted(seen) == sorted(first)


def test_async_reward(tmp_path: Path) -> None:
    rollout(config(answer_with("four"), reward="tests.runner.helpers:async_length"), tasks(2), tmp_path / "o.jsonl")
    assert [r.reward for r in read_records(tmp_path / "o.jsonl")] == [4.0, 4.0]


def test_group_reward_gives_group_normalized_advantages(tmp_path: Path) -> None:
    replies = ["The answer is 4.", "I do not know."] * 4  # one rollout at a time: samples alternate
    cfg = config(
        replies,
        group_size=4,
        concurrency=1,
        reward=REWARD,
        group_reward="tito_core.runner.rewards:group_normalized",
    )
    rollout(cfg, [tasks(3)[2]], tmp_path / "out.jsonl")
    records = sorted(read_records(tmp_path / "out.jsonl"), key=lambda r: r.sample)
    assert [r.reward for r in records] == [1.0, 0.0, 1.0, 0.0]
    assert [r.advantage for r in records] == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)


def test_a_raising_group_reward_marks_its_group(tmp_path: Path) -> None:
    cfg = config(answer_with("4"), group_size=2, reward=REWARD, group_reward="tests.runner.helpers:group_fails")
    rollout(cfg, tasks(2), tmp_path / "out.jsonl")
    records = list(read_records(tmp_path / "out.jsonl"))
    assert len(records) == 4
    assert all(r.status == "failed" and "group boom" in (r.status_reason or "") for r in records)


# ---------------------------------------------------------------------------------------------- resume
def test_a_rerun_skips_finished_rollouts_and_adds_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rollout(config(answer_with("4"), group_size=2), tasks(3), out)
    first = out.read_bytes()
    summary = rollout(config(answer_with("4"), group_size=2), tasks(5), out)
    assert out.read_bytes().startswith(first)  # append-only
    keys = [(r["task_id"], r["sample"]) for r in lines(out)]
    assert len(keys) == len(set(keys)) == 10
    assert (summary.skipped, summary.written) == (6, 4)
    again = rollout(config(answer_with("4"), group_size=2), tasks(5), out)
    assert (again.skipped, again.written) == (10, 0) and len(lines(out)) == 10


def test_a_resumed_half_written_group_gets_advantages_over_the_whole_group(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    cfg = config(
        answer_with("4"),
        group_size=4,
        reward="tests.runner.helpers:sample_index",
        group_reward="tito_core.runner.rewards:group_normalized",
    )
    rollout(cfg, tasks(1), out)
    whole = [line for line in out.read_bytes().splitlines(keepends=True) if b'"kind":"advantages"' not in line]
    kept = sorted(whole, key=lambda line: json.loads(line)["sample"])[:2]
    out.write_bytes(b"".join(kept))  # as a kill after two records of the group leaves it: no advantages yet
    summary = rollout(cfg, tasks(1), out)
    assert (summary.skipped, summary.written) == (2, 2)
    assert out.read_bytes().startswith(b"".join(kept))  # the earlier records are not rewritten
    records = sorted(read_records(out), key=lambda r: r.sample)
    assert [r.reward for r in records] == [0.0, 1.0, 2.0, 3.0]
    expected = group_normalized([0.0, 1.0, 2.0, 3.0])
    assert [r.advantage for r in records] == pytest.approx(expected)  # one entry, written when the group was whole


@pytest.mark.parametrize("name", ["out.jsonl", "out.parquet"])
def test_a_resumed_runs_summary_also_covers_the_whole_file(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    out = tmp_path / name
    first = rollout(config(answer_with("The answer is 4."), reward=REWARD, row_group_size=1), tasks(3), out)
    assert (first.file_records, first.file_statuses, first.file_reward_mean) == (
        3,
        {"completed": 3},
        pytest.approx(1 / 3),
    )
    summary = rollout(config(answer_with("The answer is 5."), reward=REWARD), tasks(4), out)
    assert (summary.written, summary.reward_mean) == (1, 1.0)  # this run: t3 (2 + 3)
    assert (summary.file_records, summary.file_statuses) == (4, {"completed": 4})
    assert summary.file_reward_mean == pytest.approx(0.5) and summary.file_reward_std == pytest.approx(0.5)


def test_a_torn_last_line_is_cut_off_and_its_rollout_runs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    rollout(config(answer_with("4")), tasks(3), out)
    whole = out.read_bytes().splitlines(keepends=True)
    out.write_bytes(b"".join(whole[:2]) + whole[2][: len(whole[2]) // 2])  # as a kill mid-write leaves it
    summary = rollout(config(answer_with("4")), tasks(3), out)
    assert summary.written == 1 and "torn last line" in caplog.text
    records = lines(out)
    assert sorted(r["task_id"] for r in records) == ["t0", "t1", "t2"]


async def test_cancelling_a_run_keeps_every_written_record_whole(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    cfg = config(answer_with("4"), concurrency=2)
    cfg["backend_options"]["delay"] = 0.05
    run = asyncio.create_task(arollout(cfg, tasks(20), out))
    while not out.exists() or len(out.read_bytes().splitlines()) < 3:
        await asyncio.sleep(0.01)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    written = lines(out)  # every line parses
    assert 3 <= len(written) < 20
    summary = await arollout(cfg, tasks(20), out)
    assert summary.skipped == len(written)
    keys = [(r["task_id"], r["sample"]) for r in lines(out)]
    assert len(keys) == len(set(keys)) == 20


# ------------------------------------------------------------------------------------------ retry_failed
def test_retry_failed_reruns_the_failed_records_and_keeps_the_others_byte_for_byte(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    rollout(config(answer_with("4"), group_size=2, reward="tests.runner.helpers:raises_on_t1"), tasks(3), out)
    kept = [line for line in out.read_bytes().splitlines(keepends=True) if b'"task_id":"t1"' not in line]
    again = config(answer_with("4"), group_size=2, reward=REWARD)  # the reward service is back
    assert rollout(again, tasks(3), out).written == 0  # off by default: failed records count as done
    summary = rollout(again, tasks(3), out, retry_failed=True)
    assert (summary.skipped, summary.written) == (4, 2) and "removing 2 failed records" in caplog.text
    assert out.read_bytes().startswith(b"".join(kept))  # the other records, byte for byte, in their order
    records = list(read_records(out))
    assert sorted(r.key for r in records) == [(f"t{i}", s) for i in range(3) for s in range(2)]  # no duplicates
    assert {r.status for r in records} == {"completed"}
    assert summary.file_statuses == {"completed": 6}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_retry_failed_with_a_group_reward_reruns_the_whole_group(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    group = "tito_core.runner.rewards:group_normalized"
    first = config(answer_with("4"), group_size=2, reward="tests.runner.helpers:raises_on_t1_sample_1")
    rollout({**first, "rollout": {**first["rollout"], "group_reward": group}}, tasks(3), out)
    before = {r.key: r.status for r in read_records(out)}
    assert before[("t1", 0)] == "completed" and before[("t1", 1)] == "failed"
    again = config(answer_with("4"), group_size=2, reward="tests.runner.helpers:sample_index", group_reward=group)
    summary = rollout(again, tasks(3), out, retry_failed=True)
    assert (summary.skipped, summary.written) == (4, 2)  # t1's completed sample 0 runs again too
    records = [r for r in read_records(out) if r.task_id == "t1"]
    assert sorted(r.sample for r in records) == [0, 1]
    assert [r.advantage for r in sorted(records, key=lambda r: r.sample)] == pytest.approx([-1.0, 1.0], abs=1e-5)


def test_failed_keys_keeps_aborted_records_and_tasks_not_in_the_dataset() -> None:
    outcomes = {
        ("a", 0): ("completed", 1.0),
        ("a", 1): ("failed", None),
        ("b", 0): ("aborted", None),
        ("b", 1): ("completed", 0.0),
        ("gone", 0): ("failed", None),
    }
    assert failed_keys(outcomes, {"a", "b"}, whole_groups=False) == {("a", 1)}
    assert failed_keys(outcomes, {"a", "b"}, whole_groups=True) == {("a", 0), ("a", 1)}


def test_retry_failed_rewrites_only_the_parquet_parts_holding_failed_records(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "out.parquet"
    cfg = config(answer_with("4"), group_size=2, row_group_size=3, reward="tests.runner.helpers:raises_on_t1")
    rollout({**cfg, "rollout": {**cfg["rollout"], "concurrency": 1}}, tasks(4), out)
    parts = {p.name: pq.read_table(p).column("task_id").to_pylist() for p in out.glob("*.parquet")}
    assert sorted(parts.values()) == [["t0", "t0", "t1"], ["t1", "t2", "t2"], ["t3", "t3"]]  # one rollout at a time
    data = {p.name: p.read_bytes() for p in out.glob("*.parquet")}
    again = config(answer_with("4"), group_size=2, row_group_size=3, reward=REWARD)
    summary = rollout(again, tasks(4), out, retry_failed=True)
    assert (summary.skipped, summary.written) == (6, 2)
    after = {p.name: pq.read_table(p).column("task_id").to_pylist() for p in out.glob("*.parquet")}
    for name, ids in parts.items():
        if "t1" in ids:
            assert after[name] == [i for i in ids if i != "t1"]  # rewritten without t1's records
        else:
            assert (out / name).read_bytes() == data[name]  # untouched
    records = list(read_records(out))
    assert sorted(r.key for r in records) == [(f"t{i}", s) for i in range(4) for s in range(2)]
    assert {r.status for r in records} == {"completed"} and not list(out.glob("*.tmp"))


# --------------------------------------------------------------------------------------------- Parquet
def test_parquet_output_flushes_row_groups_and_resumes(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "out.parquet"
    rollout(config(answer_with("4"), group_size=2, row_group_size=2, reward=REWARD), tasks(3), out)
    assert len(list(out.glob("*.parquet"))) == 3  # 6 records, 2 per row group, each a whole part file
    table = pq.read_table(out)
    assert table.num_rows == 6
    assert {"task_id", "sample", "group", "status", "reward", "trajectory", "timings", "tokens"} <= set(
        table.column_names
    )
    summary = rollout(config(answer_with("4"), group_size=2, row_group_size=2), tasks(4), out)
    assert (summary.skipped, summary.written) == (6, 2)
    records = list(read_records(out))
    assert len({r.key for r in records}) == len(records) == 8
    assert Trajectory.from_record(records[0].trajectory).loss_mask.count(1) == records[0].tokens.output


def test_parquet_dataset(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    dataset = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(tasks(2)), dataset)
    rollout(config(answer_with("4"), reward=REWARD), dataset, tmp_path / "out.jsonl")
    assert sorted((r.task_id, r.reward) for r in read_records(tmp_path / "out.jsonl")) == [("t0", 0.0), ("t1", 0.0)]


# ------------------------------------------------------------------------------------ errors before work
def test_a_row_without_prompt_is_an_error_naming_it_before_any_work(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "tasks.jsonl", [*tasks(1), {"id": "x", "answer": "1"}, *tasks(3)[1:]])
    with pytest.raises(DatasetError, match=r"tasks.jsonl: row 2: no `prompt`"):
        rollout(config(answer_with("4")), dataset, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_dataset_rows_are_checked_before_the_prepare_hook_runs(tmp_path: Path) -> None:
    PREPARED.clear()
    dataset = write_jsonl(tmp_path / "tasks.jsonl", [*tasks(2), {"id": "x"}])
    cfg = config(answer_with("4"), prepare="tests.runner.helpers:prepare_records_call")
    with pytest.raises(DatasetError, match="row 3: no `prompt`"):
        rollout(cfg, dataset, tmp_path / "out.jsonl")
    assert PREPARED == []  # the hook (which may build a model) never ran
    rollout(cfg, tasks(1), tmp_path / "out.jsonl")
    assert PREPARED == ["called"]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}], "row 2: id '1' repeats row 1"),
        ([{"prompt": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}], "last message"),
        ([{"prompt": [{"role": "robot", "content": "a"}]}], "needs a `role`"),
        ([{"prompt": 3}], "text or a list of chat messages"),
    ],
)
def test_bad_dataset_rows(tmp_path: Path, rows: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(DatasetError, match=message):
        rollout(config(answer_with("4")), write_jsonl(tmp_path / "t.jsonl", rows), tmp_path / "out.jsonl")


def test_a_line_that_is_not_json_is_named(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"prompt": "a"}\n{oops\n')
    with pytest.raises(DatasetError, match="line 2: not JSON"):
        rollout(config(answer_with("4")), tmp_path / "t.jsonl", tmp_path / "out.jsonl")


def test_config_errors_come_before_any_work(tmp_path: Path) -> None:
    toml = tmp_path / "tito.toml"
    toml.write_text('backend = "scripted"\n[rollout]\ngroup_sise = 4\n')
    with pytest.raises(ConfigError, match="group_sise"):
        rollout(toml, tasks(1), tmp_path / "out.jsonl")
    with pytest.raises(ConfigError, match=r"`rollout\.group_size` must be at least 1"):
        rollout(config(answer_with("4")), tasks(1), tmp_path / "out.jsonl", group_size=0)
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_module'"):
        rollout(config(answer_with("4"), reward="no_such_module:f"), tasks(1), tmp_path / "out.jsonl")
    missing = config(answer_with("4"))
    missing["tokenizer"] = str(tmp_path / "no-tokenizer")
    with pytest.raises(ConfigError, match="no-tokenizer"):
        rollout(missing, tasks(1), tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_an_unreachable_server_is_an_error_before_any_work(tmp_path: Path) -> None:
    pytest.importorskip("tito_sglang")
    cfg = {
        "backend": "sglang",
        "tokenizer": tokenizer_dir(),
        "backend_options": {"base_url": "http://127.0.0.1:9", "retry": {"max_attempts": 1}},
    }
    with pytest.raises(BackendConnectionError, match=r"unreachable inference server\(s\): http://127.0.0.1:9"):
        rollout(cfg, tasks(1), tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def test_cli_overrides_replace_config_keys(tmp_path: Path) -> None:
    toml = tmp_path / "tito.toml"
    toml.write_text(
        f'backend = "scripted"\ntokenizer = {json.dumps(tokenizer_dir())}\n'
        f"[backend_options]\ntokenizer = {json.dumps(tokenizer_dir())}\nreplies = {json.dumps(['4'] * 20)}\n"
        "[rollout]\ngroup_size = 1\nconcurrency = 2\n"
    )
    summary = rollout(toml, tasks(2), tmp_path / "out.jsonl", group_size=3)
    assert summary.written == 6


def test_an_output_line_that_is_not_a_record_is_an_error_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rollout(config(answer_with("4")), tasks(2), out)
    out.write_bytes(out.read_bytes() + b'{"not": "a record"}\n')
    with pytest.raises(ConfigError, match=r"out.jsonl: line 3 is not a rollout record"):
        rollout(config(answer_with("4")), tasks(3), out)


def test_an_output_in_a_missing_folder_makes_the_folder(tmp_path: Path) -> None:
    out = tmp_path / "runs" / "deeper" / "out.jsonl"
    summary = rollout(config(answer_with("4")), tasks(2), out)
    assert summary.written == 2 and len(lines(out)) == 2


def test_an_output_that_cannot_be_made_is_a_config_error_naming_it(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"rollout output .*a-file/out.jsonl.*folder cannot be made"):
        rollout(config(answer_with("4")), tasks(1), blocker / "out.jsonl")


def test_a_rerun_with_nothing_left_loads_no_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.jsonl"
    rollout(config(answer_with("4"), group_size=2), tasks(2), out)
    before = out.read_bytes()

    async def no_worker(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a rerun with every rollout done built a worker (model, tokenizer, servers)")

    monkeypatch.setattr("tito_core.runner.run.RolloutWorker.create", no_worker)
    summary = rollout(config(answer_with("4"), group_size=2), tasks(2), out)
    assert summary.planned == summary.written == 0 and summary.skipped == 4
    assert out.read_bytes() == before


def test_a_config_error_on_a_new_output_leaves_no_file(tmp_path: Path) -> None:
    missing = config(answer_with("4"))
    missing["tokenizer"] = str(tmp_path / "no-tokenizer")
    for name in ("out.jsonl", "out.parquet"):
        with pytest.raises(ConfigError, match="no-tokenizer"):
            rollout(missing, tasks(1), tmp_path / name)
        assert not (tmp_path / name).exists()


def test_a_sync_reward_runs_off_the_event_loop_thread_and_an_async_one_on_it(tmp_path: Path) -> None:
    from . import helpers

    helpers.REWARD_THREADS.clear()
    rollout(config(answer_with("4"), reward="tests.runner.helpers:thread_reward"), tasks(3), tmp_path / "a.jsonl")
    assert len(helpers.REWARD_THREADS) == 3 and "MainThread" not in helpers.REWARD_THREADS
    helpers.REWARD_THREADS.clear()
    rollout(config(answer_with("4"), reward="tests.runner.helpers:async_thread_reward"), tasks(3), tmp_path / "b.jsonl")
    assert helpers.REWARD_THREADS == ["MainThread"] * 3


# ------------------------------------------------------------------------------------------ weight versions
def versioned(version: str | None, **rollout: Any) -> dict[str, Any]:
    cfg = config(answer_with("The answer is 4."), **rollout)
    cfg["backend_options"]["weight_version"] = version
    return cfg


@pytest.mark.parametrize("name", ["out.jsonl", "out.parquet"])
def test_records_carry_the_weight_version_range_of_their_tokens(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    out = tmp_path / name
    rollout(versioned("3", group_size=2), tasks(2), out)
    rollout(versioned(None, group_size=2), tasks(3), out)  # t2 on a backend that reports no versions
    records = {r.key: r for r in read_records(out)}
    assert len(records) == 6
    for key, record in records.items():
        expected = None if key[0] == "t2" else "3"
        assert (record.weight_version_min, record.weight_version_max) == (expected, expected), key
        traj = Trajectory.from_record(record.trajectory)
        assert traj.weight_version_range() == (None if expected is None else (expected, expected))


def test_records_and_parquet_parts_written_before_versions_existed_still_read(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    old_jsonl = tmp_path / "old.jsonl"
    rollout(versioned("1"), tasks(1), old_jsonl)
    line = json.loads(old_jsonl.read_text())
    del line["weight_version_min"], line["weight_version_max"]
    old_jsonl.write_text(json.dumps(line) + "\n")
    (record,) = read_records(old_jsonl)
    assert record.weight_version_min is None and record.weight_version_max is None
    # a Parquet output resumed by this version: the old part lacks the columns, the new part has them
    out = tmp_path / "out.parquet"
    rollout(versioned("1"), tasks(1), out)
    (part,) = out.glob("*.parquet")
    table = pq.read_table(part)
    pq.write_table(table.drop_columns(["weight_version_min", "weight_version_max"]), part)
    part.rename(part.with_name("part-0-old.parquet"))  # sorts first: its schema must not hide the new columns
    rollout(versioned("2"), tasks(2), out)
    got = {r.task_id: (r.weight_version_min, r.weight_version_max) for r in read_records(out)}
    assert got == {"t0": (None, None), "t1": ("2", "2")}


# ---------------------------------------------------------------------------------------------- one writer
@pytest.mark.parametrize("name", ["out.jsonl", "out.parquet"])
def test_one_writer_per_output_in_this_process_too(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    out = tmp_path / name
    with open_writer(out) as writer:
        assert (tmp_path / f"{name}.lock").read_text().strip() == str(os.getpid())
        with pytest.raises(OutputLockedError, match=rf"{name} is being written by process {os.getpid()}"):
            open_writer(out)
        with pytest.raises(OutputLockedError):
            rollout(config(answer_with("4")), tasks(1), out)
        assert writer.finished() == set()
    assert not (tmp_path / f"{name}.lock").exists()
    rollout(config(answer_with("4")), tasks(1), out)  # released: the next writer takes it
    assert [r.key for r in read_records(out)] == [("t0", 0)]


def test_group_advantages_are_an_entry_after_the_records_and_the_last_entry_wins(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    cfg = config(answer_with("4"), group_size=2, reward="tests.runner.helpers:sample_index",
                 group_reward="tito_core.runner.rewards:group_normalized")  # fmt: skip
    rollout(cfg, tasks(1), out)
    kinds = [row.get("kind", "record") for row in lines(out)]
    assert kinds == ["record", "record", "advantages"]
    rollout({**cfg, "rollout": {**cfg["rollout"], "group_size": 3}}, tasks(1), out)  # the group grows
    assert [row.get("kind", "record") for row in lines(out)][3:] == ["record", "advantages"]
    records = sorted(read_records(out), key=lambda r: r.sample)
    assert [r.advantage for r in records] == pytest.approx(group_normalized([0.0, 1.0, 2.0]))  # all three, anew


def test_parquet_group_advantages_live_beside_the_parts_and_read_table_still_reads_the_records(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out = tmp_path / "out.parquet"
    cfg = config(answer_with("4"), group_size=2, reward="tests.runner.helpers:sample_index", row_group_size=1,
                 group_reward="tito_core.runner.rewards:group_normalized")  # fmt: skip
    rollout(cfg, tasks(2), out)
    assert list(out.glob("_advantages-*.parquet")) and len(list(out.glob("part-*.parquet"))) == 4
    assert pq.read_table(out).num_rows == 4  # the entries' files are skipped (their names start with _)
    records = sorted(read_records(out), key=lambda r: r.key)
    assert [r.advantage for r in records] == pytest.approx(group_normalized([0.0, 1.0]) * 2)
    failing = config(answer_with("4"), group_size=2, group_reward="tests.runner.helpers:group_fails")
    rollout(failing, tasks(3), out)
    by_task = {r.key: r.status for r in read_records(out)}
    assert by_task[("t2", 0)] == by_task[("t2", 1)] == "failed" and by_task[("t0", 0)] == "completed"
    summary = rollout(failing, tasks(3), out, retry_failed=True)  # the whole failed group, its entry too
    assert summary.written == 2


# ---------------------------------------------------------------------------------------------- executors
class _InProcess:
    """A plugin: the scripted backend registered as an in-process one (as the embedded model is), counting builds."""

    built: ClassVar[list[int]] = []

    @hookimpl
    def tito_backends(self) -> list[BackendSpec]:
        def factory(**options: Any) -> ScriptedBackend:
            _InProcess.built.append(os.getpid())
            return ScriptedBackend(**options)

        return [BackendSpec(name="embedded-test", factory=factory, in_process=True)]


class _Elsewhere(Executor):
    """An executor whose 'workers' build their own backends, as Ray actors do (here: one more worker, in process)."""

    routes_only = True

    async def run(self, items: Any, worker: RolloutWorker, emit: Any, on_start: Any = None) -> None:
        own = await RolloutWorker.create(worker.config, check_servers=False)
        with pytest.raises(TitoError, match="runs in the worker processes"):
            await worker.pool.server("embedded-test").backend.generate(None)  # type: ignore[arg-type]
        for item in items:
            async with worker.pool.lease() as server:  # the driver routes by name
                await emit(await own.run(item.task, item.sample, server=server.name))
        await own.aclose()


def test_a_driver_that_only_routes_builds_no_in_process_backend(tmp_path: Path) -> None:
    cfg = config(answer_with("4"), group_size=2)
    cfg["backend"] = "embedded-test"
    _InProcess.built.clear()
    with temporary_plugin(_InProcess(), name="embedded-test"):
        summary = rollout(cfg, tasks(2), tmp_path / "out.jsonl", executor=_Elsewhere())
        assert summary.written == 4 and summary.statuses == {"completed": 4}
        assert len(_InProcess.built) == 1  # the worker's; the driver built none
        rollout(cfg, tasks(3), tmp_path / "out.jsonl")  # the local executor builds it, as before
        assert len(_InProcess.built) == 2
