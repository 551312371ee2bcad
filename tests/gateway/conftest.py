"""A gateway on the scripted backend (offline Qwen3 tokenizer), started on loopback, and an OpenAI client for it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tito_core.config import TitoConfig
from tito_core.gateway import Gateway
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import qwen_tokenizer_dir


class GrammarBackend(ScriptedBackend):
    """A scripted backend that says it applies grammars (the script must follow them)."""

    supports_grammar = True


def config(**options: Any) -> TitoConfig:
    return TitoConfig(backend="scripted", tokenizer=str(qwen_tokenizer_dir("qwen3")), **options)


@pytest.fixture
async def backend(qwen3_tokenizer: Any) -> GrammarBackend:
    return GrammarBackend(qwen3_tokenizer, [])


@pytest.fixture
async def gateway(backend: GrammarBackend, qwen3_tokenizer: Any, tmp_path: Any) -> AsyncIterator[Gateway]:
    gw = Gateway(config(), tokenizer=qwen3_tokenizer, backend=backend, output=tmp_path / "out.jsonl")
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()
