"""Teacher-forced logprobs of recorded token ids: what a trainer recomputes from the same weights.

One forward pass of the whole sequence with a plain Hugging Face causal LM (no cache, no sampling), then
``log_softmax`` in float32 at each position, read at the next token. This is the trainer's side of the
sampler/trainer mismatch that :func:`tito_core.analysis.drift.logprob_gap` measures.

A vision-language model (Qwen2.5-VL and its kin) scores a sequence with images or videos too: give ``media`` (the
trajectory's :meth:`~tito_core.trajectory.Trajectory.prompt_media`) and its :func:`vision_of`. Their pixel inputs
and 3-D positions are made as the embedded backend makes them when it samples (the model directory's processors,
each span checked against its placeholders).

A mixture-of-experts model scores a sequence under the routing it was sampled with (routing replay, R3): give
``routed_experts``, the recorded experts of every token but the last (:meth:`~tito_core.trajectory.Trajectory.
routed_experts`, or verl's / slime's export field), and each token is routed to them, the gate weights recomputed
from the model's router logits (:func:`tito_transformers.routing.replay_routing`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .routing import expert_ids, replay_routing

if TYPE_CHECKING:
    from tito_core.media import PromptMedia

__all__ = ["kept_token_logprobs", "load_model", "token_logprobs", "token_logprobs_at", "vision_of"]


def load_model(model_path: str, *, dtype: str = "float32", device: str = "cpu", num_threads: int | None = 1) -> Any:
    """Load ``model_path`` for scoring (eval mode).

    ``AutoModelForCausalLM`` loads it, or ``AutoModelForImageTextToText`` for a vision-language model (a
    ``vision_config``).

    Args:
        model_path: A local model directory (nothing is fetched).
        dtype: ``"float32"`` (default, as a CPU trainer would), ``"bfloat16"`` or ``"float16"``.
        device: A torch device.
        num_threads: ``torch.set_num_threads`` (None leaves torch's default).
    """
    import torch

    from ._load import _auto_class

    if num_threads is not None:
        torch.set_num_threads(num_threads)
    model: Any = _auto_class(model_path).from_pretrained(model_path, dtype=getattr(torch, dtype))
    return model.to(device).eval()


def vision_of(model: Any, model_path: str) -> Any | None:
    """The vision side of a model loaded from ``model_path`` (its processors), or None for a text-only model.

    What :func:`token_logprobs` sees a sequence's ``media`` through.
    """
    from ._vision import _vision_of

    return _vision_of("scoring", model_path, model)


def token_logprobs(
    model: Any,
    token_ids: Sequence[int],
    *,
    temperature: float = 1.0,
    media: Sequence[PromptMedia] = (),
    vision: Any = None,
    routed_experts: Any = None,
) -> list[float | None]:
    """``log p(token_ids[i] | token_ids[:i])`` for every position, None at position 0 (no context).

    Computed in float32 from the model's logits, whatever the model's dtype. ``temperature`` divides the
    logits first (the distribution a sampler at that temperature draws from, without top-k / top-p). ``media``:
    the images and videos among ``token_ids``, seen through ``vision`` (:func:`vision_of`). ``routed_experts``: the
    recorded routing to replay, ``(len(token_ids) - 1, layers, top_k)`` expert ids (numpy, torch or lists).
    """
    return token_logprobs_at(
        model, token_ids, (temperature,), media=media, vision=vision, routed_experts=routed_experts
    )[0]


def token_logprobs_at(
    model: Any,
    token_ids: Sequence[int],
    temperatures: Sequence[float],
    *,
    media: Sequence[PromptMedia] = (),
    vision: Any = None,
    routed_experts: Any = None,
) -> list[list[float | None]]:
    """:func:`token_logprobs` at several temperatures from one forward pass (one list per temperature).

    Raises:
        ValueError: ``media`` without a ``vision`` to see it; ``routed_experts`` that do not fit the sequence or the
            model (:func:`tito_transformers.routing.replay_routing`).
        tito_core.errors.BackendRequestError: An item does not fit its span (its grid, its placeholder count).
    """
    import torch

    if any(t <= 0 for t in temperatures):
        raise ValueError(f"temperatures must be positive, got {list(temperatures)}")
    if not token_ids:
        return [[] for _ in temperatures]
    out: list[list[float | None]] = []
    with torch.inference_mode():
        logits = _logits(model, token_ids, media, vision, routed_experts)
        targets = logits.new_tensor(list(token_ids[1:]), dtype=torch.long)
        for temperature in temperatures:
            scaled = logits if temperature == 1.0 else logits / temperature
            logprobs = torch.log_softmax(scaled, dim=-1).gather(1, targets[:, None])[:, 0]
            values: list[float | None] = [None]
            values.extend(float(x) for x in logprobs.tolist())
            out.append(values)
    return out


def kept_token_logprobs(
    model: Any,
    token_ids: Sequence[int],
    kept: Mapping[int, tuple[Sequence[int], float]],
    *,
    media: Sequence[PromptMedia] = (),
    vision: Any = None,
    routed_experts: Any = None,
) -> tuple[list[float | None], list[float | None]]:
    """Logprobs of the positions of ``kept`` (position -> its kept set and temperature) from one forward pass.

    Returns the logprobs over each kept set (:func:`tito_core.kept_logprobs.kept_logprobs`: what the engine sampled
    from) and over the whole vocabulary at the same temperature (the common mistake, off by ``log S``); None at every
    other position. ``routed_experts``: the routing to replay, as for :func:`token_logprobs`.
    """
    import torch

    from tito_core.kept_logprobs import kept_logprobs

    n = len(token_ids)
    masked: list[float | None] = [None] * n
    full: list[float | None] = [None] * n
    positions = sorted(p for p in kept if 0 < p < n)
    if not positions:
        return masked, full
    with torch.inference_mode():
        logits = _logits(model, token_ids, media, vision, routed_experts)
        for temperature in sorted({kept[p][1] for p in positions}):
            at = [p for p in positions if kept[p][1] == temperature]
            rows = logits[[p - 1 for p in at]]
            targets = [token_ids[p] for p in at]
            ids: list[int] = []
            offsets = [0]
            for p in at:
                ids.extend(kept[p][0])
                offsets.append(len(ids))
            with_mask = kept_logprobs(rows, targets, (ids, offsets), temperature=temperature)
            whole = torch.log_softmax(rows / temperature, dim=-1).gather(1, rows.new_tensor(targets).long()[:, None])
            for p, a, b in zip(at, with_mask.tolist(), whole[:, 0].tolist(), strict=True):
                masked[p], full[p] = float(a), float(b)
    return masked, full


def _logits(
    model: Any, token_ids: Sequence[int], media: Sequence[PromptMedia], vision: Any, routed_experts: Any = None
) -> Any:
    """The float32 logits predicting ``token_ids[1:]`` (one teacher-forced forward pass; inside inference mode)."""
    import torch

    if routed_experts is not None and len(token_ids) > 1:  # one token: no logits are read, nothing to route
        with replay_routing(model, _every_token(routed_experts, len(token_ids))):
            return _logits(model, token_ids, media, vision)

    if media and vision is None:
        raise ValueError("a sequence with images or videos needs the model's `vision` (vision_of): a text-only model")
    device = next(model.parameters()).device
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=device)
    inputs: dict[str, Any] = {}
    if media:
        from tito_core.backend import GenerateRequest, SamplingParams

        from ._vision import _rope_positions

        request = GenerateRequest(rid="score", input_ids=list(token_ids), prefix_len=0, sampling=SamplingParams(),
                                  media=tuple(media))  # fmt: skip
        pixels = vision.pixels(request)
        positions, _ = _rope_positions(model, ids, pixels, vision)
        inputs = {**pixels.forward_inputs(device, model.dtype), "position_ids": positions}
    return model(input_ids=ids, **inputs).logits[0, :-1].float()


def _every_token(routed_experts: Any, length: int) -> Any:
    """The recorded rows of a sequence of ``length`` tokens (``length - 1``), plus one for its last token.

    The last token was never fed when it was sampled, so it has no routing; its row (a copy of the one before) only
    routes the logits after the sequence, which nothing reads.
    """
    import torch

    rows = expert_ids(routed_experts)
    if rows.dim() != 3 or rows.shape[0] != length - 1:
        raise ValueError(
            f"routed_experts must hold one (layers, top_k) row per token but the last: {length - 1} rows for "
            f"{length} tokens, got shape {tuple(rows.shape)}"
        )
    return torch.cat([rows, rows[-1:]])
