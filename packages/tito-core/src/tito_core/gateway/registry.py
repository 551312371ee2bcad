"""The gateway's open rollouts: one :class:`~tito_core.rollout_core.call.Rollout` each, its calls and idle clock.

A :class:`GatewayRollout` takes calls concurrently, each on its own lineage (the core's
:class:`~tito_core.rollout_core.lineages.Lineages` picks one per call and lets a call branch off a lineage another
call holds); :meth:`GatewayRollout.claim` counts them, and a finished one refuses every call (409). The
:class:`Registry` finds rollouts by id (404 when unknown), removes them when they are taken (409 while calls run),
and ends the ones idle past the timeout through a callback (the gateway closes them with a status and writes them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

from ..rollout_core import CallOptions, Rollout
from .errors import GatewayError
from .images import ImageReader
from .matching import ReplyBook
from .rewards import TurnRewards

__all__ = ["GatewayRollout", "Registry", "new_token"]

logger = logging.getLogger("tito")
T = TypeVar("T")


def new_token() -> str:
    """A rollout token: ``tito-`` and 192 random bits (URL-safe base64)."""
    return "tito-" + secrets.token_urlsafe(24)


KEEP_FINISHED = 1024
"""Finished rollouts whose trajectory ``GET /rollouts/<id>`` still answers (and whose ids stay taken)."""


class GatewayRollout:
    """One rollout served by the gateway.

    Attributes:
        id: The rollout id (the trajectory's ``rollout_id``): a name, not a secret.
        token: The rollout's secret (192 random bits, chosen by the gateway, never by a client): its routes take
            ``Authorization: Bearer <token>`` (or ``x-api-key``) and nothing else but the gateway's own key.
        base_url: The OpenAI base URL a client uses for this rollout: ``http://HOST:PORT/rollouts/<id>/v1``.
        task_id: The task this rollout runs (the rollout id when none was given).
        metadata: What the client gave when opening it (kept in the trajectory's metadata too).
        core: The core's rollout (its trajectory, renderer and calls).
        replies: The assistant messages returned so far, for matching replays.
        front_states: Each front's own state for this rollout (:meth:`~tito_core.gateway.fronts.Front.new_state`:
            the Responses API's past responses, for ``previous_response_id``), by front name.
        images: The reader of its requests' ``image_url`` parts (the last request's images kept by URL).
        started: Unix time it was opened.
        last_used: ``time.monotonic()`` of the last call's end (or the opening).
        tool_calls: Tool calls the rollout's outputs asked for (the record's ``tokens.tool_calls``).
        sample: The rollout's sample number within its task (the record's key is ``(task_id, sample)``).
        group: The record's group id (0 unless the opener gives one).
        options: The model's per-call options (sampling, limits, default ``tool_choice``).
        rewards: The per-call rewards given so far (``POST /rollouts/<id>/reward``).
        lost_engine: True once a call on it failed with a :class:`~tito_core.errors.BackendConnectionError`
            (the runner then has its server checked, as for a Strands rollout).
    """

    def __init__(self, rollout_id: str, base_url: str, core: Rollout, task_id: str, metadata: dict[str, Any]):
        self.id = rollout_id
        self.token = new_token()
        self.base_url = base_url
        self.core = core
        self.task_id = task_id
        self.metadata = metadata
        self.replies = ReplyBook()
        self.front_states: dict[str, Any] = {}
        self.images = ImageReader()
        self.started = time.time()
        self.last_used = time.monotonic()
        self.tool_calls = 0
        self.sample = 0
        self.group = 0
        self.lost_engine = False
        self.rewards = TurnRewards()
        self.options = CallOptions()  # the model's per-call options (the gateway's setup), set by ``open``
        self.finished = False
        self.calls: set[asyncio.Task[Any]] = set()  # the model calls running now (a drain past its time cancels them)
        self._running = 0
        self._idle = asyncio.Event()  # set while no call runs: what idle() waits on
        self._idle.set()

    @property
    def busy(self) -> bool:
        """True while a call runs."""
        return self._running > 0

    async def idle(self) -> None:
        """Return once no call runs on the rollout (at once when none does)."""
        await self._idle.wait()

    async def run_call(self, call: Coroutine[Any, Any, T]) -> T:
        """Run a model call as a task a shutdown's drain can cancel (``Registry.finish_calls``).

        Raises:
            GatewayError: 503 when the drain cancelled it (its client gets an error, never a 200).
        """
        task: asyncio.Task[T] = asyncio.ensure_future(call)
        self.calls.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this request itself was cancelled (its client went away, the server stops)
            late = "the gateway shut down during the call: it ran past the drain time and was cancelled"
            raise GatewayError(503, late, code="shutting_down") from None
        finally:
            self.calls.discard(task)

    @contextlib.contextmanager
    def claim(self) -> Iterator[None]:
        """Count one call in flight on the rollout (others may run: each holds its own lineage in the core).

        Raises:
            GatewayError: 409 when it was finished.
        """
        if self.finished:
            raise GatewayError(409, f"rollout {self.id!r} is finished and takes no more calls", code="rollout_finished")
        self._running += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()
            self.last_used = time.monotonic()


class Registry:
    """The open rollouts by id, and the idle sweep.

    Args:
        idle_timeout: Seconds without a call after which a rollout is ended (``on_idle``).
        on_idle: Called with each idle rollout (already removed from the registry).
    """

    def __init__(self, idle_timeout: float, on_idle: Callable[[GatewayRollout], Awaitable[None]]) -> None:
        if idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive, got {idle_timeout!r}")
        self.idle_timeout = idle_timeout
        self._on_idle = on_idle
        self._open: dict[str, GatewayRollout] = {}
        self._finished: OrderedDict[str, bytes] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None

    def keep_finished(self, rollout_id: str, trajectory_json: bytes) -> list[str]:
        """Keep a finished rollout's trajectory JSON (the last :data:`KEEP_FINISHED`); returns the ids let go."""
        self._finished[rollout_id] = trajectory_json
        gone = []
        while len(self._finished) > KEEP_FINISHED:
            gone.append(self._finished.popitem(last=False)[0])
        return gone

    def finished(self, rollout_id: str) -> bytes | None:
        """The trajectory JSON of a rollout finished lately (None: not finished, or let go)."""
        return self._finished.get(rollout_id)

    @staticmethod
    def new_id() -> str:
        """A fresh rollout id."""
        return f"ro-{uuid.uuid4().hex[:20]}"

    def add(self, rollout: GatewayRollout) -> None:
        """Register an opened rollout.

        Raises:
            GatewayError: 409 when the id is taken.
        """
        if rollout.id in self._open:
            raise GatewayError(409, f"rollout {rollout.id!r} is already open", code="rollout_exists")
        self._open[rollout.id] = rollout

    def get(self, rollout_id: str) -> GatewayRollout:
        """The open rollout ``rollout_id``.

        Raises:
            GatewayError: 404 when no open rollout has that id.
        """
        found = self._open.get(rollout_id)
        if found is None:
            raise GatewayError(404, f"no open rollout {rollout_id!r}", param="rollout_id", code="rollout_not_found")
        return found

    def remove(self, rollout_id: str) -> GatewayRollout:
        """Take ``rollout_id`` out of the registry (it refuses later calls).

        Raises:
            GatewayError: 404 when unknown; 409 while a call runs on it.
        """
        found = self.get(rollout_id)
        if found.busy:
            raise GatewayError(409, f"rollout {rollout_id!r} is answering a call", code="rollout_busy")
        found.finished = True
        del self._open[rollout_id]
        return found

    def open_rollouts(self) -> list[GatewayRollout]:
        """The open rollouts, oldest first."""
        return list(self._open.values())

    def busy(self) -> list[GatewayRollout]:
        """The open rollouts answering a call now."""
        return [r for r in self._open.values() if r.busy]

    async def finish_calls(self, within_s: float, hurry: asyncio.Event) -> None:
        """Let the calls in flight end, for at most ``within_s`` seconds or until ``hurry`` is set.

        Then cancel the ones still running (each answers its client with an error) and wait for them to end.
        """
        busy = self.busy()
        if not busy:
            return
        logger.info("gateway shutting down: waiting up to %g s for %d calls in flight", within_s, len(busy))
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(r.idle()) for r in busy]
        hurried: asyncio.Future[Any] = asyncio.ensure_future(hurry.wait())
        deadline = time.monotonic() + within_s
        pending: set[asyncio.Future[Any]] = set(waits)
        while pending and not hurried.done() and (left := deadline - time.monotonic()) > 0:
            _, pending = await asyncio.wait({*pending, hurried}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(hurried)
        hurried.cancel()
        late = [call for r in busy if r.busy for call in r.calls]
        for call in late:
            call.cancel()
        await asyncio.gather(*waits)  # a cancelled call ends at once: its engine abort is bounded (5 s)
        if late:
            logger.warning("gateway shutdown: %d calls still running after %g s were cancelled", len(late), within_s)

    def drain(self) -> list[GatewayRollout]:
        """Every open rollout, removed (shutdown)."""
        out = list(self._open.values())
        for rollout in out:
            rollout.finished = True
        self._open.clear()
        return out

    def __len__(self) -> int:
        return len(self._open)

    # ------------------------------------------------------------------------------------------------ idle
    def start(self) -> None:
        """Start the idle sweep (on the running loop)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="tito-gateway-idle")

    async def stop(self) -> None:
        """Stop the idle sweep."""
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper

    def idle(self, now: float | None = None) -> list[GatewayRollout]:
        """The rollouts without a call for ``idle_timeout`` seconds (none busy)."""
        now = time.monotonic() if now is None else now
        return [r for r in self._open.values() if not r.busy and now - r.last_used >= self.idle_timeout]

    async def _sweep(self) -> None:
        interval = min(max(self.idle_timeout / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(interval)
            for rollout in self.idle():
                if rollout.id in self._open and not rollout.busy:
                    self.remove(rollout.id)
                    await self._on_idle(rollout)
