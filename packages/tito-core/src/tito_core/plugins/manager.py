"""The plugin manager: loads the ``tito`` entry points and the core's built-ins, and indexes their records.

:class:`TitoPluginManager` is a pluggy manager that reads the entry points once (lazily, tolerating a
plugin that fails to import), registers ``tito_core.plugins.builtins``, collects the
:class:`~tito_core.plugins.BackendSpec` / :class:`~tito_core.plugins.ToolParserSpec`
records by name, and creates the selected one. The process-wide instance is in
``tito_core.plugins.registry``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, NamedTuple, TypeVar

import pluggy

from tito_core.errors import ConfigError, UnknownPluginError
from tito_core.plugins.hookspecs import (
    ENTRY_POINT_GROUP,
    PROJECT_NAME,
    BackendSpec,
    FrontSpec,
    InputKindSpec,
    TitoSpecs,
    ToolParserSpec,
    VisionFamilySpec,
)
from tito_core.plugins.options import call_factory, check_options

__all__ = ["BUILTIN_PLUGIN", "PluginFailure", "PluginLoadError", "PluginWarning", "TitoPluginManager"]

BUILTIN_PLUGIN = "core"
"""Name under which the core's built-ins are registered (also their entry-point name)."""
_BUILTINS_MODULE = "tito_core.plugins.builtins"
# What tito-core's `core` entry point names: today's module, and the one an installation made before the
# built-ins moved still declares (its metadata is rewritten only when the package is reinstalled).
_BUILTIN_ENTRY_VALUES = frozenset({_BUILTINS_MODULE, "tito_core._builtins"})
# First-party adapters that ship as extras of tito-core; used for install hints only.
_FIRST_PARTY_EXTRAS = {"vllm": "vllm", "sglang": "sglang", "transformers": "transformers"}
_TRUE = {"1", "true", "yes", "on"}


class PluginWarning(UserWarning):
    """A plugin could not be loaded (or misbehaved) and was skipped."""


class PluginLoadError(ConfigError, ImportError):
    """The selected backend or tool parser exists but its code could not be loaded."""


class PluginFailure(NamedTuple):
    """A plugin that could not be loaded or whose hook failed."""

    plugin: str
    """Plugin (entry-point) name."""
    label: str
    """Plugin name with its distribution and version, for messages."""
    error: BaseException
    """What went wrong."""


_SpecT = TypeVar("_SpecT", BackendSpec, ToolParserSpec, InputKindSpec, VisionFamilySpec, FrontSpec)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def _env_list(name: str) -> frozenset[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return frozenset(part.strip().lower() for part in value.split(",") if part.strip())


class TitoPluginManager(pluggy.PluginManager):
    """A pluggy manager for the ``tito`` project that also loads entry points and indexes records.

    Args:
        autoload: Load entry points; None reads ``TITO_DISABLE_PLUGIN_AUTOLOAD`` when loading.
        allow: Names of the entry points to load; None reads ``TITO_PLUGINS`` when loading.
        builtins: Register the core's built-ins (``tito_core.plugins.builtins``).

    """

    def __init__(
        self, *, autoload: bool | None = None, allow: Iterable[str] | None = None, builtins: bool = True
    ) -> None:
        super().__init__(PROJECT_NAME)
        self.add_hookspecs(TitoSpecs)
        self._autoload = autoload
        self._allow = None if allow is None else frozenset(name.strip().lower() for name in allow)
        self._builtins = builtins
        self._loaded = False
        self._lock = threading.RLock()
        self._labels: dict[str, str] = {}
        self._failures: dict[str, PluginFailure] = {}
        self._records_cache: dict[str, dict[str, Any]] = {}
        self._providers: dict[str, dict[str, str]] = {}

    # --- loading ------------------------------------------------------------------------------------

    def load_plugins(self) -> None:
        """Load entry points and built-ins, once; later calls do nothing."""
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # set first: a plugin that looks up backends while loading must not recurse
            autoload = not _env_flag("TITO_DISABLE_PLUGIN_AUTOLOAD") if self._autoload is None else self._autoload
            if autoload:
                self._load_entry_points(_env_list("TITO_PLUGINS") if self._allow is None else self._allow)
            if self._builtins:
                self._register_builtins()

    def _load_entry_points(self, allow: frozenset[str] | None) -> None:
        seen: set[str] = set()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            name = ep.name.strip().lower()
            dist = getattr(ep, "dist", None)
            label = f"{name} ({dist.name} {dist.version})" if dist is not None else name
            builtin = name == BUILTIN_PLUGIN and ep.value.strip() in _BUILTIN_ENTRY_VALUES
            if builtin:
                if not self._builtins:
                    continue
            elif allow is not None and name not in allow:
                continue
            seen.add(name)
            if self.is_blocked(name):
                continue
            if self.has_plugin(name):
                if self._labels.get(name) != label:
                    warnings.warn(
                        f"tito plugin {label} skipped: the name {name!r} is already taken by {self.describe(name)}",
                        PluginWarning,
                        stacklevel=4,
                    )
                continue
            try:
                plugin = _builtins_module() if builtin else ep.load()
                if not self.is_registered(plugin):
                    self._labels[name] = label
                    self.register(plugin, name=name)
            except Exception as exc:
                self._labels[name] = label
                self._record_failure(name, exc, "could not be loaded")
        for name in sorted((allow or frozenset()) - seen - {BUILTIN_PLUGIN}):
            warnings.warn(
                f"TITO_PLUGINS names {name!r}, but no installed package declares a tito entry point of that name",
                PluginWarning,
                stacklevel=4,
            )

    def _register_builtins(self) -> None:
        builtins = _builtins_module()
        if self.is_registered(builtins):
            return
        name = BUILTIN_PLUGIN if not self.has_plugin(BUILTIN_PLUGIN) else builtins.__name__
        self._labels.setdefault(name, f"{name} (tito-core, built in)")
        self.register(builtins, name=name)

    def _record_failure(self, name: str, exc: BaseException, what: str) -> None:
        label = self.describe(name)
        self._failures[name] = PluginFailure(name, label, exc)
        warnings.warn(
            f"tito plugin {label} {what} and was skipped: {type(exc).__name__}: {exc}",
            PluginWarning,
            stacklevel=5,
        )

    # --- registration -------------------------------------------------------------------------------

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register a plugin object (a module or any object with ``@hookimpl`` functions)."""
        registered = super().register(plugin, name)
        self._records_cache.clear()
        return registered

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any | None:
        """Unregister a plugin object, by object or by name."""
        removed = super().unregister(plugin, name)
        self._records_cache.clear()
        return removed

    def describe(self, name: str) -> str:
        """Return a plugin's name with its distribution and version, as used in messages."""
        return self._labels.get(name, name)

    @property
    def failures(self) -> dict[str, PluginFailure]:
        """Plugins that failed to load or whose hooks raised, by plugin name."""
        self.load_plugins()
        return dict(self._failures)

    # --- records ------------------------------------------------------------------------------------

    def backends(self) -> dict[str, BackendSpec]:
        """All registered backends by name, sorted."""
        return self._records("tito_backends", "backend", BackendSpec)

    def tool_parsers(self) -> dict[str, ToolParserSpec]:
        """All registered tool parsers by name, sorted."""
        return self._records("tito_tool_parsers", "tool parser", ToolParserSpec)

    def input_kinds(self) -> dict[str, InputKindSpec]:
        """All registered input kinds by name, sorted."""
        return self._records("tito_input_kinds", "input kind", InputKindSpec)

    def vision_families(self) -> dict[str, VisionFamilySpec]:
        """All registered vision families by name, sorted."""
        return self._records("tito_vision_families", "vision family", VisionFamilySpec)

    def fronts(self) -> dict[str, FrontSpec]:
        """All registered gateway fronts by name, sorted."""
        return self._records("tito_fronts", "front", FrontSpec)

    def resolve(
        self, kind: str, spec: BackendSpec | ToolParserSpec | InputKindSpec | VisionFamilySpec | FrontSpec
    ) -> Any:
        """The object a record's factory names (imported now when it is a ``"module:attr"`` string).

        Raises:
            PluginLoadError: it cannot be imported.
        """
        label = self._providers.get(kind, {}).get(spec.name, spec.name)
        return self._resolve(kind, spec, label)

    def provider(self, kind: str, name: str) -> str | None:
        """Label of the plugin that provides the ``kind`` (``"backend"``/``"tool parser"``) ``name``."""
        if kind == "backend":
            self.backends()
        else:
            self.tool_parsers()
        return self._providers.get(kind, {}).get(name.strip().lower())

    def _records(self, hook: str, kind: str, spec_type: type[_SpecT]) -> dict[str, _SpecT]:
        self.load_plugins()
        with self._lock:
            cached = self._records_cache.get(hook)
            if cached is not None:
                return dict(cached)
            records: dict[str, _SpecT] = {}
            providers: dict[str, str] = {}
            for impl in getattr(self.hook, hook).get_hookimpls():
                if impl.hookwrapper or impl.wrapper:
                    continue
                label = self.describe(impl.plugin_name)
                try:
                    produced = list(impl.function() or ())
                    for spec in produced:
                        if not isinstance(spec, spec_type):
                            raise TypeError(f"{hook}() yielded {spec!r}, not a {spec_type.__name__}")
                except Exception as exc:
                    self._record_failure(impl.plugin_name, exc, f"failed in {hook}()")
                    continue
                for spec in produced:
                    if spec.name in providers:
                        raise ConfigError(
                            f"{kind} {spec.name!r} is provided by two plugins: {providers[spec.name]} and "
                            f"{label}. Uninstall one of them, or choose which plugins load with "
                            "TITO_PLUGINS=name,..."
                        )
                    records[spec.name] = spec
                    providers[spec.name] = label
            ordered = dict(sorted(records.items()))
            self._records_cache[hook] = ordered
            self._providers[kind] = providers
            return dict(ordered)

    def _create(self, hook: str, kind: str, name: str, options: Mapping[str, Any]) -> object:
        key = name.strip().lower()
        records: Mapping[str, BackendSpec | ToolParserSpec] = (
            self.backends() if hook == "tito_backends" else self.tool_parsers()
        )
        spec = records.get(key)
        if spec is None:
            raise self._unknown(kind, key, list(records))
        label = self._providers.get(kind, {}).get(key, key)
        factory = self._resolve(kind, spec, label)
        check_options(kind, key, factory, options)
        return call_factory(kind, key, factory, options)

    def _resolve(
        self,
        kind: str,
        spec: BackendSpec | ToolParserSpec | InputKindSpec | VisionFamilySpec | FrontSpec,
        label: str,
    ) -> Callable[..., Any]:
        if not isinstance(spec.factory, str):
            return spec.factory
        module_name, _, attr = spec.factory.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except Exception as exc:
            raise PluginLoadError(
                f"{kind} {spec.name!r} from plugin {label} could not be loaded from {spec.factory!r}: "
                f"{type(exc).__name__}: {exc}{_install_hint(spec.name, prefix='. ')}"
            ) from exc
        if not callable(obj):
            raise PluginLoadError(f"{kind} {spec.name!r}: {spec.factory!r} is not callable")
        return obj  # type: ignore[no-any-return]

    def _unknown(self, kind: str, name: str, available: list[str]) -> Exception:
        failure = self._failures.get(name)
        if failure is not None:
            error = PluginLoadError(
                f"{kind} {name!r} is provided by plugin {failure.label}, which failed to load: "
                f"{type(failure.error).__name__}: {failure.error}{_install_hint(name, prefix='. ')}"
            )
            error.__cause__ = failure.error
            return error
        hints = []
        close = difflib.get_close_matches(name, available, n=1)
        if close:
            hints.append(f"Did you mean {close[0]!r}?")
        install = _install_hint(name)
        if install:
            hints.append(install)
        if self._failures:
            broken = ", ".join(f.label for f in self._failures.values())
            hints.append(f"Plugins that failed to load: {broken}.")
        return UnknownPluginError(kind, name, available, " ".join(hints) or None)


def _install_hint(name: str, prefix: str = "") -> str:
    extra = _FIRST_PARTY_EXTRAS.get(name)
    if extra is None:
        return ""
    return f'{prefix}The {name} backend is installed with: pip install "tito-core[{extra}]"'


def _builtins_module() -> ModuleType:
    """The core's own plugin module, imported on first use (listing it imports none of its factories)."""
    from tito_core.plugins import builtins

    return builtins
