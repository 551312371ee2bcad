"""The agent-runner suite: `tito rollout` with `[rollout.agent]` on the scripted backend, through the gateway."""

from __future__ import annotations

import importlib
import sys

try:
    importlib.import_module("tito_core.gateway")
except ImportError:  # TODO(s33): the gateway lands in parallel; its stand-in serves until it is merged
    from . import _standin_gateway

    sys.modules["tito_core.gateway"] = _standin_gateway
