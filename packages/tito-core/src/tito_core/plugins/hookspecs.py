"""The plugin contract: pluggy's markers for the ``tito`` project, the records a plugin yields, the hooks.

This module is what a plugin author reads: :data:`hookimpl` marks a hook implementation, :class:`TitoSpecs`
lists the hooks, and :class:`BackendSpec` / :class:`ToolParserSpec` are the records they yield. It imports
nothing of the plugin machinery (``tito_core.plugins.manager`` builds on it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import msgspec
import pluggy

from tito_core.backend import Backend
from tito_core.errors import ConfigError
from tito_core.media.base import MediaItem
from tito_core.media.families import VisionFamily
from tito_core.tool_parsers.base import ToolParser

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT_NAME",
    "BackendSpec",
    "FrontSpec",
    "InputKindSpec",
    "TitoSpecs",
    "ToolParserSpec",
    "VisionFamilySpec",
    "hookimpl",
    "hookspec",
]

PROJECT_NAME = "tito"
"""The pluggy project name, used for the markers and the manager."""
ENTRY_POINT_GROUP = "tito"
"""The entry-point group plugins declare (``[project.entry-points.tito]``)."""

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
"""Marks a hook specification. Only the core defines specs."""
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Marks a plugin's hook implementation: ``@hookimpl def tito_backends(): ...``."""

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_FACTORY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _check_spec(spec: BackendSpec | ToolParserSpec | InputKindSpec | VisionFamilySpec | FrontSpec, kind: str) -> None:
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


class InputKindSpec(msgspec.Struct, frozen=True):
    """An input kind a plugin provides (``image`` and ``video`` are the core's).

    Attributes:
        name: The kind's name: a chat content part ``{"type": name, name: item}`` holds one item, and spans,
            requests and backends' ``input_kinds`` name it so.
        factory: The kind's item class (a :class:`~tito_core.media.MediaItem` subclass whose ``kind`` is
            ``name``), or a ``"module:attr"`` string naming it.
        description: One line shown when kinds are listed.
    """

    name: str
    factory: str | type[MediaItem]
    description: str = ""

    def __post_init__(self) -> None:
        _check_spec(self, "input kind")


class VisionFamilySpec(msgspec.Struct, frozen=True):
    """A vision model family a plugin provides: its placeholders and token counts (Qwen-VL is the core's).

    Attributes:
        name: The family's name.
        factory: ``factory(image_processor, tokenizer, directory)`` returning a
            :class:`~tito_core.media.families.VisionFamily` (``directory`` is the model directory or None), or a
            ``"module:attr"`` string naming it.
        processors: The name prefixes of the Hugging Face image processor classes it serves
            (``"Qwen2VL"`` serves ``Qwen2VLImageProcessor`` and ``Qwen2VLImageProcessorPil``).
        description: One line shown when families are listed.
    """

    name: str
    factory: str | Callable[..., VisionFamily]
    processors: tuple[str, ...]
    description: str = ""

    def __post_init__(self) -> None:
        _check_spec(self, "vision family")
        if not self.processors or not all(isinstance(p, str) and p for p in self.processors):
            raise ConfigError(f"vision family {self.name!r}: processors must name at least one processor class prefix")


class FrontSpec(msgspec.Struct, frozen=True):
    """A gateway front a plugin provides: the codec of one wire API (``tito serve`` serves every registered one).

    Attributes:
        name: The front's name (``chat_completions``, ``responses``, ``messages``, ``gemini`` are the core's).
        factory: A callable returning a :class:`~tito_core.gateway.fronts.Front` (usually the class), or a
            ``"module:attr"`` string naming one, imported when a gateway starts.
        description: One line shown when fronts are listed.
    """

    name: str
    factory: str | Callable[[], object]
    description: str = ""

    def __post_init__(self) -> None:
        _check_spec(self, "front")


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

    @hookspec
    def tito_input_kinds(self) -> Iterable[InputKindSpec]:
        """Yield the input kinds this plugin provides (a kind of non-text input: its item class).

        A kind's items go into chat messages as ``{"type": name, name: item}``; a vision family that places
        them (``tito_vision_families``) and a backend whose ``input_kinds`` name it complete it::

            @hookimpl
            def tito_input_kinds():
                yield InputKindSpec("audio", "tito_audio:AudioClip", "A clip of 16 kHz samples")
        """
        yield from ()

    @hookspec
    def tito_vision_families(self) -> Iterable[VisionFamilySpec]:
        """Yield the vision model families this plugin provides, each with the image processors it serves.

        For example::

        @hookimpl
        def tito_vision_families():
            yield VisionFamilySpec("gemma3", "tito_gemma:Gemma3Family", ("Gemma3",), "Gemma 3: 256 tokens per image")
        """
        yield from ()

    @hookspec
    def tito_fronts(self) -> Iterable[FrontSpec]:
        """Yield the gateway fronts this plugin provides: each the codec of one wire API over the neutral call.

        A front (:class:`~tito_core.gateway.fronts.Front`) decodes its wire request into a
        :class:`~tito_core.gateway.call.CallRequest` and encodes the :class:`~tito_core.gateway.call.CallAnswer`, its
        stream and its errors (the core's are in ``tito_core.gateway.fronts``)::

            @hookimpl
            def tito_fronts():
                yield FrontSpec("ollama", "tito_ollama:OllamaChat", "Ollama's /api/chat")
        """
        yield from ()
