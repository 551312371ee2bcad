"""tito-backend-echo: the smallest complete tito backend, and the template for writing one.

The "model" repeats the last ``window`` tokens of the prompt, then emits the tokenizer's EOS id. It
honours the parts of :class:`~tito_core.backend.GenerateRequest` a real adapter must: the token limit,
``ignore_eos``, stop token ids, logprobs, the prompt echo and cancellation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from tito_core.backend import Backend, FinishReason, GenerateRequest, GenerateResult
from tito_core.errors import ContextLengthError
from tito_core.plugins import BackendSpec, hookimpl


class EchoBackend(Backend):
    """Echoes the end of the prompt, one token per (simulated) decoding step."""

    name = "echo"

    def __init__(
        self, *, eos_token_id: int, window: int = 16, context_length: int = 32768, delay_s: float = 0.0
    ) -> None:
        if window < 1 or context_length < 1:
            raise ValueError("window and context_length must be positive")
        self.eos_token_id = eos_token_id
        self.window = window
        self.context_length = context_length
        self.delay_s = delay_s

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        ids, sampling = request.input_ids, request.sampling
        if not ids or not 0 <= request.prefix_len <= len(ids):
            raise ValueError("echo: input_ids must not be empty and prefix_len must lie within them")
        if sampling.stop:
            raise ValueError("echo: stop strings are not supported (this backend never decodes text)")
        room = self.context_length - len(ids)
        if room <= 0:
            raise ContextLengthError(f"{len(ids)} prompt tokens fill the context", backend=self.name)
        limit = room if sampling.max_new_tokens is None else min(room, sampling.max_new_tokens)
        source = list(ids[-self.window :])
        stops = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else {self.eos_token_id})
        output: list[int] = []
        finish: FinishReason = "length"
        matched: int | None = None
        while len(output) < limit:
            await asyncio.sleep(self.delay_s)  # one decoding step; cancellation lands here
            step = len(output)
            echoing = sampling.ignore_eos or step < len(source)
            token = source[step % len(source)] if echoing else self.eos_token_id
            output.append(token)
            if token in stops:
                finish, matched = "stop", token
                break
        new_prompt = range(request.prefix_len, len(ids))
        return GenerateResult(
            output_ids=output,
            output_logprobs=[0.0] * len(output) if request.return_logprobs else None,
            finish_reason=finish,
            matched_stop=matched,
            prompt_ids=list(ids),
            prompt_logprobs=[None if i == 0 else 0.0 for i in new_prompt] if request.return_prompt_logprobs else None,
            prompt_tokens=len(ids),
        )

    async def max_context_length(self) -> int | None:
        return self.context_length


@hookimpl
def tito_backends() -> Iterator[BackendSpec]:
    yield BackendSpec("echo", EchoBackend, "Echoes the end of the prompt (example adapter)")
