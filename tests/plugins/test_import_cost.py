"""import tito_core loads no plugin, adapter or torch; listing backends imports no backend code."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY_OR_ADAPTER = ("torch", "tito_vllm", "tito_sglang", "tito_backend_echo", "tito_core.plugins.builtins")

IMPORT_ONLY = """
import json, sys
import tito_core
registry = sys.modules.get("tito_core.plugins.registry")
print(json.dumps({
    "modules": sorted(sys.modules),
    "manager_created": None if registry is None else registry._manager is not None,
}))
"""

LIST_ONLY = """
import json, sys, warnings
warnings.simplefilter("ignore")
from tito_core.plugins import list_backends, list_tool_parsers, plugin_manager
list_tool_parsers()
specs = list_backends()
entry_modules = {type(p).__name__ == "module" and p.__name__ for p in plugin_manager().get_plugins()}
factories = sorted({s.factory.partition(":")[0] for s in specs.values() if isinstance(s.factory, str)})
print(json.dumps({
    "modules": sorted(sys.modules),
    "imported_factories": [m for m in factories if m in sys.modules and m not in entry_modules],
    "names": sorted(specs),
}))
"""


def run_python(code: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TITO_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def offenders(modules: object) -> list[str]:
    assert isinstance(modules, list)
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY_OR_ADAPTER)]


def test_import_tito_core_loads_no_plugins() -> None:
    result = run_python(IMPORT_ONLY)
    assert offenders(result["modules"]) == []
    assert result["manager_created"] in (None, False), "import tito_core must not create the plugin manager"


def test_listing_backends_imports_no_backend_implementation() -> None:
    # Adapters' entry-point modules must stay cheap: the factory string is imported only on selection
    # (an adapter package whose __init__ imports its HTTP client eagerly fails here).
    result = run_python(LIST_ONLY)
    modules = result["modules"]
    assert isinstance(modules, list)
    assert "torch" not in modules
    assert result["imported_factories"] == [], "listing must not import backend implementations"
    assert "echo" in result["names"]  # type: ignore[operator]
