"""Teacher-forced logprobs of recorded token ids: what a trainer recomputes from the same weights.

One forward pass of the whole sequence with a plain Hugging Face causal LM (no cache, no sampling), then
``log_softmax`` in float32 at each position, read at the next token. This is the trainer's side of the
sampler/trainer mismatch that :func:`tito_core.analysis.drift.logprob_gap` measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["load_model", "token_logprobs", "token_logprobs_at"]


def load_model(model_path: str, *, dtype: str = "float32", device: str = "cpu", num_threads: int | None = 1) -> Any:
    """Load ``model_path`` with ``AutoModelForCausalLM`` for scoring (eval mode).

    Args:
        model_path: A local model directory (nothing is fetched).
        dtype: ``"float32"`` (default, as a CPU trainer would), ``"bfloat16"`` or ``"float16"``.
        device: A torch device.
        num_threads: ``torch.set_num_threads`` (None leaves torch's default).
    """
    import torch
    from transformers import AutoModelForCausalLM

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model: Any = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
    return model.to(device).eval()


def token_logprobs(model: Any, token_ids: Sequence[int], *, temperature: float = 1.0) -> list[float | None]:
    """``log p(token_ids[i] | token_ids[:i])`` for every position, None at position 0 (no context).

    Computed in float32 from the model's logits, whatever the model's dtype. ``temperature`` divides the
    logits first (the distribution a sampler at that temperature draws from, without top-k / top-p).
    """
    return token_logprobs_at(model, token_ids, (temperature,))[0]


def token_logprobs_at(model: Any, token_ids: Sequence[int], temperatures: Sequence[float]) -> list[list[float | None]]:
    """:func:`token_logprobs` at several temperatures from one forward pass (one list per temperature)."""
    import torch

    if any(t <= 0 for t in temperatures):
        raise ValueError(f"temperatures must be positive, got {list(temperatures)}")
    if not token_ids:
        return [[] for _ in temperatures]
    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
    out: list[list[float | None]] = []
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, :-1].float()
        for temperature in temperatures:
            scaled = logits if temperature == 1.0 else logits / temperature
            logprobs = torch.log_softmax(scaled, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
            values: list[float | None] = [None]
            values.extend(float(x) for x in logprobs.tolist())
            out.append(values)
    return out
