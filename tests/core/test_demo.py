"""The demo finds its backend and its model by name (plugin registry, entry point), never by importing an adapter."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from tito_core import demo
from tito_core.backend import Backend, GenerateResult
from tito_core.plugins import BackendSpec, hookimpl, isolated_plugin_manager
from tito_testing.tokenizers import qwen_tokenizer_dir


class FakeEmbeddedBackend(Backend):
    """Stands in for the embedded backend: takes the model folder, as the real one does."""

    name = "transformers"

    def __init__(self, *, model_path: str) -> None:
        self.model_path = model_path

    async def generate(self, request):  # type: ignore[no-untyped-def]
        return GenerateResult(output_ids=[0])


class FakeEmbeddedPlugin:
    @hookimpl
    def tito_backends(self):  # type: ignore[no-untyped-def]
        yield BackendSpec("transformers", FakeEmbeddedBackend, "stand-in for tito-transformers", in_process=True)


@pytest.fixture
def demo_site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed distribution declaring a demo model `tito-test-fake` (a Qwen tokenizer folder, no template)."""
    dist = tmp_path / "tito_fake_demo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tito-fake-demo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tito.demo]\ntito-test-fake = tito_fake_demo:build\n")
    folder = qwen_tokenizer_dir("qwen3")
    (tmp_path / "tito_fake_demo.py").write_text(f"def build():\n    return {str(folder)!r}, None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return folder


def test_the_demo_takes_the_registered_backend_and_the_declared_model(
    demo_site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo, "DEMO_MODEL", "tito-test-fake")
    with isolated_plugin_manager(autoload=False) as manager:
        manager.register(FakeEmbeddedPlugin(), name="fake-embedded")
        model, where = demo._embedded_model()
    assert isinstance(model.backend, FakeEmbeddedBackend)
    assert model.backend.model_path == str(demo_site)
    assert model.tool_parser.name == "hermes"
    assert str(demo_site) in where


def test_without_a_package_declaring_the_model_the_demo_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo, "DEMO_MODEL", "tito-test-nothing-declares-this")
    with pytest.raises(SystemExit, match="pip install torch"):
        demo._embedded_model()


def test_the_demo_imports_no_adapter() -> None:
    tree = ast.parse(inspect.getsource(demo))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | {
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
    }
    assert not any(name.startswith(("tito_transformers", "tito_vllm", "tito_sglang")) for name in imported)
