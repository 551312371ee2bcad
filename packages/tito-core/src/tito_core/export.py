"""Trainer formats: a :class:`~tito_core.trajectory.Trajectory` as the fields each RL trainer expects.

Every exporter returns plain Python data (no trainer is imported). The *response* is everything after
the prompt: the model's outputs (loss 1) and the tool results / boundaries between them (loss 0).
Logprobs of non-output tokens are ``0.0``, as the trainers expect.

A rollout whose history was rewritten (a trimming or summarizing conversation manager, a retried call) has
several branches. :func:`training_branches` makes each branch a training sample (``branch_reward="shared"``,
the default) or keeps only the final one (``"last"``); every exporter takes a trajectory (its tokens from the
first prompt on) or one :class:`TrainingBranch`. The rule that makes a token trained once: a branch's sample
trains only the tokens that branch generated. Its prompt is everything before its first own output token, the
prefix it shares with its parent included, so what the parent generated is trained in the parent's sample.

Weight versions (:mod:`tito_core.versions`) go in the trainer's own field where it has one, else in a documented
extra field (docs/exports.md); a sample whose tokens have no versions (the backend reported none) exports none.

Images (docs/multimodal.md, "Trainer fields") go in each trainer's own field, every image of the sample's ids in
token order, as PIL images (``images="pil"``) or their sha256 (``"sha256"``, for rows written to a file); a
text-only sample's fields are unchanged. Pixel inputs need the model's image processor, which the caller gives.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

import msgspec

from .export_images import ImageForm, image_values, media_data, only_images, pixel_inputs
from .trajectory import Trajectory
from .versions import VersionSpan, int_version, version_range

__all__ = [
    "VERL_METRICS",
    "BranchReward",
    "TrainingBranch",
    "to_slime",
    "to_trl",
    "to_verl",
    "training_branches",
    "verl_multi_modal_inputs",
]

BranchReward = Literal["shared", "last"]
"""How a rollout with several branches becomes training samples: ``shared`` (every branch that generated tokens
is a sample, each given the episode's reward and advantage) or ``last`` (only the final branch, trained whole)."""

BRANCH_REWARDS: tuple[BranchReward, ...] = ("shared", "last")

_SLIME_STATUS = {
    "running": "PENDING",
    "completed": "COMPLETED",
    "truncated": "TRUNCATED",
    "aborted": "ABORTED",
    "failed": "FAILED",
}


class TrainingBranch(msgspec.Struct, frozen=True, kw_only=True):
    """One branch of a rollout as one training sample.

    Attributes:
        trajectory: The branch (its own tokens: the shared prefix is a copy of its parent's).
        shared_prefix: How many leading tokens it shares with its parent branch (0 for the first branch).
        trained_from: The first token the sample may train: ``shared_prefix`` under ``branch_reward="shared"``
            (the parent trains the rest), 0 for the only sample under ``"last"``.
        final: Whether this is the rollout's last branch (the one the agent finished on).
    """

    trajectory: Trajectory
    shared_prefix: int
    trained_from: int
    final: bool

    @property
    def prompt_length(self) -> int:
        """The sample's prompt: every token before the first one this branch generated (from ``trained_from``)."""
        return self.trajectory.first_output_from(self.trained_from)

    def lineage(self) -> dict[str, Any]:
        """``rollout_id``, ``branch``, ``parent_branch``, ``shared_prefix`` and ``final``, as export columns."""
        traj = self.trajectory
        return {
            "rollout_id": traj.rollout_id,
            "branch": traj.branch,
            "parent_branch": traj.parent_branch,
            "shared_prefix": self.shared_prefix,
            "final": self.final,
        }


def training_branches(traj: Trajectory, *, branch_reward: BranchReward = "shared") -> list[TrainingBranch]:
    """The training samples of one rollout (``traj``: its final branch, as ``TitoModel.reset()`` returns it).

    ``shared``: one sample per branch that generated at least one token of its own, oldest first, and always
    the final branch. ``last``: the final branch alone, trained from its first token (the behaviour of exporting
    ``traj`` itself). Rewards and advantages are the episode's: give each sample its rollout's values.

    Raises:
        ValueError: An unknown ``branch_reward``.
    """
    if branch_reward not in BRANCH_REWARDS:
        raise ValueError(f"branch_reward must be one of {list(BRANCH_REWARDS)}, not {branch_reward!r}")
    if branch_reward == "last":
        return [TrainingBranch(trajectory=traj, shared_prefix=traj.fork_at, trained_from=0, final=True)]
    samples = []
    for branch in traj.all_branches:
        final = branch is traj
        if final or branch.first_output_from(branch.fork_at) < len(branch):
            samples.append(
                TrainingBranch(
                    trajectory=branch, shared_prefix=branch.fork_at, trained_from=branch.fork_at, final=final
                )
            )
    return samples


def _response(item: Trajectory | TrainingBranch) -> tuple[Trajectory, int, list[int], list[int], list[float]]:
    """The trajectory, where its response starts, all its ids, and the response's loss mask and logprobs."""
    traj = item.trajectory if isinstance(item, TrainingBranch) else item
    start = item.prompt_length
    ids = traj.token_ids
    mask = traj.loss_mask[start:]
    logprobs = [0.0 if (lp is None or not m) else lp for lp, m in zip(traj.logprobs[start:], mask, strict=True)]
    return traj, start, ids, mask, logprobs


def _token_versions(traj: Trajectory, start: int, spans: list[VersionSpan]) -> list[str | None]:
    """Per token from ``start`` on, the weight version that generated it (None on loss-0 tokens)."""
    out: list[str | None] = [None] * (len(traj) - start)
    for span in spans:
        out[span.start - start : span.end - start] = [span.version] * (span.end - span.start)
    return out


def _verl_global_steps(spans: list[VersionSpan]) -> dict[str, int]:
    """The oldest and newest version as verl's ``min_global_steps`` / ``max_global_steps``, when both are integers."""
    span = version_range(s.version for s in spans)
    low, high = (int_version(span[0]), int_version(span[1])) if span is not None else (None, None)
    return {} if low is None or high is None else {"min_global_steps": low, "max_global_steps": high}


def to_slime(
    item: Trajectory | TrainingBranch, *, tokenizer: Any = None, processor: Any = None, images: ImageForm = "pil"
) -> dict[str, Any]:
    """Fields of slime's ``Sample``: assign them onto the sample (``status`` names a ``Sample.Status`` member).

    ``item`` is a trajectory or one :class:`TrainingBranch` of it. ``rollout_routed_experts`` is a
    ``(len(tokens) - 1, layers, top_k)`` int32 numpy array when routing was recorded (numpy required then).
    ``response`` (text) is filled when a tokenizer is given. ``weight_versions`` is set when the versions of
    the tokens the sample trains are known: one per model call, as slime's own rollout records them (a call
    generated across a weight update adds one per version, oldest first).

    With images or videos: ``multimodal_inputs`` is ``{"images": [...], "videos": [...]}`` (slime's raw form, what
    its processor takes; a video is ``(frames, {"fps", "total_num_frames"})``), and, when ``processor`` (the model's
    directory or processor) is given, ``multimodal_train_inputs`` is ``{"pixel_values", "image_grid_thw"}`` and
    ``{"pixel_values_videos", "video_grid_thw"}`` as torch tensors (what slime's training forward concatenates).
    """
    traj, start, ids, mask, logprobs = _response(item)
    fields: dict[str, Any] = {
        "tokens": ids,
        "response_length": len(ids) - start,
        "loss_mask": mask,
        "rollout_log_probs": logprobs,
        "status": _SLIME_STATUS[traj.status],
        "rollout_id": traj.rollout_id,
    }
    spans = traj.weight_versions(since=start)
    if spans is not None:  # slime's own field: one version per model call (one per span when a call has several)
        fields["weight_versions"] = [span.version for span in spans]
    if tokenizer is not None:
        fields["response"] = tokenizer.decode(ids[start:], skip_special_tokens=False)
    routed = traj.routed_experts()
    if routed is not None:
        import numpy as np

        data, (layers, top_k) = routed
        fields["rollout_routed_experts"] = np.frombuffer(data, dtype="<i4").reshape(-1, layers, top_k)
    if traj.media:  # slime's own fields: the raw images and videos, and the processed ones when a processor is given
        fields["multimodal_inputs"] = media_data(traj, images)
        if processor is not None:
            fields["multimodal_train_inputs"] = pixel_inputs(traj, processor)
    return fields


# verl's ``AgentLoopMetrics``: seconds spent generating / in tools, engine preemptions (-1: unknown).
VERL_METRICS: dict[str, float] = {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1}


def turn_token_scores(item: Trajectory | TrainingBranch, turn_rewards: Sequence[float | None]) -> list[float]:
    """Token-level scores over ``item``'s response: each turn's reward at that turn's last output token, 0 elsewhere.

    ``turn_rewards`` is a record's (one per model call, by turn index; None for none). The list is aligned with
    the response (``response_ids`` of :func:`to_verl`): what verl's agent loop makes of one ``reward_score`` at the
    last response token (``rm_scores``), made per turn; verl's token-level advantage estimators (REINFORCE++'s
    returns) credit each turn's tokens with its reward and the later turns'.
    """
    traj, start, ids, _, _ = _response(item)
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
    """
    unknown = sorted(set(metrics or {}) - set(VERL_METRICS))
    if unknown:
        raise ValueError(f"unknown verl metrics {unknown}; expected some of {sorted(VERL_METRICS)}")
    traj, start, ids, mask, logprobs = _response(item)
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


@overload
def to_trl(traj: Trajectory | TrainingBranch, *, images: ImageForm = ...) -> dict[str, Any]: ...
@overload
def to_trl(traj: Sequence[Trajectory | TrainingBranch], *, images: ImageForm = ...) -> dict[str, list[Any]]: ...
def to_trl(
    traj: Trajectory | TrainingBranch | Sequence[Trajectory | TrainingBranch], *, images: ImageForm = "pil"
) -> dict[str, Any]:
    """The shape TRL's ``GRPOTrainer(rollout_func=...)`` returns.

    One trajectory (or :class:`TrainingBranch`) gives one rollout's fields; a sequence (the batch, one per
    prompt TRL passed, in order) gives the dict of per-rollout lists that ``rollout_func`` returns.
    ``weight_versions`` (per completion token, None on loss-0 tokens) is added when a rollout has versions
    (None for one without). ``images`` (TRL's vision-language column: the rollout's images in token order) is
    added when a rollout has images (``[]`` for one without, in a batch).
    """
    if not isinstance(traj, (Trajectory, TrainingBranch)):
        rows = [to_trl(t, images=images) for t in traj]
        keys = ["prompt_ids", "completion_ids", "logprobs", "env_mask"]
        if any("weight_versions" in row for row in rows):
            keys.append("weight_versions")
        columns = {key: [row.get(key) for row in rows] for key in keys}
        if any("images" in row for row in rows):
            columns["images"] = [row.get("images", []) for row in rows]
        return columns
    source, start, ids, mask, logprobs = _response(traj)
    row = {"prompt_ids": ids[:start], "completion_ids": ids[start:], "logprobs": logprobs, "env_mask": mask}
    spans = source.weight_versions(since=start)
    if spans is not None:  # an extra column: TRL passes it to the reward functions
        row["weight_versions"] = _token_versions(source, start, spans)
    if source.media:  # TRL's vision-language column (its dataset form; see docs/multimodal.md for what it uses)
        only_images(source, "TRL")
        row["images"] = image_values(source, images)
    return row
