"""strands-env needs Python >= 3.12: its session (nox -s strands_env) installs it; elsewhere this suite is skipped."""

from __future__ import annotations

import pytest

pytest.importorskip("strands_env")
