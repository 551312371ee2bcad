"""Output tokens per second of the embedded ``transformers`` backend at 1 and N concurrent rollouts.

Each rollout is one ``generate`` call: a chat prompt, greedy decoding of ``--tokens`` new tokens (EOS
ignored, so every rollout produces the same number). Concurrent rollouts are ``asyncio.gather``-ed on one
backend, which batches them. Reported: wall time, output tokens/s over all rollouts, and per rollout.
``--grammar`` runs every concurrency a second time with each rollout constrained to a hermes tool call whose
argument is a free JSON string (the grammar's most expensive masks); a rollout that closes the call then ends
on EOS, so it may produce fewer tokens. Not a test. Usage::

    python benchmarks/embedded.py [--model smollm2|tiny|DIR] [--concurrency 1 16] [--tokens 64] [--threads N]
        [--grammar]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.",
    "List three uses of a paperclip.",
]


# A JSON string written right-recursively, as xgrammar's own JSON-schema grammars are: the usual
# `"\"" ( [^"\\] | "\\" ... )* "\""` form makes xgrammar's masks inside the string ~3000x slower (0.07 ms ->
# 150-350 ms per step on Qwen's 151k vocabulary, measured), see docs/transformers.md.
GRAMMAR = r"""root ::= "<tool_call>\n{\"name\": \"answer\", \"arguments\": {\"text\": \"" chars "}}\n</tool_call>"
chars ::= "\"" | [^"\\\x00-\x1F] chars | "\\" escape chars
escape ::= ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]
"""


def model_dir(name: str) -> Path:
    """The model directory for a name (building the model on first use)."""
    if name == "smollm2":
        from tito_transformers.models import build_smollm2

        return build_smollm2()
    if name == "tiny":
        from tito_testing.tiny_model import build_tiny_qwen3

        return build_tiny_qwen3()
    return Path(name)


async def run(backend: Any, prompts: list[list[int]], tokens: int, grammar: str | None = None) -> tuple[float, int]:
    """Run one greedy rollout per prompt concurrently; return the wall time and the tokens produced."""
    from tito_core.backend import GenerateRequest, SamplingParams

    sampling = SamplingParams(temperature=0.0, max_new_tokens=tokens, ignore_eos=True)
    requests = [
        GenerateRequest(rid=uuid.uuid4().hex, input_ids=p, prefix_len=0, sampling=sampling, grammar=grammar)
        for p in prompts
    ]
    started = time.perf_counter()
    results = await asyncio.gather(*(backend.generate(r) for r in requests))
    return time.perf_counter() - started, sum(len(r.output_ids) for r in results)


def main() -> None:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, tiny, or a model directory")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per rollout")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16")
    parser.add_argument("--grammar", action="store_true", help="also run each concurrency under a tool-call grammar")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from tito_transformers import TransformersBackend

    directory = model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    backend = TransformersBackend(
        directory, dtype=args.dtype, num_threads=args.threads, max_batch_size=max(args.concurrency)
    )
    import torch

    def prompt(i: int) -> list[int]:
        messages = [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return list(tokenizer.encode(text, add_special_tokens=False))

    print(
        f"model {args.model} ({directory.name}), dtype {backend.dtype}, torch threads {torch.get_num_threads()}, "
        f"{args.tokens} new tokens per rollout, prompts of ~{len(prompt(0))} tokens"
    )
    asyncio.run(run(backend, [prompt(0)], 4))  # warm-up
    if args.grammar:  # warm-up: the tokenizer info and the compiled grammar, built once
        asyncio.run(run(backend, [prompt(0)], 4, GRAMMAR))
    for n in args.concurrency:
        for grammar in (None, GRAMMAR) if args.grammar else (None,):
            seconds, produced = asyncio.run(run(backend, [prompt(i) for i in range(n)], args.tokens, grammar))
            print(
                f"concurrency {n:3d}{' grammar' if grammar else '':8}: {produced} tokens in {seconds:6.2f} s = "
                f"{produced / seconds:7.1f} tokens/s ({produced / n / seconds:6.1f} per rollout)"
            )
    backend.close()


if __name__ == "__main__":
    main()
