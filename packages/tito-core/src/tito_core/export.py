"""Trainer formats: a :class:`~tito_core.trajectory.Trajectory` as the fields each RL trainer expects.

Every exporter returns plain Python data (no trainer is imported). The *response* is everything after
the first prompt: the model's outputs (loss 1) and the tool results / boundaries between them (loss 0).
Logprobs of non-output tokens are ``0.0``, as the trainers expect.

Weight versions (:mod:`tito_core.versions`) go in the trainer's own field where it has one, else in a documented
extra field (docs/exports.md); a trajectory whose backend reported no versions exports none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from .trajectory import Trajectory
from .versions import int_version

_SLIME_STATUS = {
    "running": "PENDING",
    "completed": "COMPLETED",
    "truncated": "TRUNCATED",
    "aborted": "ABORTED",
    "failed": "FAILED",
}


def _response(traj: Trajectory) -> tuple[int, list[int], list[int], list[float]]:
    start = traj.prompt_length
    ids = traj.token_ids
    mask = traj.loss_mask[start:]
    logprobs = [0.0 if (lp is None or not m) else lp for lp, m in zip(traj.logprobs[start:], mask, strict=True)]
    return start, ids, mask, logprobs


def response_weight_versions(traj: Trajectory) -> list[str | None] | None:
    """Per response token, the weight version that generated it (None on loss-0 tokens); None when unknown."""
    versions = traj.token_weight_versions()
    return None if versions is None else versions[traj.prompt_length :]


def verl_global_steps(traj: Trajectory) -> dict[str, int]:
    """The weight versions as verl's ``min_global_steps`` / ``max_global_steps`` (``extra_fields``).

    Empty unless the oldest and newest versions are integers (a trainer's step).
    """
    span = traj.weight_version_range()
    low, high = (int_version(span[0]), int_version(span[1])) if span is not None else (None, None)
    return {} if low is None or high is None else {"min_global_steps": low, "max_global_steps": high}


def to_slime(traj: Trajectory, *, tokenizer: Any = None) -> dict[str, Any]:
    """Fields of slime's ``Sample``: assign them onto the sample (``status`` names a ``Sample.Status`` member).

    ``rollout_routed_experts`` is a ``(len(tokens) - 1, layers, top_k)`` int32 numpy array when routing
    was recorded (numpy required then). ``response`` (text) is filled when a tokenizer is given.
    ``weight_versions`` is set when the versions are known: one per model call, as slime's own rollout
    records them (a call generated across a weight update adds one per version, oldest first).
    """
    start, ids, mask, logprobs = _response(traj)
    fields: dict[str, Any] = {
        "tokens": ids,
        "response_length": len(ids) - start,
        "loss_mask": mask,
        "rollout_log_probs": logprobs,
        "status": _SLIME_STATUS[traj.status],
        "rollout_id": traj.rollout_id,
    }
    spans = traj.weight_versions()
    if spans is not None:  # slime's own field: one version per model call (one per span when a call has several)
        fields["weight_versions"] = [span.version for span in spans]
    if tokenizer is not None:
        fields["response"] = tokenizer.decode(ids[start:], skip_special_tokens=False)
    routed = traj.routed_experts()
    if routed is not None:
        import numpy as np

        data, (layers, top_k) = routed
        fields["rollout_routed_experts"] = np.frombuffer(data, dtype="<i4").reshape(-1, layers, top_k)
    return fields


# verl's ``AgentLoopMetrics``: seconds spent generating / in tools, engine preemptions (-1: unknown).
VERL_METRICS: dict[str, float] = {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1}


def to_verl(traj: Trajectory, *, metrics: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Fields of verl's ``AgentLoopOutput`` (before its padding).

    ``metrics`` are verl's ``AgentLoopMetrics`` (:data:`VERL_METRICS` names them; those not given keep
    their defaults). A trajectory records no timings, so the caller measures them. ``extra_fields`` holds
    verl's ``min_global_steps`` / ``max_global_steps`` when the weight versions are integers
    (:func:`verl_global_steps`).
    """
    unknown = sorted(set(metrics or {}) - set(VERL_METRICS))
    if unknown:
        raise ValueError(f"unknown verl metrics {unknown}; expected some of {sorted(VERL_METRICS)}")
    start, ids, mask, logprobs = _response(traj)
    fields: dict[str, Any] = {
        "prompt_ids": ids[:start],
        "response_ids": ids[start:],
        "response_mask": mask,
        "response_logprobs": logprobs,
        "num_turns": len(traj.turns),
        "metrics": {**VERL_METRICS, **(metrics or {})},
    }
    steps = verl_global_steps(traj)
    if steps:  # verl's own fields for the weight versions a trajectory was generated across
        fields["extra_fields"] = steps
    return fields


@overload
def to_trl(traj: Trajectory) -> dict[str, Any]: ...
@overload
def to_trl(traj: Sequence[Trajectory]) -> dict[str, list[Any]]: ...
def to_trl(traj: Trajectory | Sequence[Trajectory]) -> dict[str, Any]:
    """The shape TRL's ``GRPOTrainer(rollout_func=...)`` returns.

    One trajectory gives one rollout's fields; a sequence (the batch, one per prompt TRL passed, in
    order) gives the dict of per-rollout lists that ``rollout_func`` returns. ``weight_versions`` (per
    completion token, None on loss-0 tokens) is added when a rollout has versions (None for one without).
    """
    if not isinstance(traj, Trajectory):
        rows = [to_trl(t) for t in traj]
        keys = ["prompt_ids", "completion_ids", "logprobs", "env_mask"]
        if any("weight_versions" in row for row in rows):
            keys.append("weight_versions")
        return {key: [row.get(key) for row in rows] for key in keys}
    start, ids, mask, logprobs = _response(traj)
    row = {"prompt_ids": ids[:start], "completion_ids": ids[start:], "logprobs": logprobs, "env_mask": mask}
    versions = response_weight_versions(traj)
    if versions is not None:  # an extra column: TRL passes it to the reward functions
        row["weight_versions"] = versions
    return row
