"""The repository root is a workspace: installing it fails with the command that installs the packages."""

import importlib.util
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _backend():
    build_system = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["build-system"]
    assert build_system["requires"] == []  # nothing is fetched to fail
    (path,) = build_system["backend-path"]
    module = build_system["build-backend"]
    spec = importlib.util.spec_from_file_location(module, ROOT / path / f"{module}.py")
    assert spec is not None and spec.loader is not None
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    return backend


HOOKS = [
    "get_requires_for_build_wheel",
    "get_requires_for_build_sdist",
    "get_requires_for_build_editable",
    "prepare_metadata_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "build_wheel",
    "build_sdist",
    "build_editable",
]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_build_hook_refuses_with_the_install_command(hook, tmp_path):
    backend = _backend()
    with pytest.raises(SystemExit) as exc_info:
        getattr(backend, hook)(str(tmp_path))
    message = str(exc_info.value.code)
    assert backend.INSTALL in message and "workspace, not a package" in message


def test_the_install_command_names_existing_packages_and_is_the_documented_one():
    backend = _backend()
    paths = [arg.split("[")[0] for arg in shlex.split(backend.INSTALL) if arg.startswith("packages/")]
    assert paths[0] == "packages/tito-core"
    assert sorted(paths) == sorted(str(p.parent.relative_to(ROOT)) for p in ROOT.glob("packages/*/pyproject.toml"))
    assert all((ROOT / p / "pyproject.toml").is_file() for p in paths)
    assert backend.INSTALL in (ROOT / "README.md").read_text(encoding="utf-8")
