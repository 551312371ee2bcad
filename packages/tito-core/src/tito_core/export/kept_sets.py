"""tito's layout of a sample's sampling masks (kept sets), shared by every export (docs/exports.md).

None of the trainers tito exports to has a field of its own for them yet, so each export carries the same three:

* ``sampling_mask_ids``: the kept ids of every response token, row after row (ints);
* ``sampling_mask_offsets``: ``response_length + 1`` offsets into them, from 0: token ``i``'s kept set is
  ``ids[offsets[i]:offsets[i + 1]]``; an empty row keeps the whole vocabulary (a loss-0 token, or a call that did
  not truncate);
* ``sampling_mask_missing``: True when a call of the response truncated sampling but its engine returned no kept
  sets (its logprobs are then the engine's as reported; ``Turn.sampling_mask_missing`` says why).

:func:`tito_core.kept_logprobs.kept_logprobs` takes ``(ids, offsets)`` as they are.
"""

from __future__ import annotations

from typing import Any

from ..trajectory import Trajectory
from ..trajectory.views import sampling_masks

__all__ = ["KEPT_SET_KEYS", "kept_set_fields"]

KEPT_SET_KEYS = ("sampling_mask_ids", "sampling_mask_offsets", "sampling_mask_missing")
"""The export fields of the layout, in order."""


def kept_set_fields(traj: Trajectory, start: int) -> dict[str, Any]:
    """The kept sets of ``traj``'s tokens from ``start`` on, in tito's layout; empty when no call truncated."""
    masks = sampling_masks(traj.turns, start, len(traj))
    if masks is None:
        return {}
    ids, offsets, missing = masks
    return dict(zip(KEPT_SET_KEYS, (ids, offsets, missing), strict=True))
