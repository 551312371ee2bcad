"""Agent Lightning v1: a tito rollout as the store events its trainer reads.

Agent Lightning's gateway records every proxied model call as a ``model_request`` event (the
non-streaming OpenAI response with vLLM's ``prompt_token_ids`` / ``choices[0].token_ids`` and
``logprobs.content``), and the environment reports a ``reward`` event; its training bridge turns them
into triplets. tito generates token-in/token-out without that gateway, so it posts the same events
itself, one ``model_request`` per model call, to the rollout's event URL (``AGL_EVENT_URL``, set by
Agent Lightning's runners). :func:`rollout_agent` makes an agent class its local runner can start.
Agent Lightning is not imported here; only ``httpx`` (a tito-core dependency) is used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from ..errors import ConfigError
from ..export.agentlightning import model_request_events
from ..trajectory import Trajectory

AgentFn = Callable[[Any], Awaitable[tuple[Trajectory, float | None]]]
"""``async def solve(task) -> (trajectory, reward)``: run one agent on one task."""


async def post_rollout(
    traj: Trajectory,
    reward: float | None = None,
    *,
    event_url: str | None = None,
    key: str | None = None,
    model: str = "tito",
    client: httpx.AsyncClient | None = None,
) -> None:
    """Post ``traj``'s ``model_request`` events, then the ``reward`` event (when not None), in order.

    Args:
        traj: The rollout.
        reward: Its scalar reward; None posts no reward event.
        event_url: ``.../api/rollouts/{rollout_id}/attempt/{attempt_id}/events``; default ``$AGL_EVENT_URL``.
        key: The store's API key; default ``$AGL_KEY`` (empty: none).
        model: The model name recorded in the events.
        client: An httpx client to post with (one is opened and closed otherwise).

    Raises:
        ConfigError: No event URL given or in the environment.
        httpx.HTTPStatusError: The store refused an event (e.g. 404 for an unknown rollout).
    """
    url = event_url or os.environ.get("AGL_EVENT_URL")
    if not url:
        raise ConfigError("no Agent Lightning event URL: pass event_url= or set AGL_EVENT_URL")
    key = os.environ.get("AGL_KEY", "") if key is None else key
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    bodies = [{"event_type": "model_request", "data": data} for data in model_request_events(traj, model=model)]
    if reward is not None:
        bodies.append({"event_type": "reward", "data": {"value": float(reward), "source": "agent"}})
    own = client is None
    http = client or httpx.AsyncClient(timeout=60.0)
    try:
        for body in bodies:
            (await http.post(url, json=body, headers=headers)).raise_for_status()
    finally:
        if own:
            await http.aclose()


def task_from_env(name: str = "AGL_TASK") -> Any:
    """The task Agent Lightning's local runner put in ``$name`` (its ``env_map``): JSON decoded when it is JSON."""
    raw = os.environ.get(name)
    if raw is None:
        raise ConfigError(f"${name} is not set: map the rollout input to it with the rollout's local.env_map")
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def rollout_agent(fn: AgentFn, *, task_env: str = "AGL_TASK", model: str = "tito") -> type[Any]:
    """Make ``fn`` an agent class for Agent Lightning's local runner (``config.local.agent_class``).

    The runner instantiates the class with no arguments and awaits ``run()``: it reads the task from
    ``$task_env``, awaits ``fn(task)`` and posts the trajectory and reward with :func:`post_rollout`.
    Use it as a decorator at module level (the runner imports the class by its path)::

        @rollout_agent
        async def Solve(task):  # noqa: N802 - the name is a class for the runner
            ...
            return model.reset(), reward
    """

    class TitoRolloutAgent:
        """Runs one tito rollout and records it in the Agent Lightning store."""

        async def run(self) -> Trajectory:
            traj, reward = await fn(task_from_env(task_env))
            await post_rollout(traj, reward, model=model)
            return traj

    TitoRolloutAgent.__name__ = TitoRolloutAgent.__qualname__ = getattr(fn, "__name__", "TitoRolloutAgent")
    TitoRolloutAgent.__module__ = getattr(fn, "__module__", __name__)
    TitoRolloutAgent.__doc__ = fn.__doc__ or TitoRolloutAgent.__doc__
    return TitoRolloutAgent
