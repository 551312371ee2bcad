"""How large an answer may be: the default body limit and the bound derived from a generation request."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_BODY", "response_byte_limit"]

DEFAULT_MAX_BODY: Final = 64 * 1024 * 1024
"""Body limit of a request that names none (server info, model lists, ...): 64 MiB."""


def response_byte_limit(
    max_new_tokens: int | None,
    *,
    echoed_tokens: int = 0,
    logprobs: bool = True,
    prompt_logprob_tokens: int = 0,
    routed_expert_tokens: int = 0,
    context_length: int | None = None,
    per_token: int = 1024,
    per_token_no_logprobs: int = 128,
    per_echoed_token: int = 16,
    per_routed_expert_token: int = 16 * 1024,
    overhead: int = 1024 * 1024,
) -> int:
    """A generous upper bound of the answer body of one generation, in bytes.

    Per output token: an id, its text (JSON-escaped, up to tens of bytes), and with logprobs the logprob
    entry (vLLM's chat entries carry the token's bytes, SGLang's a triple): ``per_token`` bytes with
    logprobs, ``per_token_no_logprobs`` without. Per token echoed back (prompt ids): ``per_echoed_token``;
    per prompt token with a logprob: ``per_token``; per token with routed experts (base64 of
    ``layers x top_k`` int32): ``per_routed_expert_token``. Plus a fixed ``overhead`` for the envelope,
    usage and metadata. Without ``max_new_tokens`` the output is bounded by ``context_length`` (or 128k
    tokens when unknown).

    An answer past this is not a generation of that request; the backend option ``max_response_bytes``
    replaces the derived limit when an engine legitimately sends more.
    """
    if max_new_tokens is None or max_new_tokens < 0:
        max_new_tokens = context_length if context_length is not None and context_length > 0 else 131_072
    out = max_new_tokens * (per_token if logprobs else per_token_no_logprobs)
    return (
        overhead
        + out
        + max(0, echoed_tokens) * per_echoed_token
        + max(0, prompt_logprob_tokens) * per_token
        + max(0, routed_expert_tokens) * per_routed_expert_token
    )
