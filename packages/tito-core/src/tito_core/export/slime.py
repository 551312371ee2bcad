"""slime: a trajectory as the fields of slime's ``Sample`` (the generate hook is :mod:`tito_core.trainers.slime`)."""

from __future__ import annotations

from typing import Any, get_args

from ..errors import ConfigError
from ..trajectory import Trajectory
from .branches import TrainingBranch, response
from .kept_sets import KeptSetLayout, kept_set_fields, slime_kept_set_fields
from .media import ImageForm, media_data, pixel_inputs

__all__ = ["to_slime"]

_SLIME_STATUS = {
    "running": "PENDING",
    "completed": "COMPLETED",
    "truncated": "TRUNCATED",
    "aborted": "ABORTED",
    "failed": "FAILED",
}


def to_slime(
    item: Trajectory | TrainingBranch,
    *,
    tokenizer: Any = None,
    processor: Any = None,
    images: ImageForm = "pil",
    kept_sets: KeptSetLayout = "trainer",
) -> dict[str, Any]:
    """Fields of slime's ``Sample``: assign them onto the sample (``status`` names a ``Sample.Status`` member).

    ``item`` is a trajectory or one :class:`TrainingBranch` of it. ``rollout_routed_experts`` is a
    ``(len(tokens) - 1, layers, top_k)`` int32 numpy array when routing was recorded (numpy required then).
    ``response`` (text) is filled when a tokenizer is given. ``weight_versions`` is set when the versions of
    the tokens the sample trains are known: one per model call, as slime's own rollout records them (a call
    generated across a weight update adds one per version, oldest first). When a call truncated sampling, the
    response's kept sets: in slime's own ``rollout_top_p_token_ids`` and ``rollout_top_p_token_offsets``
    (:func:`~tito_core.export.kept_sets.slime_kept_set_fields`), or with ``kept_sets="tito"`` in tito's layout
    (:func:`~tito_core.export.kept_sets.kept_set_fields`, with its ``sampling_mask_missing`` flag).

    With images or videos: ``multimodal_inputs`` is ``{"images": [...], "videos": [...]}`` (slime's raw form, what
    its processor takes; a video is ``(frames, {"fps", "total_num_frames"})``), and, when ``processor`` (the model's
    directory or processor) is given, ``multimodal_train_inputs`` is ``{"pixel_values", "image_grid_thw"}`` and
    ``{"pixel_values_videos", "video_grid_thw"}`` as torch tensors (what slime's training forward concatenates).

    Raises:
        KeptSetLayoutError: ``kept_sets="trainer"`` and a token the sample trains has no kept set although another
            call truncated (slime would train it at log-probability 0).
        ConfigError: ``kept_sets`` is neither ``"trainer"`` nor ``"tito"``.
    """
    if kept_sets not in get_args(KeptSetLayout):
        raise ConfigError(f"kept_sets must be one of {list(get_args(KeptSetLayout))}, not {kept_sets!r}")
    traj, start, ids, mask, logprobs = response(item)
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
    if kept_sets == "trainer":
        fields.update(slime_kept_set_fields(traj, start, mask))
    else:
        fields.update(kept_set_fields(traj, start))
    if traj.media:  # slime's own fields: the raw images and videos, and the processed ones when a processor is given
        fields["multimodal_inputs"] = media_data(traj, images)
        if processor is not None:
            fields["multimodal_train_inputs"] = pixel_inputs(traj, processor)
    return fields
