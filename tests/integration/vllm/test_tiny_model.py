"""The tiny test model: the architecture asked for, eos ids, and a byte-identical rebuild."""

from __future__ import annotations

import filecmp
import json
import subprocess
from pathlib import Path

import pytest

from .conftest import SERVER_PYTHON

pytestmark = pytest.mark.integration


def test_tiny_model_config(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["vocab_size"] == 151669
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (64, 2, 128)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (2, 1, 64)
    assert config["tie_word_embeddings"] is True
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643]
    assert (tiny_model_dir / "tokenizer.json").is_file() and (tiny_model_dir / "tokenizer_config.json").is_file()


def test_tiny_model_rebuild_is_byte_identical(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    subprocess.run([SERVER_PYTHON, "-m", "tito_testing.tiny_model", str(out)], check=True, timeout=600)
    for name in ("model.safetensors", "tokenizer.json"):
        assert filecmp.cmp(tiny_model_dir / name, out / name, shallow=False), f"{name} differs on rebuild"
    # The shared cache may have been built by another environment's transformers (the embedded backend's
    # suite builds it too): the JSON configs record that version and nothing else that may differ.
    for name in ("config.json", "generation_config.json"):
        cached, rebuilt = (json.loads((d / name).read_text()) for d in (tiny_model_dir, out))
        cached.pop("transformers_version", None)
        rebuilt.pop("transformers_version", None)
        assert cached == rebuilt, f"{name} differs on rebuild"
