"""The contract between the core and an inference engine adapter.

An adapter is a :class:`Backend` subclass: it turns a :class:`GenerateRequest` into one request to its
engine and the engine's answer into a :class:`GenerateResult`. Everything else (templating, the
trajectory, tool parsing, Strands events) lives in the core, once, for every engine.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import msgspec

from tito_core._suggest import did_you_mean
from tito_core.errors import ConfigError, at_key
from tito_core.media import PromptMedia
from tito_core.sampling_mask import SamplingMask
from tito_core.versions import VersionSpan

__all__ = [
    "Backend",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "SamplingParams",
    "sampling_params",
]

FinishReason = Literal["stop", "length", "abort"]
"""Why generation ended: a stop token/string (``stop``), the token limit (``length``), or the engine
aborted the request (``abort``)."""


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Engine-neutral sampling parameters; adapters map them to their engine's names.

    Every field is checked when the struct is built, however it is built (directly, by
    :func:`sampling_params` from a mapping, by msgspec decoding, by ``msgspec.structs.replace``); a bad
    value raises :class:`~tito_core.errors.ConfigError` naming the field:

    - ``max_new_tokens``: an int >= 0 (0 generates nothing: a request that only scores its prompt, e.g. for
      prompt logprobs; engines that cannot do that, such as vLLM, refuse it themselves).
    - ``temperature``: a finite number >= 0 (0 is greedy decoding).
    - ``top_p``: a number in (0, 1].
    - ``top_k``: an int >= 1, or -1 for "no top-k" (the value vLLM and SGLang both accept; 0 is
      rejected because SGLang and older vLLM refuse it — leave ``top_k`` unset to use the engine's
      default).
    - ``seed``: an int. A rollout's call ``k`` (from 0) samples with ``seed + k``, so its calls never reuse one
      random stream; the runner gives each rollout its own seed (:func:`tito_core.runner.rollout_seed`).
    - ``stop``: non-empty strings (a list or tuple, not a bare string).
    - ``stop_token_ids``: ints >= 0.
    - ``extra``: a mapping with string keys, passed through unchanged to the engine for anything
      engine-specific (constrained decoding such as SGLang's ``regex`` or vLLM's
      ``structured_outputs``, ``min_p``, penalties, ...).

    Unset fields (None) leave the engine's default in place.
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

    def __post_init__(self) -> None:
        _check_sampling(self)

    def with_defaults(self, defaults: Mapping[str, Any]) -> SamplingParams:
        """These parameters with their unset ``temperature``, ``top_p`` and ``top_k`` taken from ``defaults``."""
        unset = {
            name: defaults[name]
            for name in ("temperature", "top_p", "top_k")
            if getattr(self, name) is None and defaults.get(name) is not None
        }
        return msgspec.structs.replace(self, **unset) if unset else self

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

    def truncates(self, vocab_size: int | None = None) -> bool:
        """Whether these parameters sample from a truncated distribution (its kept sets are then recorded).

        ``top_k`` below the vocabulary, ``top_p`` < 1 or ``extra["min_p"]`` > 0, at a temperature other than 0
        (greedy decoding samples nothing: it records no mask). Unset fields count as no truncation: the core
        first fills them from the backend's :meth:`Backend.sampling_defaults` (a model's ``generation_config``, where
        the backend knows that the engine applies it).
        """
        if self.temperature == 0:
            return False
        k = self.top_k
        if k is not None and k != -1 and (vocab_size is None or k < vocab_size):
            return True
        if self.top_p is not None and self.top_p < 1:
            return True
        min_p = self.extra.get("min_p")
        return isinstance(min_p, int | float) and not isinstance(min_p, bool) and min_p > 0


_SAMPLING_FIELDS: frozenset[str] = frozenset(SamplingParams.__struct_fields__)


def sampling_params(value: SamplingParams | Mapping[str, Any] | None = None, /) -> SamplingParams:
    """Check sampling parameters and return them as :class:`SamplingParams`.

    The one schema behind ``TitoModel(..., sampling=...)``, ``TitoModel.update_config(sampling=...)``
    and a config file's ``sampling`` table.

    Args:
        value: A :class:`SamplingParams` (returned as is: it was checked when built), a mapping of its
            field names (``{"temperature": 0.7, "max_new_tokens": 512}``), or None for the engine's
            defaults.

    Raises:
        ConfigError: A key is not a field (the message names the closest field: ``unknown key
            `sampling.temprature`; did you mean `temperature`?``), a value has the wrong type, or a
            value is out of range (see :class:`SamplingParams`).

    """
    if value is None:
        return SamplingParams()
    if isinstance(value, SamplingParams):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"`sampling` must be a SamplingParams or a mapping of its fields, got {type(value).__name__}")
    for key in value:
        if key not in _SAMPLING_FIELDS:
            raise ConfigError(f"unknown key `sampling.{key}`{did_you_mean(str(key), _SAMPLING_FIELDS)}")
    if isinstance(value.get("stop"), str):  # the commonest slip; msgspec would only say "expected array"
        raise _bad("stop", 'a list of strings (write stop=["..."], not a bare string)', value["stop"])
    try:
        return msgspec.convert(dict(value), SamplingParams)
    except msgspec.ValidationError as exc:
        if isinstance(exc.__cause__, ConfigError):  # raised by __post_init__: already one clear message
            raise ConfigError(str(exc.__cause__)) from exc.__cause__
        raise ConfigError(f"invalid `sampling`: {at_key(exc, 'sampling')}") from exc


def _bad(field: str, requirement: str, value: object) -> ConfigError:
    return ConfigError(f"`sampling.{field}` must be {requirement}, got {value!r}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_sampling(params: SamplingParams) -> None:
    """Check every field of ``params``; normalise list ``stop`` / ``stop_token_ids`` to tuples."""
    n = params.max_new_tokens
    if n is not None and not (_is_int(n) and n >= 0):
        raise _bad("max_new_tokens", "an int >= 0 (or None for the engine's default)", n)
    t = params.temperature
    if t is not None and not (_is_number(t) and math.isfinite(t) and t >= 0):
        raise _bad("temperature", "a finite number >= 0 (0 is greedy decoding)", t)
    p = params.top_p
    if p is not None and not (_is_number(p) and 0 < p <= 1):
        raise _bad("top_p", "a number in (0, 1]", p)
    k = params.top_k
    if k is not None and not (_is_int(k) and (k >= 1 or k == -1)):
        raise _bad("top_k", "an int >= 1, or -1 to disable top-k (0 is refused by SGLang and older vLLM)", k)
    if params.seed is not None and not _is_int(params.seed):
        raise _bad("seed", "an int", params.seed)
    stop = params.stop
    if isinstance(stop, str | bytes) or not isinstance(stop, Sequence):
        raise _bad("stop", 'a list of strings (write stop=["..."], not a bare string)', stop)
    for s in stop:
        if not (isinstance(s, str) and s):
            raise _bad("stop", "a list of non-empty strings", stop)
    ids = params.stop_token_ids
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise _bad("stop_token_ids", "a list of token ids", ids)
    for i in ids:
        if not (_is_int(i) and i >= 0):
            raise _bad("stop_token_ids", "a list of ints >= 0", ids)
    if not isinstance(params.ignore_eos, bool):
        raise _bad("ignore_eos", "a bool", params.ignore_eos)
    extra = params.extra
    if not isinstance(extra, Mapping):
        raise _bad("extra", "a mapping of engine-specific parameters", extra)
    for key in extra:
        if not isinstance(key, str):
            raise _bad("extra", "a mapping with string keys", extra)
    # Built directly with lists or another mapping type: store what the annotations promise.
    if type(stop) is not tuple:
        msgspec.structs.force_setattr(params, "stop", tuple(stop))
    if type(ids) is not tuple:
        msgspec.structs.force_setattr(params, "stop_token_ids", tuple(ids))
    if type(extra) is not dict:
        msgspec.structs.force_setattr(params, "extra", dict(extra))


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
        return_sampling_mask: Ask for the kept set of every output token (:mod:`tito_core.sampling_mask`), and for
            logprobs over it: set by the core when ``sampling`` truncates, only for backends with
            ``supports_sampling_mask = True``.
        messages: Chat-template messages, set only for backends with ``renders_prompt = True``.
        tools: OpenAI-style tool schemas, set only for backends with ``renders_prompt = True``.
        grammar: A grammar the output must follow (constrained decoding, e.g. a forced tool call from
            Strands' ``tool_choice``), or None. EBNF in the dialect of xgrammar and llama.cpp's GBNF
            (``root ::= call ...``), which vLLM's ``structured_outputs.grammar`` and SGLang's
            ``ebnf`` sampling parameter both read. Set only for backends with ``supports_grammar = True``.
        sequence: Names the token sequence this request extends: the same for every call of one trajectory
            branch, a new one after a fork or a reset (the core ends the old one with
            :meth:`Backend.end_sequence`, and is the only one that does). Within one sequence, ``input_ids`` only
            grow: each request's ids start with the previous request's ``input_ids[:prefix_len]``. A backend
            that keeps a sequence between calls (SGLang sessions, the JSON of the ids sent so far) keys that state
            by it; None means no continuity is promised.
        media: The images, videos and other inputs of ``input_ids``, in token order: each one's span (its
            placeholder tokens, already expanded to what the model consumes, and its ``kind``) and the item.
            Empty for text-only prompts; a backend only gets the kinds its ``input_kinds`` name.
        never_sample: Token ids the engine must never sample (vision placeholders): adapters map them to the
            engine's logit bias or bad-token list. The core also rejects an output holding one.
    """

    rid: str
    input_ids: Sequence[int]
    prefix_len: int
    sampling: SamplingParams
    return_logprobs: bool = True
    return_prompt_logprobs: bool = False
    return_routed_experts: bool = False
    return_sampling_mask: bool = False
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    grammar: str | None = None
    sequence: str | None = None
    media: tuple[PromptMedia, ...] = ()
    never_sample: tuple[int, ...] = ()


class GenerateResult(msgspec.Struct, frozen=True, kw_only=True):
    """What the engine produced for one :class:`GenerateRequest`, exactly as it reported it.

    Attributes:
        output_ids: Generated token ids, the stop token included when the engine emitted one.
        output_logprobs: One logprob per output id, or None when not requested / not returned. With
            ``sampling_mask``, the logprobs of the distribution the engine sampled from: renormalised over each
            token's kept set.
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
        weight_versions: Which weights generated the output: spans that tile ``output_ids`` exactly
            (:mod:`tito_core.versions`), or None when the engine does not say. Never guessed.
        sampling_mask: The kept set of each output token, when the request asked (``return_sampling_mask``).
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
    weight_versions: tuple[VersionSpan, ...] | None = None
    sampling_mask: SamplingMask | None = None


PauseMode = Literal["keep", "recompute", "abort"]
"""How a paused engine treats its requests in flight (:meth:`Backend.pause_generation`)."""


class Capabilities(msgspec.Struct, frozen=True, gc=False):
    """What a backend can do, read once from its class attributes (:meth:`Backend.capabilities`)."""

    name: str
    renders_prompt: bool
    supports_grammar: bool
    supports_pause: bool
    supports_score: bool
    input_kinds: frozenset[str] = frozenset()
    supports_sampling_mask: bool = False


class Backend(abc.ABC):
    """An inference engine client.

    Subclasses implement :meth:`generate`; the rest has sensible defaults. A backend instance may be
    shared by many :class:`~tito_core.TitoModel` instances and used from any event loop.
    Cancelling :meth:`generate` must stop the request on the engine (abort it), not leave it running.
    """

    name: ClassVar[str] = "backend"
    renders_prompt: ClassVar[bool] = False
    """True for backends that send chat messages and let the server render the prompt (e.g. an
    OpenAI chat endpoint). The core then checks the echoed ``prompt_ids`` against the trajectory."""
    supports_grammar: ClassVar[bool] = False
    """True for backends that apply :attr:`GenerateRequest.grammar` with the engine's constrained decoding.
    A call that needs a grammar (a forced tool call) on a backend without it fails with a clear error."""

    @abc.abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one generation and return exactly what the engine produced."""

    def capabilities(self) -> Capabilities:
        """What this backend can do, as one struct (the core reads it once per rollout)."""
        return Capabilities(
            name=self.name,
            renders_prompt=bool(self.renders_prompt),
            supports_grammar=bool(self.supports_grammar),
            supports_pause=bool(self.supports_pause),
            supports_score=bool(self.supports_score),
            input_kinds=frozenset(self.input_kinds),
            supports_sampling_mask=bool(self.supports_sampling_mask),
        )

    supports_sampling_mask: ClassVar[bool] = False
    """True for backends that honour :attr:`GenerateRequest.return_sampling_mask`: the kept set of every output token
    and logprobs over it. A truncating call on a backend without it is refused in the default ``exact`` mode
    (:class:`~tito_core.errors.SamplingMaskError`)."""
    no_sampling_mask_reason: ClassVar[str] = ""
    """Why the backend cannot return sampling masks (the refusal quotes it), when it cannot."""

    supports_pause: ClassVar[bool] = False
    """True for backends whose engine can freeze the requests in flight and go on with them later
    (:meth:`pause_generation`, :meth:`resume_generation`), and relabel its weights (:meth:`set_weight_version`):
    what :func:`tito_core.weights.weight_update` needs."""

    def sampling_defaults(self) -> Mapping[str, Any]:
        """What the engine gives the ``temperature``, ``top_p`` and ``top_k`` a request leaves unset, where known.

        The core fills a call's unset fields from it before it decides whether the call truncates, so that a model
        whose ``generation_config`` truncates by default (Qwen3: ``top_k`` 20) records its kept sets, and the
        request states what the engine applies. Empty (the default): the engine's own "no truncation", or unknown.
        """
        return {}

    async def max_context_length(self) -> int | None:
        """The engine's context window in tokens, or None when unknown.

        The core asks before every call and keeps no copy: a backend that has to fetch it caches it (the one
        cache of the limit). An error is logged and the call goes on without a limit; the next call asks again.
        """
        return None

    async def pause_generation(self, mode: PauseMode = "keep") -> None:
        """Stop generating until :meth:`resume_generation`; requests sent meanwhile wait for the resume.

        ``keep``: the requests in flight freeze with their KV cache, which they go on from. ``recompute``: they
        go back to the queue, their prompt and the tokens generated so far recomputed when they go on (under the
        weights loaded meanwhile). ``abort``: they end now with ``finish_reason="abort"`` and the tokens
        generated so far, which :func:`tito_core.weights.weight_update` callers continue as partial rollouts.
        A backend refuses a mode its engine lacks with a :class:`~tito_core.errors.ConfigError`.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot pause generation (supports_pause is False)")

    async def resume_generation(self) -> None:
        """Let the requests frozen by :meth:`pause_generation` go on."""
        raise NotImplementedError(f"{type(self).__name__} cannot resume generation (supports_pause is False)")

    async def set_weight_version(self, version: str) -> None:
        """Label the engine's current weights ``version`` (what its answers' weight-version spans then say)."""
        raise NotImplementedError(f"{type(self).__name__} cannot label its weights (supports_pause is False)")

    supports_score: ClassVar[bool] = False
    """True for backends that implement :meth:`score`: what a weight probe
    (``weight_update(..., probe=...)``, :class:`tito_core.weights.WeightProbe`) needs."""

    @property
    def input_kinds(self) -> frozenset[str]:
        """The input kinds (``image``, ``video``, ...) this backend sends to its engine; none by default.

        The kinds of :attr:`GenerateRequest.media` it takes (docs/multimodal.md): a prompt holding another kind is a
        :class:`~tito_core.media.MediaError` before any request. A backend declares its kinds as a class attribute
        (``input_kinds = frozenset({"image"})``), or overrides this property where they depend on the instance (the
        model it loaded).
        """
        return frozenset()

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        """The engine's logprob of each of ``token_ids[1:]`` given the tokens before it, under the weights now.

        One prefill (prompt logprobs), nothing served from a cache computed under other weights. Returns
        ``len(token_ids) - 1`` values (None where the engine gave none).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot score a token sequence (supports_score is False)")

    def end_sequence(self, sequence: str) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Forget :attr:`GenerateRequest.sequence` ``sequence``: its branch was reset, forked, or a call failed.

        Called from synchronous code (``TitoModel.reset``) as well as inside a call, so it must not block; a
        backend that keeps engine state per sequence frees it (in the background). No request of
        ``sequence`` follows.
        """

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections and other resources."""

    async def __aenter__(self) -> Backend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
