"""Model loading for the embedded backend: which model, where and in what dtype, and what it says about itself.

:func:`_placement` checks the model options before anything heavy happens (an already-loaded model is used as
is, see :func:`_shared_model`); :func:`_load` loads the model (or takes the shared one), puts it in eval mode
and reads from its configs what the backend needs: the context window, the vocabulary size, the EOS ids, the
``generation_config`` sampling defaults, and whether its KV cache rows can be stacked into one batch. A
vision-language model (a config with a ``vision_config``) is loaded by ``AutoModelForImageTextToText``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_DTYPES = ("bfloat16", "float16", "float32")


@dataclasses.dataclass(frozen=True)
class _Loaded:
    """A model ready to generate with, and what the backend reads from its configs."""

    model: Any  # in eval mode
    context: int | None  # the context window (None: unknown)
    vocab: int
    eos_token_ids: frozenset[int]
    defaults: dict[str, Any]  # generation_config's temperature, top_p, top_k (temperature 0 without do_sample)
    mergeable: bool  # plain full-attention cache layers, whose rows can be padded and stacked


def _placement(
    model_path: str | os.PathLike[str] | None, model: Any, dtype: str | None, device: str | None, attn: str | None
) -> tuple[str, str, str]:
    """Check the model options; returns ``(model_path, device, dtype name)`` (those of ``model`` when given)."""
    import torch

    if model is not None:
        model_path, device = _shared_model(model, model_path, device, dtype, attn)
    elif model_path is None:
        raise ValueError("give `model_path` (a model directory) or `model` (an already-loaded model)")
    device = device or "cpu"
    if dtype is None:  # CPUs without bfloat16 units run bfloat16 several times slower than float32
        dtype = "float32" if torch.device(device).type == "cpu" else "bfloat16"
    if model is not None:
        dtype = str(model.dtype).removeprefix("torch.")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, not {dtype!r}")
    return str(model_path), device, dtype


def _load(
    model_path: str,
    model: Any,
    device: torch.device,
    dtype: torch.dtype,
    attn: str | None,
    max_context_length: int | None,
) -> _Loaded:
    """Load the model from ``model_path`` unless ``model`` is given, and read its configs."""
    from transformers import GenerationConfig

    if model is None:
        auto = _auto_class(model_path)
        loaded: Any = auto.from_pretrained(model_path, dtype=dtype, attn_implementation=attn or "sdpa")
        model = loaded.to(device)
    model = model.eval()  # a shared model: the same module, put in eval mode (no dropout)
    config = model.config.get_text_config(decoder=True)
    context = max_context_length or getattr(config, "max_position_embeddings", None)
    vocab = int(config.vocab_size)
    try:
        generation = GenerationConfig.from_pretrained(model_path).to_diff_dict()
    except OSError:  # no generation_config.json: the model config's ids only
        generation = {}
    eos = generation.get("eos_token_id", getattr(config, "eos_token_id", None))
    eos_token_ids = frozenset(int(i) for i in ([] if eos is None else eos if isinstance(eos, list) else [eos]))
    defaults = {key: generation[key] for key in ("temperature", "top_p", "top_k") if generation.get(key) is not None}
    if generation.get("do_sample") is False:
        defaults["temperature"] = 0.0
    return _Loaded(model, context, vocab, eos_token_ids, defaults, _plain_dynamic_cache(model))


def _auto_class(model_path: str) -> Any:
    """The auto class that loads ``model_path``: image-text-to-text with a ``vision_config``, else causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(model_path)
    return AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM


def _shared_model(
    model: Any, model_path: str | os.PathLike[str] | None, device: str | None, dtype: str | None, attn: str | None
) -> tuple[str, str]:
    """Check the options given with an already-loaded ``model``; returns its ``(model_path, device)``."""
    import torch

    if dtype is not None or attn is not None:
        raise ValueError("`dtype` and `attn_implementation` apply to a model loaded from `model_path`, not to `model`")
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise ValueError(
            f"`model` must be a loaded causal LM (a torch module with a config), not {type(model).__name__}"
        )
    own = next(model.parameters()).device
    want = torch.device(device) if device is not None else own
    if want.type != own.type or want.index not in (None, own.index):
        raise ValueError(f"`model` is on {own}, not on the `device` given ({device}); move it first")
    if model_path is None:
        model_path = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", None)
        if not model_path:
            raise ValueError("`model` has no `name_or_path`: give `model_path` (its tokenizer's directory)")
    return str(model_path), str(own)


def _plain_dynamic_cache(model: Any) -> bool:
    """True when the model's KV cache is plain full-attention layers, whose rows can be padded and stacked."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:
        return False
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
