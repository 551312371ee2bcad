"""Reading a vLLM answer: the JSON body decoded, the choice and its ids, logprobs checked, the result built.

Shared by every vLLM endpoint (``/inference/v1/generate``, ``/v1/completions``, ``/v1/chat/completions``); each
refusal is a :class:`~tito_core.errors.BackendResponseError` naming the backend, the route and the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import msgspec

from tito_core.backend import FinishReason, GenerateRequest, GenerateResult
from tito_core.errors import BackendResponseError
from tito_core.versions import decode_spans
from tito_vllm import _wire

__all__ = ["FINISH_REASONS", "AnswerReader"]

FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "stop",  # chat endpoint, server-side tool parser matched a call
    "repetition": "stop",  # repetition detection; stop_reason names the pattern
    "length": "length",
    "abort": "abort",
}

_V = TypeVar("_V")


class AnswerReader:
    """Decodes and checks vLLM answers for one backend (``backend``: its name, for the errors)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def decode(self, raw: bytes, view: type[_V], path: str) -> _V:
        try:
            return msgspec.json.decode(raw, type=view)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            # UnicodeDecodeError: invalid UTF-8 inside a JSON string (msgspec raises it, not a DecodeError)
            text = raw[:2000].decode("utf-8", errors="replace")
            raise BackendResponseError(
                f"{self.backend}: unexpected answer from {path}: {exc}", field="body", body=text, backend=self.backend
            ) from exc

    def only_choice(self, choices: Sequence[_V], path: str) -> _V:
        if len(choices) != 1:
            raise BackendResponseError(
                f"{self.backend}: {path} returned {len(choices)} choices, expected 1",
                field="choices",
                value=len(choices),
                backend=self.backend,
            )
        return choices[0]

    def output_ids(self, token_ids: list[int] | None, path: str) -> list[int]:
        if token_ids is None:
            raise BackendResponseError(
                f"{self.backend}: {path} returned no token_ids (a vLLM older than 0.10.2 ignores return_token_ids)",
                field="token_ids",
                backend=self.backend,
            )
        return token_ids

    def misaligned(self, path: str, detail: str) -> BackendResponseError:
        return BackendResponseError(
            f"{self.backend}: {path}: output logprobs misaligned: {detail}", field="logprobs", backend=self.backend
        )

    def check_length(self, n_logprobs: int, n_ids: int, path: str) -> None:
        if n_logprobs != n_ids:
            raise self.misaligned(path, f"{n_logprobs} logprobs for {n_ids} output tokens")

    def check_tagged_tokens(self, tokens: Sequence[str | None], output_ids: list[int], path: str) -> None:
        """With ``return_tokens_as_token_ids`` each logprob names its token as ``token_id:N``: check it."""
        prefix = _wire.TOKEN_ID_PREFIX
        if len(tokens) != len(output_ids):
            raise self.misaligned(path, f"{len(tokens)} logprob tokens for {len(output_ids)} output tokens")
        for position, (token, token_id) in enumerate(zip(tokens, output_ids, strict=True)):
            if token is None or not token.startswith(prefix):
                return  # the server does not tag tokens with ids: the length check is all we can do
            if token[len(prefix) :] != str(token_id):
                raise self.misaligned(path, f"logprob {position} is for {token!r}, the output token is {token_id}")

    def floats(self, values: Sequence[float | None], path: str) -> list[float]:
        if any(v is None for v in values):
            raise self.misaligned(path, "a generated token has a null logprob")
        return [v for v in values if v is not None]

    def result(
        self,
        request: GenerateRequest,
        choice: _wire._Choice,
        output_ids: list[int],
        logprobs: list[float] | None,
        usage: _wire.Usage | None,
        prompt_ids: list[int] | None,
        prompt_logprobs: _wire.PromptLogprobs | None,
        path: str,
    ) -> GenerateResult:
        reason = choice.finish_reason or "stop"
        finish = FINISH_REASONS.get(reason)
        if finish is None:
            raise BackendResponseError(
                f"{self.backend}: {path}: generation failed on the server (finish_reason {reason!r})",
                field="finish_reason",
                value=reason,
                body=str(choice.stop_reason) if choice.stop_reason is not None else None,
                backend=self.backend,
            )
        matched: str | int | None = choice.stop_reason
        if matched is None and finish == "stop" and reason == "stop" and output_ids:
            matched = output_ids[-1]  # vLLM reports EOS as stop_reason null; the EOS id is the last id
        routed: bytes | None = None
        routed_shape: tuple[int, int] | None = None
        routed_start = 0
        if request.return_routed_experts and choice.routed_experts:
            routed, shape = _wire.decode_npy_int32(choice.routed_experts, backend=self.backend)
            if len(shape) != 3:
                raise BackendResponseError(
                    f"{self.backend}: {path}: routed_experts has shape {shape}, not (tokens, layers, top_k)",
                    field="routed_experts",
                    value=shape,
                    backend=self.backend,
                )
            routed_shape = (shape[1], shape[2])
            routed_start = request.prefix_len
        prompt_lp: list[float | None] | None = None
        if request.return_prompt_logprobs and prompt_logprobs is not None:
            prompt_lp = self.prompt_logprobs(request, prompt_ids, prompt_logprobs, path)
        cached = None
        if usage is not None and usage.prompt_tokens_details is not None:
            cached = usage.prompt_tokens_details.cached_tokens
        versions = None
        if choice.weight_versions is not None:
            versions = decode_spans(choice.weight_versions, len(output_ids), backend=self.backend)
        return GenerateResult(
            output_ids=output_ids,
            output_logprobs=logprobs,
            finish_reason=finish,
            matched_stop=matched,
            prompt_ids=prompt_ids,
            prompt_logprobs=prompt_lp,
            prompt_tokens=usage.prompt_tokens if usage is not None else None,
            cached_tokens=cached,
            routed_experts=routed,
            routed_experts_start=routed_start,
            routed_experts_shape=routed_shape,
            weight_versions=versions,
        )

    def prompt_logprobs(
        self,
        request: GenerateRequest,
        prompt_ids: list[int] | None,
        entries: _wire.PromptLogprobs,
        path: str,
    ) -> list[float | None]:
        """Logprob of each new prompt token (``input_ids[prefix_len:]``), read by token id."""
        ids: Sequence[int] = prompt_ids if prompt_ids is not None else request.input_ids
        if len(entries) != len(ids):
            raise BackendResponseError(
                f"{self.backend}: {path}: {len(entries)} prompt logprobs for a {len(ids)}-token prompt",
                field="prompt_logprobs",
                value=len(entries),
                backend=self.backend,
            )
        out: list[float | None] = []
        for position in range(request.prefix_len, len(ids)):
            entry = entries[position]
            item = entry.get(ids[position]) if entry is not None else None
            out.append(item.logprob if item is not None else None)
        return out
