"""TRL: tito rollouts behind ``GRPOTrainer(rollout_func=...)``.

TRL calls ``rollout_func(prompts, trainer)`` synchronously with the prompts of the current step (each
already repeated ``num_generations`` times by its sampler) and expects one rollout per prompt, in order,
as the columns :func:`tito_core.export.to_trl` returns; ``env_mask`` marks tool and template tokens (0)
so they carry no loss. TRL itself is not imported here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..export import to_trl
from ..trajectory import Trajectory

T = TypeVar("T")
RolloutFn = Callable[[Any], Awaitable[Trajectory]]
"""``async def rollout(prompt) -> Trajectory``: run one agent on one TRL prompt and return its trajectory."""


def rollout_func(
    rollout: RolloutFn, *, max_concurrency: int | None = None
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """TRL's ``rollout_func`` running ``rollout(prompt)`` for every prompt, concurrently.

    Args:
        rollout: Runs one rollout (typically a Strands agent on a fresh :class:`~tito_core.TitoModel`) and
            returns its trajectory, e.g. ``model.reset()`` after the agent returns.
        max_concurrency: At most this many rollouts at once (None: all of the step's prompts).

    Raises:
        TypeError: ``rollout`` returned something other than a :class:`Trajectory`.
    """
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")

    async def run_all(prompts: list[Any]) -> list[Trajectory]:
        limit = asyncio.Semaphore(max_concurrency or max(1, len(prompts)))

        async def one(prompt: Any) -> Trajectory:
            async with limit:
                traj = await rollout(prompt)
            if not isinstance(traj, Trajectory):
                raise TypeError(f"the rollout function must return a tito Trajectory, got {type(traj).__name__}")
            return traj

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    def func(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        return to_trl(run_sync(run_all(list(prompts))))

    return func


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code, also when an event loop is already running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
