"""Rollouts on a Ray cluster: an executor for ``tito rollout --executor ray``, and a class for Ray Data.

:class:`RayExecutor` runs a run's rollouts on Ray actors; :class:`RolloutBatches` is a callable class for
``ray.data.Dataset.map_batches``. Needs ``pip install "tito-core[ray]"``; ``ray`` is imported on first use.

How a run on Ray works (docs/scaling.md says why):

* **Workers** are Ray actors (:class:`RolloutActor`), each building its own
  :class:`~tito_core.runner.worker.RolloutWorker` from the run's resolved config and running up to
  ``rollout.concurrency`` rollouts at once on its own event loop: the same rollout code as a local run.
* **Records stream back to the driver**, which writes them with the same writer as a local run: one file, the
  same format and the same resume rule (a rerun skips what is written), no shards and no merge step. A record is
  small next to the rollout that made it (milliseconds to minutes of engine time), so one writer keeps up.
* **Routing stays in the driver**: the run's one :class:`~tito_core.runner.servers.ServerPool` (with its health
  checks) leases a server to each rollout before it is handed to a worker, and the worker runs the rollout on
  that server by name. One routing state for the whole cluster, sticky per rollout, and no extra round trip.
* **Dynamic handout**: the driver keeps ``concurrency`` lanes per worker; a lane hands its worker the next item
  of one shared queue as soon as its previous rollout is back, so a slow worker simply takes fewer items.
* **A lost worker** (its process or node dies) loses only its rollouts in flight: the driver puts them back in
  the queue, where the other workers (and a replacement actor, up to ``replacements``) take them. Nothing
  written is touched. When no worker is left, the run stops with an error; a rerun resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args

import msgspec

from .._optional import pyarrow
from .._optional import ray as import_ray
from ..config import RolloutSettings, TitoConfig
from ..errors import ConfigError, DatasetError, TitoError
from ..records import RolloutRecord, arrow_schema, record_to_row
from .collector import collector_for_rollouts
from .dataset import Task, task_from_row
from .executor import Emit, Executor, LocalExecutor, WorkItem
from .run import group_advantages, prepare_config
from .samples import ExportFormat, training_rows
from .servers import ServerPool
from .staleness import with_staleness
from .worker import RolloutWorker

__all__ = ["RayExecutor", "RolloutActor", "RolloutBatches"]

T = TypeVar("T")

_ITEM_ENCODER = msgspec.msgpack.Encoder()
_ITEM = msgspec.msgpack.Decoder(WorkItem)
_RECORD = msgspec.msgpack.Decoder(RolloutRecord)


class RolloutActor:
    """One Ray worker: a :class:`~tito_core.runner.worker.RolloutWorker` built from the run's config.

    Created by :class:`RayExecutor` as an async Ray actor (``max_concurrency`` above the rollouts it may run at
    once) and kept between runs of the same executor: a run only sends its config (:meth:`configure`), so the
    process start and imports (seconds) are paid once. Items and records travel as msgpack bytes.
    """

    def __init__(self) -> None:
        self._worker: RolloutWorker | None = None
        self._config: tuple[TitoConfig, str | None] | None = None
        self._building = asyncio.Lock()
        self._collector = contextlib.ExitStack()  # rollout.gc, held while a worker is built
        # The tokenizer's imports (seconds) now, while the driver is still loading and checking: configure()
        # then mostly reads files.
        with contextlib.suppress(ImportError):
            from transformers import AutoTokenizer  # noqa: F401

    async def configure(self, config: TitoConfig, base_dir: str | None) -> str:
        """Build the worker for ``config`` (import tools and rewards, load the tokenizer); returns ``host:pid``.

        The driver has checked every server; its pool does the routing and the health checks.
        """
        async with self._building:
            if self._worker is None or self._config != (config, base_dir):
                if self._worker is not None:
                    await self._worker.aclose()
                    self._worker = None
                    self._collector.close()
                where = Path(base_dir) if base_dir is not None else None
                self._worker = await RolloutWorker.create(config, base_dir=where, check_servers=False)
                self._config = (config, base_dir)
                # this process only runs rollouts: tuned once for the worker's life, not per item
                self._collector.enter_context(collector_for_rollouts(config.rollout.gc))
        return f"{socket.gethostname()}:{os.getpid()}"

    async def run(self, item: bytes, server: str) -> tuple[bytes, bool]:
        """Run one work item on the named server; returns the record and whether the server still looks healthy."""
        worker = self._worker
        if worker is None:
            raise TitoError("the worker was not configured")
        work = _ITEM.decode(item)
        record = await worker.run(work.task, work.sample, server=server)
        return _ITEM_ENCODER.encode(record), worker.pool.server(server).healthy


@dataclass(eq=False)
class _Slot:
    """A worker actor as the driver sees it."""

    handle: Any
    alive: bool = True
    lanes: int = 0


class RayExecutor(Executor):
    """Run the rollouts on Ray actors, streaming records back to the driver's writer (see the module doc).

    The worker actors are started by the first run and kept for the next runs of this executor (an RL loop
    that rolls out every step pays their start once); :meth:`close` (or leaving a ``with`` block) stops them,
    and the local Ray this executor started, if it started one. They also end with this process.

    Args:
        workers: Worker actors (each runs ``rollout.concurrency`` rollouts at once, or ``concurrency``).
        address: The Ray cluster to join (``"auto"``: the one this machine belongs to). Without it, and without
            a Ray already initialised in this process, a local Ray starts (and stops at :meth:`close`).
        concurrency: Rollouts at once per worker (default: the config's ``rollout.concurrency``).
        num_cpus: CPUs each worker reserves from Ray's scheduler.
        replacements: Workers that may be started during one run in place of lost ones (default: ``workers``).
        init_options: More keyword arguments for ``ray.init`` when this executor starts or joins Ray.
        actor_options: More Ray actor options for the workers (``resources``, ``runtime_env``, ...).
        start_timeout_s: Seconds a worker may take to start and load its config (Ray schedules it only when the
            cluster has the resources it asks for).
    """

    routes_only = True  # the driver routes; each worker actor builds its own backends

    def __init__(
        self,
        workers: int = 2,
        *,
        address: str | None = None,
        concurrency: int | None = None,
        num_cpus: float = 1.0,
        replacements: int | None = None,
        init_options: Mapping[str, Any] | None = None,
        actor_options: Mapping[str, Any] | None = None,
        start_timeout_s: float = 300.0,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}")
        if concurrency is not None and concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {concurrency}")
        self.workers = workers
        self.address = address
        self.concurrency = concurrency
        self.num_cpus = num_cpus
        self.replacements = workers if replacements is None else replacements
        self.init_options = dict(init_options or {})
        self.actor_options = dict(actor_options or {})
        self.start_timeout_s = start_timeout_s
        self.lost = 0  # workers lost during the last run
        self._slots: list[_Slot] = []
        self._started_ray = False

    @property
    def actors(self) -> list[Any]:
        """The live worker actors' handles."""
        return [slot.handle for slot in self._slots if slot.alive]

    def close(self) -> None:
        """Stop the worker actors, and the local Ray if this executor started it."""
        ray = import_ray()
        for slot in self._slots:
            with contextlib.suppress(Exception):
                ray.kill(slot.handle)
        self._slots = []
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def run(
        self,
        items: Sequence[WorkItem],
        worker: RolloutWorker,
        emit: Emit,
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """Run every item on the worker actors; ``emit`` (in this process) writes each record as it comes back."""
        ray = import_ray()
        if not items:  # a rerun of a finished output: nothing to start
            return
        self._ensure_ray(ray)
        config_ref = ray.put(_shippable(ray, worker.config))
        base_dir = None if worker.base_dir is None else str(worker.base_dir)
        concurrency = self.concurrency or worker.settings.concurrency
        actor_class = self._actor_class(ray, concurrency)

        async def configure(slot: _Slot) -> _Slot:
            try:
                async with asyncio.timeout(self.start_timeout_s):
                    await slot.handle.configure.remote(config_ref, base_dir)
            except TimeoutError:
                raise TitoError(
                    f"a Ray worker did not start within {self.start_timeout_s:g} s: does the cluster have "
                    f"{self.num_cpus:g} CPU(s) free for each of the {self.workers} workers (and the actor options' "
                    "resources)?"
                ) from None
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else exc
                raise ConfigError(f"a Ray worker could not start: {cause}") from exc
            return slot

        async def start_actor() -> _Slot:
            slot = _Slot(actor_class.remote())
            self._slots.append(slot)
            return await configure(slot)

        async def fresh(slot: _Slot) -> _Slot:
            try:
                return await configure(slot)
            except ray.exceptions.RayActorError:  # died between runs: start another
                slot.alive = False
                return await start_actor()

        self._slots = [slot for slot in self._slots if slot.alive]
        kept = [fresh(slot) for slot in self._slots[: self.workers]]
        first = await asyncio.gather(*kept, *(start_actor() for _ in range(self.workers - len(kept))))
        self._slots = [slot for slot in self._slots if slot.alive]
        await self._handout(ray, items, worker.pool, emit, on_start, first, concurrency, start_actor)

    def prestart(self, settings: RolloutSettings) -> None:
        """Start the worker actors (Ray creates them in the background) while the driver loads and checks."""
        _refuse_gateway_pool(settings)
        ray = import_ray()
        self._ensure_ray(ray)
        actor_class = self._actor_class(ray, self.concurrency or settings.concurrency)
        alive = sum(slot.alive for slot in self._slots)
        self._slots.extend(_Slot(actor_class.remote()) for _ in range(self.workers - alive))

    def _ensure_ray(self, ray: Any) -> None:
        if not ray.is_initialized():
            ray.init(address=self.address, **self.init_options)
            self._started_ray = True
            self._slots = []  # actors of an earlier Ray session are gone with it

    def _actor_class(self, ray: Any, concurrency: int) -> Any:
        return ray.remote(RolloutActor).options(
            num_cpus=self.num_cpus, max_concurrency=concurrency + 1, **self.actor_options
        )

    async def _handout(
        self,
        ray: Any,
        items: Sequence[WorkItem],
        pool: ServerPool,
        emit: Emit,
        on_start: Callable[[], None] | None,
        first: list[_Slot],
        concurrency: int,
        start_actor: Callable[[], Coroutine[Any, Any, _Slot]],
    ) -> None:
        """Feed the items to the workers' lanes from one queue, re-queueing the items of a lost worker."""
        queue: asyncio.Queue[WorkItem | None] = asyncio.Queue()
        for item in items:
            queue.put_nowait(item)
        remaining = len(items)
        announced: set[tuple[str, int]] = set()
        replacements = self.replacements
        working = list(first)
        self.lost = 0

        def lanes(group: asyncio.TaskGroup, slot: _Slot) -> None:
            slot.lanes = concurrency
            for _ in range(concurrency):
                group.create_task(lane(group, slot))
                if remaining == 0:  # a replacement that came up after the last record: its lanes end at once
                    queue.put_nowait(None)

        async def lose(group: asyncio.TaskGroup, slot: _Slot) -> None:
            nonlocal replacements
            if not slot.alive:
                return
            slot.alive = False
            self.lost += 1
            if replacements > 0:
                replacements -= 1
                replacement = await start_actor()
                working.append(replacement)
                lanes(group, replacement)
            elif not any(s.alive for s in working):
                raise TitoError(
                    f"every Ray worker was lost; {remaining} rollouts were not run (rerun the same command to resume)"
                )

        async def lane(group: asyncio.TaskGroup, slot: _Slot) -> None:
            nonlocal remaining
            while True:
                item = await queue.get()
                if item is None:
                    return
                if not slot.alive:
                    queue.put_nowait(item)
                    return
                try:
                    async with pool.lease() as server:
                        if (item.task.id, item.sample) not in announced:  # a retried item is still in flight
                            announced.add((item.task.id, item.sample))
                            if on_start is not None:
                                on_start()
                        blob, healthy = await slot.handle.run.remote(_ITEM_ENCODER.encode(item), server.name)
                except ray.exceptions.RayActorError:
                    queue.put_nowait(item)  # lost with its worker: another worker takes it
                    await lose(group, slot)
                    return
                if not healthy:
                    await pool.suspect(server)
                await emit(_RECORD.decode(blob))
                remaining -= 1
                if remaining == 0:
                    for _ in range(sum(s.lanes for s in working)):
                        queue.put_nowait(None)

        try:
            async with asyncio.TaskGroup() as group:
                for slot in first:
                    lanes(group, slot)
        except BaseExceptionGroup as failed:  # one lane's error (the others were cancelled by it): raise it as is
            raise failed.exceptions[0] from None
        finally:
            self._slots = [slot for slot in self._slots if slot.alive]


def _shippable(ray: Any, config: TitoConfig) -> TitoConfig:
    """``config``, after checking that it can travel to the workers (Ray pickles it)."""
    try:
        ray.cloudpickle.dumps(config)
    except Exception as exc:
        raise ConfigError(
            f"the config cannot be sent to Ray workers ({type(exc).__name__}: {exc}): give backend options as plain "
            "values (text, numbers, lists, mappings) that the workers can rebuild objects from, not live objects"
        ) from exc
    return config


class RolloutBatches:
    """Rows of tasks to rows of rollouts, for ``ray.data.Dataset.map_batches``.

    Each task row (the dataset columns of :mod:`~tito_core.runner.dataset`: ``id``, ``prompt``, ``answer``,
    ``metadata``, and any other column) becomes ``group_size`` rows with the columns of the Parquet rollout file
    (:func:`~tito_core.records.record_to_row`; ``read_records``' ``record_from_row`` turns one back into a
    record). Rows need an ``id``; a ``group`` column, when present, gives the group id (use the dataset's row
    index to match what ``tito rollout`` writes), else it is 0. The rollouts of a batch run concurrently
    (``rollout.concurrency``) on this actor's event loop; each actor routes between the servers on its own.

        ds.map_batches(RolloutBatches, fn_constructor_kwargs={"config": "tito.toml"}, concurrency=4,
                       batch_format="pyarrow")

    With ``rollout.current_version``, each record's staleness is set as the runner sets it; with
    ``rollout.max_staleness`` and ``rollout.stale = "drop"``, stale rollouts are left out of the returned rows
    (after the group's advantages, which are computed over the whole group).

    With ``samples`` (a trainer format: ``"slime"``, ``"verl"``, ``"trl"`` or ``"agl"``), the rows are training
    samples instead: one per training branch of each rollout, as ``tito export`` writes them
    (:func:`~tito_core.runner.samples.training_rows`, with the config's ``rollout.branch_reward``).

    Args:
        config: A TOML file, a mapping of config keys, or a :class:`~tito_core.config.TitoConfig`.
        samples: Give training samples in this trainer's format instead of rollout records.
        **overrides: Config keys replacing the file's, as for ``tito_core.rollout``.
    """

    def __init__(self, config: Any, *, samples: ExportFormat | None = None, **overrides: Any) -> None:
        if samples is not None and samples not in get_args(ExportFormat):
            raise ConfigError(f"unknown samples format {samples!r}; expected one of {list(get_args(ExportFormat))}")
        self.samples = samples
        self._pa, _ = pyarrow()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tito-rollouts", daemon=True)
        self._thread.start()
        self.worker: RolloutWorker = self._call(self._setup(config, overrides))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    async def _setup(config: Any, overrides: Mapping[str, Any]) -> RolloutWorker:
        resolved, base_dir = await prepare_config(config, overrides)
        _refuse_gateway_pool(resolved.rollout)
        worker = await RolloutWorker.create(resolved, base_dir=base_dir)
        worker.pool.start()
        return worker

    def __call__(self, batch: Any) -> Any:
        """Run the batch's tasks; returns a ``pyarrow.Table`` of rollout rows (by task, then sample), or training rows.

        Training rows (one per training branch) with ``samples``.
        """
        records = self._call(self._rollouts(_tasks_of(_rows(batch))))
        if self.samples is not None:
            branch_reward = self.worker.settings.branch_reward
            return self._pa.Table.from_pylist(list(training_rows(records, self.samples, branch_reward=branch_reward)))
        return self._pa.Table.from_pylist([record_to_row(r) for r in records], schema=arrow_schema(self._pa))

    async def _rollouts(self, tasks: list[Task]) -> list[RolloutRecord]:
        worker = self.worker
        settings = worker.settings
        items = [WorkItem(task, sample) for task in tasks for sample in range(settings.group_size)]
        done: list[RolloutRecord] = []

        async def keep(record: RolloutRecord) -> None:
            done.append(record)

        with collector_for_rollouts(settings.gc):
            await LocalExecutor(settings.concurrency).run(items, worker, keep)
        order = {task.id: n for n, task in enumerate(tasks)}
        done.sort(key=lambda r: (order[r.task_id], r.sample))
        out: list[RolloutRecord] = done
        if worker.group_reward is not None:
            out = []
            # sorted by task, so each group is one run of records; every group runs whole here: nothing earlier
            for _, group in itertools.groupby(done, key=lambda r: r.task_id):
                out.extend(await group_advantages(worker.group_reward, list(group), earlier={}))
        out = [with_staleness(r, settings.current_version, settings.max_staleness) for r in out]
        if settings.stale == "drop":
            out = [r for r in out if not r.stale]
        return out

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is None or loop.is_closed():
            return
        worker = getattr(self, "worker", None)
        if worker is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(worker.aclose(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)


def _rows(batch: Any) -> list[dict[str, Any]]:
    """The rows of a Ray Data batch: a ``pyarrow.Table``, a ``pandas.DataFrame`` or a mapping of columns."""
    if hasattr(batch, "to_pylist"):
        rows: list[dict[str, Any]] = batch.to_pylist()
        return rows
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):
        return [dict(row) for row in batch.to_dict("records")]
    if isinstance(batch, Mapping):
        columns = {name: list(_plain(values)) for name, values in batch.items()}
        count = len(next(iter(columns.values()), []))
        return [{name: values[n] for name, values in columns.items()} for n in range(count)]
    raise DatasetError(f"a Ray Data batch must be a pyarrow Table, a pandas DataFrame or columns, not {type(batch)}")


def _plain(values: Any) -> Any:
    return values.tolist() if hasattr(values, "tolist") else values


def _tasks_of(rows: list[dict[str, Any]]) -> list[Task]:
    tasks = []
    for n, row in enumerate(rows):
        fields = {key: _plain(value) for key, value in row.items()}
        if fields.get("id") is None:
            raise DatasetError(f"Ray Data batch: row {n + 1}: no `id` (each row needs one: batches have no position)")
        group = fields.pop("group", None)
        task = task_from_row(fields, int(group) if group is not None else 0, where="Ray Data batch")
        tasks.append(task)
    return tasks


def _refuse_gateway_pool(settings: RolloutSettings) -> None:
    """Each Ray worker serves its agents from a gateway of its own: ``[rollout.gateway]`` is for a local run."""
    if settings.gateway is not None:
        raise ConfigError(
            "`[rollout.gateway]` with Ray workers: each Ray worker already runs its agents' gateway in its own "
            "process; remove `[rollout.gateway]`, or run locally with `[rollout.gateway] ray = ...` to put the "
            "gateway workers on Ray"
        )
