"""Checking a plugin factory's options against its signature, and calling it with them.

A misspelt option (``get_backend("vllm", bse_url=...)``) is a :class:`~tito_core.errors.ConfigError` that
names the closest accepted option, before the factory runs.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from tito_core._suggest import did_you_mean
from tito_core.errors import ConfigError

__all__ = ["call_factory", "check_options"]

_OPTION_KINDS = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_UNEXPECTED_KEYWORD = re.compile(r"got an unexpected keyword argument '(\w+)'")


def _accepted_options(factory: Callable[..., Any]) -> tuple[inspect.Signature, frozenset[str]] | None:
    """The factory's signature and every keyword it accepts, or None when that cannot be known.

    A factory whose signature ends in ``**kwargs`` hides its options. When the factory is a class, its
    ``__init__`` chain is followed: each ``__init__`` that takes ``**kwargs`` is assumed to hand them on
    to the next one in the MRO, until one names all its parameters. When nothing names them all (a
    plain function taking ``**kwargs``, or the chain reaching ``object``), None: anything goes through.
    """
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some callables have no introspectable signature
        return None
    names = {p.name for p in signature.parameters.values() if p.kind in _OPTION_KINDS}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()):
        return signature, frozenset(names)
    if not isinstance(factory, type):
        return None
    for cls in factory.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        if cls is object:
            return None
        try:
            params = list(inspect.signature(init).parameters.values())[1:]  # without self
        except (TypeError, ValueError):
            return None
        names.update(p.name for p in params if p.kind in _OPTION_KINDS)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return signature, frozenset(names)
    return None


_accepted_cache: dict[Any, tuple[inspect.Signature, frozenset[str]] | None] = {}


def _accepted_options_cached(factory: Callable[..., Any]) -> tuple[inspect.Signature, frozenset[str]] | None:
    """:func:`_accepted_options`, looked up once per factory (one model per rollout asks for its parser)."""
    try:
        return _accepted_cache[factory]
    except KeyError:
        accepted = _accepted_cache[factory] = _accepted_options(factory)
        return accepted
    except TypeError:  # an unhashable callable
        return _accepted_options(factory)


def check_options(kind: str, name: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> None:
    """Raise ConfigError for an option the factory does not take (naming the closest one)."""
    accepted = _accepted_options_cached(factory)
    if accepted is None:
        return
    signature, names = accepted
    for key in options:
        if key not in names:
            raise ConfigError(
                f"invalid options for {kind} {name!r}: unknown option `{key}`"
                f"{did_you_mean(key, names, listing='accepted options')}"
            )
    try:
        signature.bind(**options)
    except TypeError as exc:  # a required option missing, or one that is positional-only
        raise ConfigError(
            f"invalid options for {kind} {name!r}: {exc} (accepted options: {', '.join(sorted(names)) or 'none'})"
        ) from exc


def call_factory(kind: str, name: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> object:
    """Call the factory; a keyword it refuses (one its signature could not show) is a ConfigError."""
    try:
        return factory(**options)
    except TypeError as exc:
        match = _UNEXPECTED_KEYWORD.search(str(exc))
        if match is None or match.group(1) not in options:
            raise
        raise ConfigError(f"invalid options for {kind} {name!r}: unknown option `{match.group(1)}` ({exc})") from exc
