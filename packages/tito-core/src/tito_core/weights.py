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

**The probe** (``probe=WeightProbe(...)``) checks that the engines serve the weights the trainer pushed, not only
that something was loaded: the trainer gives a short token sequence and its own logprobs of it under the new
weights; after the resume, each engine scores the sequence (one prefill, :meth:`Backend.score`) and an engine
whose logprobs differ beyond the probe's tolerance is paused again and named in a ``WeightUpdateError`` with the
mean and max difference. Neither engine runs a request while paused (SGLang's scheduler skips every batch,
vLLM's schedules nothing new), so the probe needs the resume; its window is one prefill long, and in ``abort``
mode tito holds its continuations until the probe passed. An engine that fails the probe is left paused, not
resumed: its rollouts then wait (up to the backend's ``timeout``) instead of sampling from weights the trainer
never pushed, and a new ``weight_update`` with the right weights resumes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence

import msgspec

from .backend import Backend, PauseMode
from .errors import ConfigError, WeightUpdateError

__all__ = [
    "ProbeScore",
    "WeightProbe",
    "WeightUpdate",
    "aborted_by_update",
    "aborting_updates",
    "wait_for_resume",
    "weight_update",
]

logger = logging.getLogger("tito.weights")


class WeightProbe(msgspec.Struct, frozen=True, kw_only=True):
    """A check that an engine serves the weights the trainer pushed: a token sequence and the trainer's logprobs.

    The trainer computes ``logprobs`` itself, with the weights it pushes (a forward pass of its own model), so
    an engine that loaded nothing, another checkpoint or part of one is caught, however it reports the load.
    ``weight_update(..., probe=...)`` has every engine score ``token_ids`` (one prefill each) before it lets
    generation go on.

    Attributes:
        token_ids: The sequence, at least 2 tokens (a few dozen of ordinary text is plenty); kept as a tuple.
        logprobs: ``logprobs[i]`` is the trainer's logprob (natural log, temperature 1) of ``token_ids[i + 1]``
            given ``token_ids[: i + 1]``: ``len(token_ids) - 1`` finite values.
        tolerance: The largest mean ``|engine - trainer|`` over the sequence, in nats, that passes. Two bf16
            implementations of the same weights differ by ~1e-3 to 1e-2 nats a token; another checkpoint of
            the tiny test model by ~0.2. Calibrate it once on known-good weights of your model.
        max_tolerance: The largest difference at any one token that passes, or None (only the mean is checked).
    """

    token_ids: Sequence[int]
    logprobs: Sequence[float]
    tolerance: float = 0.05
    max_tolerance: float | None = None

    def __post_init__(self) -> None:
        ids, logprobs = tuple(self.token_ids), tuple(self.logprobs)
        msgspec.structs.force_setattr(self, "token_ids", ids)
        msgspec.structs.force_setattr(self, "logprobs", logprobs)
        if len(ids) < 2 or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ConfigError(f"WeightProbe.token_ids must be at least 2 token ids >= 0, got {ids[:8]!r}")
        if len(logprobs) != len(ids) - 1:
            raise ConfigError(
                f"WeightProbe.logprobs must have one value per token after the first: {len(ids) - 1} for "
                f"{len(ids)} token ids, got {len(logprobs)}"
            )
        if not all(isinstance(v, (int, float)) and math.isfinite(v) and v <= 0 for v in logprobs):
            raise ConfigError("WeightProbe.logprobs must be finite logprobs (<= 0)")
        for name in ("tolerance", "max_tolerance"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"WeightProbe.{name} must be a positive number of nats, got {value!r}")

    def compare(self, engine: str, scored: Sequence[float | None]) -> ProbeScore:
        """How far an engine's logprobs of ``token_ids[1:]`` (``scored``) are from the trainer's.

        Raises:
            WeightUpdateError: ``scored`` has another length, or a missing or non-finite value.
        """
        if len(scored) != len(self.logprobs):
            raise WeightUpdateError(
                f"{engine} scored {len(scored)} tokens of the weight probe, expected {len(self.logprobs)}"
            )
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in scored):
            raise WeightUpdateError(f"{engine} gave a missing or non-finite logprob for a token of the weight probe")
        diffs = [abs(float(a) - b) for a, b in zip(scored, self.logprobs, strict=True)]  # type: ignore[arg-type]
        mean, most = sum(diffs) / len(diffs), max(diffs)
        passed = mean <= self.tolerance and (self.max_tolerance is None or most <= self.max_tolerance)
        return ProbeScore(engine=engine, mean_diff=mean, max_diff=most, tokens=len(diffs), passed=passed)


class ProbeScore(msgspec.Struct, frozen=True, kw_only=True):
    """One engine's score of a :class:`WeightProbe`.

    Attributes:
        engine: The engine (its base URL, else the backend's name).
        mean_diff: Mean ``|engine logprob - trainer logprob|`` over the probe's tokens, in nats.
        max_diff: The largest of those differences.
        tokens: How many tokens were compared.
        passed: Whether it is within the probe's tolerances.
    """

    engine: str
    mean_diff: float
    max_diff: float
    tokens: int
    passed: bool

    def describe(self) -> str:
        """One line: the engine, the mean and the max difference."""
        return (
            f"{self.engine}: mean |logprob - the trainer's| {self.mean_diff:.3g} nats, max {self.max_diff:.3g}, "
            f"over {self.tokens} tokens"
        )


class WeightUpdate:
    """What ``async with weight_update(...) as update`` gives.

    After the block, ``update.probes`` holds each engine's :class:`ProbeScore` (empty without a probe).
    """

    def __init__(self) -> None:
        self.probes: list[ProbeScore] = []


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
    probe: WeightProbe | None = None,
    resume_attempts: int = 3,
    retry_delay_s: float = 0.5,
) -> AsyncIterator[WeightUpdate]:
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
        probe: A :class:`WeightProbe` the trainer computed with the new weights: once the block ran and the
            engines are resumed, each engine scores it (one prefill, :meth:`~tito_core.backend.Backend.score`;
            every backend must ``supports_score``). An engine beyond its tolerance, or that cannot score it, is
            paused again (in ``mode``) and named in a ``WeightUpdateError``; in ``abort`` mode the cut calls are
            continued only after the probe. ``update.probes`` holds the scores.
        resume_attempts: Tries per engine to resume it (a lost answer to a resume is tried again).
        retry_delay_s: Seconds between those tries.

    Yields:
        A :class:`WeightUpdate`, whose ``probes`` are filled in after the block.

    Raises:
        ConfigError: A backend cannot pause (its ``supports_pause`` is False), or a probe was given to a backend
            that cannot score one (``supports_score`` False); nothing is paused.
        WeightUpdateError: An engine refused the pause (the others were resumed), refused the version (all were
            resumed, the block's weights are in place), could not be resumed (``paused`` names it), or failed the
            probe (``probes`` has its score, ``paused`` names it when it was paused again).
    """
    targets = list(backends)
    unable = [_name(b) for b in targets if not b.supports_pause]
    if unable:
        raise ConfigError(f"cannot pause {', '.join(unable)} for a weight update: the backend has no pause")
    if probe is not None:
        if not isinstance(probe, WeightProbe):
            raise ConfigError(f"probe must be a WeightProbe, got {type(probe).__name__}")
        unscored = [_name(b) for b in targets if not getattr(b, "supports_score", False)]
        if unscored:
            raise ConfigError(
                f"cannot check the weights of {', '.join(unscored)} with a probe: the backend cannot score a token "
                "sequence (supports_score is False)"
            )
    label = None if version is None else str(version)
    gates = [_gate(b) for b in targets] if mode == "abort" else []
    update = WeightUpdate()
    for gate in gates:
        gate.close()  # before the pause: every abort it causes is known as the update's
    try:
        async with _paused(targets, label, mode, resume_attempts, retry_delay_s, probe, update):
            yield update
    finally:
        for gate in gates:
            gate.open()  # the aborted calls go on, under the new weights (after the probe, when there is one)


@contextlib.asynccontextmanager
async def _paused(
    targets: Sequence[Backend],
    label: str | None,
    mode: PauseMode,
    resume_attempts: int,
    retry_delay_s: float,
    probe: WeightProbe | None,
    update: WeightUpdate,
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
        resumed_at = time.monotonic()
        left = await _resume(paused, resume_attempts, retry_delay_s)
        if left:
            message = f"{', '.join(left)} could not be resumed after the weight update: still paused"
            if not failed:
                raise WeightUpdateError(message, paused=left)
            logger.error("%s (the update itself failed too: that error follows)", message)
    if probe is not None:
        await _check_probe(targets, probe, mode, resumed_at, update)


async def _check_probe(
    targets: Sequence[Backend], probe: WeightProbe, mode: PauseMode, resumed_at: float, update: WeightUpdate
) -> None:
    """Have every engine score ``probe``; pause again each one that fails it, and raise naming them."""

    async def one(backend: Backend) -> ProbeScore | str:
        name = _name(backend)
        try:
            scored = await backend.score(probe.token_ids)
            return probe.compare(name, scored)
        except WeightUpdateError as exc:
            return str(exc)
        except Exception as exc:
            return f"{name} could not score the weight probe ({type(exc).__name__}: {exc})"

    results = await asyncio.gather(*(one(b) for b in targets))
    update.probes = [r for r in results if isinstance(r, ProbeScore)]
    for score in update.probes:
        logger.info("weight probe %s: %s", "passed" if score.passed else "FAILED", score.describe())
    failing = [(b, r) for b, r in zip(targets, results, strict=True) if isinstance(r, str) or not r.passed]
    if not failing:
        return
    again: list[str] = []
    running: list[str] = []
    modes: set[str] = set()
    for backend, _ in failing:
        try:
            modes.add(await _pause_again(backend, mode))
            again.append(_name(backend))
        except Exception as exc:
            logger.error("pausing %s again after its failed weight probe failed: %s", _name(backend), exc)
            running.append(_name(backend))
    window = time.monotonic() - resumed_at
    reasons = "; ".join(
        r if isinstance(r, str) else f"{r.describe()} (tolerance {_tolerances(probe)})" for _, r in failing
    )
    outcome = []
    if again:
        outcome.append(
            f"{', '.join(again)} paused again ({'/'.join(sorted(modes))}) {window:.2f} s after the resume the probe "
            "needed: generation "
            "was not resumed on weights that are not the trainer's (resume them with a new weight_update once the "
            "right weights are loaded)"
        )
    if running:
        outcome.append(f"{', '.join(running)} could not be paused again and are generating on them")
    raise WeightUpdateError(
        f"the weight probe failed: {reasons}. " + "; ".join(outcome),
        paused=again,
        probes=[r for _, r in failing if isinstance(r, ProbeScore)],
    )


async def _pause_again(backend: Backend, mode: PauseMode) -> PauseMode:
    """Pause an engine that failed the probe; returns the mode used.

    A ``keep`` update pauses it again in ``recompute`` where the engine has that mode (SGLang). Two reasons: the
    KV cache its requests built in the probe window comes from weights the trainer never pushed, and SGLang's
    in-place pause leaves its running batch as it is: a request that finished just before it (the probe's own)
    stays there until the scheduler's next step, which a paused scheduler never takes, and the next update's
    cache flush then fails with "requests are still running or queued". A recompute pause empties the running
    batch: the next update can flush, and the requests are prefilled again under its weights.
    """
    if mode == "keep":
        try:
            await backend.pause_generation("recompute")
            return "recompute"
        except ConfigError:  # the engine has no recompute pause (vLLM): keep it is
            pass
    await backend.pause_generation(mode)
    return mode


def _tolerances(probe: WeightProbe) -> str:
    if probe.max_tolerance is None:
        return f"mean {probe.tolerance:g}"
    return f"mean {probe.tolerance:g}, max {probe.max_tolerance:g}"


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
