"""Agent Lightning v1: a trajectory as the ``model_request`` events its store records, one per model call.

Agent Lightning's gateway records every proxied model call as a ``model_request`` event (the non-streaming OpenAI
response with vLLM's ``prompt_token_ids`` / ``choices[0].token_ids`` and ``logprobs.content``); its training
bridge turns them into triplets. Posting them to its store, and the agent class its runner starts, are
:mod:`tito_core.trainers.agentlightning`'s.
"""

from __future__ import annotations

from typing import Any, Literal

from ..trajectory import Trajectory
from ..versions import int_version
from .branches import TrainingBranch
from .media import data_url, only_images, prompt_images

__all__ = ["model_request_events"]


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
