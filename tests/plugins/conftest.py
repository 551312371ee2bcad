"""Fixtures for plugin tests: a fresh plugin manager per test, a clean environment, fake plugins."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tito_core.plugins import TitoPluginManager, isolated_plugin_manager

# A fake distribution on sys.path: a dist-info folder with entry points, plus the plugin modules.
# Each module is a plugin as a third party would write it.
FAKE_DIST = "tito_fake_plugins-1.0.dist-info"
FAKE_LABEL = "tito-fake-plugins 1.0"
FAKE_MODULES = {
    "tito_fake_good": """
        from tito_core.backend import Backend, GenerateResult
        from tito_core.plugins import BackendSpec, ToolParserSpec, hookimpl
        from tito_core.tool_parsers.base import ParsedOutput


        class GoodBackend(Backend):
            name = "good"

            def __init__(self, *, url="local"):
                self.url = url

            async def generate(self, request):
                return GenerateResult(output_ids=[1], output_logprobs=[0.0], finish_reason="stop")


        class PlainParser:
            name = "plain"

            def __init__(self, *, strip=True):
                self.strip = strip

            def parse(self, text, tools=None):
                return ParsedOutput(content=text.strip() if self.strip else text)


        @hookimpl
        def tito_backends():
            yield BackendSpec("good", GoodBackend, "a backend that loads")
            yield BackendSpec("lazy", "tito_fake_lazy_impl:LazyBackend", "imported only when selected")


        @hookimpl
        def tito_tool_parsers():
            yield ToolParserSpec("plain", PlainParser)
    """,
    "tito_fake_lazy_impl": """
        from tito_core.backend import Backend, GenerateResult


        class LazyBackend(Backend):
            async def generate(self, request):
                return GenerateResult(output_ids=[2])
    """,
    "tito_fake_broken": """
        raise ImportError("tito_fake_broken needs a library that is not installed")
    """,
    "tito_fake_dupe": """
        from tito_core.plugins import BackendSpec, hookimpl


        @hookimpl
        def tito_backends():
            yield BackendSpec("good", "tito_fake_dupe:Nothing")
    """,
    "tito_fake_hookerror": """
        from tito_core.plugins import hookimpl


        @hookimpl
        def tito_backends():
            raise RuntimeError("hook exploded")
            yield
    """,
}
FAKE_ENTRY_POINTS = """
[tito]
good = tito_fake_good
broken = tito_fake_broken
dupe = tito_fake_dupe
hookerror = tito_fake_hookerror
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TITO_DISABLE_PLUGIN_AUTOLOAD", "TITO_PLUGINS", "TITO_CONFIG", "TITO_BACKEND"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def manager(clean_environment: None) -> Iterator[TitoPluginManager]:
    """A fresh process-wide manager; it loads (reading the environment) on the first lookup."""
    with isolated_plugin_manager() as pm:
        yield pm


@pytest.fixture(scope="session")
def fake_site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("fake-site")
    dist = site / FAKE_DIST
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tito-fake-plugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(FAKE_ENTRY_POINTS)
    for module, source in FAKE_MODULES.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))
    return site


@pytest.fixture
def fake_site(fake_site_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put the fake plugin distribution on sys.path for one test."""
    monkeypatch.syspath_prepend(str(fake_site_dir))
    return fake_site_dir
