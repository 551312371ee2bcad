"""``[rollout.gateway]``: the ``[rollout.agent]`` rollouts' gateway in worker processes or Ray actors.

:class:`PoolGateways` starts one :class:`~tito_core.gateway.workers.WorkerPool` per server the run uses (a
:class:`~tito_core.gateway.ray_workers.RayWorkerPool` with ``ray``), at the first rollout on that server: the
processes of ``tito serve --workers N``, with the runner as their supervisor. Each rollout is opened on the live
worker holding the fewest of the run's rollouts (``POST /rollouts`` on that worker, with the id ``task:sample``
when it fits the gateway's id alphabet) and its agent gets that worker's endpoint: ``base_url`` and the rollout's
own token. Nothing routes the agent's calls.

**Records: the run's one writer.** The pool's writer is :class:`_Handover`: each record a worker hands over (when
the runner finishes a rollout, telling the worker how its agent ended) goes to the rollout waiting for it, and the
runner builds its own record from that trajectory (its reward, its timings) and writes it to the run's output,
as it does for a rollout of its in-process gateway. So the output is the run's file, with the resume rule it
always had.

**A lost worker.** The pool reads a lost worker's journal (in ``<output>.journal/``) and gives back, for each
rollout it held, the trajectory of its last answered call, ``failed`` with "gateway worker lost: ...". The runner
stops those rollouts' agents and writes those records: failed rollouts like any other, which a rerun with
``rollout.retry_failed`` runs again. The other workers go on. When every worker of a server is lost, the run stops
with :class:`NoGatewayWorker` (the records written are kept; a rerun resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import msgspec

from ..config import GatewaySettings, TitoConfig
from ..errors import TitoError
from ..gateway.app import ID_CHARACTERS, MAX_ENDED_ERROR, MAX_ID_LENGTH
from ..gateway.workers import LOST, WorkerHandle, WorkerPool
from ..records import GroupAdvantages, Key, RecordWriter, RolloutRecord
from ..status import Outcome, RolloutTimedOut, WorkerLost, status_of
from ..trajectory import Trajectory, TrajectoryRecord
from .servers import Server

__all__ = ["GatewayWorkerLost", "NoGatewayWorker", "PoolGateways", "PoolRollout"]

logger = logging.getLogger("tito.runner")


class GatewayWorkerLost(TitoError):
    """The gateway worker holding a rollout was lost while its agent ran: the agent was stopped."""


class NoGatewayWorker(TitoError):
    """No gateway worker serves a server (none started, or every one was lost): the run stops, a rerun resumes."""


class PoolRollout:
    """One rollout open on a pool worker: its agent's endpoint, and the record that ends it.

    It is an :class:`~tito_core.runner.agent_process.Endpoint`, as a rollout of the in-process gateway is.
    """

    lost_engine = False  # a worker's calls are its own: the run's health checks find a lost engine

    def __init__(
        self, pools: PoolGateways, rollout_id: str, wanted: str, worker: WorkerHandle, opened: dict[str, Any]
    ) -> None:
        self.pools = pools
        self.id = rollout_id  # the worker's id of the rollout (``wanted`` when it fits the gateway's ids)
        self.wanted = wanted  # the run's id, ``task:sample``: the trajectory's rollout id
        self.worker = worker
        self.base_url: str = opened["base_url"]
        self.token: str = opened["token"]
        self.record: asyncio.Future[RolloutRecord] = asyncio.get_running_loop().create_future()

    async def guard(self, agent: Awaitable[str]) -> str:
        """Run the agent to its end, or until its worker is lost (then it is stopped: :class:`GatewayWorkerLost`)."""
        running = asyncio.ensure_future(agent)
        gone = asyncio.ensure_future(self.worker.gone.wait())
        try:
            await asyncio.wait({running, gone}, return_when=asyncio.FIRST_COMPLETED)
            if running.done():
                return running.result()
            raise GatewayWorkerLost(f"gateway worker {self.worker.index} was lost: the agent was stopped")
        finally:
            gone.cancel()
            if not running.done():
                running.cancel()  # a command agent's process group is killed before it returns
                await asyncio.wait({running})

    async def end(self, ended: Outcome | None) -> Trajectory:
        """Finish the rollout on its worker, closed as ``ended`` says; its trajectory, with the run's rollout id.

        A worker lost before or during the finish gives back the rollout from its journal (``failed``).

        Raises:
            TitoError: The worker refused to finish it (its answer is quoted).
        """
        try:
            return await self._end(self.pools.client(), ended)
        finally:
            self.pools.release(self)

    async def drop(self) -> None:
        """The run was cancelled: its worker ends the rollout when the pool closes (not recorded by the run)."""
        self.pools.release(self)

    async def _end(self, session: aiohttp.ClientSession, ended: Outcome | None) -> Trajectory:
        url = f"{self.worker.base_url}/rollouts/{quote(self.id, safe=':@')}/finish"
        body = {"ended": _wire(ended)} if ended is not None else {}
        headers = {"Authorization": f"Bearer {self.token}"}
        cut: aiohttp.ClientError | None = None
        for _ in range(3):  # a connection cut mid-answer: ask again (a finished rollout's record is here then)
            if self.record.done() or self.worker.gone.is_set():
                break
            try:
                async with session.post(url, json=body, headers=headers) as answer:
                    status, text = answer.status, await answer.text()
            except aiohttp.ClientConnectorError:  # nothing listens there: the worker is gone or going
                await _first(self.record, self.worker.gone.wait())
                break
            except aiohttp.ClientError as exc:
                cut = exc
                continue
            if not self.record.done():  # written before the worker answers 200: anything else is a refusal
                raise TitoError(f"gateway worker {self.worker.index} did not finish rollout {self.id}: {status} "
                                f"{text[:500]}")  # fmt: skip
            break
        else:
            if not self.record.done() and not self.worker.gone.is_set():
                raise TitoError(f"gateway worker {self.worker.index} could not be reached to finish rollout "
                                f"{self.id}: {type(cut).__name__}: {cut}")  # fmt: skip
        if self.record.done():
            return Trajectory.from_record(_renamed(self.record.result().trajectory, self.wanted))
        reason = f"{LOST}: worker {self.worker.index} (pid {self.worker.pid}); its journal held nothing of this rollout"
        return Trajectory(self.wanted).close(*status_of(WorkerLost(reason, "running")))


class PoolGateways:
    """The run's gateway worker pools, one per server, each started at its first rollout (see the module doc).

    Args:
        config: The run's resolved configuration (each worker builds its gateway and backend from it).
        settings: The ``[rollout.gateway]`` table.
        idle_timeout: The workers' idle timeout (the runner's time limit ends an agent, not the gateway).
        journals: The folder of the workers' journals (one subfolder per server).
    """

    def __init__(self, config: TitoConfig, settings: GatewaySettings, *, idle_timeout: float, journals: Path) -> None:
        self.config = config
        self.settings = settings
        self.idle_timeout = idle_timeout
        self.journals = journals
        self.pools: dict[str, WorkerPool] = {}
        self.waiting: dict[str, PoolRollout] = {}  # by the worker's rollout id
        self._load: dict[WorkerHandle, int] = {}  # the run's open rollouts per worker
        self._turn = itertools.count()
        self._starting = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    async def open(self, server: Server, rollout_id: str, task_id: str, sample: int, group: int) -> PoolRollout:
        """Open rollout ``rollout_id`` on the least loaded live worker of ``server``'s pool.

        Raises:
            NoGatewayWorker: Every worker of the pool was lost.
            TitoError: A worker refused to open it.
        """
        pool = await self._pool(server)
        session = self.client()
        wanted = rollout_id if _fits(rollout_id) else None
        body = {"task_id": task_id, "metadata": {"sample": sample}, "group": group, "id": wanted}
        for worker in self._order(pool):
            try:
                async with session.post(f"{worker.base_url}/rollouts", json=body) as answer:
                    status, text = answer.status, await answer.read()
            except aiohttp.ClientError:  # gone, or going: its journal's line (if any) comes back unwaited for
                continue
            if status != 201:
                raise TitoError(f"gateway worker {worker.index} did not open rollout {rollout_id}: {status} "
                                f"{text[:500]!r}")  # fmt: skip
            answer = msgspec.json.decode(text)
            opened = PoolRollout(self, answer["id"], rollout_id, worker, answer)
            self.waiting[opened.id] = opened
            self._load[worker] = self._load.get(worker, 0) + 1
            return opened
        lost = ", ".join(f"worker {w.index}: {_how(pool, w)}" for w in pool.workers)
        raise NoGatewayWorker(f"every gateway worker of server {server.name} was lost ({lost}); the records written "
                              "so far are kept: run the same command again to resume")  # fmt: skip

    def release(self, rollout: PoolRollout) -> None:
        """The run is done with ``rollout`` (recorded, or cancelled: a worker then ends it on its own)."""
        if self.waiting.get(rollout.id) is rollout:
            del self.waiting[rollout.id]
            self._load[rollout.worker] -= 1

    async def aclose(self) -> None:
        """Drain and stop every pool (a rollout still open on a worker is ended there, not recorded here)."""
        pools, self.pools = list(self.pools.values()), {}
        try:
            for pool in pools:
                await pool.close()
        finally:
            if self._session is not None:
                await self._session.close()
                self._session = None
            with contextlib.suppress(OSError):
                self.journals.rmdir()  # empty once every pool read its workers' journals

    def client(self) -> aiohttp.ClientSession:
        """The run's client session to the workers (made on first use, on the run's loop)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    def _order(self, pool: WorkerPool) -> list[WorkerHandle]:
        """The live workers, the least loaded first (ties in turn, so that one at a time still spreads)."""
        live = [w for w in pool.workers if w.ready.is_set() and not w.gone.is_set()]
        start = next(self._turn) % len(live) if live else 0
        live = live[start:] + live[:start]
        return sorted(live, key=lambda w: self._load.get(w, 0))

    async def _pool(self, server: Server) -> WorkerPool:
        """``server``'s pool, started at the first rollout that needs it."""
        pool = self.pools.get(server.name)
        if pool is not None:
            return pool
        async with self._starting:
            if server.name not in self.pools:
                try:
                    self.pools[server.name] = await self._start(server)
                except (TitoError, OSError) as exc:
                    raise NoGatewayWorker(f"the gateway workers for server {server.name} did not start: {exc}") from exc
            return self.pools[server.name]

    async def _start(self, server: Server) -> WorkerPool:
        config = self.config
        if isinstance(config.backend_options.get("base_url"), list):  # several servers: this pool's one
            own = {**config.backend_options, "base_url": server.name}
            config = msgspec.structs.replace(config, backend_options=own)
        self.journals.mkdir(mode=0o700, exist_ok=True)
        options: dict[str, Any] = {
            "records": _Handover(self.journals, self.waiting),
            "journals": self.journals / f"server-{len(self.pools)}",
            "idle_timeout": self.idle_timeout,
        }
        settings = self.settings
        if settings.ray is not None:
            from ..gateway.ray_workers import RayWorkerPool

            pool: WorkerPool = RayWorkerPool(config, settings.workers, address=settings.ray,
                                             num_cpus=settings.num_cpus or 1.0, **options)  # fmt: skip
        else:
            pool = WorkerPool(config, settings.workers, **options)
        try:
            await pool.start()
        except BaseException:
            await pool.close()
            raise
        logger.info("gateway workers for %s: %s", server.name, ", ".join(w.base_url for w in pool.workers))
        return pool


class _Handover(RecordWriter):
    """A pool's writer in a run: each record goes to the rollout waiting for it; the run writes a record of its own.

    A record comes from a worker (a finished rollout) or from a lost worker's journal, and goes to the rollout of the
    same id opened on that worker.
    """

    def __init__(self, path: Path, waiting: dict[str, PoolRollout]) -> None:
        self.path = path
        self.waiting = waiting
        self._opened({}, {})

    def write(self, record: RolloutRecord) -> None:
        """Give ``record`` to the rollout waiting for it, else drop it.

        Nobody waits for a rollout the run stopped, or one of an earlier run's journal (the run runs what its output
        lacks).
        """
        rollout = self.waiting.get(record.trajectory.rollout_id)
        if rollout is None or rollout.worker.base_url != record.server or rollout.record.done():
            logger.info("gateway record of rollout %s (%s) not waited for: dropped", record.trajectory.rollout_id,
                        record.status_reason or record.status)  # fmt: skip
            return
        rollout.record.set_result(record)

    def finished(self) -> set[Key]:
        """None: the workers' keys are not the run's (they number samples of their own, from 0 for each task).

        So the pool numbers a task's samples without reading every key handed over, and a journal's rollout is
        given back unless the journal says it ended (one that ended after all is dropped: its rollout has a record).
        """
        return set()

    def write_advantages(self, entry: GroupAdvantages) -> None:
        """Not used: the run writes group advantages."""
        raise NotImplementedError("a gateway pool's records go to the run, which writes advantages")

    def _remove(self, keys: set[Key]) -> None:
        raise NotImplementedError("a gateway pool's records go to the run, which removes records")

    def close(self) -> None:
        """Nothing to close: the run's output is the run's."""


def _wire(ended: Outcome) -> dict[str, Any]:
    """How an agent ended, as ``finish``'s ``ended`` says it."""
    if isinstance(ended, RolloutTimedOut):
        return {"timed_out_s": ended.seconds}
    _, reason = status_of(ended)
    return {"error": (reason or type(ended).__name__)[:MAX_ENDED_ERROR]}


def _fits(rollout_id: str) -> bool:
    """Whether the gateway takes ``rollout_id`` as a rollout's id (else a worker picks one)."""
    return len(rollout_id) <= MAX_ID_LENGTH and set(rollout_id) <= ID_CHARACTERS and rollout_id not in (".", "..")


def _renamed(record: TrajectoryRecord, rollout_id: str) -> TrajectoryRecord:
    """``record`` (and its earlier branches) under the run's rollout id."""
    if record.rollout_id == rollout_id:
        return record
    branches = [_renamed(branch, rollout_id) for branch in record.branches]
    return msgspec.structs.replace(record, rollout_id=rollout_id, branches=branches)


def _how(pool: WorkerPool, worker: WorkerHandle) -> str:
    lost = next((lost for lost in pool.lost if lost.index == worker.index), None)
    return f"exit status {lost.exitcode}" if lost is not None else "not serving"


async def _first(future: asyncio.Future[Any], other: Awaitable[Any]) -> None:
    """Return once ``future`` is done or ``other`` ends (``future`` is left as it is)."""
    waiter = asyncio.ensure_future(other)
    try:
        await asyncio.wait({future, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
