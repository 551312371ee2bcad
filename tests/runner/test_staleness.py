"""Staleness in the runner: ``rollout.max_staleness`` against ``rollout.current_version``, dropped or marked."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tito_core import rollout
from tito_core.backend import GenerateRequest
from tito_core.config import RolloutSettings, load_config
from tito_core.errors import ConfigError
from tito_core.records import RolloutRecord
from tito_core.runner import JsonReporter, read_records
from tito_core.runner.progress import summary_table
from tito_core.runner.samples import training_rows
from tito_core.runner.staleness import current_int, is_stale, staleness, with_staleness

from .helpers import answer_with, config, lines, tasks

REWARD = "tests.runner.helpers:contains_answer"
GROUP = "tito_core.runner.rewards:group_normalized"


def by_sample(versions: dict[int, str | None]) -> Any:
    """A scripted ``weight_version``: the version of each sample, read from the request's sequence (``t0:1/...``)."""

    def version(request: GenerateRequest) -> str | None:
        assert request.sequence is not None
        rollout_id = request.sequence.split("/")[0]
        return versions[int(rollout_id.rsplit(":", 1)[1])]

    return version


def versioned(weight_version: Any, **rollout_keys: Any) -> dict[str, Any]:
    cfg = config(answer_with("The answer is 4."), **rollout_keys)
    cfg["backend_options"]["weight_version"] = weight_version
    return cfg


def test_staleness_counts_integer_versions_only() -> None:
    def record(low: str | None) -> RolloutRecord:
        (one,) = _records()
        return msgspec.structs.replace(one, weight_version_min=low, weight_version_max=low)

    assert staleness(record("3"), 7) == 4 and staleness(record("3"), "7") == 4
    assert staleness(record("9"), 7) == -2  # newer than the trainer says: never stale
    assert staleness(record("default"), 7) is None and staleness(record(None), 7) is None
    assert staleness(record("3"), "step-7") is None and staleness(record("3"), None) is None
    assert is_stale(record("3"), 7, 3) and not is_stale(record("4"), 7, 3) and not is_stale(record("3"), 7, None)
    assert not is_stale(record("default"), 7, 0)  # not comparable: never stale
    assert current_int(True) is None and current_int(5) == 5 and current_int("-1") == -1
    marked = with_staleness(record("3"), 7, 2)
    assert (marked.staleness, marked.stale) == (4, True)
    assert with_staleness(record("3"), None, None) == record("3")


_CACHE: list[RolloutRecord] = []


def _records() -> list[RolloutRecord]:
    """One record made by a real run (built once)."""
    if not _CACHE:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.jsonl"
            rollout(versioned("1"), tasks(1), out)
            _CACHE.extend(read_records(out))
    return _CACHE


@pytest.mark.parametrize("name", ["out.jsonl", "out.parquet"])
def test_mark_writes_every_rollout_and_marks_the_stale_ones(tmp_path: Path, name: str) -> None:
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    out = tmp_path / name
    cfg = versioned(by_sample({0: "3", 1: "6", 2: "default"}), group_size=3, current_version=7, max_staleness=2)
    summary = rollout(cfg, tasks(2), out)
    records = {r.key: r for r in read_records(out)}
    assert len(records) == 6 and summary.written == 6 and summary.dropped == 0
    for (_, sample), record in records.items():
        assert record.staleness == {0: 4, 1: 1, 2: None}[sample]
        assert record.stale is (sample == 0)
        assert record.status == "completed"  # the mark is its own field: the status still says how it ended
    assert summary.stale == 2 and summary.current_version == "7" and summary.max_staleness == 2
    assert (summary.weight_version_min, summary.weight_version_max) == ("default", "6")
    rows = list(training_rows(read_records(out), "trl", current_version=7, max_staleness=2))
    assert sorted((r["task_id"], r["sample"]) for r in rows) == [(t, s) for t in ("t0", "t1") for s in (1, 2)]
    assert len(list(training_rows(read_records(out), "trl"))) == 6  # no filter asked: every record
    with pytest.raises(ConfigError, match="current_version"):
        list(training_rows(read_records(out), "trl", max_staleness=2))


def test_drop_writes_no_stale_rollout_counts_it_and_a_rerun_runs_it_again(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    stream = io.StringIO()
    keys: dict[str, Any] = {"group_size": 2, "current_version": "7", "max_staleness": 2, "stale": "drop"}
    keys.update(reward=REWARD, group_reward=GROUP, concurrency=1)
    summary = rollout(versioned(by_sample({0: "3", 1: "7"}), **keys), tasks(2), out, reporter=JsonReporter(stream))
    assert summary.planned == 4 and summary.written == 2 and summary.dropped == 2 and summary.stale == 0
    assert (summary.weight_version_min, summary.weight_version_max) == ("7", "7")  # of the records written
    written = lines(out)
    assert {(r["task_id"], r["sample"]) for r in written if "kind" not in r} == {("t0", 1), ("t1", 1)}
    assert not [r for r in written if r.get("kind") == "advantages"]  # no group is whole: no advantages yet
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    rollouts = [e for e in events if e["event"] == "rollout"]
    assert (
        sorted((e["sample"], e["dropped"], e["staleness"]) for e in rollouts)
        == [(0, True, 4)] * 2 + [(1, False, 0)] * 2
    )
    assert rollouts[-1]["done"] == 4 and events[-1]["dropped"] == 2
    # the rerun (newer weights now) runs only the dropped rollouts, and the groups get their advantages
    again = rollout(versioned("8", **{**keys, "current_version": 8}), tasks(2), out)
    assert again.skipped == 2 and again.written == 2 and again.dropped == 0
    records = {r.key: r for r in read_records(out)}
    assert len(records) == 4 and all(r.advantage is not None for r in records.values())
    assert records[("t0", 0)].weight_version_min == "8" and records[("t0", 0)].staleness == 0
    assert records[("t0", 1)].staleness == 0  # as of when it was written (version 7, current 7)


def test_the_summary_table_shows_versions_and_stale_counts(tmp_path: Path) -> None:
    from rich.console import Console

    cfg = versioned(by_sample({0: "3", 1: "6"}), group_size=2, current_version=7, max_staleness=2, stale="drop")
    summary = rollout(cfg, tasks(1), tmp_path / "out.jsonl")
    console = Console(width=160, record=True)
    console.print(summary_table(summary))
    text = console.export_text()
    assert "weight versions │ 6 (current 7)" in text
    assert "1 dropped (more than 2 versions behind 7; not written, a rerun runs them again)" in text
    marked = rollout(versioned("3", current_version=7, max_staleness=2), tasks(1), tmp_path / "marked.jsonl")
    console = Console(width=160, record=True)
    console.print(summary_table(marked))
    assert "1 marked stale (more than 2 versions behind 7; written with stale=true)" in console.export_text()
    plain = rollout(versioned(None), tasks(1), tmp_path / "plain.jsonl")
    console = Console(width=160, record=True)
    console.print(summary_table(plain))
    text = console.export_text()
    assert "- (none reported)" in text and "stale" not in text


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"max_staleness": 2}, "`rollout.max_staleness` needs `rollout.current_version`"),
        ({"max_staleness": -1, "current_version": 3}, "`rollout.max_staleness` must be >= 0, got -1"),
        ({"current_version": ""}, "`rollout.current_version` must be a version"),
        ({"stale": "delete"}, "rollout.stale"),
        ({"current_version": 1.5}, "rollout.current_version"),
    ],
)
def test_bad_staleness_settings_are_config_errors_naming_the_key(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("`", ".")):
        load_config({"backend": "scripted", "rollout": keys})


def test_current_version_is_an_override_and_a_python_int_or_text() -> None:
    assert RolloutSettings(current_version=7).current_version == 7
    cfg = load_config({"backend": "scripted", "rollout": {"current_version": "12", "max_staleness": 0}})
    assert cfg.rollout.current_version == "12" and cfg.rollout.stale == "mark"


def test_inspect_shows_the_files_version_range_and_stale_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tito_core.cli import main

    out = tmp_path / "out.jsonl"
    rollout(versioned(by_sample({0: "3", 1: "12"}), group_size=2, current_version=12, max_staleness=8), tasks(1), out)
    rollout(versioned(None), tasks(2), out)  # t1: a backend that reports no versions
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "weight versions: 3..12 (2 of 3 rollouts report versions); 1 marked stale" in shown
    plain = tmp_path / "plain.jsonl"
    rollout(versioned(None), tasks(1), plain)
    capsys.readouterr()
    assert main(["inspect", str(plain)]) == 0
    assert "weight versions: none reported" in capsys.readouterr().out


def test_the_cli_sets_the_current_version_and_logs_dropped_rollouts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tito_core.cli import main

    from .helpers import tokenizer_dir, write_jsonl

    write_jsonl(tmp_path / "t.jsonl", tasks(2))
    tok = json.dumps(tokenizer_dir())
    (tmp_path / "tito.toml").write_text(
        f'backend = "scripted"\ntokenizer = {tok}\n[backend_options]\ntokenizer = {tok}\n'
        f'replies = {json.dumps(["The answer is 4."] * 50)}\nweight_version = "2"\n'
        '[rollout]\nmax_staleness = 1\nstale = "drop"\ncurrent_version = 2\n'
    )
    out = tmp_path / "out.jsonl"
    args = ["rollout", "--config", str(tmp_path / "tito.toml"), "--dataset", str(tmp_path / "t.jsonl")]
    assert main([*args, "--output", str(out), "--log-json", "--set", "rollout.current_version=4"]) == 0
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    summary = events[-1]
    assert summary["event"] == "summary" and summary["dropped"] == 2 and summary["written"] == 0
    assert summary["current_version"] == "4" and (not out.exists() or not out.read_text())
    assert main([*args, "--output", str(out), "--quiet"]) == 0  # the file's current_version (2): nothing stale
    assert [r.staleness for r in read_records(out)] == [0, 0]


def test_rollout_batches_mark_and_drop_as_the_runner_does() -> None:
    pa = pytest.importorskip("pyarrow")
    from tito_core.records import record_from_row
    from tito_core.runner.ray_executor import RolloutBatches

    batch = pa.Table.from_pylist([{**task, "group": 0} for task in tasks(1)])
    keys: dict[str, Any] = {"group_size": 2, "current_version": 7, "max_staleness": 2, "group_reward": GROUP}
    keys["reward"] = "tests.runner.helpers:sample_index"
    marked = [record_from_row(row) for row in RolloutBatches(versioned(by_sample({0: "3", 1: "6"}), **keys))(batch)
              .to_pylist()]  # fmt: skip
    assert [(r.sample, r.staleness, r.stale) for r in marked] == [(0, 4, True), (1, 1, False)]
    dropped = RolloutBatches(versioned(by_sample({0: "3", 1: "6"}), **keys, stale="drop"), samples="trl")(batch)
    assert dropped.column("sample").to_pylist() == [1]
    assert dropped.column("advantage").to_pylist() == pytest.approx([1.0], abs=1e-5)  # over the whole group


def test_export_leaves_out_rollouts_stale_against_the_given_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tito_core.cli import main

    out = tmp_path / "out.jsonl"
    rollout(versioned(by_sample({0: "3", 1: "6"}), group_size=2), tasks(1), out)  # no current version: no mark
    target = tmp_path / "trl.jsonl"
    assert main(["export", "--to", "trl", str(out), str(target), "--max-staleness", "2", "--current-version", "7"]) == 0
    assert [row["sample"] for row in lines(target)] == [1]
    assert main(["export", "--to", "trl", str(out), str(target)]) == 0
    assert [row["sample"] for row in lines(target)] == [0, 1]
    capsys.readouterr()
    assert main(["export", "--to", "trl", str(out), str(tmp_path / "x.jsonl"), "--max-staleness", "2"]) == 2
    assert "--max-staleness needs --current-version" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_the_summary_counts_calls_continued_after_an_abort_mode_update(tmp_path: Path) -> None:
    from rich.console import Console

    from tito_core.runner.summary import RunStats

    out = tmp_path / "out.jsonl"
    rollout(config(answer_with("The answer is 4.")), tasks(1), out)
    record = next(iter(read_records(out)))
    traj = record.trajectory
    turn = msgspec.structs.replace(traj.turns[0], continued_rids=(f"{traj.turns[0].rid}-c1",))
    earlier = msgspec.structs.replace(traj, turns=[turn], branches=[])
    cut = msgspec.structs.replace(record, trajectory=msgspec.structs.replace(traj, turns=[turn], branches=[earlier]))
    stats = RunStats(str(out), planned=2, skipped=0)
    for each in (record, cut):
        stats.start()
        stats.add(each)
    summary = stats.summary()
    assert summary.partial_calls == 2  # the cut record's final branch and the branch it holds
    console = Console(file=io.StringIO(), width=120)
    console.print(summary_table(summary))
    assert "partial rollouts" in console.file.getvalue() and "2 calls cut by a weight update" in console.file.getvalue()
