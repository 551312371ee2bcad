"""The runner: a dataset of tasks times ``group_size`` rollouts, into a resumable rollout file.

Everything that can be wrong is checked before the first rollout: the config (keys, values, import paths),
every dataset row, the tokenizer, and every server's health. Then each rollout runs on a fresh agent and
model, and its record is written as soon as it is done (with a group reward function: as soon as its
group is done). A rerun on the same output skips the rollouts already there (with ``rollout.retry_failed``,
it first removes the ``failed`` records and runs them again).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..config import TitoConfig, load_config, with_overrides
from ..errors import ConfigError, DatasetError
from .dataset import Task, load_tasks, task_from_row
from .executor import Executor, LocalExecutor, WorkItem
from .progress import QuietReporter, Reporter
from .records import Key, Outcome, RecordWriter, RolloutRecord, check_output, open_writer
from .rewards import GroupRewardFn, call_maybe_async
from .summary import RunStats, RunSummary
from .worker import RolloutWorker, import_object

__all__ = ["arollout", "failed_keys", "group_advantages", "prepare_config", "rollout"]

logger = logging.getLogger("tito.runner")

ConfigSource = str | os.PathLike[str] | TitoConfig | Mapping[str, Any]
DatasetSource = str | os.PathLike[str] | Sequence[Task | Mapping[str, Any]]


def rollout(
    config: ConfigSource,
    dataset: DatasetSource,
    output: str | os.PathLike[str],
    *,
    reporter: Reporter | None = None,
    executor: Executor | None = None,
    **overrides: Any,
) -> RunSummary:
    """Run every task of ``dataset`` ``group_size`` times and append one record per rollout to ``output``.

    The blocking form of :func:`arollout` (it runs its own event loop); see there for the arguments.
    """
    return asyncio.run(arollout(config, dataset, output, reporter=reporter, executor=executor, **overrides))


async def arollout(
    config: ConfigSource,
    dataset: DatasetSource,
    output: str | os.PathLike[str],
    *,
    reporter: Reporter | None = None,
    executor: Executor | None = None,
    **overrides: Any,
) -> RunSummary:
    """Run every task of ``dataset`` ``group_size`` times and append one record per rollout to ``output``.

    Args:
        config: A TOML file, a mapping of config keys, or a :class:`~tito_core.config.TitoConfig`.
        dataset: A ``.jsonl`` / ``.parquet`` file of tasks, or the tasks (``Task`` objects or rows).
        output: The rollout file: ``.parquet`` for Parquet, JSON lines otherwise. Existing records are kept
            and their rollouts skipped (``retry_failed`` removes the failed ones first, to run again).
        reporter: Progress reporting (default: none; the CLI uses a rich progress bar).
        executor: Who runs the rollouts (default: :class:`LocalExecutor` at ``rollout.concurrency``).
        **overrides: Config keys replacing the file's: model keys (``backend``, ``tokenizer``, ``sampling``,
            ...) or ``[rollout]`` keys (``group_size``, ``concurrency``, ``timeout_s``, ...); None is ignored.

    Returns:
        What the run did. Cancelled (Ctrl-C), it writes every record finished so far and re-raises.

    Raises:
        ConfigError: A bad config value or import path, a missing tokenizer.
        DatasetError: An unreadable dataset or a bad row (the row is named).
        BackendConnectionError: An inference server does not answer its health check.
    """
    loaded, base_dir = _load_config(config, overrides)
    tasks = _tasks(dataset)  # every row checked before the prepare hook (which may build a model)
    check_output(output)  # and the output's folder: a bad path fails before any model loads
    resolved = await _run_prepare(loaded, base_dir, overrides)
    settings = resolved.rollout
    fresh = not Path(output).exists()
    writer = open_writer(output, row_group_size=settings.row_group_size)
    worker: RolloutWorker | None = None
    try:
        if settings.retry_failed:
            retry = failed_keys(
                writer.outcomes(), {t.id for t in tasks}, whole_groups=settings.group_reward is not None
            )
            if retry:
                logger.warning("%s: removing %d failed records (retry_failed): they run again", output, len(retry))
                writer.remove(retry)
        done = writer.finished()
        items = [
            WorkItem(task, sample)
            for task in tasks
            for sample in range(settings.group_size)
            if (task.id, sample) not in done
        ]
        if items:  # a rerun with nothing left to do loads no model and asks no server
            worker = await RolloutWorker.create(resolved, base_dir=base_dir)
    except BaseException:
        writer.close()
        if fresh:
            _discard_if_empty(Path(output))  # a config error leaves no empty output behind
        raise
    skipped = len(tasks) * settings.group_size - len(items)
    stats = RunStats(str(output), planned=len(items), skipped=skipped, previous=writer.outcomes())
    reporter = reporter if reporter is not None else QuietReporter()
    reporter.start(stats)
    interrupted = True
    try:
        if worker is not None:
            sink = _Sink(writer, stats, reporter, worker.group_reward, items, writer.outcomes())
            runner = executor if executor is not None else LocalExecutor(settings.concurrency)
            worker.pool.start()

            def started() -> None:
                stats.start()
                reporter.started(stats)

            await runner.run(items, worker, sink.emit, started)
        interrupted = False
    finally:
        writer.close()
        if worker is not None:
            await worker.aclose()
        summary = stats.summary(interrupted=interrupted)
        reporter.finish(summary)
    return summary


def _discard_if_empty(path: Path) -> None:
    """Remove an output this run created and wrote nothing to (an empty file, or a Parquet folder of no parts)."""
    with contextlib.suppress(OSError):
        if path.is_dir():
            path.rmdir()  # only when empty
        elif path.stat().st_size == 0:
            path.unlink()


async def prepare_config(source: ConfigSource, overrides: Mapping[str, Any]) -> tuple[TitoConfig, Path | None]:
    """The config with ``overrides`` applied and its ``prepare`` hook run, and the directory import paths may use."""
    config, base_dir = _load_config(source, overrides)
    return await _run_prepare(config, base_dir, overrides), base_dir


def _load_config(source: ConfigSource, overrides: Mapping[str, Any]) -> tuple[TitoConfig, Path | None]:
    """The config with ``overrides`` applied (not yet its ``prepare`` hook), and the directory of its file."""
    base_dir: Path | None = None
    if isinstance(source, TitoConfig):
        config = source
    else:
        if not isinstance(source, Mapping):
            base_dir = Path(source).resolve().parent
        config = load_config(source)
    return with_overrides(config, overrides), base_dir  # first: an override may name the prepare hook itself


async def _run_prepare(config: TitoConfig, base_dir: Path | None, overrides: Mapping[str, Any]) -> TitoConfig:
    """``config`` after its ``prepare`` hook's changes (explicit ``overrides`` still win)."""
    if config.rollout.prepare:
        hook = import_object(config.rollout.prepare, search=base_dir)
        if inspect.iscoroutinefunction(hook):
            changes = await hook()
        else:
            changes = await asyncio.to_thread(hook)  # it may build a model: seconds, off the event loop
        if changes is not None:
            if not isinstance(changes, Mapping):
                raise ConfigError(f"`rollout.prepare` must return a mapping of config keys or None, not {changes!r}")
            config = with_overrides(config, changes, origin=f"the result of {config.rollout.prepare}")
            config = with_overrides(config, overrides)  # explicit overrides win over the hook's values
    return config


def _tasks(dataset: DatasetSource) -> list[Task]:
    if isinstance(dataset, (str, os.PathLike)):
        return load_tasks(dataset)
    tasks = [
        item if isinstance(item, Task) else task_from_row(item, index, where="dataset")
        for index, item in enumerate(dataset)
    ]
    if not tasks:
        raise DatasetError("dataset: no tasks")
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise DatasetError("dataset: task ids repeat")
    return tasks


def failed_keys(outcomes: Mapping[Key, Outcome], task_ids: set[str], *, whole_groups: bool) -> set[Key]:
    """The records ``retry_failed`` removes: ``failed`` ones of these tasks (``aborted`` ones stay).

    With ``whole_groups`` (a group reward function), every record of a task that has a failed one: its
    advantages were computed with the failed rollout, so the whole group runs again.
    """
    failed = {key for key, (status, _) in outcomes.items() if status == "failed" and key[0] in task_ids}
    if not whole_groups:
        return failed
    groups = {task_id for task_id, _ in failed}
    return {key for key in outcomes if key[0] in groups}


async def group_advantages(
    fn: GroupRewardFn, group: list[RolloutRecord], *, earlier: Mapping[int, float | None]
) -> list[RolloutRecord]:
    """The new records of one finished group with ``advantage`` set by ``fn``; all ``failed`` when ``fn`` raises.

    ``fn`` sees the rewards of the whole group in sample order: ``earlier`` (sample to reward) are the group's
    records already in the output (a resumed, half-written group), ``group`` the new ones. Only the new records
    are returned: written records are never rewritten.
    """
    rewards = dict(earlier)
    rewards.update((r.sample, r.reward) for r in group)
    order = sorted(rewards)
    try:
        values = list(await call_maybe_async(fn, [rewards[s] for s in order]))
        if len(values) != len(order):
            raise ValueError(f"returned {len(values)} values for a group of {len(order)}")
        by_sample = {s: None if v is None else float(v) for s, v in zip(order, values, strict=True)}
    except Exception as exc:
        reason = f"group reward function raised {type(exc).__name__}: {exc}"
        return [msgspec.structs.replace(r, status="failed", status_reason=reason) for r in group]
    return [msgspec.structs.replace(r, advantage=by_sample[r.sample]) for r in group]


class _Sink:
    """Writes records as they come; with a group reward, holds each group until its last rollout is done.

    ``previous`` holds the outcomes of the records already in the output: the group reward function sees the
    rewards of a resumed group's earlier records together with the new ones.
    """

    def __init__(
        self,
        writer: RecordWriter,
        stats: RunStats,
        reporter: Reporter,
        group_reward: GroupRewardFn | None,
        items: Sequence[WorkItem],
        previous: Mapping[Key, Outcome],
    ) -> None:
        self.writer = writer
        self.stats = stats
        self.reporter = reporter
        self.group_reward = group_reward
        self.expected: dict[str, int] = defaultdict(int)
        for item in items:
            self.expected[item.task.id] += 1
        self.pending: dict[str, list[RolloutRecord]] = defaultdict(list)
        self.earlier: dict[str, dict[int, float | None]] = defaultdict(dict)
        for (task_id, sample), (_, reward) in previous.items():
            if task_id in self.expected:
                self.earlier[task_id][sample] = reward

    async def emit(self, record: RolloutRecord) -> None:
        self.stats.in_flight -= 1
        if self.group_reward is None:
            self._write(record)
            return
        bucket = self.pending[record.task_id]
        bucket.append(record)
        if len(bucket) < self.expected[record.task_id]:
            return
        del self.pending[record.task_id]
        bucket.sort(key=lambda r: r.sample)
        for done in await group_advantages(self.group_reward, bucket, earlier=self.earlier.pop(record.task_id, {})):
            self._write(done)

    def _write(self, record: RolloutRecord) -> None:
        self.writer.write(record)
        self.stats.add(record, was_in_flight=False)
        self.reporter.record(record, self.stats)
