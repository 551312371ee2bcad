"""A sample's sampling masks (kept sets) in the export layouts: tito's, and slime's own fields (docs/exports.md).

tito's layout, what every export carries for a trainer without a field of its own (verl, TRL):

* ``sampling_mask_ids``: the kept ids of every response token, row after row (ints);
* ``sampling_mask_offsets``: ``response_length + 1`` offsets into them, from 0: token ``i``'s kept set is
  ``ids[offsets[i]:offsets[i + 1]]``; an empty row keeps the whole vocabulary (a loss-0 token, or a call that did
  not truncate);
* ``sampling_mask_missing``: True when a call of the response truncated sampling but its engine returned no kept
  sets (its logprobs are then the engine's as reported; ``Turn.sampling_mask_missing`` says why).

slime's layout (``Sample.rollout_top_p_token_ids`` and ``rollout_top_p_token_offsets``, THUDM/slime since 8f5e2151)
is the same CSR over the response, but slime reads an empty row as the sampled token alone (its loss masks every
other id and puts the sampled one back: log-probability 0), so it is written only when every token the sample
trains has a kept set. :func:`tito_core.kept_logprobs.kept_logprobs` takes either ``(ids, offsets)`` pair as it is.
"""

from __future__ import annotations

from typing import Any, Literal

from ..errors import KeptSetLayoutError
from ..trajectory import Trajectory
from ..trajectory.views import sampling_masks

__all__ = ["KEPT_SET_KEYS", "SLIME_KEPT_SET_KEYS", "KeptSetLayout", "kept_set_fields", "slime_kept_set_fields"]

KEPT_SET_KEYS = ("sampling_mask_ids", "sampling_mask_offsets", "sampling_mask_missing")
"""The export fields of tito's layout, in order."""

SLIME_KEPT_SET_KEYS = ("rollout_top_p_token_ids", "rollout_top_p_token_offsets")
"""slime's ``Sample`` fields for the kept sets: flat ids and ``response_length + 1`` offsets."""

KeptSetLayout = Literal["trainer", "tito"]
"""Where an export puts the kept sets: the trainer's own fields where it has them (slime), else tito's layout
(``trainer``, the default); or tito's layout whatever the trainer (``tito``)."""


def kept_set_fields(traj: Trajectory, start: int) -> dict[str, Any]:
    """The kept sets of ``traj``'s tokens from ``start`` on, in tito's layout; empty when no call truncated."""
    masks = sampling_masks(traj.turns, start, len(traj))
    if masks is None:
        return {}
    ids, offsets, missing = masks
    return dict(zip(KEPT_SET_KEYS, (ids, offsets, missing), strict=True))


def slime_kept_set_fields(traj: Trajectory, start: int, loss_mask: list[int]) -> dict[str, Any]:
    """The kept sets of ``traj``'s tokens from ``start`` on as slime's fields; empty when no call truncated.

    Rows of loss-0 tokens (the prompt's, tool results) may be empty, as slime's own rollout leaves them.

    Raises:
        KeptSetLayoutError: A token the sample trains (``loss_mask`` 1) has no kept set: its call did not truncate,
            or truncated and its engine returned none. slime would train it at log-probability 0.
    """
    masks = sampling_masks(traj.turns, start, len(traj))
    if masks is None:
        return {}
    ids, offsets, _ = masks
    for i, trained in enumerate(loss_mask):
        if trained and offsets[i] == offsets[i + 1]:
            raise KeptSetLayoutError(
                f"slime cannot take the kept sets of rollout {traj.rollout_id!r}: response token {i} is trained but "
                f"{_why(traj, start + i)}, and slime reads an empty row as the sampled token alone (log-probability "
                '0). Export it in tito\'s layout instead (kept_sets="tito", tito export --kept-sets tito: '
                "sampling_mask_ids, sampling_mask_offsets, sampling_mask_missing)"
            )
    return dict(zip(SLIME_KEPT_SET_KEYS, (ids, offsets), strict=True))


def _why(traj: Trajectory, position: int) -> str:
    """Why the output token at ``position`` has no kept set, naming its turn."""
    for turn in traj.turns:
        if turn.output_start <= position < turn.output_start + turn.output_len:
            if turn.sampling_mask_missing is not None:
                return f"turn {turn.index} truncated sampling and recorded no kept set ({turn.sampling_mask_missing})"
            return f"turn {turn.index} did not truncate sampling (its tokens were drawn from the whole vocabulary)"
    return "no turn generated it"
