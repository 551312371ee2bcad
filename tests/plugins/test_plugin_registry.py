"""Finding backends and tool parsers by name: entry points, built-ins, switches, failures, conflicts."""

from __future__ import annotations

import importlib.metadata
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tito_core.backend import Backend, GenerateRequest, GenerateResult
from tito_core.errors import ConfigError, UnknownPluginError
from tito_core.plugins import (
    BackendSpec,
    PluginLoadError,
    PluginWarning,
    TitoPluginManager,
    ToolParserSpec,
    get_backend,
    get_tool_parser,
    hookimpl,
    isolated_plugin_manager,
    list_backends,
    list_tool_parsers,
    plugin_manager,
    temporary_plugin,
)
from tito_core.tool_parsers.base import ParsedOutput

FAKE_LABEL = "tito-fake-plugins 1.0"  # the fake distribution of conftest.py


class NullBackend(Backend):
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return GenerateResult(output_ids=[])


class BackendPlugin:
    """A plugin object registering one backend, as tests (and applications) may do in code."""

    def __init__(self, *specs: BackendSpec) -> None:
        self.specs = specs

    @hookimpl
    def tito_backends(self) -> Iterator[BackendSpec]:
        yield from self.specs


class ParserPlugin:
    def __init__(self, *specs: ToolParserSpec) -> None:
        self.specs = specs

    @hookimpl
    def tito_tool_parsers(self) -> Iterator[ToolParserSpec]:
        yield from self.specs


class UpperParser:
    name = "upper"

    def parse(self, text: str, tools: object = None) -> ParsedOutput:
        return ParsedOutput(content=text.upper())


# --- discovery ---------------------------------------------------------------------------------------


def test_echo_backend_is_discovered_through_its_installed_entry_point() -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group="tito")}
    assert "echo" in names, "examples/tito-backend-echo is not installed (pip install -e examples/tito-backend-echo)"
    from tito_backend_echo import EchoBackend

    assert "echo" in list_backends()
    assert "tito-backend-echo" in (plugin_manager().provider("backend", "echo") or "")
    backend = get_backend("echo", eos_token_id=7)
    assert isinstance(backend, EchoBackend)
    assert backend.eos_token_id == 7


def test_builtins_are_registered_like_any_plugin() -> None:
    assert {"hermes", "qwen_xml"} <= set(list_tool_parsers())
    assert plugin_manager().get_plugin("core") is sys.modules["tito_core.plugins.builtins"]


def test_an_installation_whose_metadata_names_the_old_builtins_module_still_loads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # tito-core's `core` entry point named `tito_core._builtins` before the built-ins moved into the plugins
    # package; an environment installed then keeps that metadata until the package is reinstalled.
    legacy = importlib.metadata.EntryPoint(name="core", value="tito_core._builtins", group="tito")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [legacy] if group == "tito" else [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "hermes" in list_tool_parsers()
    assert plugin_manager().get_plugin("core") is sys.modules["tito_core.plugins.builtins"]
    assert plugin_manager().failures == {}


def test_scripted_backend_is_discovered_through_the_tito_testing_entry_point() -> None:
    names = {ep.name for ep in importlib.metadata.entry_points(group="tito")}
    assert "scripted" in names, "packages/tito-testing is not installed (pip install -e packages/tito-testing)"
    assert list_backends()["scripted"].factory == "tito_testing.scripted:ScriptedBackend"
    assert "tito-testing" in (plugin_manager().provider("backend", "scripted") or "")
    assert plugin_manager().get_plugin("scripted") is sys.modules["tito_testing.plugin"]


def test_builtins_are_registered_when_autoload_is_off() -> None:
    with isolated_plugin_manager(autoload=False):
        assert list(list_backends()) == []  # the core registers no backend; scripted is tito-testing's
        assert list(list_tool_parsers()) == sorted(
            ["hermes", "qwen_xml", "llama3_json", "mistral", "glm", "kimi_k2", "deepseek_v3", "gpt_oss", "gemma4"]
        )


def test_manager_is_created_lazily_and_loads_once(manager: TitoPluginManager) -> None:
    assert plugin_manager() is manager
    first = manager.get_plugins()
    manager.load_plugins()
    plugin_manager()
    assert manager.get_plugins() == first


def test_hookimpls_match_the_specs() -> None:
    plugin_manager().check_pending()  # a misspelled hook name in any installed plugin fails here


def test_records_are_sorted_by_name(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good,echo")
    assert list(list_backends()) == sorted(list_backends())


# --- errors for unknown names ------------------------------------------------------------------------


def test_unknown_backend_lists_installed_backends() -> None:
    with pytest.raises(UnknownPluginError) as info:
        get_backend("nosuchengine")
    message = str(info.value)
    assert "unknown backend 'nosuchengine'" in message
    assert "echo" in message and "scripted" in message
    assert info.value.available == sorted(list_backends())
    assert isinstance(info.value, ConfigError)


@pytest.mark.parametrize("name", ["vllm", "sglang", "transformers"])
def test_missing_first_party_backend_gives_the_install_hint(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "echo")  # as if tito-vllm / tito-sglang were not installed
    with pytest.raises(UnknownPluginError) as info:
        get_backend(name)
    assert f'pip install "tito-core[{name}]"' in str(info.value)
    assert "echo" in str(info.value)


def test_unknown_name_suggests_a_close_match() -> None:
    with pytest.raises(UnknownPluginError, match="Did you mean 'echo'"):
        get_backend("ecoh")


def test_unknown_tool_parser_lists_installed_parsers() -> None:
    with pytest.raises(UnknownPluginError, match=r"unknown tool parser 'nope'; installed tool parsers: .*hermes"):
        get_tool_parser("nope")


def test_names_are_case_insensitive() -> None:
    assert isinstance(get_backend(" ECHO ", eos_token_id=1), Backend)


# --- environment switches ----------------------------------------------------------------------------


def test_disable_autoload_env_loads_only_builtins(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert list(list_backends()) == []
    with pytest.raises(UnknownPluginError):
        get_backend("echo")


def test_disable_autoload_env_accepts_false_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_DISABLE_PLUGIN_AUTOLOAD", "0")
    assert "echo" in list_backends()


def test_allow_list_env_loads_only_named_plugins(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good, echo")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither broken nor dupe is even imported
        assert set(list_backends()) == {"echo", "good", "lazy"}
    assert "plain" in list_tool_parsers()


def test_empty_allow_list_loads_no_entry_points(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "")
    assert list(list_backends()) == []


def test_allow_list_naming_a_missing_plugin_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "echo,notinstalled")
    with pytest.warns(PluginWarning, match="TITO_PLUGINS names 'notinstalled'"):
        assert "echo" in list_backends()


def test_manager_arguments_override_the_environment(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_DISABLE_PLUGIN_AUTOLOAD", "1")
    with isolated_plugin_manager(autoload=True, allow=["good"]):
        assert set(list_backends()) == {"good", "lazy"}


# --- broken plugins ----------------------------------------------------------------------------------


def test_broken_plugin_does_not_break_others(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good,broken,echo,scripted")
    with pytest.warns(PluginWarning, match=rf"broken \({FAKE_LABEL}\) could not be loaded"):
        backends = list_backends()
    assert {"good", "echo", "scripted"} <= set(backends)
    assert isinstance(get_backend("good"), Backend)
    failure = plugin_manager().failures["broken"]
    assert isinstance(failure.error, ImportError)


def test_selecting_a_broken_plugin_raises_a_clear_error(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good,broken")
    with pytest.warns(PluginWarning):
        plugin_manager()
    with pytest.raises(
        PluginLoadError, match=r"backend 'broken' is provided by plugin broken .* failed to load"
    ) as info:
        get_backend("broken")
    assert "needs a library that is not installed" in str(info.value)
    assert isinstance(info.value.__cause__, ImportError)
    assert isinstance(info.value, ImportError) and isinstance(info.value, ConfigError)


def test_unknown_name_mentions_plugins_that_failed(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "broken")
    with pytest.warns(PluginWarning):
        plugin_manager()
    with pytest.raises(UnknownPluginError, match=r"Plugins that failed to load: broken"):
        get_backend("other")


def test_plugin_whose_hook_raises_is_skipped(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good,hookerror")
    with pytest.warns(PluginWarning, match=r"hookerror .* failed in tito_backends\(\).*hook exploded"):
        assert "good" in list_backends()
    assert "hookerror" in plugin_manager().failures


def test_plugin_yielding_the_wrong_record_type_is_skipped() -> None:
    class Wrong:
        @hookimpl
        def tito_backends(self) -> Iterator[object]:
            yield ToolParserSpec("oops", UpperParser)

    with temporary_plugin(Wrong(), name="wrong"), pytest.warns(PluginWarning, match="not a BackendSpec"):
        assert "oops" not in list_backends()


def test_missing_factory_module_fails_only_when_selected() -> None:
    plugin = BackendPlugin(BackendSpec("ghost", "tito_no_such_module_anywhere:Ghost"))
    with temporary_plugin(plugin, name="ghosts"):
        assert "ghost" in list_backends()
        with pytest.raises(PluginLoadError, match=r"'ghost' from plugin ghosts could not be loaded .*tito_no_such"):
            get_backend("ghost")


def test_missing_first_party_adapter_module_gives_the_install_hint() -> None:
    plugin = BackendPlugin(BackendSpec("vllm", "tito_vllm_not_installed.backend:VLLMBackend"))
    expected = r'pip install "tito-core\[vllm\]"'
    with (
        isolated_plugin_manager(autoload=False),
        temporary_plugin(plugin, name="fake-vllm"),
        pytest.raises(PluginLoadError, match=expected),
    ):
        get_backend("vllm")


# --- conflicts ---------------------------------------------------------------------------------------


def test_duplicate_backend_names_name_both_plugins(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good,dupe")
    with pytest.raises(ConfigError) as info:
        list_backends()
    message = str(info.value)
    assert "backend 'good' is provided by two plugins" in message
    assert f"good ({FAKE_LABEL})" in message and f"dupe ({FAKE_LABEL})" in message


def test_a_plugin_cannot_replace_a_builtin() -> None:
    plugin = ParserPlugin(ToolParserSpec("hermes", UpperParser))
    expected = r"tool parser 'hermes' is provided by two plugins: .*core.*impostor"
    with temporary_plugin(plugin, name="impostor"), pytest.raises(ConfigError, match=expected):
        get_tool_parser("hermes")
    assert "hermes" in list_tool_parsers()  # unregistered again: the conflict is gone


def test_duplicate_with_installed_entry_point_names_its_distribution() -> None:
    plugin = BackendPlugin(BackendSpec("echo", NullBackend))
    expected = r"echo \(tito-backend-echo [^)]*\) and my-echo"
    with temporary_plugin(plugin, name="my-echo"), pytest.raises(ConfigError, match=expected):
        get_backend("echo", eos_token_id=1)


# --- laziness ----------------------------------------------------------------------------------------


def test_string_factories_are_imported_only_when_selected(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good")
    monkeypatch.delitem(sys.modules, "tito_fake_lazy_impl", raising=False)
    assert list_backends()["lazy"].factory == "tito_fake_lazy_impl:LazyBackend"
    assert "tito_fake_lazy_impl" not in sys.modules
    backend = get_backend("lazy")
    assert type(backend).__name__ == "LazyBackend"
    assert "tito_fake_lazy_impl" in sys.modules


def test_listing_builtins_imports_none_of_their_factories() -> None:
    with isolated_plugin_manager(autoload=False):
        specs: dict[str, BackendSpec | ToolParserSpec] = {**list_backends(), **list_tool_parsers()}
    for spec in specs.values():
        assert isinstance(spec.factory, str), f"{spec.name}: built-ins must use lazy import strings"


# --- records, options, results -----------------------------------------------------------------------


def test_spec_names_are_normalised_and_validated() -> None:
    assert BackendSpec(" My-Engine ", NullBackend).name == "my-engine"
    with pytest.raises(ConfigError, match="invalid backend name"):
        BackendSpec("two words", NullBackend)
    with pytest.raises(ConfigError, match="not a 'module:attribute' string"):
        BackendSpec("x", "module_without_attribute")
    with pytest.raises(ConfigError, match="must be callable"):
        ToolParserSpec("x", 42)  # type: ignore[arg-type]
    spec = BackendSpec("x", NullBackend)
    with pytest.raises(AttributeError):
        spec.name = "y"  # type: ignore[misc]


def test_unknown_backend_option_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"invalid options for backend 'echo'.*accepted options: context_length"):
        get_backend("echo", eos_token_id=1, temprature=0.5)


def test_option_typo_names_the_closest_option_of_the_example_plugin() -> None:
    with pytest.raises(ConfigError) as info:
        get_backend("echo", eos_token_id=1, windw=4)
    assert str(info.value) == (
        "invalid options for backend 'echo': unknown option `windw`; did you mean `window`? "
        "(accepted options: context_length, delay_s, eos_token_id, window)"
    )


def test_missing_required_option_lists_the_options() -> None:
    with pytest.raises(ConfigError) as info:
        get_backend("echo", window=4)
    assert "missing a required argument: 'eos_token_id'" in str(info.value)
    assert "accepted options: context_length, delay_s, eos_token_id, window" in str(info.value)


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_first_party_adapter_option_typo(name: str) -> None:
    pytest.importorskip(f"tito_{name}")
    with pytest.raises(ConfigError) as info:
        get_backend(name, base_ulr="http://127.0.0.1:1")
    message = str(info.value)
    assert message.startswith(f"invalid options for backend {name!r}: unknown option `base_ulr`")
    assert "did you mean `base_url`?" in message
    assert "accepted options: " in message and "timeout" in message


def test_vllm_chat_mode_option_typo() -> None:
    pytest.importorskip("tito_vllm")
    with pytest.raises(ConfigError, match="unknown option `timout`; did you mean `timeout`"):
        get_backend("vllm", mode="chat", timout=3.0)


class _Base(NullBackend):
    def __init__(self, base_url: str = "http://x", *, timeout: float = 1.0) -> None:
        self.base_url, self.timeout = base_url, timeout


class _Passing(_Base):
    """Takes **kwargs only to hand them on: its options are its own plus _Base's."""

    def __init__(self, *, model: str = "m", **kwargs: float | str) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.model = model


class _Open(NullBackend):
    """Keeps any keyword: nothing can be checked."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs


def _open_factory(**kwargs: object) -> Backend:
    return _Open(**kwargs)


def _refusing_factory(**kwargs: object) -> Backend:
    return _Base(**kwargs)  # type: ignore[arg-type]


def test_kwargs_chain_of_a_class_is_followed() -> None:
    with temporary_plugin(BackendPlugin(BackendSpec("passing", _Passing)), name="passing"):
        backend = get_backend("passing", model="q", base_url="http://y", timeout=2.0)
        assert isinstance(backend, _Passing) and (backend.model, backend.base_url, backend.timeout) == (
            "q",
            "http://y",
            2.0,
        )
        with pytest.raises(ConfigError) as info:
            get_backend("passing", timeot=2.0)
    assert "unknown option `timeot`; did you mean `timeout`? (accepted options: base_url, model, timeout)" in str(
        info.value
    )


def test_open_ended_factories_are_let_through() -> None:
    plugin = BackendPlugin(BackendSpec("open", _Open), BackendSpec("openfn", _open_factory))
    with temporary_plugin(plugin, name="open"):
        open_backend = get_backend("open", anything=1)
        function_backend = get_backend("openfn", anything=2)
    assert isinstance(open_backend, _Open) and open_backend.kwargs == {"anything": 1}
    assert isinstance(function_backend, _Open) and function_backend.kwargs == {"anything": 2}


def test_keyword_refused_behind_kwargs_is_still_a_config_error() -> None:
    with temporary_plugin(BackendPlugin(BackendSpec("refusing", _refusing_factory)), name="refusing"):
        assert isinstance(get_backend("refusing", timeout=3.0), _Base)
        with pytest.raises(
            ConfigError, match=r"invalid options for backend 'refusing': unknown option `timout`"
        ) as info:
            get_backend("refusing", timout=3.0)
    assert isinstance(info.value.__cause__, TypeError)


def test_other_type_errors_from_a_factory_are_not_rewritten() -> None:
    def broken(**kwargs: object) -> Backend:
        raise TypeError("unsupported operand type(s)")

    plugin = BackendPlugin(BackendSpec("broken", broken))
    with temporary_plugin(plugin, name="broken"), pytest.raises(TypeError, match="unsupported operand") as info:
        get_backend("broken", a=1)
    assert not isinstance(info.value, ConfigError)


def test_tool_parser_option_typo(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good")
    with pytest.raises(ConfigError, match=r"tool parser 'plain': unknown option `strp`; did you mean `strip`"):
        get_tool_parser("plain", strp=False)


def test_factory_must_return_a_backend() -> None:
    plugin = BackendPlugin(BackendSpec("notabackend", lambda: object()))  # type: ignore[arg-type,return-value]
    with temporary_plugin(plugin, name="bad"), pytest.raises(TypeError, match="not a Backend"):
        get_backend("notabackend")


def test_tool_parser_by_name_with_options(fake_site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_PLUGINS", "good")
    parser = get_tool_parser("plain", strip=False)
    assert parser.parse("  hi ").content == "  hi "


def test_builtin_tool_parsers_by_name() -> None:
    pytest.importorskip("tito_core.tool_parsers.hermes")
    pytest.importorskip("tito_core.tool_parsers.qwen_xml")
    assert get_tool_parser("hermes").name == "hermes"
    assert get_tool_parser("qwen_xml").name == "qwen_xml"


def test_scripted_backend_by_name() -> None:
    pytest.importorskip("tito_testing.scripted")
    from tito_testing.scripted import ScriptedBackend

    spec = list_backends()["scripted"]
    assert plugin_manager()._resolve("backend", spec, "scripted") is ScriptedBackend


def test_built_tool_parser_is_returned_as_is() -> None:
    parser = UpperParser()
    assert get_tool_parser(parser) is parser
    with pytest.raises(ConfigError, match="already-built"):
        get_tool_parser(parser, strict=True)
    with pytest.raises(TypeError):
        get_tool_parser(42)  # type: ignore[arg-type]


def test_temporary_plugin_is_removed_afterwards() -> None:
    with temporary_plugin(ParserPlugin(ToolParserSpec("upper", UpperParser)), name="upper-plugin") as name:
        assert name == "upper-plugin"
        assert get_tool_parser("upper").parse("a").content == "A"
    assert "upper" not in list_tool_parsers()
    assert plugin_manager().get_plugin("upper-plugin") is None


def test_isolated_manager_restores_the_previous_one(manager: TitoPluginManager) -> None:
    with isolated_plugin_manager(autoload=False) as inner:
        assert plugin_manager() is inner
    assert plugin_manager() is manager
