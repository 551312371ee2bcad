"""Weight updates while rollouts are in flight: pause the engines, push the weights, relabel, resume.

    async with weight_update([backend, ...], version=7):
        await push_weights()  # the trainer's own transfer: NCCL, shared memory, a checkpoint on disk, ...

The handshake, in order: every engine freezes the requests it is running (**keep** mode: SGLang's
``/pause_generation`` ``in_place``, vLLM's ``/pause?mode=keep``), the block runs (the caller pushes the
weights, by its own means or the engine's update endpoint), every engine labels its weights ``version``, and
every engine resumes. The requests in flight go on under the new weights: no rollout restarts, no token is
generated or recorded twice, and each turn's tokens carry the versions that generated them
(``Turn.weight_versions``: two spans for a turn that straddled the update).

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
from collections.abc import AsyncIterator, Iterable, Sequence

from .backend import Backend, PauseMode
from .errors import ConfigError, WeightUpdateError

__all__ = ["weight_update"]

logger = logging.getLogger("tito.weights")


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
    """Pause ``backends`` in keep mode around the block, label their weights ``version``, then resume them.

    Args:
        backends: The engines serving the policy (each a distinct server; every one must ``supports_pause``).
        version: The new weights' version (an int is labelled as its decimal text); None keeps the label.
        mode: ``keep`` (the requests in flight go on from their KV cache: fastest; their tokens after the update
            are the new weights' over a prefix cached under the old ones) or ``recompute`` (their prompt and
            tokens so far are prefilled again under the new weights, so every later token's logprob is the new
            weights' exactly; SGLang only).
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
