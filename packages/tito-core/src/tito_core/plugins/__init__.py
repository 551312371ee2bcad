"""Plugins: how backends and tool parsers are found by name.

tito uses `pluggy <https://pluggy.readthedocs.io>`_ with one project name, ``tito``, for the plugin
manager, the markers and the entry-point group. A plugin is a module that implements one or both hooks
of :class:`~tito_core.plugins.TitoSpecs` and yields small named records
(:class:`~tito_core.plugins.BackendSpec`, :class:`~tito_core.plugins.ToolParserSpec`)::

    # tito_mybackend.py                         pyproject.toml:
    from tito_core.plugins import BackendSpec, hookimpl       [project.entry-points.tito]
                                                              mybackend = "tito_mybackend"
    @hookimpl
    def tito_backends():
        yield BackendSpec("mybackend", "tito_mybackend.client:MyBackend", "My engine over HTTP")

The core's own backends and tool parsers (``tito_core.plugins.builtins``) and the first-party adapters
(``tito-vllm``, ``tito-sglang``) register exactly the same way; nothing in the core names an engine.

Loading is lazy, idempotent and tolerant: entry points are read on the first lookup, not on
``import tito_core``; a record's factory given as a ``"module:attr"`` string is imported only when that
backend or parser is selected; a plugin that fails to import only warns (:class:`PluginWarning`) and
becomes an error when something it provides is asked for.

This package re-exports its modules' public names; each module has one job:
``hookspecs`` (the contract a plugin implements), ``manager``
(loading and indexing plugins), ``options`` (checking a factory's options),
``registry`` (the process-wide manager and the lookups by name) and
``builtins`` (the core's own plugin). Imports point one way: the registry uses the manager; the
manager uses the option checks, the built-ins (on first load) and the hook specs; the built-ins use only
the hook specs.

Two environment variables control loading:

``TITO_DISABLE_PLUGIN_AUTOLOAD=1``
    Load no entry points; only the core's built-ins (and plugins registered in code) are available.
``TITO_PLUGINS=a,b``
    Load only the entry points with these names (the built-ins are always loaded). Set but empty, it
    loads none.
"""

from __future__ import annotations

from tito_core.plugins.hookspecs import (
    ENTRY_POINT_GROUP,
    PROJECT_NAME,
    BackendSpec,
    FrontSpec,
    InputKindSpec,
    TitoSpecs,
    ToolParserSpec,
    VisionFamilySpec,
    hookimpl,
    hookspec,
)
from tito_core.plugins.manager import BUILTIN_PLUGIN, PluginFailure, PluginLoadError, PluginWarning, TitoPluginManager
from tito_core.plugins.registry import (
    get_backend,
    get_tool_parser,
    input_kinds,
    isolated_plugin_manager,
    list_backends,
    list_tool_parsers,
    plugin_manager,
    temporary_plugin,
    vision_family_factory,
)

__all__ = [
    "BUILTIN_PLUGIN",
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "BackendSpec",
    "FrontSpec",
    "InputKindSpec",
    "PluginFailure",
    "PluginLoadError",
    "PluginWarning",
    "TitoPluginManager",
    "TitoSpecs",
    "ToolParserSpec",
    "VisionFamilySpec",
    "get_backend",
    "get_tool_parser",
    "hookimpl",
    "hookspec",
    "input_kinds",
    "isolated_plugin_manager",
    "list_backends",
    "list_tool_parsers",
    "plugin_manager",
    "temporary_plugin",
    "vision_family_factory",
]
