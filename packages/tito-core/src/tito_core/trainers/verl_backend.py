"""What verl's agent loop needs from tito: a backend over verl's server manager, a trajectory as its output.

Both are re-exported by :mod:`tito_core.trainers.verl`, their documented home; they live here so that the
agent loop (:mod:`tito_core.trainers.verl_agent_loop`) and the registration in :mod:`tito_core.trainers.verl`
do not import each other. verl is imported only by :func:`agent_loop_output`.

Images go as verl's own agent loops send them (verl 0.9.1's ``SingleTurnAgentLoop`` / ``ToolAgentLoop``):
``prompt_ids`` with every image's placeholder run EXPANDED (the ids tito records) and ``image_data``, the
images as PIL images in token order. verl's servers take it from there: its vLLM server collapses each run
to one placeholder (``qwen2_5_vl_dedup_image_tokens``) and vLLM expands it again with the same model's
processor; its SGLang server passes the expanded ids and the images on. verl's ``TokenOutput`` does not say
how many tokens the engine consumed, so tito checks before sending that verl's collapse gives back exactly
one placeholder per image (each image's run stands alone), and otherwise refuses with an ``ImageError``.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping
from typing import Any

from ..backend import Backend, FinishReason, GenerateRequest, GenerateResult
from ..errors import BackendResponseError
from ..export import to_verl
from ..media import ImageError
from ..trajectory import Trajectory
from ..versions import VersionSpan

__all__ = ["VerlServerBackend", "agent_loop_output"]


def agent_loop_output(
    traj: Trajectory,
    *,
    reward_score: float | None = None,
    metrics: Mapping[str, float] | None = None,
    response_length: int | None = None,
) -> Any:
    """The ``AgentLoopOutput`` of ``traj``, built and validated by verl's pydantic model.

    ``response_length`` cuts the response to verl's ``rollout.response_length``, as verl's own loops do
    (its postprocessing pads to that length and cannot take more).
    """
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

    fields = to_verl(traj, metrics=metrics)
    if response_length is not None:
        for key in ("response_ids", "response_mask", "response_logprobs"):
            fields[key] = fields[key][:response_length]
    return AgentLoopOutput(**fields, reward_score=reward_score)


class VerlServerBackend(Backend):
    """A tito backend generating through verl's server manager (``LLMServerClient`` / ``AsyncLLMServerManager``).

    Args:
        server_manager: verl's server manager: ``await generate(request_id, *, prompt_ids, sampling_params,
            image_data=None)`` returning a ``TokenOutput`` (``token_ids``, ``log_probs``, ``stop_reason``).
            The backend takes images (``input_kinds``) when its ``generate`` names ``image_data``.
        sampling_params: The sampling parameters verl passes to the agent loop's ``run``; tito's own
            (``max_new_tokens`` as ``max_tokens``, stops) are laid over them per call.
        context_length: The engine's context window, when known.
    """

    name = "verl"

    def __init__(
        self,
        server_manager: Any,
        sampling_params: Mapping[str, Any] | None = None,
        *,
        context_length: int | None = None,
    ) -> None:
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params or {})
        self.context_length = context_length
        self.generate_seconds = 0.0
        """Wall time spent in ``server_manager.generate`` so far (verl's ``generate_sequences`` metric)."""
        self._takes_images = _takes_images(server_manager)

    @property  # a property here: it depends on the server manager given
    def input_kinds(self) -> frozenset[str]:
        """``{"image"}`` when verl's server manager takes ``image_data`` (verl 0.9.1's ``LLMServerClient`` does)."""
        return frozenset({"image"}) if self._takes_images else frozenset()

    async def max_context_length(self) -> int | None:
        """The configured context window."""
        return self.context_length

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """One ``server_manager.generate`` call on the whole prompt."""
        params = {**self.sampling_params, **request.sampling.extra}
        params.update(request.sampling.engine_fields(max_new_tokens="max_tokens"))
        params["logprobs"] = request.return_logprobs
        images: dict[str, Any] = {}
        if request.media:
            images["image_data"] = self._image_data(request)
        started = time.perf_counter()
        try:
            out = await self.server_manager.generate(
                request_id=request.rid, prompt_ids=list(request.input_ids), sampling_params=params, **images
            )
        finally:
            self.generate_seconds += time.perf_counter() - started
        ids = [int(i) for i in out.token_ids]
        logprobs = getattr(out, "log_probs", None)
        if request.return_logprobs and logprobs is None:
            raise BackendResponseError(
                "verl's server returned no log_probs although logprobs were asked", field="log_probs", backend=self.name
            )
        if logprobs is not None and len(logprobs) != len(ids):
            raise BackendResponseError(
                f"{len(logprobs)} log_probs for {len(ids)} token_ids", field="log_probs", backend=self.name
            )
        limit = params.get("max_tokens")
        finish: FinishReason = "stop"
        if getattr(out, "stop_reason", None) == "aborted":
            finish = "abort"
        elif isinstance(limit, int) and len(ids) >= limit:
            finish = "length"
        return GenerateResult(
            output_ids=ids,
            output_logprobs=[float(x) for x in logprobs] if request.return_logprobs and logprobs is not None else None,
            finish_reason=finish,
            weight_versions=_versions(getattr(out, "extra_fields", None), len(ids)),
        )

    def _image_data(self, request: GenerateRequest) -> list[Any]:
        """The request's images as verl's ``image_data`` (PIL images in token order), once the ids are checked.

        Raises:
            ImageError: the server manager takes no images, or a placeholder run of the ids is not exactly one
                image's span (verl's collapse to one placeholder per run would then pair images wrongly).
        """
        if not self._takes_images:
            raise ImageError(
                f"the prompt holds {len(request.media)} image(s) but verl's server manager "
                f"({type(self.server_manager).__name__}) takes no image_data"
            )
        ids = list(request.input_ids)
        total = 0
        for item in request.media:
            span = item.span
            pad = span.placeholder_id
            before = ids[span.start - 1] if span.start > 0 else None
            after = ids[span.end] if span.end < len(ids) else None
            if pad in (before, after) or ids[span.start : span.end].count(pad) != span.length:
                raise ImageError(
                    f"image {item.image!r} at {span.start}..{span.end} is not a run of its own: verl's server "
                    "collapses each placeholder run to one image, so the engine would not see these ids"
                )
            total += span.length
        pads = {item.span.placeholder_id for item in request.media}
        stray = sum(ids.count(p) for p in pads) - total
        if stray:
            raise ImageError(
                f"the prompt holds {stray} image placeholder token(s) outside its images' spans: verl's server "
                "would pair them with images"
            )
        return [item.image.to_pil() for item in request.media]


def _takes_images(server_manager: Any) -> bool:
    """Whether ``server_manager.generate`` has an ``image_data`` parameter (a ``**kwargs`` catch-all is not one)."""
    try:
        params = inspect.signature(server_manager.generate).parameters
    except (AttributeError, TypeError, ValueError):
        return False
    return "image_data" in params


def _versions(extra: Any, n: int) -> tuple[VersionSpan, ...] | None:
    """The output's version from verl's ``min_global_steps`` / ``max_global_steps`` (the weights' global step).

    One span when both are set and equal; None when verl does not say, or when the output was resumed across
    an update (the two differ, and verl does not say at which token the weights changed).
    """
    if not isinstance(extra, Mapping):
        return None
    low, high = extra.get("min_global_steps"), extra.get("max_global_steps")
    if low is None or low != high or isinstance(low, bool) or not isinstance(low, int | str):
        return None
    return (VersionSpan(version=str(low), start=0, end=n),) if n else ()
