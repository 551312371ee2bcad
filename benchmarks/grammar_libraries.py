"""Compare the constrained-decoding libraries the embedded backend could use: llguidance, xgrammar, outlines-core.

Measures, on the vocabularies of SmolLM2-135M (49k) and the tiny random Qwen3 (151k): the tokenizer-info build,
the compile of a hermes tool-call grammar (one ``add(a, b)`` tool) and of a grammar with a generic JSON value
and an alternation over three tools, and the time to compute one token mask while walking a valid output.
outlines-core reads no EBNF: it gets the equivalent regex where one exists (a recursive JSON value has none).
Needs all three libraries installed beside tito-transformers (not a dependency of the project)::

    python benchmarks/grammar_libraries.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

HERMES = r"""root ::= "<tool_call>\n{\"name\": \"add\", \"arguments\": " args "}\n</tool_call>"
args ::= "{\"a\": " int ", \"b\": " int "}"
int ::= "-"? [0-9]+
"""
HERMES_REGEX = r'<tool_call>\n\{"name": "add", "arguments": \{"a": -?[0-9]+, "b": -?[0-9]+\}\}\n</tool_call>'
HERMES_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": -7}}\n</tool_call>'

JSON_TOOLS = r"""root ::= "<tool_call>\n" call "\n</tool_call>"
call ::= add_call | search_call | note_call
add_call ::= "{\"name\": \"add\", \"arguments\": " add "}"
search_call ::= "{\"name\": \"search\", \"arguments\": " object "}"
note_call ::= "{\"name\": \"note\", \"arguments\": " object "}"
add ::= "{\"a\": " number ", \"b\": " number "}"
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]*
"""
JSON_TEXT = (
    '<tool_call>\n{"name": "search", "arguments": {"query": "weather in Paris", "filters": '
    '{"days": [1, 2, 3], "metric": true, "note": null}}}\n</tool_call>'
)


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    """Best wall time of ``repeat`` calls (seconds) and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def walk(tokenizer: Any, text: str, mask: Callable[[], None], consume: Callable[[int], bool]) -> tuple[str, int]:
    """Median / max time of one mask computation along the tokens of ``text`` (each must be accepted)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    times = []
    for token in ids:
        start = time.perf_counter()
        mask()
        times.append(time.perf_counter() - start)
        if not consume(token):
            raise RuntimeError(f"token {token} {tokenizer.decode([token])!r} rejected")
    return f"{statistics.median(times) * 1e3:.3f} / {max(times) * 1e3:.3f} ms", len(ids)


def _untagged(text: str) -> str:
    """``text`` without the hermes tags (a grammar's literals or an output)."""
    return (
        text.replace("<tool_call>\\n", "")
        .replace("\\n</tool_call>", "")
        .replace("<tool_call>\n", "")
        .replace("\n</tool_call>", "")
    )


def bench_llguidance(tokenizer: Any, vocab: int) -> dict[str, Any]:
    """llguidance: GBNF translated to its Lark dialect by its own ``gbnf_to_lark``."""
    import llguidance
    import llguidance.hf
    import llguidance.torch
    from llguidance.gbnf_to_lark import gbnf_to_lark

    build, info = timed(lambda: llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab), 3)
    row: dict[str, Any] = {"tokenizer_info_s": build}
    for name, grammar, text in (("hermes", HERMES, HERMES_TEXT), ("json_tools", JSON_TOOLS, JSON_TEXT)):
        lark = gbnf_to_lark(grammar)
        compiled, matcher = timed(lambda lark=lark: llguidance.LLMatcher(info, lark), 5)
        if matcher.is_error():
            raise RuntimeError(matcher.get_error())
        bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
        try:
            step, n = walk(
                tokenizer,
                text,
                lambda m=matcher, b=bitmask: llguidance.torch.fill_next_token_bitmask(m, b),
                matcher.consume_token,
            )
        except RuntimeError as exc:
            # llguidance treats every added token (Qwen's `<tool_call>`) as special: a string literal never
            # matches it. Time the masks on the same grammar without the tags.
            row[f"{name}_walk"] = str(exc)
            matcher = llguidance.LLMatcher(info, gbnf_to_lark(_untagged(grammar)))
            step, n = walk(
                tokenizer,
                _untagged(text),
                lambda m=matcher, b=bitmask: llguidance.torch.fill_next_token_bitmask(m, b),
                matcher.consume_token,
            )
        row[f"{name}_compile_s"], row[f"{name}_mask_s"], row[f"{name}_tokens"] = compiled, step, n
    return row


def bench_xgrammar(tokenizer: Any, vocab: int) -> dict[str, Any]:
    """xgrammar: the GBNF text as is."""
    import xgrammar as xgr

    build, info = timed(lambda: xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab), 3)
    row: dict[str, Any] = {"tokenizer_info_s": build}
    for name, grammar, text in (("hermes", HERMES, HERMES_TEXT), ("json_tools", JSON_TOOLS, JSON_TEXT)):
        # a fresh compiler each time: its cache would otherwise make every compile after the first free
        compiled_s, compiled = timed(
            lambda g=grammar: xgr.GrammarCompiler(info, cache_enabled=False).compile_grammar(g), 5
        )
        matcher = xgr.GrammarMatcher(compiled)
        bitmask = xgr.allocate_token_bitmask(1, vocab)
        step, n = walk(tokenizer, text, lambda m=matcher, b=bitmask: m.fill_next_token_bitmask(b), matcher.accept_token)
        row[f"{name}_compile_s"], row[f"{name}_mask_s"], row[f"{name}_tokens"] = compiled_s, step, n
    return row


def bench_outlines(tokenizer: Any, vocab: int) -> dict[str, Any]:
    """outlines-core: regexes (it reads no grammar)."""
    import outlines_core
    import torch
    from outlines_core.json_schema import build_regex_from_schema

    def vocabulary() -> Any:
        # byte-level BPE: map each token's printable form back to its bytes
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        decode = {c: b for b, c in bytes_to_unicode().items()}
        tokens: dict[bytes, list[int]] = {}
        special = set(tokenizer.all_special_ids)
        for text, index in tokenizer.get_vocab().items():
            if index in special or index >= vocab:
                continue
            raw = bytes(decode[c] for c in text) if all(c in decode for c in text) else text.encode()
            tokens.setdefault(raw, []).append(index)
        return outlines_core.Vocabulary(tokenizer.eos_token_id, tokens)

    build, info = timed(vocabulary, 3)
    row: dict[str, Any] = {"tokenizer_info_s": build}
    # the nearest regex to the JSON grammar: schema-built, bounded nesting (outlines-core has no recursion)
    args = build_regex_from_schema('{"type": "object"}')
    tools = (
        r'<tool_call>\n\{"name": "add", "arguments": \{"a": -?[0-9]+, "b": -?[0-9]+\}\}\n</tool_call>|'
        rf'<tool_call>\n\{{"name": "(search|note)", "arguments": {args}\}}\n</tool_call>'
    )
    for name, regex, text in (("hermes", HERMES_REGEX, HERMES_TEXT), ("json_tools", tools, JSON_TEXT)):
        compiled_s, index = timed(lambda r=regex: outlines_core.Index(r, info), 3)
        guide = outlines_core.Guide(index)
        mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

        def consume(token: int, guide: Any = guide) -> bool:
            guide.advance(token)
            return True

        try:
            step, n = walk(
                tokenizer,
                text,
                lambda g=guide, m=mask: g.write_mask_into(m.data_ptr(), m.numel(), m.element_size()),
                consume,
            )
        except Exception as exc:  # the schema regex may not admit this text's whitespace
            step, n = f"walk failed: {exc}", 0
        row[f"{name}_compile_s"], row[f"{name}_mask_s"], row[f"{name}_tokens"] = compiled_s, step, n
    return row


def main() -> None:
    """Print one row per vocabulary and library."""
    from transformers import AutoTokenizer

    from tito_testing.tiny_model import build_tiny_qwen3
    from tito_transformers.models import build_smollm2

    for label, path in (("SmolLM2 (49k)", build_smollm2()), ("tiny Qwen3 (151k)", build_tiny_qwen3())):
        tokenizer = AutoTokenizer.from_pretrained(path)
        vocab = len(tokenizer)
        for lib, bench in (
            ("llguidance", bench_llguidance),
            ("xgrammar", bench_xgrammar),
            ("outlines-core", bench_outlines),
        ):
            try:
                row = bench(tokenizer, vocab)
            except Exception as exc:
                row = {"error": f"{type(exc).__name__}: {exc}"}
            shown = {k: (f"{v * 1000:.3f} ms" if isinstance(v, float) else v) for k, v in row.items()}
            print(f"{label:18} {lib:14} {shown}", flush=True)


if __name__ == "__main__":
    main()
