"""The process-wide plugin manager and the lookups by name everyone uses (``get_backend("vllm", ...)``).

The manager is created and loaded on the first lookup, never on ``import tito_core``;
:func:`isolated_plugin_manager` swaps in a fresh one for a test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from tito_core.backend import Backend
from tito_core.errors import ConfigError
from tito_core.media.base import MediaItem
from tito_core.plugins.hookspecs import BackendSpec, ToolParserSpec
from tito_core.plugins.manager import TitoPluginManager
from tito_core.tool_parsers.base import ToolParser

__all__ = [
    "get_backend",
    "get_tool_parser",
    "input_kinds",
    "isolated_plugin_manager",
    "list_backends",
    "list_tool_parsers",
    "plugin_manager",
    "temporary_plugin",
    "vision_family_factory",
]

_manager: TitoPluginManager | None = None
_manager_lock = threading.Lock()


def plugin_manager() -> TitoPluginManager:
    """Return the process-wide plugin manager, created and loaded on first use."""
    global _manager
    manager = _manager
    if manager is None:
        with _manager_lock:
            if _manager is None:
                _manager = TitoPluginManager()
            manager = _manager
    manager.load_plugins()
    return manager


@contextlib.contextmanager
def isolated_plugin_manager(
    *, autoload: bool | None = None, allow: Iterable[str] | None = None, builtins: bool = True
) -> Iterator[TitoPluginManager]:
    """Use a fresh manager as the process-wide one inside the block (for tests).

    The manager is not loaded yet when it is yielded, so plugins registered on it first are seen
    before entry points; it loads on the first lookup. Arguments are those of :class:`TitoPluginManager`.
    """
    global _manager
    previous = _manager
    manager = TitoPluginManager(autoload=autoload, allow=allow, builtins=builtins)
    _manager = manager
    try:
        yield manager
    finally:
        _manager = previous


@contextlib.contextmanager
def temporary_plugin(plugin: object, name: str | None = None) -> Iterator[str]:
    """Register ``plugin`` on the process-wide manager inside the block; yields its registered name."""
    manager = plugin_manager()
    registered = manager.register(plugin, name=name)
    if registered is None:  # blocked
        raise ConfigError(f"plugin {name or plugin!r} is blocked")
    if name is not None:
        manager._labels.setdefault(registered, name)
    try:
        yield registered
    finally:
        manager.unregister(plugin)


def list_backends() -> dict[str, BackendSpec]:
    """Every installed backend by name (sorted); nothing is instantiated or imported beyond plugins."""
    return plugin_manager().backends()


def list_tool_parsers() -> dict[str, ToolParserSpec]:
    """Every installed tool parser by name (sorted)."""
    return plugin_manager().tool_parsers()


def get_backend(name: str, **options: Any) -> Backend:
    """Create the backend registered as ``name`` with ``options`` as keyword arguments.

    Raises:
        UnknownPluginError: No installed plugin provides ``name``; the message lists what is installed.
        PluginLoadError: The plugin providing ``name`` is installed but its code failed to import.
        ConfigError: ``options`` do not match the backend's parameters.

    """
    backend = plugin_manager()._create("tito_backends", "backend", name, options)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend {name!r} factory returned {type(backend).__name__}, not a Backend")
    return backend


def get_tool_parser(name: str | ToolParser, **options: Any) -> ToolParser:
    """Create the tool parser registered as ``name``; an already-built parser is returned as is."""
    if not isinstance(name, str):
        if not isinstance(name, ToolParser):
            raise TypeError(f"expected a tool parser name or a ToolParser, got {type(name).__name__}")
        if options:
            raise ConfigError("tool parser options cannot be applied to an already-built parser")
        return name
    parser = plugin_manager()._create("tito_tool_parsers", "tool parser", name, options)
    if not isinstance(parser, ToolParser):
        raise TypeError(f"tool parser {name!r} factory returned {type(parser).__name__}, not a ToolParser")
    return parser


def input_kinds() -> dict[str, type[MediaItem]]:
    """Every registered input kind's item class, by kind name.

    Raises:
        PluginLoadError: a kind's class cannot be imported.
        ConfigError: a kind's factory is not a :class:`~tito_core.media.MediaItem` class of that kind.
    """
    manager = plugin_manager()
    kinds: dict[str, type[MediaItem]] = {}
    for name, spec in manager.input_kinds().items():
        item_type = manager.resolve("input kind", spec)
        if not (isinstance(item_type, type) and issubclass(item_type, MediaItem)) or item_type.kind != name:
            raise ConfigError(f"input kind {name!r}: {spec.factory!r} is not a MediaItem class whose kind is {name!r}")
        kinds[name] = item_type
    return kinds


def vision_family_factory(processor_name: str) -> Callable[..., Any]:
    """The factory of the registered vision family that serves the image processor class ``processor_name``.

    Raises:
        ConfigError: no registered family serves it (the message lists the families and their processors).
    """
    manager = plugin_manager()
    families = manager.vision_families()
    for spec in families.values():
        if processor_name.startswith(spec.processors):  # by name: another family's processor may look alike
            factory: Callable[..., Any] = manager.resolve("vision family", spec)
            return factory
    known = "; ".join(f"{s.name} ({' / '.join(s.processors)})" for s in families.values()) or "none"
    raise ConfigError(
        f"tito does not know the image placeholders of {processor_name} (families: {known}); register one with the "
        "tito_vision_families plugin hook, or pass `family=` a VisionFamily of your own"
    )
