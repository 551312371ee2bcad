"""Optional dependencies (pyarrow for Parquet, Ray), imported on first use with an install hint."""

from __future__ import annotations

from typing import Any

from .errors import ConfigError


def pyarrow() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or a :class:`ConfigError` saying how to install them."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError('Parquet files need pyarrow: pip install "tito-core[parquet]"') from None
    return pa, pq


def ray() -> Any:
    """The ``ray`` module, or a :class:`ConfigError` saying how to install it."""
    try:
        import ray as ray_module
    except ImportError:
        raise ConfigError('the Ray executor needs Ray: pip install "tito-core[ray]"') from None
    return ray_module
