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
from typing import Any, Literal

import httpx

from ..errors import ConfigError
from ..export import TrainingBranch
from ..export_images import data_url, only_images, prompt_images
from ..trajectory import Trajectory
from ..versions import int_version

AgentFn = Callable[[Any], Awaitable[tuple[Trajectory, float | None]]]
"""``async def solve(task) -> (trajectory, reward)``: run one agent on one task."""


def model_request_events(
    item: Trajectory | TrainingBranch, *, model: str = "tito", images: Literal["url", "sha256"] = "url"
) -> list[dict[str, Any]]:
    """One ``model_request`` event payload per model call of a trajectory, shaped as the gateway records them.

    Each carries the call's whole prompt (the trajectory up to the call's output) and its output ids;
    ``logprobs`` is present only when every output token has one. Given one :class:`TrainingBranch`, only the
    calls whose output that branch generated itself (the calls of its shared prefix are its parent's). When the
    call's weight versions are known, the choice carries them as vLLM's ``/inference/v1/generate`` does
    (``weight_versions``: spans over the output tokens), and ``model_version`` (Agent Lightning's own field, an
    int) is set when the whole output came from one integer version.

    A call whose prompt holds images carries them where Agent Lightning's rollout manager reads them (its
    ``Triplet.image_urls``): ``request.messages``, one user message of ``image_url`` parts, the prompt's images in
    token order, each a ``data:`` URL (``images="url"``) or ``sha256:<hex>`` (``"sha256"``, rows written to a
    file, whose bytes are in ``<output>.images/``). The text stays in the token ids.
    """
    traj = item.trajectory if isinstance(item, TrainingBranch) else item
    since = item.prompt_length
    ids, lps = traj.token_ids, traj.logprobs
    only_images(traj, "Agent Lightning")  # its Triplet carries image URLs only
    pictures = prompt_images(traj)
    events = []
    for turn in traj.turns:
        if turn.output_start < since:
            continue
        start, end = turn.output_start, turn.output_start + turn.output_len
        choice: dict[str, Any] = {"index": 0, "token_ids": ids[start:end], "finish_reason": turn.finish_reason}
        versions = turn.weight_versions
        if versions is not None:
            choice["weight_versions"] = [{"version": v.version, "start": v.start, "end": v.end} for v in versions]
        single = versions[0].version if versions is not None and len(versions) == 1 else None
        out_lps = lps[start:end]
        if all(lp is not None for lp in out_lps):
            # vLLM's chat logprobs with ``return_tokens_as_token_ids``: the token named by its id
            content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids[start:end], out_lps, strict=True)]
            choice["logprobs"] = {"content": content}
        usage = {"prompt_tokens": end - turn.output_len, "completion_tokens": turn.output_len}
        response: dict[str, Any] = {
            "id": turn.rid,
            "object": "chat.completion",
            "model": model,
            "prompt_token_ids": ids[:start],
        }
        response |= {"choices": [choice], "usage": usage}
        request: dict[str, Any] = {"rid": turn.rid, "stop_reason": turn.stop_reason}
        seen = [p for p in pictures if p.span.end <= start]
        if seen:  # Agent Lightning reads a call's images from its request's image_url parts, in order
            urls = [data_url(p) if images == "url" else f"sha256:{p.image.sha256}" for p in seen]
            parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
            request["messages"] = [{"role": "user", "content": parts}]
        events.append(
            {
                "model": model,
                "model_version": int_version(single),
                "request": request,
                "response": response,
                "server": {"model": model, "endpoint": "tito", "version": None},
                "http_status": 200,
                "status": "ok",
                "usage": usage,
                "finish_reason": turn.finish_reason,
            }
        )
    return events


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
