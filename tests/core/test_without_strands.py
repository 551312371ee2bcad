"""The rollout core, the adapters, the gateway and the runner's agent path import with Strands blocked: only the
Strands front (``TitoModel``) and the runner's Strands worker need it. A fresh interpreter each time, with an
import hook that refuses ``strands``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "strands" or name.startswith("strands."):
            raise ImportError("strands is blocked: " + name)
sys.meta_path.insert(0, Block())
import {module}
"""
MODULES = [
    "tito_core.errors",
    "tito_core.rollout_core",
    "tito_core.weights",
    "tito_core.gateway",
    "tito_core.gateway.server",
    "tito_core.runner.agent_process",
    "tito_core.records",
    "tito_sglang",
    "tito_vllm",
    "tito_transformers",
]


@pytest.mark.parametrize("module", MODULES)
def test_it_imports_without_strands(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None:
        pytest.skip(f"{module} is not installed in this environment")
    done = subprocess.run([sys.executable, "-c", BLOCK.format(module=module)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_blocker_blocks() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK.format(module="tito_core.strands_front.model")], capture_output=True, text=True
    )
    assert done.returncode != 0 and "strands is blocked" in done.stderr  # the Strands front needs it: the test can fail
