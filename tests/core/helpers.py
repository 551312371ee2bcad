"""Small builders shared by the core tests (the tools and the Hermes call builder live in tests.helpers)."""

from __future__ import annotations

from tests.helpers import add, echo, hermes_call

__all__ = ["SYSTEM", "add", "echo", "hermes_call"]

SYSTEM = "You are a careful assistant."
