"""The executor seam: who runs the rollouts, and where.

An :class:`Executor` takes the work items of a run (``(task, sample)`` pairs), runs each with a
:class:`~tito_core.runner.worker.RolloutWorker` and hands every record to ``emit`` as soon as it is done; the
runner writes it, so every executor produces the same file. :class:`LocalExecutor` runs them on this event
loop with bounded concurrency. A distributed executor (Ray) would split the items into shards, build a
``RolloutWorker`` from the same config in each worker process (:meth:`RolloutWorker.create`), run a
``LocalExecutor`` there, and stream the records back to ``emit`` in the driver.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from ..config import RolloutSettings
from ..errors import ConfigError
from ..records import RolloutRecord
from .dataset import Task
from .worker import RolloutWorker

__all__ = ["Emit", "Executor", "LocalExecutor", "WorkItem"]

Emit = Callable[[RolloutRecord], Awaitable[None]]


class WorkItem(msgspec.Struct, frozen=True):
    """One rollout to run: sample ``sample`` of ``task``."""

    task: Task
    sample: int


class Executor(abc.ABC):
    """Runs work items and emits one record per item (a cancelled run emits only what finished)."""

    routes_only: bool = False
    """True when the rollouts run in other processes, each with its own backends: this process then only routes
    them, and builds no in-process backend (an embedded model) it would never generate with."""

    def prestart(self, settings: RolloutSettings) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Start the workers' processes now, while this process loads the tokenizer and checks the servers.

        Called by the runner once it knows there is work, before :meth:`run`; ``settings`` are the run's.
        """

    @abc.abstractmethod
    async def run(
        self,
        items: Sequence[WorkItem],
        worker: RolloutWorker,
        emit: Emit,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """Run every item; call ``on_start`` when a rollout starts and ``emit`` with its record when it ends."""


class LocalExecutor(Executor):
    """Run rollouts on this event loop, at most ``concurrency`` at once, in the order given."""

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        self.concurrency = concurrency

    async def run(
        self,
        items: Sequence[WorkItem],
        worker: RolloutWorker,
        emit: Emit,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """Run the items in ``concurrency`` lanes; an exception in ``emit`` cancels the rest."""
        pending = iter(items)

        async def lane() -> None:
            for item in pending:  # the lanes share one iterator: each item is taken once
                # Back to the event loop between rollouts: a backend that answers without suspending (in-process)
                # would otherwise run a lane to the end of the dataset before a Ctrl-C's cancellation is delivered.
                await asyncio.sleep(0)
                await emit(await worker.run(item.task, item.sample, on_start))

        async with asyncio.TaskGroup() as group:
            for _ in range(min(self.concurrency, len(items))):
                group.create_task(lane())
