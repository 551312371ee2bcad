"""Constrained decoding in the embedded backend (grammars and regexes, xgrammar) on the tiny random Qwen3.

The random model writes gibberish unconstrained; under a grammar it must write exactly what the grammar
allows, end on a stop token once the grammar is complete, and report the constrained distribution's logprobs.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import BackendRequestError
from tito_core.tool_parsers.hermes import HermesToolParser
from tito_transformers import TransformersBackend

pytest.importorskip("xgrammar")

EOS = {151645, 151643}  # <|im_end|>, <|endoftext|>: the tiny model's generation_config

# one hermes call to add(a: int, b: int), numbers of at most three digits: the grammar always completes
ADD_CALL = r"""root ::= "<tool_call>\n{\"name\": \"add\", \"arguments\": " args "}\n</tool_call>"
args ::= "{\"a\": " int ", \"b\": " int "}"
int ::= "-"? [0-9] [0-9]? [0-9]?
"""
ADD_CALL_TEXT = re.compile(
    r'<tool_call>\n\{"name": "add", "arguments": \{"a": -?[0-9]{1,3}, "b": -?[0-9]{1,3}\}\}\n</tool_call>'
)

# alternation over three tools, two of them taking any JSON object (bounded strings and nesting keep it short)
TOOLS = r"""root ::= "<tool_call>\n" call "\n</tool_call>"
call ::= add_call | search_call | note_call
add_call ::= "{\"name\": \"add\", \"arguments\": {\"a\": " number ", \"b\": " number "}}"
search_call ::= "{\"name\": \"search\", \"arguments\": " object "}"
note_call ::= "{\"name\": \"note\", \"arguments\": " object "}"
object ::= "{" ( pair ( ", " pair ){0,2} )? "}"
pair ::= string ": " value
value ::= string | number | "true" | "false" | "null" | "[" ( leaf ( ", " leaf ){0,2} )? "]" | flat
flat ::= "{" ( string ": " leaf ( ", " string ": " leaf ){0,2} )? "}"
leaf ::= string | number | "true" | "false" | "null"
string ::= "\"" [a-z ]{0,8} "\""
number ::= "-"? [0-9]{1,3}
"""


@pytest.fixture(scope="module")
def fp32(tiny_model_dir: Path) -> Iterator[TransformersBackend]:
    backend = TransformersBackend(tiny_model_dir, dtype="float32", max_context_length=512)
    yield backend
    backend.close()


def request(
    ids: list[int], grammar: str | None = None, prompt_logprobs: bool = False, **sampling: Any
) -> GenerateRequest:
    return GenerateRequest(
        rid=uuid.uuid4().hex,
        input_ids=ids,
        prefix_len=0,
        sampling=SamplingParams(**sampling),
        grammar=grammar,
        return_prompt_logprobs=prompt_logprobs,
    )


def prompt(tokenizer: Any, text: str = "Add 2 and 3.") -> list[int]:
    ids: list[int] = tokenizer.encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")
    return ids


def body(tokenizer: Any, result: GenerateResult) -> str:
    """The output text without its final stop token."""
    assert result.finish_reason == "stop" and result.output_ids[-1] in EOS and result.matched_stop in EOS
    text: str = tokenizer.decode(result.output_ids[:-1], skip_special_tokens=False)
    return text


def check_logprobs(result: GenerateResult) -> None:
    assert result.output_logprobs is not None and len(result.output_logprobs) == len(result.output_ids)
    assert all(math.isfinite(lp) and lp <= 0 for lp in result.output_logprobs)


async def test_forced_hermes_call_matches_the_grammar_parses_and_stops(fp32, tokenizer) -> None:
    samplings = ({"temperature": 0.0}, {"temperature": 1.0, "seed": 7}, {"temperature": 1.0, "seed": 8})
    results = await asyncio.gather(
        *(fp32.generate(request(prompt(tokenizer), ADD_CALL, max_new_tokens=100, **s)) for s in samplings)
    )
    for result in results:
        text = body(tokenizer, result)
        assert ADD_CALL_TEXT.fullmatch(text), text
        check_logprobs(result)
        parsed = HermesToolParser().parse(text)
        assert [(call.name, call.error) for call in parsed.calls] == [("add", None)]
        assert set(parsed.calls[0].input) == {"a", "b"} and all(type(v) is int for v in parsed.calls[0].input.values())
    # the same request without the grammar writes no tool call at all
    free = await fp32.generate(request(prompt(tokenizer), temperature=0.0, max_new_tokens=40))
    assert "<tool_call>" not in tokenizer.decode(free.output_ids)


async def test_grammar_complete_ends_on_eos_even_under_ignore_eos(fp32, tokenizer) -> None:
    result = await fp32.generate(
        request(prompt(tokenizer), ADD_CALL, temperature=0.0, max_new_tokens=100, ignore_eos=True)
    )
    assert ADD_CALL_TEXT.fullmatch(body(tokenizer, result))


async def test_stop_token_ids_end_a_complete_grammar(fp32, tokenizer) -> None:
    newline = tokenizer.encode("\n")[0]
    grammar = 'root ::= "yes" | "no"'
    result = await fp32.generate(
        request(
            prompt(tokenizer), grammar, temperature=0.0, max_new_tokens=20, stop_token_ids=[newline], ignore_eos=True
        )
    )
    assert result.finish_reason == "stop" and result.output_ids[-1] == newline == result.matched_stop
    assert tokenizer.decode(result.output_ids[:-1]) in ("yes", "no")


async def test_json_values_and_alternation_over_tools(fp32, tokenizer) -> None:
    names = set()
    ids = prompt(tokenizer, "Search or take a note.")
    results = await asyncio.gather(
        *(fp32.generate(request(ids, TOOLS, temperature=1.0, seed=seed, max_new_tokens=200)) for seed in range(6))
    )
    for result in results:
        text = body(tokenizer, result)
        check_logprobs(result)
        assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
        call = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        assert set(call) == {"name", "arguments"} and isinstance(call["arguments"], dict)
        parsed = HermesToolParser().parse(text)
        assert [(c.name, c.input, c.error) for c in parsed.calls] == [(call["name"], call["arguments"], None)]
        names.add(call["name"])
    assert names <= {"add", "search", "note"} and len(names) >= 2  # the alternation is really sampled


async def test_constrained_logprobs_are_the_masked_renormalised_distribution(fp32, tokenizer) -> None:
    import torch
    import xgrammar

    ids = prompt(tokenizer)
    for temperature in (0.0, 1.0):
        result = await fp32.generate(request(ids, ADD_CALL, temperature=temperature, seed=3, max_new_tokens=100))
        output = result.output_ids
        # an independent recomputation: one full forward, then each position's mask from a fresh matcher
        with torch.no_grad():
            logits = fp32.model(torch.tensor([[*ids, *output]])).logits[0, len(ids) - 1 : -1].float()
        info = xgrammar.TokenizerInfo.from_huggingface(
            fp32._tokenizer, vocab_size=fp32._preparer.vocab, stop_token_ids=sorted(EOS)
        )
        matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(info).compile_grammar(ADD_CALL))
        bitmask = xgrammar.allocate_token_bitmask(1, fp32._preparer.vocab)
        expected, raw = [], []
        for row, token in zip(logits, output, strict=True):
            raw.append(float(row[token] - torch.logsumexp(row, -1)))
            matcher.fill_next_token_bitmask(bitmask)
            masked = row.clone()[None]
            xgrammar.apply_token_bitmask_inplace(masked, bitmask)
            expected.append(float(masked[0, token] - torch.logsumexp(masked[0], -1)))
            assert matcher.accept_token(token)
        assert result.output_logprobs is not None
        assert max(abs(a - b) for a, b in zip(result.output_logprobs, expected, strict=True)) < 1e-3
        # masking only removes competitors: never below the unconstrained logprob, and far above it here
        assert all(c >= r - 1e-3 for c, r in zip(result.output_logprobs, raw, strict=True))
        assert max(c - r for c, r in zip(result.output_logprobs, raw, strict=True)) > 5.0


async def test_processed_logprobs_under_a_grammar(tiny_model_dir, tokenizer) -> None:
    backend = TransformersBackend(tiny_model_dir, dtype="float32", logprobs_mode="processed")
    try:
        result = await backend.generate(
            request(prompt(tokenizer), ADD_CALL, temperature=0.7, seed=1, max_new_tokens=100)
        )
        assert ADD_CALL_TEXT.fullmatch(body(tokenizer, result))
        check_logprobs(result)
    finally:
        backend.close()


async def test_mixed_batch_constrains_only_the_rows_with_a_grammar(
    fp32, tokenizer, batch_sizes, decode_together
) -> None:
    texts = ["Add 2 and 3.", "Hello there", "Add 10 and 20.", "Why is the sky"]
    reqs = [
        request(prompt(tokenizer, t), ADD_CALL if i % 2 == 0 else None, temperature=0.0, max_new_tokens=100)
        for i, t in enumerate(texts)
    ]
    alone = [await fp32.generate(r) for r in reqs]
    batch_sizes.clear()
    with decode_together(fp32, len(reqs)):  # the grammar rows reach the queue later (compiled off the loop)
        together = await asyncio.gather(*(fp32.generate(r) for r in reqs))
    assert max(batch_sizes) == 4
    for i, (a, b) in enumerate(zip(alone, together, strict=True)):
        assert a.output_ids == b.output_ids, f"row {i} depends on the batch"
        check_logprobs(b)
        if i % 2 == 0:
            assert ADD_CALL_TEXT.fullmatch(body(tokenizer, b))
        else:  # unconstrained: the random model's gibberish, no tool call
            assert "<tool_call>" not in tokenizer.decode(b.output_ids)


async def test_max_new_tokens_cuts_a_grammar_with_length(fp32, tokenizer) -> None:
    grammar = 'root ::= "<tool_call>\\n{\\"a\\": " [0-9]+ "}\\n</tool_call>"'
    result = await fp32.generate(request(prompt(tokenizer), grammar, temperature=0.0, max_new_tokens=24))
    assert result.finish_reason == "length" and len(result.output_ids) == 24
    check_logprobs(result)
    text = tokenizer.decode(result.output_ids)
    assert re.fullmatch(r'<tool_call>\n\{"a": [0-9]+', text), text


async def test_regex_in_sampling_extra(fp32, tokenizer) -> None:
    result = await fp32.generate(
        request(prompt(tokenizer), temperature=0.0, max_new_tokens=30, extra={"regex": r"The answer is [0-9]{1,2}\."})
    )
    assert re.fullmatch(r"The answer is [0-9]{1,2}\.", body(tokenizer, result))


@pytest.mark.parametrize(
    ("grammar", "extra", "field", "message"),
    [
        ('root ::= "a" b', {}, "grammar", 'Rule "b" is not defined'),
        ('start ::= "a"', {}, "grammar", 'root rule with name "root" is not found'),
        ('root ::= "a', {}, "grammar", "string literal"),
        (None, {"regex": "(ab"}, "sampling.extra.regex", "parenthesis is not closed"),
        (None, {"regex": 5}, "sampling.extra.regex", "must be a string"),
        ('root ::= "a"', {"regex": "a"}, "sampling.extra.regex", "not both"),
    ],
)
async def test_bad_constraint_raises_before_generation(
    fp32, tokenizer, batch_sizes, grammar, extra, field, message
) -> None:
    with pytest.raises(BackendRequestError, match=re.escape(message)) as caught:
        await fp32.generate(request(prompt(tokenizer), grammar, max_new_tokens=5, extra=extra))
    assert caught.value.field == field and caught.value.backend == "transformers"
    assert "[" not in str(caught.value).split(":")[0]  # xgrammar's "[time] file.cc:line:" prefix is gone
    assert batch_sizes == []  # nothing reached the decoding loop
    ok = await fp32.generate(request(prompt(tokenizer), 'root ::= "ok"', temperature=0.0, max_new_tokens=5))
    assert tokenizer.decode(ok.output_ids[:-1]) == "ok"


async def test_cancelled_constrained_request_stops_at_the_next_step(
    tiny_model_dir, tokenizer, batch_sizes, step_gate
) -> None:
    backend = TransformersBackend(tiny_model_dir, max_batch_size=1)
    try:
        step_gate.close()  # held before its first decoding step: it cannot reach its "." and end before the cancel
        long = asyncio.create_task(
            backend.generate(request(prompt(tokenizer), 'root ::= [a-z]+ "."', temperature=1.0, max_new_tokens=2000))
        )
        assert await asyncio.to_thread(step_gate.held.wait, 120)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        steps = len(batch_sizes)
        step_gate.open.set()
        async with asyncio.timeout(30):
            result = await backend.generate(
                request(prompt(tokenizer), temperature=0, max_new_tokens=3, ignore_eos=True)
            )
        assert len(result.output_ids) == 3
        assert len(batch_sizes) - steps <= 10
    finally:
        backend.close()
