"""The rollout runner: a dataset of tasks -> groups of rollouts -> rewards -> a resumable rollout file.

:func:`rollout` (blocking) and :func:`arollout` (async) are the entry points; ``tito rollout`` is a thin
command line over them. Modules, one job each:

* :mod:`~tito_core.runner.dataset`: tasks;
* :mod:`~tito_core.runner.worker`: one rollout;
* :mod:`~tito_core.runner.limits`: the loop limiter;
* :mod:`~tito_core.runner.collector`: the garbage collector while many rollouts run;
* :mod:`~tito_core.runner.rewards`: reward functions;
* :mod:`~tito_core.runner.servers`: routing between inference servers;
* :mod:`~tito_core.runner.executor`: the seam between the run and where rollouts execute;
* :mod:`~tito_core.records`: the file format;
* :mod:`~tito_core.runner.staleness`: how far a record's weights are behind the trainer's;
* :mod:`~tito_core.runner.summary` and :mod:`~tito_core.runner.progress`: reporting.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Exports load on first use: the agent path takes tasks from here without importing the Strands worker
# (tests/core/test_without_strands.py). The record names are tito_core.records', re-exported for the runner's users.
_EXPORTS = {
    "Task": "dataset", "load_tasks": "dataset", "rollout_seed": "dataset",
    "Executor": "executor", "LocalExecutor": "executor", "WorkItem": "executor",
    "JsonReporter": "progress", "QuietReporter": "progress", "Reporter": "progress", "RichReporter": "progress",
    "RolloutRecord": "..records", "Timings": "..records", "TokenCounts": "..records", "open_writer": "..records",
    "read_records": "..records",
    "Sample": "rewards", "group_normalized": "rewards",
    "arollout": "run", "rollout": "run",
    "ServerPool": "servers",
    "RunSummary": "summary",
    "RolloutWorker": "worker",
}  # fmt: skip

if TYPE_CHECKING:
    from ..records import RolloutRecord, Timings, TokenCounts, open_writer, read_records
    from .dataset import Task, load_tasks, rollout_seed
    from .executor import Executor, LocalExecutor, WorkItem
    from .progress import JsonReporter, QuietReporter, Reporter, RichReporter
    from .rewards import Sample, group_normalized
    from .run import arollout, rollout
    from .servers import ServerPool
    from .summary import RunSummary
    from .worker import RolloutWorker


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module if module.startswith(".") else f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "Executor",
    "JsonReporter",
    "LocalExecutor",
    "QuietReporter",
    "Reporter",
    "RichReporter",
    "RolloutRecord",
    "RolloutWorker",
    "RunSummary",
    "Sample",
    "ServerPool",
    "Task",
    "Timings",
    "TokenCounts",
    "WorkItem",
    "arollout",
    "group_normalized",
    "load_tasks",
    "open_writer",
    "read_records",
    "rollout",
    "rollout_seed",
]
