"""The runner: a dataset of tasks times ``group_size`` rollouts, into a resumable rollout file.

Everything that can be wrong is checked before the first rollout: the config (keys, values, import paths),
every dataset row, the tokenizer, and every server's health. Then each rollout runs on a fresh agent and
model, and its record is written as soon as it is done (with a group reward function, the group's advantages
follow its last record). A rerun on the same output skips the rollouts already there (with ``rollout.retry_failed``,
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

from ..config import RolloutSettings, TitoConfig, load_config, with_overrides
from ..errors import ConfigError, DatasetError
from ..harbor.tasks import HARBOR_KEY, load_harbor_tasks
from ..records import (
    GroupAdvantages,
    Key,
    Outcome,
    OutputLock,
    RecordWriter,
    RolloutRecord,
    check_output,
    open_writer,
)
from .collector import collector_for_rollouts
from .dataset import Task, load_tasks, task_from_row
from .executor import Executor, LocalExecutor, WorkItem
from .interrupts import run_interruptible
from .progress import QuietReporter, Reporter
from .rewards import GroupRewardFn, call_maybe_async
from .staleness import with_staleness
from .summary import RunStats, RunSummary
from .worker import RolloutWorker, import_object

__all__ = ["advantage_entry", "arollout", "failed_keys", "group_advantages", "prepare_config", "rollout"]

logger = logging.getLogger("tito.runner")

ConfigSource = str | os.PathLike[str] | TitoConfig | Mapping[str, Any]
DatasetSource = str | os.PathLike[str] | Sequence[Task | Mapping[str, Any]]


def rollout(
    config: ConfigSource,
    dataset: DatasetSource | None,
    output: str | os.PathLike[str],
    *,
    reporter: Reporter | None = None,
    executor: Executor | None = None,
    **overrides: Any,
) -> RunSummary:
    """Run every task of ``dataset`` ``group_size`` times and append one record per rollout to ``output``.

    The blocking form of :func:`arollout` (it runs its own event loop); see there for the arguments. Ctrl-C
    raises ``KeyboardInterrupt`` as soon as the finished records are written and the output is closed, without
    waiting for threads whose results nobody will read (see ``tito_core.runner.interrupts``).
    """
    return run_interruptible(arollout(config, dataset, output, reporter=reporter, executor=executor, **overrides))


async def arollout(
    config: ConfigSource,
    dataset: DatasetSource | None,
    output: str | os.PathLike[str],
    *,
    reporter: Reporter | None = None,
    executor: Executor | None = None,
    **overrides: Any,
) -> RunSummary:
    """Run every task of ``dataset`` ``group_size`` times and append one record per rollout to ``output``.

    Args:
        config: A TOML file, a mapping of config keys, or a :class:`~tito_core.config.TitoConfig`.
        dataset: A ``.jsonl`` / ``.parquet`` file of tasks, or the tasks (``Task`` objects or rows); None: the
            config's ``[rollout.tasks]`` (a Harbor dataset, :mod:`tito_core.harbor`).
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
        OutputLockedError: Another live run is writing ``output`` (the message names its pid).
    """
    loaded, base_dir = _load_config(config, overrides)
    tasks = _tasks(dataset, loaded, base_dir)  # every row checked before the prepare hook (which may build a model)
    check_output(output)  # and the output's folder: a bad path fails before any model loads
    lock = OutputLock(output)  # and a second run on this output is refused at once, not after a model loads
    try:
        resolved = await _run_prepare(loaded, base_dir, overrides)
        settings = resolved.rollout
        fresh = not Path(output).exists()
        writer = open_writer(output, row_group_size=settings.row_group_size, lock=lock)
    except BaseException:
        lock.release()
        raise
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
            if executor is not None:
                executor.prestart(settings)  # its workers start while this process loads and checks
            # a run's gateway workers build their own backends, as an executor's workers do
            routes_only = (executor is not None and executor.routes_only) or settings.gateway is not None
            journals = Path(output).with_name(Path(output).name + ".journal")  # [rollout.gateway]'s workers'
            worker = await RolloutWorker.create(resolved, base_dir=base_dir, routes_only=routes_only, journals=journals)
    except BaseException:
        writer.close()
        if fresh:
            _discard_if_empty(Path(output))  # a config error leaves no empty output behind
        raise
    skipped = len(tasks) * settings.group_size - len(items)
    stats = RunStats(
        str(output),
        planned=len(items),
        skipped=skipped,
        previous=writer.outcomes(),
        current_version=settings.current_version,
        max_staleness=settings.max_staleness,
        drop_stale=settings.stale == "drop",
    )
    reporter = reporter if reporter is not None else QuietReporter()
    reporter.start(stats)
    interrupted = True
    try:
        group_reward = worker.group_reward if worker is not None else _group_reward(settings.group_reward, base_dir)
        sink = _Sink(writer, stats, reporter, group_reward, items, writer.outcomes(), settings=settings)
        await sink.settle_resumed([t.id for t in tasks], settings.group_size)
        if worker is not None:
            runner = executor if executor is not None else LocalExecutor(settings.concurrency)
            worker.pool.start()

            def started() -> None:
                stats.start()
                reporter.started(stats)

            with collector_for_rollouts(settings.gc):
                await runner.run(items, worker, sink.emit, started)
        interrupted = False
    finally:
        writer.close()
        if worker is not None:
            await worker.aclose()
        summary = stats.summary(interrupted=interrupted)
        reporter.finish(summary)
    return summary


def _group_reward(path: str | None, base_dir: Path | None) -> GroupRewardFn | None:
    """The group reward function a rerun with nothing to run still needs, to write advantages a kill left out."""
    return import_object(path, search=base_dir) if path else None


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


def _tasks(dataset: DatasetSource | None, config: TitoConfig, base_dir: Path | None) -> list[Task]:
    if dataset is None:
        source = config.rollout.tasks
        if source is None or source.harbor is None:
            raise DatasetError("no dataset: give one (`--dataset`), or a Harbor dataset in `[rollout.tasks] harbor`")
        harbor = load_harbor_tasks((base_dir or Path.cwd()) / source.harbor)
        return [Task(id=t.id, prompt=t.prompt, metadata={HARBOR_KEY: t.spec}, index=t.index) for t in harbor]
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


async def advantage_entry(fn: GroupRewardFn, task_id: str, rewards: Mapping[int, float | None]) -> GroupAdvantages:
    """The :class:`GroupAdvantages` of one finished group: ``fn`` over its rewards (sample to reward), in order.

    The entry has ``error`` set when ``fn`` raises or returns the wrong number of values.
    """
    order = sorted(rewards)
    try:
        values = list(await call_maybe_async(fn, [rewards[s] for s in order]))
        if len(values) != len(order):
            raise ValueError(f"returned {len(values)} values for a group of {len(order)}")
        numbers = [None if v is None else float(v) for v in values]
    except Exception as exc:
        reason = f"group reward function raised {type(exc).__name__}: {exc}"
        return GroupAdvantages(task_id=task_id, samples=order, values=[None] * len(order), error=reason)
    return GroupAdvantages(task_id=task_id, samples=order, values=numbers)


async def group_advantages(
    fn: GroupRewardFn, group: list[RolloutRecord], *, earlier: Mapping[int, float | None]
) -> list[RolloutRecord]:
    """The records of one finished group with ``advantage`` set by ``fn``; all ``failed`` when ``fn`` raises.

    ``fn`` sees the rewards of the whole group in sample order: ``earlier`` (sample to reward) are rewards of the
    group's records held elsewhere, ``group`` the records at hand (all of one task).
    """
    if not group:
        return []
    rewards = dict(earlier)
    rewards.update((r.sample, r.reward) for r in group)
    entry = await advantage_entry(fn, group[0].task_id, rewards)
    return [entry.apply(r) for r in group]


class _Sink:
    """Writes each record as it comes; with a group reward, writes a group's advantages once its last record is in.

    No finished record waits for its group: a run killed mid-group keeps every record written, and the rerun
    computes the group's entry (:meth:`settle_resumed`) from the rewards on disk and the new records.

    Each record's staleness is set here, when it is written; a stale one is dropped with ``rollout.stale =
    "drop"``. A group with a dropped rollout gets no advantages in this run (it is not whole on disk): the rerun
    that runs the dropped rollout again writes them.
    """

    def __init__(
        self,
        writer: RecordWriter,
        stats: RunStats,
        reporter: Reporter,
        group_reward: GroupRewardFn | None,
        items: Sequence[WorkItem],
        previous: Mapping[Key, Outcome],
        *,
        settings: RolloutSettings | None = None,
    ) -> None:
        self.writer = writer
        settings = settings if settings is not None else RolloutSettings()
        self.current_version = settings.current_version
        self.max_staleness = settings.max_staleness
        self.drop_stale = settings.stale == "drop"
        self.incomplete: set[str] = set()  # groups with a dropped rollout: no advantages this run
        self.stats = stats
        self.reporter = reporter
        self.group_reward = group_reward
        self.expected: dict[str, int] = defaultdict(int)
        for item in items:
            self.expected[item.task.id] += 1
        self.rewards: dict[str, dict[int, float | None]] = defaultdict(dict)  # the group so far, on disk
        for (task_id, sample), (_, reward) in previous.items():
            self.rewards[task_id][sample] = reward
        self.written: dict[str, list[str]] = defaultdict(list)  # statuses of this run's records, per task

    async def settle_resumed(self, task_ids: Sequence[str], group_size: int) -> None:
        """Write the entries of groups that are whole on disk but have none (or a stale one).

        Those are the advantages a killed run had not written. Groups with rollouts still to run get theirs when
        they complete.
        """
        if self.group_reward is None:
            return
        entries = self.writer.advantages()
        for task_id in task_ids:
            samples = self.rewards.get(task_id, {})
            if self.expected.get(task_id) or not set(range(group_size)) <= set(samples):
                continue
            entry = entries.get(task_id)
            if entry is None or sorted(entry.samples) != sorted(samples):
                logger.info("%s: group %s was whole without advantages (an interrupted run): writing them",
                            self.writer.path, task_id)  # fmt: skip
                self.writer.write_advantages(await advantage_entry(self.group_reward, task_id, samples))

    async def emit(self, record: RolloutRecord) -> None:
        self.stats.in_flight -= 1
        record = with_staleness(record, self.current_version, self.max_staleness)
        dropped = record.stale and self.drop_stale
        if dropped:
            logger.info("%s: dropping stale rollout %s/%d (%s versions behind %s)", self.writer.path,
                        record.task_id, record.sample, record.staleness, self.current_version)  # fmt: skip
            self.stats.drop(record)
            self.reporter.record(record, self.stats)
        else:
            self._write(record)
        if self.group_reward is None:
            return
        task_id = record.task_id
        if dropped:
            self.incomplete.add(task_id)
        else:
            self.rewards[task_id][record.sample] = record.reward
            self.written[task_id].append(record.status)
        self.expected[task_id] -= 1
        if self.expected[task_id] > 0:
            return
        if task_id in self.incomplete:
            self.incomplete.discard(task_id)
            self.rewards.pop(task_id, None)
            self.written.pop(task_id, None)
            return
        entry = await advantage_entry(self.group_reward, task_id, self.rewards.pop(task_id))
        self.writer.write_advantages(entry)
        statuses = self.written.pop(task_id)
        if entry.error is not None:
            self.stats.regrade(statuses, "failed")

    def _write(self, record: RolloutRecord) -> None:
        self.writer.write(record)
        self.stats.add(record, was_in_flight=False)
        self.reporter.record(record, self.stats)
