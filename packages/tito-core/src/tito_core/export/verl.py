"""verl: a trajectory as the fields of verl's ``AgentLoopOutput``, its per-turn scores, and its multimodal inputs.

The trainer-side integration (a backend over verl's server manager, the agent loop) is :mod:`tito_core.trainers.verl`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..trajectory import Trajectory
from ..versions import VersionSpan, int_version, version_range
from .branches import TrainingBranch, response
from .kept_sets import kept_set_fields
from .media import ImageForm, media_data, pixel_inputs

__all__ = ["VERL_METRICS", "to_verl", "turn_token_scores", "verl_multi_modal_inputs"]


def _verl_global_steps(spans: list[VersionSpan]) -> dict[str, int]:
    """The oldest and newest version as verl's ``min_global_steps`` / ``max_global_steps``, when both are integers."""
    span = version_range(s.version for s in spans)
    low, high = (int_version(span[0]), int_version(span[1])) if span is not None else (None, None)
    return {} if low is None or high is None else {"min_global_steps": low, "max_global_steps": high}


# verl's ``AgentLoopMetrics``: seconds spent generating / in tools, engine preemptions (-1: unknown).
VERL_METRICS: dict[str, float] = {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1}


def turn_token_scores(item: Trajectory | TrainingBranch, turn_rewards: Sequence[float | None]) -> list[float]:
    """Token-level scores over ``item``'s response: each turn's reward at that turn's last output token, 0 elsewhere.

    ``turn_rewards`` is a record's (one per model call, by turn index; None for none). The list is aligned with
    the response (``response_ids`` of :func:`to_verl`): what verl's agent loop makes of one ``reward_score`` at the
    last response token (``rm_scores``), made per turn; verl's token-level advantage estimators (REINFORCE++'s
    returns) credit each turn's tokens with its reward and the later turns'.
    """
    traj, start, ids, _, _ = response(item)
    scores = [0.0] * (len(ids) - start)
    for turn in traj.turns:
        reward = turn_rewards[turn.index] if turn.index < len(turn_rewards) else None
        last = turn.output_start + turn.output_len - 1
        if reward is not None and turn.output_len and last >= start:
            scores[last - start] += reward
    return scores


def to_verl(
    item: Trajectory | TrainingBranch,
    *,
    metrics: Mapping[str, float] | None = None,
    images: ImageForm = "pil",
    turn_rewards: Sequence[float | None] | None = None,
) -> dict[str, Any]:
    """Fields of verl's ``AgentLoopOutput`` (before its padding), of a trajectory or one :class:`TrainingBranch`.

    ``metrics`` are verl's ``AgentLoopMetrics`` (:data:`VERL_METRICS` names them; those not given keep
    their defaults). A trajectory records no timings, so the caller measures them. ``extra_fields`` holds
    verl's ``min_global_steps`` / ``max_global_steps`` when the versions of the tokens the sample trains are
    integers. With images or videos, ``multi_modal_data`` is ``{"images": [...], "videos": [...]}`` (a video as
    verl's ``(frames, metadata)`` pair), verl's own field: verl's
    postprocessing runs its processor over them for ``multi_modal_inputs`` and the MRoPE positions
    (:func:`verl_multi_modal_inputs` gives the same inputs outside verl). With ``turn_rewards``,
    ``extra_fields["turn_scores"]`` holds one score per turn of the response, as verl's own ``turn_scores`` (None
    as 0.0), and ``extra_fields["turn_token_scores"]`` the same placed on tokens (:func:`turn_token_scores`).
    ``routed_experts`` (verl's field) is a ``(len(ids) - 1, layers, top_k)`` int32 numpy array when routing was
    recorded; ``extra_fields`` holds the response's kept sets when a call truncated sampling
    (:func:`~tito_core.export.kept_sets.kept_set_fields`).
    """
    unknown = sorted(set(metrics or {}) - set(VERL_METRICS))
    if unknown:
        raise ValueError(f"unknown verl metrics {unknown}; expected some of {sorted(VERL_METRICS)}")
    traj, start, ids, mask, logprobs = response(item)
    fields: dict[str, Any] = {
        "prompt_ids": ids[:start],
        "response_ids": ids[start:],
        "response_mask": mask,
        "response_logprobs": logprobs,
        "num_turns": sum(1 for turn in traj.turns if turn.output_start >= start),
        "metrics": {**VERL_METRICS, **(metrics or {})},
    }
    spans = traj.weight_versions(since=start)
    steps = _verl_global_steps(spans) if spans is not None else {}
    if steps:  # verl's own fields for the weight versions a trajectory was generated across
        fields["extra_fields"] = steps
    if turn_rewards is not None:
        extra = fields.setdefault("extra_fields", {})
        in_response = [t.index for t in traj.turns if t.output_start >= start]
        extra["turn_scores"] = [float(turn_rewards[i] or 0.0) if i < len(turn_rewards) else 0.0 for i in in_response]
        extra["turn_token_scores"] = turn_token_scores(item, turn_rewards)
    kept = kept_set_fields(traj, start)
    if kept:
        fields.setdefault("extra_fields", {}).update(kept)
    routed = traj.routed_experts()
    if routed is not None:  # verl's own field (rollout routing replay)
        import numpy as np

        data, (layers, top_k) = routed
        fields["routed_experts"] = np.frombuffer(data, dtype="<i4").reshape(-1, layers, top_k)
    if traj.media:  # verl's own field; its agent loops fill it from the conversation's images and videos
        fields["multi_modal_data"] = media_data(traj, images)
    return fields


def verl_multi_modal_inputs(item: Trajectory | TrainingBranch, processor: Any) -> dict[str, Any]:
    """The ``multi_modal_inputs`` verl's agent-loop postprocessing builds for a sample (verl 0.9.1).

    ``pixel_values`` and ``image_grid_thw`` (torch tensors) from the model's image processor (a directory or
    a processor), ``pixel_values_videos`` and ``video_grid_thw`` for videos, and ``images_seqlens`` (each image's
    ``h * w`` patches, repeated ``t`` times); ``{}`` for a text-only sample. verl computes these itself from
    ``multi_modal_data``; this is for a trainer fed exported rows, or to check them. The MRoPE positions come from
    the model's ``get_rope_index`` over the ids and the grids (verl binds it onto its processor).

    Raises:
        ImageError: the processor gives an image another grid than the rollout recorded.
    """
    traj = item.trajectory if isinstance(item, TrainingBranch) else item
    inputs = pixel_inputs(traj, processor, return_tensors="pt")
    if inputs:
        import torch

        grid = inputs.get("image_grid_thw")
        if grid is not None:
            inputs["images_seqlens"] = torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0])
    return inputs
