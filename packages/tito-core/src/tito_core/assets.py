"""Where tito caches what it builds offline (tokenizers, model folders), and the error for a missing input.

Shared by the embedded backend's model builder (``tito_transformers.models``) and the test support package
(``tito_testing``), so that neither production package needs the other's code.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MissingTestAssetError", "cache_root"]


class MissingTestAssetError(RuntimeError):
    """A package whose files the offline tokenizer needs is not installed."""


def cache_root() -> Path:
    """Where built assets are cached: ``$TITO_CACHE_DIR``, else ``$XDG_CACHE_HOME/tito``, else ``~/.cache/tito``."""
    if os.environ.get("TITO_CACHE_DIR"):
        return Path(os.environ["TITO_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg if xdg and os.path.isabs(xdg) else Path.home() / ".cache") / "tito"
