"""slime: run a Strands agent for a slime ``Sample`` through tito and fill the sample (slime's generate hook).

slime calls ``--custom-generate-function-path mod.generate`` as ``await generate(args, sample,
sampling_params)``. :func:`run_agent` does the backend-independent part: a fresh :class:`~tito_core.TitoModel`
per sample on the backend it is given, the agent run, and the trajectory written onto the sample with
:func:`tito_core.export.to_slime`. The backend for slime's router is the SGLang adapter's
(:func:`tito_sglang.slime.backend_from_slime_args`): this module lives with the trainers, above the Strands
front it drives, so the adapter imports no front.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..backend import Backend, SamplingParams
from ..export import to_slime
from ..media.processor import DEFAULT_MAX_IMAGES
from ..model_setup import vision_processor
from ..strands_front.model import TitoModel

__all__ = ["run_agent", "sampling_from_slime"]

_NEUTRAL = {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "ignore_eos"}
# Set by the adapter on every request anyway, or meaningless for token-in/token-out.
_DROPPED = {"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"}


def sampling_from_slime(sampling_params: Mapping[str, Any]) -> SamplingParams:
    """Convert slime's SGLang-style ``sampling_params`` to :class:`SamplingParams` (unknown keys pass through)."""
    neutral: dict[str, Any] = {k: v for k, v in sampling_params.items() if k in _NEUTRAL and v is not None}
    for key in ("stop", "stop_token_ids"):
        if key in neutral:
            value = neutral[key]
            neutral[key] = (value,) if isinstance(value, str | int) else tuple(value)
    extra = {k: v for k, v in sampling_params.items() if k not in _NEUTRAL | _DROPPED | {"sampling_seed"}}
    seed = sampling_params.get("sampling_seed")
    return SamplingParams(**neutral, seed=seed, extra=extra)


async def run_agent(
    sample: Any,
    sampling_params: Mapping[str, Any],
    *,
    backend: Backend,
    tokenizer: Any,
    run: Callable[[TitoModel], Awaitable[Any]],
    status_enum: Any = None,
    processor: Any = None,
    **model_options: Any,
) -> Any:
    """Run ``run(model)`` (which drives a Strands agent) and write the trajectory onto ``sample``.

    Errors raised by the agent loop do not escape: the trajectory keeps its tokens and its status says
    why it ended (``TRUNCATED``, ``ABORTED``, ``FAILED``), as slime expects of a rollout.

    Args:
        sample: A slime ``Sample`` (or anything with its attributes).
        sampling_params: slime's sampling parameters.
        backend: The shared backend (for slime's router: :func:`tito_sglang.slime.backend_from_slime_args`).
        tokenizer: The policy's tokenizer.
        run: An async function that builds the agent around ``model`` and runs it on the sample.
        status_enum: slime's ``Sample.Status``; when given, ``sample.status`` is set to its member.
        processor: The model's image processor, as :class:`~tito_core.TitoModel` takes it (None: the tokenizer's
            directory when it holds a ``preprocessor_config.json``; False: no vision). The same processor renders
            the images and fills ``multimodal_train_inputs`` (``pixel_values``, ``image_grid_thw``) besides
            ``multimodal_inputs`` (see ``to_slime``): slime computes neither after a custom generate.
        **model_options: More :class:`~tito_core.TitoModel` options (``tool_parser``, ...).
    """
    limit = model_options.get("max_images", DEFAULT_MAX_IMAGES)
    vision = vision_processor(processor, tokenizer, max_images=limit)  # the model's: shared per processor, tokenizer
    model = TitoModel(
        backend,
        tokenizer,
        sampling=sampling_from_slime(sampling_params),
        processor=vision if vision is not None else False,
        **model_options,
    )
    try:
        await run(model)
    except Exception as exc:  # the trajectory records why; slime reads the status
        model.trajectory.metadata["error"] = f"{type(exc).__name__}: {exc}"
    fields = to_slime(model.reset(), tokenizer=tokenizer, processor=vision)
    status = fields.pop("status")
    for name, value in fields.items():
        setattr(sample, name, value)
    sample.status = status_enum[status] if status_enum is not None else status
    return sample
