"""Plugins: how backends and tool parsers are found by name.

tito uses `pluggy <https://pluggy.readthedocs.io>`_ with one project name, ``tito``, for the plugin
manager, the markers and the entry-point group. A plugin is a module that implements one or both hooks
of :class:`TitoSpecs` and yields small named records (:class:`BackendSpec`, :class:`ToolParserSpec`)::

    # tito_mybackend.py                         pyproject.toml:
    from tito_core.plugins import BackendSpec, hookimpl       [project.entry-points.tito]
                                                              mybackend = "tito_mybackend"
    @hookimpl
    def tito_backends():
        yield BackendSpec("mybackend", "tito_mybackend.client:MyBackend", "My engine over HTTP")

The core's own backends and tool parsers (:mod:`tito_core._builtins`) and the first-party adapters
(``tito-vllm``, ``tito-sglang``) register exactly the same way; nothing in the core names an engine.

Loading is lazy, idempotent and tolerant: entry points are read on the first lookup, not on
``import tito_core``; a record's factory given as a ``"module:attr"`` string is imported only when that
backend or parser is selected; a plugin that fails to import only warns (:class:`PluginWarning`) and
becomes an error when something it provides is asked for. Two environment variables control loading:

``TITO_DISABLE_PLUGIN_AUTOLOAD=1``
    Load no entry points; only the core's built-ins (and plugins registered in code) are available.
``TITO_PLUGINS=a,b``
    Load only the entry points with these names (the built-ins are always loaded). Set but empty, it
    loads none.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import inspect
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, TypeVar

import msgspec
import pluggy

from tito_core._suggest import did_you_mean
from tito_core.backend import Backend
from tito_core.errors import ConfigError, UnknownPluginError
from tito_core.tool_parsers.base import ToolParser

__all__ = [
    "BUILTIN_PLUGIN",
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "BackendSpec",
    "PluginFailure",
    "PluginLoadError",
    "PluginWarning",
    "TitoPluginManager",
    "TitoSpecs",
    "ToolParserSpec",
    "get_backend",
    "get_tool_parser",
    "hookimpl",
    "hookspec",
    "isolated_plugin_manager",
    "list_backends",
    "list_tool_parsers",
    "plugin_manager",
    "temporary_plugin",
]

PROJECT_NAME = "tito"
"""The pluggy project name, used for the markers and the manager."""
ENTRY_POINT_GROUP = "tito"
"""The entry-point group plugins declare (``[project.entry-points.tito]``)."""
BUILTIN_PLUGIN = "core"
"""Name under which the core's built-ins are registered (also their entry-point name)."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks a hook specification. Only the core defines specs."""
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementation: ``@hookimpl def tito_backends(): ...``."""

# First-party adapters that ship as extras of tito-core; used for install hints only.
_FIRST_PARTY_EXTRAS = {"vllm": "vllm", "sglang": "sglang", "transformers": "transformers"}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_TRUE = {"1", "true", "yes", "on"}


class PluginWarning(UserWarning):
    """A plugin could not be loaded (or misbehaved) and was skipped."""


class PluginLoadError(ConfigError, ImportError):
    """The selected backend or tool parser exists but its code could not be loaded."""


def _check_spec(spec: BackendSpec | ToolParserSpec, kind: str) -> None:
    if not isinstance(spec.name, str):
        raise ConfigError(f"{kind} name must be a string, got {type(spec.name).__name__}")
    name = spec.name.strip().lower()
    if not _NAME_RE.match(name):
        raise ConfigError(f"invalid {kind} name {spec.name!r}: use lowercase letters, digits, '_', '-' and '.'")
    msgspec.structs.force_setattr(spec, "name", name)
    factory = spec.factory
    if isinstance(factory, str):
        if not _FACTORY_RE.match(factory):
            raise ConfigError(f"{kind} {name!r}: factory {factory!r} is not a 'module:attribute' string")
    elif not callable(factory):
        raise ConfigError(f"{kind} {name!r}: factory must be callable or a 'module:attribute' string")


class BackendSpec(msgspec.Struct, frozen=True):
    """A backend a plugin provides.

    Attributes:
        name: The name users select it by (``backend = "vllm"``); normalised to lowercase.
        factory: A callable returning a :class:`~tito_core.backend.Backend` (usually the class), or a
            ``"module:attr"`` string naming one, imported only when this backend is selected. Prefer the
            string when the adapter module imports anything heavy (an HTTP stack, an SDK, torch).
        description: One line shown when backends are listed.
        in_process: The engine runs inside the process that creates the backend (an embedded model), not
            behind a server: a process that only routes rollouts to others (the Ray executor's driver) then
            creates none.

    """

    name: str
    factory: str | Callable[..., Backend]
    description: str = ""
    in_process: bool = False

    def __post_init__(self) -> None:
        _check_spec(self, "backend")


class ToolParserSpec(msgspec.Struct, frozen=True):
    """A tool parser a plugin provides.

    Attributes:
        name: The name users select it by (``tool_parser = "hermes"``); normalised to lowercase.
        factory: A callable returning a :class:`~tito_core.tool_parsers.base.ToolParser`, or a
            ``"module:attr"`` string naming one, imported only when this parser is selected.
        description: One line shown when parsers are listed.

    """

    name: str
    factory: str | Callable[..., ToolParser]
    description: str = ""

    def __post_init__(self) -> None:
        _check_spec(self, "tool parser")


class TitoSpecs:
    """The hooks a tito plugin may implement (as plain functions in its module, without ``self``)."""

    @hookspec
    def tito_backends(self) -> Iterable[BackendSpec]:
        """Yield the backends this plugin provides.

        A complete plugin, ``tito_mybackend.py``, declared in its ``pyproject.toml`` with
        ``[project.entry-points.tito]`` / ``mybackend = "tito_mybackend"``::

            from tito_core.backend import Backend, GenerateRequest, GenerateResult
            from tito_core.plugins import BackendSpec, hookimpl


            class MyBackend(Backend):
                name = "mybackend"

                def __init__(self, base_url: str = "http://localhost:8000") -> None:
                    self.base_url = base_url

                async def generate(self, request: GenerateRequest) -> GenerateResult:
                    ...  # one request to the engine, token ids in, token ids out


            @hookimpl
            def tito_backends():
                yield BackendSpec("mybackend", MyBackend, "My engine over HTTP")

        Users then select it with ``get_backend("mybackend", base_url=...)`` or ``backend =
        "mybackend"`` in a tito config file. Keep the module named by the entry point cheap to import:
        give the factory as a ``"module:attr"`` string when the backend class pulls in heavy imports.
        """
        yield from ()

    @hookspec
    def tito_tool_parsers(self) -> Iterable[ToolParserSpec]:
        """Yield the tool parsers this plugin provides.

        A complete plugin, ``tito_myparser.py``, declared with ``[project.entry-points.tito]`` /
        ``myparser = "tito_myparser"``::

            from tito_core.plugins import ToolParserSpec, hookimpl
            from tito_core.tool_parsers.base import ParsedOutput


            class MyParser:
                name = "myparser"

                def parse(self, text, tools=None):
                    return ParsedOutput(content=text.strip())


            @hookimpl
            def tito_tool_parsers():
                yield ToolParserSpec("myparser", MyParser, "Plain text, never a tool call")

        Users then select it with ``tool_parser = "myparser"`` (or ``get_tool_parser("myparser")``).
        """
        yield from ()


class PluginFailure(NamedTuple):
    """A plugin that could not be loaded or whose hook failed."""

    plugin: str
    """Plugin (entry-point) name."""
    label: str
    """Plugin name with its distribution and version, for messages."""
    error: BaseException
    """What went wrong."""


_SpecT = TypeVar("_SpecT", BackendSpec, ToolParserSpec)


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
        builtins: Register the core's built-ins (:mod:`tito_core._builtins`).

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
            if name == BUILTIN_PLUGIN and ep.value.strip() == "tito_core._builtins":
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
                plugin = ep.load()
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
        from tito_core import _builtins

        if self.is_registered(_builtins):
            return
        name = BUILTIN_PLUGIN if not self.has_plugin(BUILTIN_PLUGIN) else _builtins.__name__
        self._labels.setdefault(name, f"{name} (tito-core, built in)")
        self.register(_builtins, name=name)

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
        _check_options(kind, key, factory, options)
        return _call_factory(kind, key, factory, options)

    def _resolve(self, kind: str, spec: BackendSpec | ToolParserSpec, label: str) -> Callable[..., Any]:
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


def _check_options(kind: str, name: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> None:
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


def _call_factory(kind: str, name: str, factory: Callable[..., Any], options: Mapping[str, Any]) -> object:
    """Call the factory; a keyword it refuses (one its signature could not show) is a ConfigError."""
    try:
        return factory(**options)
    except TypeError as exc:
        match = _UNEXPECTED_KEYWORD.search(str(exc))
        if match is None or match.group(1) not in options:
            raise
        raise ConfigError(f"invalid options for {kind} {name!r}: unknown option `{match.group(1)}` ({exc})") from exc


# --- the process-wide manager -----------------------------------------------------------------------

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
