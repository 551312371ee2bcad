"""tito_core.integrations without their libraries: lazy imports, the error that says what to install, and the
config hook they use (a TitoModel subclass built from a config)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tito_core import TitoModel, load_config
from tito_core.errors import ConfigError
from tito_core.integrations import strands_env
from tito_testing.tokenizers import load_qwen_tokenizer, qwen_tokenizer_dir


def test_the_strands_env_module_does_not_import_strands_env():
    code = (
        "import sys, tito_core.integrations.strands_env;"
        "print(sorted(m for m in ('strands_env', 'strands_sglang') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_using_it_without_strands_env_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "strands_env.core.types", None)  # importing it now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install strands-env"):
        strands_env.termination_reason("completed", None)


class Tagged(TitoModel):
    pass


def test_a_config_builds_the_model_class_it_is_given() -> None:
    tokenizer = load_qwen_tokenizer("qwen3")
    config = load_config(
        {
            "backend": "scripted",
            "tokenizer": str(qwen_tokenizer_dir("qwen3")),
            "backend_options": {"tokenizer": tokenizer},
        }
    )
    assert type(config.create_model(tokenizer=tokenizer, model_class=Tagged)) is Tagged
    assert type(config.create_model(tokenizer=tokenizer)) is TitoModel
