"""One model setup for every front: ``TitoModel``, ``TitoConfig.create_model`` and the gateway build the same parts.

The three used to build the tokenizer, template, tool parser and options each on its own, and drifted: the
gateway inferred ``tool_parser = "auto"`` while ``create_model`` refused it. Each front now asks
:class:`~tito_core.model_setup.ModelSetup`; these tests build all three from one config and compare the parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tito_core.config import TitoConfig, load_config
from tito_core.errors import ConfigError
from tito_core.gateway import Gateway
from tito_core.model_setup import ModelSettings, ModelSetup
from tito_core.strands_front.model import TitoModel
from tito_core.tool_parsers.hermes import HermesToolParser
from tito_core.tool_parsers.qwen_xml import QwenXMLToolParser
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import qwen_tokenizer_dir
from tito_testing.vision import tiny_image_processor, vl_chat_template


def qwen3_config(**options: Any) -> TitoConfig:
    return TitoConfig(backend="scripted", tokenizer=str(qwen_tokenizer_dir("qwen3")), **options)


def parts(setup: ModelSetup) -> tuple[Any, ...]:
    return (type(setup.tool_parser), setup.renderer, setup.vision, setup.options, setup.render_mode)


async def three_setups(config: TitoConfig, tokenizer: Any, processor: Any = None) -> list[ModelSetup]:
    backend = ScriptedBackend(tokenizer, [])
    direct = config.model_setup(tokenizer, processor=processor)
    model = config.create_model(backend, tokenizer=tokenizer)
    gateway = Gateway(config, tokenizer=tokenizer, backend=backend, processor=processor)
    await gateway.prepare()
    assert gateway.setup is not None
    return [direct, model.setup, gateway.setup]


@pytest.mark.parametrize(
    ("template", "parser"),
    [(None, HermesToolParser), ("vl", QwenXMLToolParser)],
    ids=["qwen3-template", "qwen3.5-template"],
)
async def test_auto_tool_parser_is_the_same_on_every_front(qwen3_tokenizer: Any, template: Any, parser: type) -> None:
    options: dict[str, Any] = {"tool_parser": "auto", "sampling": {"temperature": 0.5, "max_new_tokens": 7}}
    if template == "vl":
        options["chat_template"] = vl_chat_template()
    setups = await three_setups(qwen3_config(**options), qwen3_tokenizer)
    assert {type(setup.tool_parser) for setup in setups} == {parser}
    assert [parts(setup) for setup in setups] == [parts(setups[0])] * 3
    assert setups[0].options.sampling.temperature == 0.5
    assert setups[0].options.sampling.max_new_tokens == 7


async def test_every_option_reaches_every_front(qwen3_tokenizer: Any, tmp_path: Path) -> None:
    tiny_image_processor().save_pretrained(tmp_path)  # a vision model's processor directory
    config = qwen3_config(
        processor=str(tmp_path),
        tool_parser="qwen_xml",
        chat_template=vl_chat_template(),
        chat_template_kwargs={"enable_thinking": False},
        context_window_limit=4096,
        return_prompt_logprobs=True,
        tool_choice="any",
        render_mode="full",
        escape_special_text=True,
        max_images=3,
    )
    setups = await three_setups(config, qwen3_tokenizer)
    assert [parts(setup) for setup in setups] == [parts(setups[0])] * 3
    setup = setups[0]
    assert setup.options.context_window_limit == 4096 and setup.options.return_prompt_logprobs
    assert setup.options.tool_choice == {"any": {}}
    assert setup.render_mode == "full" and setup.renderer.escape_special_text
    assert setup.vision is not None and setup.vision.max_images == 3
    assert setup.never_sample and set(setup.never_sample) <= set(range(setup.renderer.vocab_size))


def test_model_arguments_and_config_give_one_setup(qwen3_tokenizer: Any) -> None:
    model = TitoModel(ScriptedBackend(qwen3_tokenizer, []), qwen3_tokenizer, tool_parser="auto", sampling={"top_k": 5})
    setup = qwen3_config(tool_parser="auto", sampling={"top_k": 5}).model_setup(qwen3_tokenizer)
    assert parts(model.setup) == parts(setup)
    assert model.renderer is setup.renderer and model.tool_parser.__class__ is setup.tool_parser.__class__


def test_setup_errors_name_the_problem(qwen3_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="only used when the tool parser is given by name"):
        ModelSetup.build(qwen3_tokenizer, tool_parser=HermesToolParser(), tool_parser_options={"strict": True})
    with pytest.raises(ConfigError, match=r"unknown tool parser.*hermse"):
        qwen3_config(tool_parser="hermse").model_setup(qwen3_tokenizer)
    with pytest.raises(ConfigError, match="`context_window_limit` must be a positive integer"):
        ModelSetup.build(qwen3_tokenizer, context_window_limit=0)
    with pytest.raises(ConfigError, match="on_prefix_mismatch must be"):
        ModelSetup.build(qwen3_tokenizer, on_prefix_mismatch="ignore")
    with pytest.raises(ConfigError, match="`tokenizer` is not set"):
        TitoConfig(backend="scripted").model_setup()


async def test_the_settings_are_declared_once(qwen3_tokenizer: Any) -> None:
    """ModelSettings names every setting: each is a config key and a TitoModel option, and reaches every front.

    ``return_logprobs`` and ``on_prefix_mismatch`` were TitoModel's options only: a config could not hold them.
    """
    assert set(ModelSettings.__struct_fields__) <= set(TitoConfig.__struct_fields__)
    config = qwen3_config(return_logprobs=False, on_prefix_mismatch="error", max_images=5)
    for setup in await three_setups(config, qwen3_tokenizer):
        assert not setup.options.return_logprobs and setup.on_prefix_mismatch == "error"
    model = TitoModel(ScriptedBackend(qwen3_tokenizer, []), qwen3_tokenizer, settings=config, tool_parser="qwen_xml")
    assert isinstance(model.tool_parser, QwenXMLToolParser) and model.setup.on_prefix_mismatch == "error"
    with pytest.raises(ConfigError, match=r"unknown model setting `tool_parsr`; did you mean `tool_parser`"):
        TitoModel(ScriptedBackend(qwen3_tokenizer, []), qwen3_tokenizer, tool_parsr="hermes")
    with pytest.raises(ConfigError, match="render_mode must be 'auto', 'incremental' or 'full', not 'partial'"):
        ModelSetup.build(qwen3_tokenizer, render_mode="partial")
    with pytest.raises(ConfigError, match="`tool_parser` must name a tool parser plugin, got 5"):
        load_config({"backend": "scripted", "tool_parser": 5})
