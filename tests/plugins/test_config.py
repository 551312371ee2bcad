"""TitoConfig: loading from TOML, mappings and the environment; clear errors; building objects."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tito_core.backend import SamplingParams
from tito_core.config import TitoConfig, load_config
from tito_core.errors import ConfigError
from tito_core.model_setup import ModelSettings
from tito_core.plugins import ToolParserSpec, hookimpl, temporary_plugin
from tito_core.tool_parsers.base import ParsedOutput

FULL = """
backend = "echo"
backend_options = { eos_token_id = 151645, window = 4 }
tokenizer = "Qwen/Qwen3-0.6B"
tool_parser = "qwen_xml"
tool_parser_options = { strict = true }
sampling = { temperature = 1, top_p = 0.95, max_new_tokens = 512, stop = ["</answer>"] }
chat_template = "{{ messages }}"
chat_template_kwargs = { enable_thinking = false }
context_window_limit = 32768
return_prompt_logprobs = true
return_routed_experts = true
"""


def write(tmp_path: Path, text: str, name: str = "tito.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_top_level_keys(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, FULL))
    assert config.backend == "echo"
    assert config.backend_options == {"eos_token_id": 151645, "window": 4}
    assert config.tokenizer == "Qwen/Qwen3-0.6B"
    assert config.tool_parser == "qwen_xml"
    assert config.tool_parser_options == {"strict": True}
    assert config.chat_template_kwargs == {"enable_thinking": False}
    assert config.context_window_limit == 32768
    assert config.return_prompt_logprobs and config.return_routed_experts
    assert config.sampling_params() == SamplingParams(
        temperature=1.0, top_p=0.95, max_new_tokens=512, stop=("</answer>",)
    )


def test_tito_table_in_a_larger_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[trainer]\nlr = 1e-6\n\n[tito]\nbackend = "sglang"\n\n[tito.sampling]\ntemperature = 0.7\n')
    config = load_config(str(path))
    assert config.backend == "sglang"
    assert config.sampling == {"temperature": 0.7}


def test_pyproject_tool_table(tmp_path: Path) -> None:
    path = write(tmp_path, '[project]\nname = "x"\n\n[tool.tito]\nbackend = "vllm"\n', "pyproject.toml")
    assert load_config(path).backend == "vllm"
    with pytest.raises(ConfigError, match=r"pyproject.toml: no \[tool.tito\] table"):
        load_config(write(tmp_path, '[project]\nname = "x"\n', "pyproject.toml"))


def test_defaults_from_a_mapping() -> None:
    config = load_config({"backend": "vllm"})
    assert config == TitoConfig(backend="vllm")
    assert config.tool_parser == "hermes"
    assert config.sampling_params() == SamplingParams()
    assert config.backend_options == {} and config.tokenizer is None and config.context_window_limit is None


def test_config_is_frozen() -> None:
    config = load_config({"backend": "vllm"})
    with pytest.raises(AttributeError):
        config.backend = "sglang"  # type: ignore[misc]


def test_env_config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_CONFIG", str(write(tmp_path, 'backend = "sglang"\n')))
    assert load_config().backend == "sglang"


def test_env_backend_overrides_every_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_BACKEND", "echo")
    assert load_config(write(tmp_path, 'backend = "sglang"\n')).backend == "echo"
    assert load_config({"backend": "vllm", "tokenizer": "t"}).backend == "echo"
    assert load_config({"tokenizer": "t"}).backend == "echo"  # supplies the required key
    assert load_config().backend == "echo"  # enough on its own


def test_no_source_and_no_environment() -> None:
    with pytest.raises(ConfigError, match="TITO_CONFIG"):
        load_config()


def test_unknown_key_names_file_key_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend = "vllm"\ntool_parsr = "hermes"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    assert "unknown key `tool_parsr`" in message and "did you mean `tool_parser`" in message


def test_unknown_key_in_tito_table_is_dotted(tmp_path: Path) -> None:
    path = write(tmp_path, '[tito]\nbackend = "vllm"\nbakend_options = {}\n')
    with pytest.raises(ConfigError, match=r"unknown key `tito.bakend_options`; did you mean `backend_options`"):
        load_config(path)


def test_wrong_type_names_file_and_key(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend = "vllm"\ncontext_window_limit = "large"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "Expected `int | null`, got `str`" in str(info.value)
    assert "`context_window_limit`" in str(info.value)


def test_unknown_sampling_key(tmp_path: Path) -> None:
    path = write(tmp_path, '[tito]\nbackend = "vllm"\n[tito.sampling]\ntemprature = 0.5\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message
    assert "unknown key `sampling.temprature`" in message and "did you mean `temperature`" in message


def test_wrong_sampling_value_type() -> None:
    with pytest.raises(ConfigError, match=r"invalid `sampling`: Expected `int \| null`.*`sampling.max_new_tokens`"):
        load_config({"backend": "vllm", "sampling": {"max_new_tokens": "many"}})


def test_sampling_range_error_names_the_file_and_key_once(tmp_path: Path) -> None:
    path = write(tmp_path, '[tito]\nbackend = "vllm"\n[tito.sampling]\nmax_new_tokens = -5\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: `sampling.max_new_tokens` must be an int >= 0 (or None for the engine's default), got -5"
    )


def test_config_and_model_share_one_sampling_schema() -> None:
    from tito_core.backend import sampling_params

    mapping = {"temperature": 0.7, "top_k": -1, "stop": ["</a>"]}
    assert load_config({"backend": "vllm", "sampling": mapping}).sampling_params() == sampling_params(mapping)
    for bad in ({"temprature": 0.7}, {"top_p": 0}, {"stop": "x"}):
        with pytest.raises(ConfigError) as direct:
            sampling_params(bad)
        with pytest.raises(ConfigError) as from_config:
            load_config({"backend": "vllm", "sampling": bad})
        assert str(from_config.value) == f"config: {direct.value}"


def test_invalid_values() -> None:
    with pytest.raises(ConfigError, match="`context_window_limit` must be a positive integer"):
        load_config({"backend": "vllm", "context_window_limit": 0})
    with pytest.raises(ConfigError, match="`backend` must name a backend"):
        load_config({"backend": " "})
    with pytest.raises(ConfigError, match="missing required key `backend`"):
        load_config({"tokenizer": "x"})


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ConfigError, match=r"unknown key `sampling\.nucleus`"):
        TitoConfig(backend="vllm", sampling={"nucleus": 0.9})


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "backend = \n")
    with pytest.raises(ConfigError, match=rf"{path.name}: invalid TOML"):
        load_config(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def test_round_trips_through_msgspec() -> None:
    config = load_config({"backend": "echo", "sampling": {"temperature": 0.5}, "backend_options": {"a": 1}})
    assert msgspec.json.decode(msgspec.json.encode(config), type=TitoConfig) == config


def test_create_backend_uses_the_registry() -> None:
    from tito_backend_echo import EchoBackend

    backend = load_config({"backend": "echo", "backend_options": {"eos_token_id": 5, "window": 3}}).create_backend()
    assert isinstance(backend, EchoBackend)
    assert (backend.eos_token_id, backend.window) == (5, 3)


def test_create_backend_with_bad_options() -> None:
    config = load_config({"backend": "echo", "backend_options": {"eos_token_id": 5, "windw": 3}})
    with pytest.raises(ConfigError) as info:
        config.create_backend()
    assert str(info.value) == (
        "invalid options for backend 'echo': unknown option `windw`; did you mean `window`? "
        "(accepted options: context_length, delay_s, eos_token_id, window)"
    )


def test_create_backend_with_a_typo_in_an_adapter_option(tmp_path: Path) -> None:
    pytest.importorskip("tito_sglang")
    path = write(tmp_path, '[tito]\nbackend = "sglang"\n[tito.backend_options]\nbase_ulr = "http://127.0.0.1:1"\n')
    with pytest.raises(ConfigError, match=r"unknown option `base_ulr`; did you mean `base_url`\?"):
        load_config(path).create_backend()


class _Parser:
    name = "cfgtest"

    def __init__(self, *, flag: bool = False) -> None:
        self.flag = flag

    def parse(self, text: str, tools: Any = None) -> ParsedOutput:
        return ParsedOutput(content=text)


class _ParserPlugin:
    @hookimpl
    def tito_tool_parsers(self) -> Any:
        yield ToolParserSpec("cfgtest", _Parser)


@pytest.fixture
def fake_model_module(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Stand in for tito_core.strands_front.model so create_model is tested on its own."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class TitoModel:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append((args, kwargs))

    module = types.ModuleType("tito_core.strands_front.model")
    module.TitoModel = TitoModel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tito_core.strands_front.model", module)
    return calls


@pytest.fixture
def tiny_tokenizer_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A four-word tokenizer saved as a model directory (loads in milliseconds, no hub)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tito_core.tokenizers import clear_tokenizer_cache

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "hello": 1, "world": 2}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer"
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(str(path))
    clear_tokenizer_cache()
    return path


def test_create_model_passes_every_setting(fake_model_module: list[Any], tiny_tokenizer_dir: Path) -> None:
    from tito_core.tokenizers import load_tokenizer

    config = load_config(
        {
            "backend": "echo",
            "backend_options": {"eos_token_id": 5},
            "tokenizer": str(tiny_tokenizer_dir),
            "tool_parser": "cfgtest",
            "tool_parser_options": {"flag": True},
            "sampling": {"temperature": 0.6},
            "chat_template": "T",
            "chat_template_kwargs": {"enable_thinking": True},
            "context_window_limit": 4096,
            "return_prompt_logprobs": True,
            "render_mode": "full",
            "escape_special_text": True,
            "tool_choice": "any",
            "processor": "/models/vl",
            "max_images": 3,
        }
    )
    with temporary_plugin(_ParserPlugin(), name="cfgtest"):
        config.create_model()
    [(args, kwargs)] = fake_model_module
    assert type(args[0]).__name__ == "EchoBackend"
    assert args[1] is load_tokenizer(tiny_tokenizer_dir)  # loaded through the process-wide cache
    settings = kwargs.pop("settings")  # the model's setup (ModelSetup) looks the parser up, with its options
    assert kwargs == {"rollout_id": None}
    assert type(settings) is ModelSettings  # the settings alone, not the config they came from
    assert settings == ModelSettings(
        tool_parser="cfgtest",
        tool_parser_options={"flag": True},
        sampling={"temperature": 0.6},
        chat_template="T",
        chat_template_kwargs={"enable_thinking": True},
        context_window_limit=4096,
        return_prompt_logprobs=True,
        render_mode="full",
        escape_special_text=True,
        tool_choice="any",
        processor="/models/vl",
        max_images=3,
    )


def test_create_model_with_a_shared_backend_and_loaded_tokenizer(fake_model_module: list[Any]) -> None:
    config = load_config({"backend": "nonexistent", "tool_parser": "cfgtest"})
    shared, tokenizer = object(), object()
    with temporary_plugin(_ParserPlugin(), name="cfgtest"):
        config.create_model(shared, tokenizer=tokenizer)  # type: ignore[arg-type]
    [(args, _)] = fake_model_module
    assert args[0] is shared and args[1] is tokenizer


def test_models_from_one_config_share_one_tokenizer(fake_model_module: list[Any], tiny_tokenizer_dir: Path) -> None:
    config = load_config(
        {"backend": "echo", "backend_options": {"eos_token_id": 5}, "tokenizer": str(tiny_tokenizer_dir)}
    )
    for _ in range(3):
        config.create_model()
    tokenizers = [args[1] for args, _ in fake_model_module]
    assert len(tokenizers) == 3 and tokenizers[0] is tokenizers[1] is tokenizers[2]
    assert tokenizers[0].encode("hello world", add_special_tokens=False) == [1, 2]


def test_create_model_with_a_missing_tokenizer_path(fake_model_module: list[Any], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    config = load_config({"backend": "echo", "backend_options": {"eos_token_id": 5}, "tokenizer": str(missing)})
    with pytest.raises(ConfigError, match=rf"tokenizer path '{missing}' does not exist"):
        config.create_model()
    assert fake_model_module == []


def test_create_model_needs_a_tokenizer(fake_model_module: list[Any]) -> None:
    with pytest.raises(ConfigError, match="`tokenizer` is not set"):
        load_config({"backend": "echo"}).create_model()
