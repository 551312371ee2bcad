"""The chat templates shipped with tito-core are trl 1.16.0's files, byte for byte (the wheel: nox -s packaging)."""

import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

from tito_testing.tokenizers import TRL_TEMPLATES, MissingTestAssetError, chat_template

# SHA-256 of trl 1.16.0's trl/chat_templates/<name>.jinja (also listed in templates/SOURCES.md).
TRL_1_16_0 = {
    "qwen3": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
    "qwen3_training": "1d944ff8f268b611abb296cdd24d0f51981eef1c8647ac321c3a0258f61eb6c9",
    "qwen2_5": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "gemma4": "33204f1acb5bd0002713e16a593847f24ceeafe711ed88bda2a352dc996a3373",
}


def test_shipped_templates_are_trl_1_16_0_byte_for_byte() -> None:
    shipped = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest() for p in TRL_TEMPLATES.glob("*.jinja")}
    assert shipped == TRL_1_16_0
    for name in TRL_1_16_0:
        assert chat_template(name).encode("utf-8") == (TRL_TEMPLATES / f"{name}.jinja").read_bytes()


def test_sources_and_license_are_shipped_beside_them() -> None:
    sources = (TRL_TEMPLATES.parent / "SOURCES.md").read_text(encoding="utf-8")
    for name, digest in TRL_1_16_0.items():
        assert f"`trl/{name}.jinja`" in sources and digest in sources
    assert "Apache License" in (TRL_TEMPLATES / "LICENSE").read_text(encoding="utf-8")


def test_same_files_as_an_installed_trl() -> None:
    spec = importlib.util.find_spec("trl")  # located, not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("trl is not installed (the pinned hashes above still hold)")
    trl_dir = Path(next(iter(spec.submodule_search_locations))) / "chat_templates"
    version = importlib.metadata.version("trl")
    if version != "1.16.0":
        pytest.skip(f"trl {version} is installed, not 1.16.0")
    for name in TRL_1_16_0:
        assert (TRL_TEMPLATES / f"{name}.jinja").read_bytes() == (trl_dir / f"{name}.jinja").read_bytes()


def test_unknown_template_names_what_is_shipped() -> None:
    with pytest.raises(MissingTestAssetError, match="qwen3_training"):
        chat_template("no_such_template")
