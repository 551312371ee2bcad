"""The contract between the core and an inference engine adapter.

An adapter is a :class:`Backend` subclass: it turns a :class:`GenerateRequest` into one request to its
engine and the engine's answer into a :class:`GenerateResult`. Everything else (templating, the
trajectory, tool parsing, Strands events) lives in the core, once, for every engine.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import msgspec

FinishReason = Literal["stop", "length", "abort"]
"""Why generation ended: a stop token/string (``stop``), the token limit (``length``), or the engine
aborted the request (``abort``)."""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Engine-neutral sampling parameters; adapters map them to their engine's names.

    ``extra`` is passed through unchanged to the engine for anything engine-specific (constrained
    decoding such as SGLang's ``regex`` or vLLM's ``structured_outputs``, ``min_p``, penalties, ...).
    """

    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    def engine_fields(self, **names: str) -> dict[str, Any]:
        """The parameters that are set, keyed by the engine's names (``extra`` not included).

        ``names`` renames fields, e.g. ``engine_fields(max_new_tokens="max_tokens")``; tuples become lists
        and ``ignore_eos`` appears only when true.
        """
        out: dict[str, Any] = {}
        for field in ("max_new_tokens", "temperature", "top_p", "top_k", "seed"):
            value = getattr(self, field)
            if value is not None:
                out[names.get(field, field)] = value
        if self.stop:
            out[names.get("stop", "stop")] = list(self.stop)
        if self.stop_token_ids:
            out[names.get("stop_token_ids", "stop_token_ids")] = list(self.stop_token_ids)
        if self.ignore_eos:
            out[names.get("ignore_eos", "ignore_eos")] = True
        return out


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One model call, token in.

    Attributes:
        rid: Unique request id; adapters send it to engines that can abort by id.
        input_ids: The whole prompt: the trajectory so far followed by the new prompt tokens. A
            read-only sequence of ints (an ``array('i')`` in practice); do not mutate it.
        prefix_len: How many leading ``input_ids`` are the trajectory so far (already seen by the
            engine on the previous call, so cacheable); ``input_ids[prefix_len:]`` is the new prompt.
        sampling: Sampling parameters; ``max_new_tokens`` is already clamped to the room left.
        return_logprobs: Ask for the logprob of every output token.
        return_prompt_logprobs: Ask for logprobs of the new prompt tokens.
        return_routed_experts: Ask for MoE routing decisions (for routing replay).
        messages: Chat-template messages, set only for backends with ``renders_prompt = True``.
        tools: OpenAI-style tool schemas, set only for backends with ``renders_prompt = True``.
        input_ids_json: ``input_ids`` as a JSON array, byte for byte what ``msgspec.json.encode(list(input_ids))``
            gives, set only for backends with ``json_input_ids = True``. The model keeps the JSON of its
            trajectory up to date (O(new tokens) per call), so an adapter can send the whole prompt without
            converting every id again (``msgspec.Raw(request.input_ids_json)``).
    """

    rid: str
    input_ids: Sequence[int]
    prefix_len: int
    sampling: SamplingParams
    return_logprobs: bool = True
    return_prompt_logprobs: bool = False
    return_routed_experts: bool = False
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    input_ids_json: bytes | None = None


class GenerateResult(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine produced for one :class:`GenerateRequest`, exactly as it reported it.

    Attributes:
        output_ids: Generated token ids, the stop token included when the engine emitted one.
        output_logprobs: One logprob per output id, or None when not requested / not returned.
        finish_reason: Why generation ended.
        matched_stop: The stop string or token id that ended generation, when the engine says.
        prompt_ids: The prompt the engine actually consumed, when it echoes it. Required from
            ``renders_prompt`` backends, optional (but checked when present) otherwise.
        prompt_logprobs: Logprobs of ``input_ids[prefix_len:]`` (None where the engine has none).
        prompt_tokens: Prompt length as the engine counted it.
        cached_tokens: Prompt tokens served from the engine's prefix cache.
        routed_experts: Raw little-endian int32 routing decisions, ``rows x layers x top_k``.
        routed_experts_start: Token position the first routed-experts row belongs to.
        routed_experts_shape: ``(layers, top_k)`` of each routed-experts row.
    """

    output_ids: list[int]
    output_logprobs: list[float] | None = None
    finish_reason: FinishReason = "stop"
    matched_stop: str | int | None = None
    prompt_ids: list[int] | None = None
    prompt_logprobs: list[float | None] | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    routed_experts: bytes | None = None
    routed_experts_start: int = 0
    routed_experts_shape: tuple[int, int] | None = None


class Backend(abc.ABC):
    """An inference engine client.

    Subclasses implement :meth:`generate`; the rest has sensible defaults. A backend instance may be
    shared by many :class:`~tito_core.TitoModel` instances and used from any event loop.
    Cancelling :meth:`generate` must stop the request on the engine (abort it), not leave it running.
    """

    name: ClassVar[str] = "backend"
    renders_prompt: ClassVar[bool] = False
    json_input_ids: ClassVar[bool] = False
    """True for backends that send ``input_ids`` as a JSON array and use :attr:`GenerateRequest.input_ids_json`."""
    """True for backends that send chat messages and let the server render the prompt (e.g. an
    OpenAI chat endpoint). The core then checks the echoed ``prompt_ids`` against the trajectory."""

    @abc.abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one generation and return exactly what the engine produced."""

    async def max_context_length(self) -> int | None:
        """The engine's context window in tokens, or None when unknown."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections and other resources."""

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
