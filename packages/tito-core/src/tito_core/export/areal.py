"""AReaL: a trajectory as one row of the batch dict AReaL's workflows emit (``input_ids``, ``loss_mask``, ...).

AReaL (areal 1.0.x) trains on right-padded ``[B, S]`` tensors: ``input_ids``, ``attention_mask`` (True on real
tokens), ``loss_mask`` (1 on output tokens, aligned with the tokens: its actor shifts it itself), ``logprobs``
(the engine's, at each output token's own position, 0.0 elsewhere), ``versions`` (the policy version of each
output token, -1 elsewhere) and ``rewards`` (one per row). A row here is one sample's unpadded lists; padding and
``attention_mask`` are the collate step's. Its tree training packs such rows into prefix trees
(:mod:`~tito_core.export.tree` does the same from tito's rows).
"""

from __future__ import annotations

from typing import Any

from ..trajectory import Trajectory
from ..versions import int_version
from .branches import TrainingBranch, response

__all__ = ["to_areal"]


def to_areal(item: Trajectory | TrainingBranch) -> dict[str, Any]:
    """One row of AReaL's batch dict, unpadded: ``input_ids``, ``loss_mask``, ``logprobs`` and ``versions``.

    The loss mask is 1 on the tokens the sample trains (:mod:`~tito_core.export.branches`: from its first own output
    token on), so each generated token is trained in one row. ``versions`` is the integer weight version of each
    trained token, -1 elsewhere and where the version is unknown or not an integer (AReaL's versions are integers).
    """
    traj, start, ids, mask, logprobs = response(item)
    versions = [-1] * len(ids)
    for turn in traj.turns:
        if turn.output_start < start or turn.weight_versions is None:
            continue
        for span in turn.weight_versions:  # spans relative to the call's first output token
            version = int_version(span.version)
            if version is not None:
                first = turn.output_start + span.start
                versions[first : first + span.end - span.start] = [version] * (span.end - span.start)
    return {
        "input_ids": list(ids),
        "loss_mask": [0] * start + list(mask),
        "logprobs": [0.0] * start + list(logprobs),
        "versions": [v if i >= start and mask[i - start] else -1 for i, v in enumerate(versions)],
    }
