"""TRL: a trajectory (or a batch of them) as the columns ``GRPOTrainer(rollout_func=...)`` returns.

The ``rollout_func`` that runs the rollouts is :mod:`tito_core.trainers.trl`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, overload

from ..trajectory import Trajectory
from ..versions import VersionSpan
from .branches import TrainingBranch, response
from .kept_sets import KEPT_SET_KEYS, kept_set_fields
from .media import ImageForm, image_values, only_images

__all__ = ["to_trl"]


def _token_versions(traj: Trajectory, start: int, spans: list[VersionSpan]) -> list[str | None]:
    """Per token from ``start`` on, the weight version that generated it (None on loss-0 tokens)."""
    out: list[str | None] = [None] * (len(traj) - start)
    for span in spans:
        out[span.start - start : span.end - start] = [span.version] * (span.end - span.start)
    return out


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
    added when a rollout has images (``[]`` for one without, in a batch). The completion's kept sets are added when
    a call truncated sampling (:func:`~tito_core.export.kept_sets.kept_set_fields`; None for a rollout without).
    """
    if not isinstance(traj, (Trajectory, TrainingBranch)):
        rows = [to_trl(t, images=images) for t in traj]
        keys = ["prompt_ids", "completion_ids", "logprobs", "env_mask"]
        if any("weight_versions" in row for row in rows):
            keys.append("weight_versions")
        keys += [key for key in KEPT_SET_KEYS if any(key in row for row in rows)]
        columns = {key: [row.get(key) for row in rows] for key in keys}
        if any("images" in row for row in rows):
            columns["images"] = [row.get("images", []) for row in rows]
        return columns
    source, start, ids, mask, logprobs = response(traj)
    row = {"prompt_ids": ids[:start], "completion_ids": ids[start:], "logprobs": logprobs, "env_mask": mask}
    spans = source.weight_versions(since=start)
    if spans is not None:  # an extra column: TRL passes it to the reward functions
        row["weight_versions"] = _token_versions(source, start, spans)
    row.update(kept_set_fields(source, start))
    if source.media:  # TRL's vision-language column (its dataset form; see docs/multimodal.md for what it uses)
        only_images(source, "TRL")
        row["images"] = image_values(source, images)
    return row
