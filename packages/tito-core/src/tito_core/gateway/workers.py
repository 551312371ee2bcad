"""``tito serve --workers N``: N gateway processes behind one address that only opens rollouts.

**Shape.** A supervisor process runs the door (:mod:`~tito_core.gateway.door`: ``POST /rollouts`` on the front
address, handed to a worker) and N worker processes (:mod:`~tito_core.gateway.worker`), each a whole gateway on a
port of its own. A rollout lives on one worker for its whole life: ``POST /rollouts`` answers with that worker's
``base_url``, and the client talks to it directly. Each worker port keeps the gateway's defences (Host, Origin, the
key, a secret per rollout).

**Records: one merged output, one writer.** The supervisor holds the output's lock and is its only writer: a worker
hands each ended rollout's record over a pipe and answers its client once the supervisor has written it. So the
output is one ordinary rollout file (``tito view``, ``tito export``, ``tito inspect`` and a runner's resume read it as
they read any), ``(task_id, sample)`` keys stay unique (the supervisor numbers samples across workers), and no
record is written twice (the supervisor skips a key it has written). One file per worker would have kept the writes
apart, but every reader would then have had to merge files and the numbering would have needed the same
coordination. The cost is one pipe round trip per ended rollout and per opened one, none per model call.

**A lost worker loses nothing that was answered.** Each worker journals (:mod:`~tito_core.gateway.journal`, in
``<output>.journal/``) every rollout it opens and every call it answers, before the answer goes out. When a worker
ends, whatever the cause, the supervisor reads its journal and writes a record for each rollout it opened and whose
record is not in the output: the trajectory of its last answered call, ``failed`` with the reason "gateway worker
lost". A supervisor killed itself leaves the journals: the next supervisor on the same output recovers them first.

**Shutdown.** SIGINT or SIGTERM: the door refuses new rollouts (503); each worker gets SIGTERM and drains as ``tito
serve`` does (calls in flight recorded, then answered; open rollouts written ``aborted``); a second signal stops the
workers' wait. The supervisor writes what their journals hold, closes the output and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import zlib
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from ..config import TitoConfig
from ..errors import ConfigError
from ..records import RecordWriter, open_writer
from ..records.schema import Key
from .access import Access, is_loopback
from .channel import Ready, Reply, SampleOf, decode_request, encode
from .door import door_app
from .journal import lost_records
from .output import SampleNumbers
from .service import LISTEN_BACKLOG
from .worker import WorkerSettings, worker_main

__all__ = ["LOST", "LostWorker", "WorkerHandle", "WorkerPool"]

logger = logging.getLogger("tito")
LOST = "gateway worker lost"
"""The start of the reason of every rollout a lost worker's journal ends."""
LOST_WAIT_S = 10.0
"""How long the door waits for a worker that broke off an opening to be known gone (and its journal read)."""


class LostWorker(msgspec.Struct, frozen=True):
    """A worker that ended before the shutdown asked it to, and how many of its rollouts were written ``failed``."""

    index: int
    pid: int
    exitcode: int | None
    recovered: int


class WorkerHandle:
    """One worker (a process, or a Ray actor) and the supervisor's end of its connection."""

    def __init__(self, index: int, conn: Connection, journal: Path | None, pid: int = 0, handle: Any = None) -> None:
        self.index = index
        self.conn = conn
        self.journal = journal
        self.handle = handle  # the process, or the Ray actor
        self.base_url = ""
        self.pid = pid
        self.exitcode: int | None = None
        self.ending = False
        self.ready = asyncio.Event()
        self.gone = asyncio.Event()
        self.lost_ids: set[str] = set()  # the rollouts its journal held open when it ended


class WorkerPool:
    """The supervisor of N gateway worker processes (see the module's docstring).

    Args:
        config: The model configuration, given to every worker (it is pickled: its ``rollout.prepare`` ran).
        workers: How many worker processes (1 or more).
        output: The rollout file the supervisor writes (JSONL or ``.parquet``); None records nothing.
        api_key: The key that opens rollouts and reaches every one (as :class:`~tito_core.gateway.Gateway` takes
            it), on the door and every worker.
        idle_timeout: Seconds without a call after which a worker ends a rollout.
        allow_hosts: More ``Host`` values to serve, on the door and every worker.
        allow_origins: Browser origins allowed to call, on the door and every worker.
        drain_s: At shutdown, the seconds each worker's calls in flight get to finish.
        journal_fsync: Sync each journal line to the disk (a power cut loses no answered call either).
        records: Where the records go instead of an ``output`` file: a writer of the caller's (the runner's, which
            writes records of its own: :mod:`tito_core.runner.gateway_pool`), with ``journals``. The pool writes
            to it every record the workers hand over and every record it recovers from a lost worker's journal,
            and closes it at :meth:`close`.
        journals: The folder of the workers' journals; by default ``<output>.journal`` beside the output (None
            without an output: no journal, nothing to recover).
    """

    def __init__(
        self,
        config: TitoConfig,
        workers: int,
        *,
        output: str | Path | None = None,
        api_key: str | None = None,
        idle_timeout: float = 600.0,
        drain_s: float = 30.0,
        allow_hosts: Sequence[str] = (),
        allow_origins: Sequence[str] = (),
        journal_fsync: bool = False,
        records: RecordWriter | None = None,
        journals: str | Path | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"workers must be a positive integer, got {workers!r}")
        if output is not None and records is not None:
            raise ConfigError("a worker pool writes to an `output` file or to `records`, not both")
        if records is not None and journals is None:
            raise ConfigError("a worker pool writing to `records` needs `journals`: the folder its workers journal in")
        self.config = config
        self.count = workers
        self.output = Path(output) if output is not None else None
        self.records = records
        self._journals = Path(journals) if journals is not None else None
        self.access = Access(api_key, allow_hosts, allow_origins)
        self.settings = WorkerSettings(
            api_key=api_key,
            viewer_key=self.access.viewer_key,
            idle_timeout=idle_timeout,
            drain_s=drain_s,
            allow_hosts=tuple(allow_hosts),
            allow_origins=tuple(allow_origins),
            journal_fsync=journal_fsync,
        )
        self.workers: list[WorkerHandle] = []
        self.lost: list[LostWorker] = []
        self.lost_changed = asyncio.Event()  # set whenever a worker is lost (tests and operators wait on it)
        self.closing = False
        self.base_url = ""
        self._writer: RecordWriter | None = None
        self._samples = SampleNumbers()
        self._next = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def journals(self) -> Path | None:
        """The folder of the workers' journals: the one given, else beside the output."""
        if self._journals is not None:
            return self._journals
        return None if self.output is None else self.output.with_name(self.output.name + ".journal")

    # ------------------------------------------------------------------------------------------ lifecycle
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Open the output (recovering journals left by a killed supervisor), start the workers, then the door.

        Returns the door's base URL. Raises :class:`ConfigError` when a worker ends before it serves.
        """
        if not is_loopback(host) and self.access.api_key is None:
            raise ConfigError(f"binding the gateway to {host!r} (not loopback) requires an api key (--api-key)")
        self.settings = msgspec.structs.replace(self.settings, host=host)
        if self.output is not None or self.records is not None:
            self._writer = open_writer(self.output) if self.output is not None else self.records
            self._recover_left_journals()
        for index in range(self.count):
            self.workers.append(await self._launch(index))
        for worker in self.workers:
            await _first(worker.ready.wait(), worker.gone.wait())
            if not worker.ready.is_set():
                code = worker.exitcode
                raise ConfigError(f"gateway worker {worker.index} ended before serving (exit status {code})")
        self._session = aiohttp.ClientSession()
        runner = web.AppRunner(door_app(self), access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG).start()
        self._runner = runner
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.base_url = f"http://{shown}:{bound[1]}"
        self.access.bind(host, shown, int(bound[1]))
        return self.base_url

    def journal_for(self, index: int) -> Path | None:
        """Worker ``index``'s journal file (its folder made, only its owner can read it); None without an output."""
        if self.journals is None:
            return None
        self.journals.mkdir(mode=0o700, exist_ok=True)
        return self.journals / f"worker-{index}.jsonl"

    async def _launch(self, index: int) -> WorkerHandle:
        """Start worker ``index`` as a process (``spawn``), with a pipe; its end is watched (:meth:`_on_exit`)."""
        spawn = multiprocessing.get_context("spawn")
        journal = self.journal_for(index)
        mine, theirs = spawn.Pipe()
        settings = msgspec.structs.replace(self.settings, journal=str(journal) if journal else None)
        process = spawn.Process(target=worker_main, args=(theirs, self.config, settings), name=f"tito-gateway-{index}")
        process.start()
        theirs.close()
        worker = self.watch(WorkerHandle(index, mine, journal, process.pid or 0, process))
        asyncio.get_running_loop().add_reader(process.sentinel, self._on_exit, worker)
        return worker

    def watch(self, worker: WorkerHandle) -> WorkerHandle:
        """Answer ``worker``'s requests as they come."""
        asyncio.get_running_loop().add_reader(worker.conn.fileno(), self._on_requests, worker)
        return worker

    def stop_worker(self, worker: WorkerHandle) -> None:
        """Ask a worker to drain (a second time: to stop waiting for its calls): SIGTERM."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)

    def signal_workers(self) -> None:
        """Stop taking rollouts and ask every live worker to drain (again: they stop waiting for their calls)."""
        self.closing = True
        for worker in self.workers:
            if not worker.gone.is_set():
                self.stop_worker(worker)

    async def close(self) -> None:
        """Drain every worker (SIGTERM), write what their journals hold, close the door and the output."""
        if not self.closing:
            self.signal_workers()
        for worker in self.workers:
            await worker.gone.wait()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        if self.journals is not None:
            with contextlib.suppress(OSError):
                self.journals.rmdir()  # empty once every journal was read

    # ---------------------------------------------------------------------------------------- the door's
    def worker_urls(self, rollout_id: str | None = None) -> list[str]:
        """The live workers' base URLs, starting with the next in turn (round robin) or the id's (a hash of it)."""
        if rollout_id is not None:
            start = zlib.crc32(rollout_id.encode()) % len(self.workers)  # over all: stable while workers are lost
            ordered = self.workers[start:] + self.workers[:start]
            return [w.base_url for w in ordered if w.ready.is_set() and not w.gone.is_set()]
        live = [w.base_url for w in self.workers if w.ready.is_set() and not w.gone.is_set()]
        if not live:
            return []
        self._next = (self._next + 1) % len(live)
        return live[self._next :] + live[: self._next]

    def session(self) -> aiohttp.ClientSession:
        """The door's client session (made in :meth:`start`)."""
        if self._session is None:
            raise ConfigError("the worker pool is not started")
        return self._session

    async def never_opened(self, base_url: str, rollout_id: str) -> bool:
        """Whether the worker at ``base_url`` ended, its journal read whole, without having opened ``rollout_id``.

        Waits up to :data:`LOST_WAIT_S` for that. False while the worker is up: the rollout may be open there.
        """
        worker = next((w for w in self.workers if w.base_url == base_url), None)
        if worker is None:
            return False
        try:
            await asyncio.wait_for(worker.gone.wait(), LOST_WAIT_S)
        except TimeoutError:
            return False
        if worker.journal is not None and worker.journal.exists():
            return False
        return rollout_id not in worker.lost_ids

    # ----------------------------------------------------------------------------------------- the pipes
    def _on_requests(self, worker: WorkerHandle) -> None:
        while worker.conn.poll():
            try:
                data = worker.conn.recv_bytes()
            except (EOFError, OSError):
                asyncio.get_running_loop().remove_reader(worker.conn.fileno())
                self.connection_closed(worker)
                return
            reply = self._answer(worker, data)
            with contextlib.suppress(OSError):
                worker.conn.send_bytes(encode(reply))

    def _answer(self, worker: WorkerHandle, data: bytes) -> Reply:
        try:
            request = decode_request(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return Reply(error=f"the supervisor could not read the request: {exc}")
        if isinstance(request, Ready):
            worker.base_url, worker.pid = request.base_url, request.pid
            worker.ready.set()
            return Reply()
        if isinstance(request, SampleOf):
            return Reply(sample=self._samples.next(request.task_id, self._finished, request.rollout_id))
        if self._writer is None:
            return Reply(error="the gateway has no output")
        record = request.record
        if record.key in self._writer.finished():
            logger.warning("record %s/%s was written already: not twice", record.task_id, record.sample)
            return Reply()
        try:
            self._writer.write(record)
        except (OSError, ValueError) as exc:
            return Reply(error=f"{type(exc).__name__}: {exc}")
        self._samples.written(record.trajectory.rollout_id)
        return Reply()

    def _finished(self) -> set[Key]:
        return self._writer.finished() if self._writer is not None else set()

    # ---------------------------------------------------------------------------------------- lost workers
    def connection_closed(self, worker: WorkerHandle) -> None:
        """The worker's end of the connection closed (a process's end is its sentinel: :meth:`_on_exit`)."""

    def _on_exit(self, worker: WorkerHandle) -> None:
        asyncio.get_running_loop().remove_reader(worker.handle.sentinel)
        worker.handle.join()
        code = worker.exitcode = worker.handle.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        self.ended(worker, how)

    def ended(self, worker: WorkerHandle, how: str) -> None:
        """``worker`` is gone (``how``): answer what it sent last, then write its journal's rollouts."""
        if worker.ending:
            return
        worker.ending = True
        self._on_requests(worker)  # what it sent before it ended is handled first: recovery skips those keys
        asyncio.get_running_loop().remove_reader(worker.conn.fileno())
        worker.conn.close()
        code = worker.exitcode
        reason = f"{LOST}: worker {worker.index} (pid {worker.pid}) {how}"
        recovered = self._recover(worker.journal, reason, worker.lost_ids)
        if recovered or not (self.closing and code in (0, None)):
            logger.error("gateway worker %d (pid %d) %s; %d rollouts written as failed from its journal",
                         worker.index, worker.pid, how, recovered)  # fmt: skip
            self.lost.append(LostWorker(worker.index, worker.pid, code, recovered))
            self.lost_changed.set()
        worker.gone.set()

    def _recover(self, journal: Path | None, reason: str, ids: set[str] | None = None) -> int:
        """Write ``journal``'s rollouts not in the output (their ids into ``ids``); delete it once all are written."""
        if journal is None or not journal.exists():
            return 0
        if self._writer is None:
            return 0
        written = 0
        for record in lost_records(journal, self._writer.finished(), reason):
            try:
                self._writer.write(record)
            except (OSError, ValueError) as exc:
                logger.error("gateway journal %s: record %s/%s could not be written (%s); the journal is kept",
                             journal, record.task_id, record.sample, exc)  # fmt: skip
                return written
            written += 1
            self._samples.written(record.trajectory.rollout_id)
            if ids is not None:
                ids.add(record.trajectory.rollout_id)
        journal.unlink()
        journal.with_name(journal.name + ".tmp").unlink(missing_ok=True)  # a compaction cut short by the kill
        return written

    def _recover_left_journals(self) -> None:
        folder = self.journals
        if folder is None or not folder.is_dir():
            return
        for journal in sorted(folder.glob("worker-*.jsonl")):
            count = self._recover(journal, f"{LOST}: a supervisor before this one ended without reading its journal")
            if count:
                logger.error("gateway journal %s: %d rollouts of an earlier run written as failed", journal, count)


async def _first(*waits: Any) -> None:
    """Return once the first of ``waits`` (coroutines) ends; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
