"""Weight updates while rollouts are in flight: pause the engines, push the weights, relabel, resume.

    async with weight_update([backend, ...], version=7):
        await push_weights()  # the trainer's own transfer: NCCL, shared memory, a checkpoint on disk, ...

The handshake, in order: every engine freezes the requests it is running (**keep** mode: SGLang's
``/pause_generation`` ``in_place``, vLLM's ``/pause?mode=keep``), the block runs (the caller pushes the
weights, by its own means or the engine's update endpoint), every engine labels its weights ``version``, and
every engine resumes. The requests in flight go on under the new weights: no rollout restarts, no token is
generated or recorded twice, and each turn's tokens carry the versions that generated them
(``Turn.weight_versions``: two spans for a turn that straddled the update).

Where an engine cannot keep its requests (**abort** mode), the requests in flight end with the tokens generated
so far; each model call goes on from its tokens once the engines are resumed, under the new weights (a
**partial rollout**: :mod:`tito_core.partial`). The turn keeps every token once, with the logprob and the version
of the weights that sampled it; its ``Turn.continued_rids`` name the requests that continued it.

Nothing is left paused silently. A pause that one engine refuses resumes the engines already paused and raises
:class:`~tito_core.errors.WeightUpdateError`. Whatever happens in the block (an exception, a cancellation),
every paused engine is resumed; a resume that fails is tried again (it is idempotent on both engines), and an
engine that still cannot be resumed is named in a ``WeightUpdateError`` (``paused``). The rollouts in flight
meanwhile wait for their answers: an engine left paused past the backend's ``timeout`` ends them with a
``BackendTimeoutError``, a status and a reason, never silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence

from .backend import Backend, PauseMode
from .errors import ConfigError, WeightUpdateError

__all__ = ["aborted_by_update", "aborting_updates", "wait_for_resume", "weight_update"]

logger = logging.getLogger("tito.weights")


class _AbortGate:
    """The abort-mode updates of one backend: how many began, how many are under way, and who waits for them.

    Thread-safe: the update may run on the trainer's event loop while the rollouts run on others.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.begun = 0
        self.active = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def close(self) -> None:
        with self._lock:
            self.begun += 1
            self.active += 1

    def open(self) -> None:
        with self._lock:
            self.active -= 1
            if self.active:
                return
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile has nobody left to wake
                loop.call_soon_threadsafe(_wake, future)

    async def wait_open(self) -> None:
        with self._lock:
            if not self.active:
                return
            loop = asyncio.get_running_loop()
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, future))
        await future


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_gates: weakref.WeakKeyDictionary[Backend, _AbortGate] = weakref.WeakKeyDictionary()
_gates_lock = threading.Lock()


def _gate(backend: Backend) -> _AbortGate:
    with _gates_lock:
        gate = _gates.get(backend)
        if gate is None:
            gate = _gates[backend] = _AbortGate()
        return gate


def aborting_updates(backend: Backend) -> int:
    """How many abort-mode weight updates of ``backend`` have begun; read before sending a request."""
    return _gate(backend).begun


def aborted_by_update(backend: Backend, before: int) -> bool:
    """Whether an abort of a request sent when :func:`aborting_updates` was ``before`` came from a weight update.

    True when an abort-mode update began since, or one is under way (a request sent while paused).
    """
    gate = _gate(backend)
    return gate.begun != before or gate.active > 0


async def wait_for_resume(backend: Backend) -> None:
    """Return once no abort-mode weight update of ``backend`` is under way (at once when none is)."""
    await _gate(backend).wait_open()


def _name(backend: Backend) -> str:
    return str(getattr(backend, "base_url", None) or backend.name)


@contextlib.asynccontextmanager
async def weight_update(
    backends: Iterable[Backend],
    *,
    version: str | int | None = None,
    mode: PauseMode = "keep",
    resume_attempts: int = 3,
    retry_delay_s: float = 0.5,
) -> AsyncIterator[None]:
    """Pause ``backends`` around the block, label their weights ``version``, then resume them.

    Args:
        backends: The engines serving the policy (each a distinct server; every one must ``supports_pause``).
        version: The new weights' version (an int is labelled as its decimal text); None keeps the label.
        mode: ``keep`` (the requests in flight go on from their KV cache: fastest; their tokens after the update
            are the new weights' over a prefix cached under the old ones), ``recompute`` (their prompt and
            tokens so far are prefilled again under the new weights, so every later token's logprob is the new
            weights' exactly; SGLang only) or ``abort`` (they end with their tokens so far, and each model call
            sends a continuation from them after the resume: a partial rollout, exact like ``recompute``, for
            engines that can only abort; calls of a :class:`~tito_core.TitoModel` only).
        resume_attempts: Tries per engine to resume it (a lost answer to a resume is tried again).
        retry_delay_s: Seconds between those tries.

    Raises:
        ConfigError: A backend cannot pause (its ``supports_pause`` is False).
        WeightUpdateError: An engine refused the pause (the others were resumed), refused the version (all were
            resumed, the block's weights are in place), or could not be resumed (``paused`` names it).
    """
    targets = list(backends)
    unable = [_name(b) for b in targets if not b.supports_pause]
    if unable:
        raise ConfigError(f"cannot pause {', '.join(unable)} for a weight update: the backend has no pause")
    label = None if version is None else str(version)
    gates = [_gate(b) for b in targets] if mode == "abort" else []
    for gate in gates:
        gate.close()  # before the pause: every abort it causes is known as the update's
    try:
        async with _paused(targets, label, mode, resume_attempts, retry_delay_s):
            yield
    finally:
        for gate in gates:
            gate.open()  # the aborted calls go on, under the new weights


@contextlib.asynccontextmanager
async def _paused(
    targets: Sequence[Backend], label: str | None, mode: PauseMode, resume_attempts: int, retry_delay_s: float
) -> AsyncIterator[None]:
    paused: list[Backend] = []
    for backend in targets:
        try:
            await backend.pause_generation(mode)
        except BaseException as exc:
            left = await _resume(paused, resume_attempts, retry_delay_s)
            raise WeightUpdateError(
                f"{_name(backend)} refused to pause for the weight update ({type(exc).__name__}: {exc}); "
                + _resumed_or_not(paused, left),
                paused=left,
            ) from exc
        paused.append(backend)
    failed = True
    try:
        yield
        if label is not None:
            for backend in targets:
                try:
                    await backend.set_weight_version(label)
                except Exception as exc:
                    raise WeightUpdateError(
                        f"{_name(backend)} refused the weight version {label!r} ({type(exc).__name__}: {exc})"
                    ) from exc
        failed = False
    finally:
        left = await _resume(paused, resume_attempts, retry_delay_s)
        if left:
            message = f"{', '.join(left)} could not be resumed after the weight update: still paused"
            if not failed:
                raise WeightUpdateError(message, paused=left)
            logger.error("%s (the update itself failed too: that error follows)", message)


async def _resume(backends: Sequence[Backend], attempts: int, delay: float) -> list[str]:
    """Resume each backend (concurrently), trying each up to ``attempts`` times; the names of those still paused."""

    async def one(backend: Backend) -> str | None:
        for attempt in range(1, attempts + 1):
            try:
                await asyncio.shield(backend.resume_generation())  # a cancelled caller still resumes its engines
                return None
            except Exception as exc:
                logger.warning("resuming %s failed (try %d of %d): %s", _name(backend), attempt, attempts, exc)
                if attempt < attempts:
                    await asyncio.sleep(delay)
        return _name(backend)

    results = await asyncio.gather(*(one(b) for b in backends))
    return [name for name in results if name is not None]


def _resumed_or_not(paused: Sequence[Backend], left: Sequence[str]) -> str:
    if not paused:
        return "no engine was paused"
    if left:
        return f"{', '.join(left)} could not be resumed: still paused"
    return f"the {len(paused)} engine(s) paused before it were resumed"
