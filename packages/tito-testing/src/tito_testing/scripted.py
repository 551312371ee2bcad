"""An in-process backend that "generates" scripted texts as real token ids.

Used by the demo, the core's tests and anyone who wants to exercise a Strands agent through tito
without an inference engine. It records every request, so tests can assert exactly what an engine
would have received.
"""

from __future__ import annotations

import asyncio
import os
import zlib
from array import array
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from tito_core.backend import Backend, Capabilities, FinishReason, GenerateRequest, GenerateResult
from tito_core.errors import BackendError, ContextLengthError
from tito_core.sampling_mask import SamplingMask
from tito_core.versions import VersionSpan

from .gate import FileGate

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Script = str | Callable[[GenerateRequest], str]


class ScriptedReply(msgspec.Struct, frozen=True, kw_only=True):
    """A scripted reply: ``text`` is encoded, then ``stop_token`` is appended unless it is None."""

    text: str
    stop_token: str | None = "<|im_end|>"


def scripted_logprob(token_id: int, position: int) -> float:
    """A deterministic, token-dependent fake logprob in (-10, 0]."""
    return -(zlib.crc32(f"{token_id}:{position}".encode()) % 10_000) / 1000.0


def scripted_kept_set(token_id: int, vocab_size: int) -> list[int]:
    """The scripted kept set of a sampled token: itself and its neighbour id."""
    return [token_id, token_id + 1 if token_id + 1 < vocab_size else token_id - 1]


def scripted_routing(position: int, shape: tuple[int, int]) -> list[int]:
    """The scripted routing row of a token position: ``layers x top_k`` expert ids in [0, 8)."""
    layers, top_k = shape
    return [(position * 7 + layer * 3 + k) % 8 for layer in range(layers) for k in range(top_k)]


class ScriptedBackend(Backend):
    """Replies with scripted texts, tokenized with a real tokenizer.

    Args:
        tokenizer: The tokenizer (or a path for ``AutoTokenizer``) used to encode replies.
        replies: Texts, :class:`ScriptedReply` objects, or callables receiving the request and
            returning a text, used in order; running out raises :class:`BackendError`.
        context_length: Reported context window (None: unknown).
        delay: Seconds to sleep in each call (to test cancellation and concurrency).
        weight_version: Reported as the weight version of every output token (an attribute: set it to
            simulate a weight update); None reports no versions, as an engine that says nothing. A callable
            is given each request and returns the version of that call (e.g. by ``request.sequence``, which
            starts with the rollout id).
        gate: A :class:`~tito_testing.gate.FileGate`'s directory: each call, once recorded, waits there until the
            test opens the gate (a test acts while calls are known to be in flight, also in another process).
        sampling_masks: Return a kept set per output token when asked (:func:`scripted_kept_set`); False plays an
            engine that cannot (``supports_sampling_mask`` False).
        routed_experts: ``(layers, top_k)``: answer a request for routing with deterministic rows
            (:func:`scripted_routing`) from its new prompt on; None answers without routing, as an engine (or a
            proxy) that drops the field.
    """

    name = "scripted"
    input_kinds = frozenset(
        {"image", "video"}
    )  # it records requests' media (tests assert what an engine gets), ignores them

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | str,
        replies: Sequence[Script | ScriptedReply] = (),
        *,
        context_length: int | None = None,
        delay: float = 0.0,
        weight_version: str | Callable[[GenerateRequest], str | None] | None = None,
        gate: str | os.PathLike[str] | None = None,
        sampling_masks: bool = True,
        routed_experts: tuple[int, int] | None = None,
    ) -> None:
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.tokenizer = tokenizer
        self.replies: list[Script | ScriptedReply] = list(replies)
        self.context_length = context_length
        self.delay = delay
        self.weight_version = weight_version
        self.gate = FileGate(gate) if gate is not None else None
        self.requests: list[GenerateRequest] = []
        self.sampling_masks = sampling_masks
        self.routed_experts_shape = routed_experts
        self._next = 0

    def capabilities(self) -> Capabilities:
        """The backend's capabilities; sampling masks as configured."""
        return msgspec.structs.replace(super().capabilities(), supports_sampling_mask=self.sampling_masks)

    def add(self, *replies: Script | ScriptedReply) -> None:
        """Append replies to the script."""
        self.replies.extend(replies)

    async def max_context_length(self) -> int | None:
        """The configured context length."""
        return self.context_length

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Encode the next scripted reply, honouring ``max_new_tokens``."""
        if not request.input_ids:
            raise BackendError("empty prompt", backend=self.name)
        snapshot = msgspec.structs.replace(request, input_ids=list(request.input_ids))
        self.requests.append(snapshot)
        if self.context_length is not None and len(request.input_ids) >= self.context_length:
            raise ContextLengthError(
                f"prompt of {len(request.input_ids)} tokens exceeds the context length {self.context_length}",
                status=400,
                backend=self.name,
            )
        if self.gate is not None:
            await self.gate.enter()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self._next >= len(self.replies):
            raise BackendError(f"the script has no reply left for call {self._next + 1}", backend=self.name)
        script = self.replies[self._next]
        self._next += 1
        reply = script if isinstance(script, ScriptedReply) else ScriptedReply(text=_text(script, request))
        ids: list[int] = self.tokenizer.encode(reply.text, add_special_tokens=False)
        if reply.stop_token is not None:
            stop_id = self.tokenizer.convert_tokens_to_ids(reply.stop_token)
            if not isinstance(stop_id, int):
                raise BackendError(f"unknown stop token {reply.stop_token!r}", backend=self.name)
            ids.append(stop_id)
        finish: FinishReason = "stop"
        limit = request.sampling.max_new_tokens
        if limit is not None and len(ids) > limit:
            ids, finish = ids[:limit], "length"
        start = len(request.input_ids)
        logprobs = [scripted_logprob(t, start + i) for i, t in enumerate(ids)] if request.return_logprobs else None
        prompt_logprobs: list[float | None] | None = None
        if request.return_prompt_logprobs:
            new = request.input_ids[request.prefix_len :]
            prompt_logprobs = [
                None if request.prefix_len + i == 0 else scripted_logprob(t, request.prefix_len + i)
                for i, t in enumerate(new)
            ]
        return GenerateResult(
            output_ids=ids,
            output_logprobs=logprobs,
            finish_reason=finish,
            prompt_logprobs=prompt_logprobs,
            prompt_tokens=len(request.input_ids),
            cached_tokens=request.prefix_len,
            weight_versions=self._versions(request, len(ids)),
            sampling_mask=(
                SamplingMask.from_rows(scripted_kept_set(t, len(self.tokenizer)) for t in ids)
                if request.return_sampling_mask
                else None
            ),
            **self._routing(request, len(ids)),
        )

    def _routing(self, request: GenerateRequest, n: int) -> dict[str, Any]:
        shape = self.routed_experts_shape
        if not request.return_routed_experts or shape is None:
            return {}
        total = len(request.input_ids) + n
        rows = range(request.prefix_len, max(total - 1, request.prefix_len))
        data = array("i", (v for r in rows for v in scripted_routing(r, shape)))
        return {
            "routed_experts": data.tobytes(),
            "routed_experts_start": request.prefix_len,
            "routed_experts_shape": shape,
        }

    def _versions(self, request: GenerateRequest, n: int) -> tuple[VersionSpan, ...] | None:
        version = self.weight_version(request) if callable(self.weight_version) else self.weight_version
        if version is None:
            return None
        return (VersionSpan(version=version, start=0, end=n),) if n else ()


def _text(script: Any, request: GenerateRequest) -> str:
    text = script(request) if callable(script) else script
    if not isinstance(text, str):
        raise BackendError(f"a scripted reply must be text, got {type(text).__name__}", backend="scripted")
    return text
