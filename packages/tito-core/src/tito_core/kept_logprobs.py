"""What a trainer calls to score recorded tokens under truncated sampling: log-probabilities over the kept sets.

The engine sampled each token from ``softmax(logits / T)`` restricted to its kept set (top-k, top-p, min-p) and
renormalised; a full-vocabulary log-softmax is off by the kept mass, ``log S`` per token. :func:`kept_logprobs`
takes the trainer's logits of the recorded output tokens, their ids and the recorded kept sets
(:class:`~tito_core.sampling_mask.SamplingMask`, or flat ids and offsets as the exports carry them) and gives the
renormalised logprobs; :func:`log_kept_mass` gives ``log S``. Both take numpy arrays, or torch tensors (differentiable;
torch is never imported here: a tensor comes with it). An empty row keeps the whole vocabulary (a token whose call did
not truncate, as the exports' layout writes it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .sampling_mask import SamplingMask

__all__ = ["kept_logprobs", "log_kept_mass"]

Mask = SamplingMask | tuple[Sequence[int], Sequence[int]]
"""A :class:`SamplingMask`, or ``(kept ids, offsets)``: the CSR of one row per token."""


def _csr(mask: Mask, rows: int) -> tuple[Any, Any]:
    import numpy as np

    ids, offsets = mask.csr() if isinstance(mask, SamplingMask) else mask
    flat = np.asarray(ids, dtype=np.int64)
    offs = np.asarray(offsets, dtype=np.int64)
    if offs.shape != (rows + 1,) or (rows and (offs[0] != 0 or offs[-1] != len(flat) or (np.diff(offs) < 0).any())):
        raise ValueError(f"the kept sets do not fit {rows} tokens: offsets {offs.shape[0]} long, from 0 to {len(flat)}")
    return flat, offs


def _keep(logits: Any, mask: Mask) -> Any:
    """A boolean ``(tokens, vocab)`` of the kept ids (all True on an empty row), in ``logits``' library."""
    import numpy as np

    rows, vocab = logits.shape
    flat, offs = _csr(mask, rows)
    lengths = np.diff(offs)
    if flat.size and (flat.min() < 0 or flat.max() >= vocab):
        raise ValueError(f"a kept id is outside the logits' vocabulary of {vocab}")
    keep = np.zeros((rows, vocab), dtype=bool)
    keep[np.repeat(np.arange(rows), lengths), flat] = True
    keep[lengths == 0] = True
    if _is_torch(logits):
        import torch

        return torch.from_numpy(keep).to(logits.device)
    return keep


def _is_torch(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "torch"


def _temperature(mask: Mask, temperature: float | None) -> float:
    if temperature is not None:
        return temperature
    return mask.temperature if isinstance(mask, SamplingMask) else 1.0


def kept_logprobs(logits: Any, token_ids: Any, mask: Mask, *, temperature: float | None = None) -> Any:
    """The logprob of each recorded token under the distribution it was sampled from.

    Args:
        logits: ``(tokens, vocab)``: the trainer's logits predicting each output token (the positions before them),
            a numpy array or a torch tensor (any float dtype; computed in float32 at least).
        token_ids: ``(tokens,)``: the recorded ids.
        mask: Their kept sets, one row per token (an empty row: the whole vocabulary).
        temperature: The sampling temperature (the engines truncate ``softmax(logits / T)``); None takes the
            mask's own (:attr:`SamplingMask.temperature`), or 1.0 for ``(ids, offsets)``.

    Returns:
        ``(tokens,)`` log-probabilities, ``log_softmax(logits / T)`` over each kept set: the recorded logprobs when
        the trainer's weights are the engine's. A torch tensor keeps its graph.

    Raises:
        ValueError: The kept sets do not fit the logits (row count, offsets, an id outside the vocabulary).
    """
    keep = _keep(logits, mask)
    temperature = _temperature(mask, temperature)
    if _is_torch(logits):
        import torch

        scaled = logits.float() / temperature
        masked = scaled.masked_fill(~keep, -torch.inf)
        ids = torch.as_tensor(token_ids, device=logits.device).long().view(-1, 1)
        return (masked.gather(1, ids) - torch.logsumexp(masked, dim=-1, keepdim=True)).squeeze(1)
    import numpy as np

    values: Any = np.asarray(logits, dtype=np.float64 if logits.dtype == np.float64 else np.float32)
    values = values / temperature
    masked = np.where(keep, values, -np.inf)
    top = masked.max(axis=-1, keepdims=True)
    norm = top[:, 0] + np.log(np.exp(masked - top).sum(axis=-1))
    picked = masked[np.arange(len(masked)), np.asarray(token_ids, dtype=np.int64)]
    return picked - norm


def log_kept_mass(logits: Any, mask: Mask, *, temperature: float | None = None) -> Any:
    """``log S`` of each token: the log of the probability mass its kept set holds under ``softmax(logits / T)``.

    A full-vocabulary logprob is ``kept_logprobs(...) + log_kept_mass(...)``; 0 on an empty row.
    """
    keep = _keep(logits, mask)
    temperature = _temperature(mask, temperature)
    if _is_torch(logits):
        import torch

        scaled = logits.float() / temperature
        kept = torch.logsumexp(scaled.masked_fill(~keep, -torch.inf), dim=-1)
        return kept - torch.logsumexp(scaled, dim=-1)
    import numpy as np

    values: Any = np.asarray(logits, dtype=np.float64 if logits.dtype == np.float64 else np.float32)
    values = values / temperature
    top = values.max(axis=-1, keepdims=True)
    weights = np.exp(values - top)
    return np.log((weights * keep).sum(axis=-1)) - np.log(weights.sum(axis=-1))
