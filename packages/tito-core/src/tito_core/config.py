"""Configuration: the backend chosen by name, loadable from a TOML file, a mapping or the environment.

A config file holds the keys of :class:`TitoConfig` at the top level or in a ``[tito]`` table
(``[tool.tito]`` in a ``pyproject.toml``)::

    [tito]
    backend = "vllm"
    backend_options = { base_url = "http://localhost:8000" }
    tokenizer = "Qwen/Qwen3-8B"
    tool_parser = "hermes"
    sampling = { temperature = 1.0, max_new_tokens = 2048 }

The ``[rollout]`` table (or ``[tito.rollout]``) configures the rollout runner (``tito rollout``,
:func:`tito_core.rollout`): see :class:`RolloutSettings`. ``backend_options.base_url`` may list several
servers there; the runner routes rollouts between them.

Environment: ``TITO_CONFIG`` is the file :func:`load_config` reads when given no source, and
``TITO_BACKEND`` overrides ``backend`` whatever the source.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from tito_core._suggest import did_you_mean
from tito_core.backend import Backend, SamplingParams, sampling_params
from tito_core.errors import ConfigError, at_key
from tito_core.model_setup import ModelSettings, ModelSetup
from tito_core.plugins import get_backend
from tito_core.rollout_settings import AgentSettings, GatewaySettings, RolloutSettings, TaskSource
from tito_core.tokenizers import load_tokenizer

if TYPE_CHECKING:
    from tito_core.strands_front.model import TitoModel

__all__ = ["AgentSettings", "GatewaySettings", "RolloutSettings", "TitoConfig", "load_config", "with_overrides"]


class TitoConfig(ModelSettings, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Everything needed to build a :class:`~tito_core.strands_front.model.TitoModel` from names and plain values.

    A config is the model's :class:`~tito_core.model_setup.ModelSettings` (every setting at the top level:
    ``tool_parser``, ``sampling``, ``chat_template``, ``processor``, ...; documented there, in their plain form:
    a parser by name, sampling as a table, a processor directory) and the attributes below.

    Attributes:
        backend: Name of the backend plugin (``"vllm"``, ``"sglang"``, ``"scripted"``, a third party's).
        backend_options: Keyword arguments for the backend's factory (``base_url``, timeouts, ...).
        tokenizer: A tokenizer directory or a Hugging Face hub name, loaded with
            :func:`tito_core.tokenizers.load_tokenizer` (local files first, once per process).
        rollout: Settings of the rollout runner (:class:`RolloutSettings`).

    """

    backend: str
    backend_options: dict[str, Any] = msgspec.field(default_factory=dict)
    tokenizer: str | None = None
    rollout: RolloutSettings = msgspec.field(default_factory=RolloutSettings)

    def __post_init__(self) -> None:
        if not self.backend.strip():
            raise ConfigError("`backend` must name a backend plugin, got an empty string")
        if not isinstance(self.tool_parser, str):  # a config holds plain values: a parser by its name
            raise ConfigError(f"`tool_parser` must name a tool parser plugin, got {self.tool_parser!r}")
        if not isinstance(self.processor, str | bool | None):
            raise ConfigError(f"`processor` must be a directory, true or false, got {self.processor!r}")
        if not isinstance(self.sampling, dict):
            raise ConfigError(f"`sampling` must be a table of sampling parameters, got {self.sampling!r}")
        super().__post_init__()

    def sampling_params(self) -> SamplingParams:
        """Return the config's ``sampling`` as :class:`~tito_core.backend.SamplingParams`.

        The same schema as ``TitoModel(..., sampling=...)``: :func:`tito_core.backend.sampling_params`.
        """
        return sampling_params(self.sampling)

    def create_backend(self) -> Backend:
        """Create the configured backend through the plugin registry."""
        if isinstance(self.backend_options.get("base_url"), list):
            raise ConfigError(
                "`backend_options.base_url` lists several servers: only the rollout runner routes between them;"
                " give one URL to build a single backend"
            )
        return get_backend(self.backend, **self.backend_options)

    def settings(self) -> ModelSettings:
        """The model's settings of this config (its :class:`~tito_core.model_setup.ModelSettings` fields)."""
        return ModelSettings(**{name: getattr(self, name) for name in ModelSettings.__struct_fields__})

    def tokenizer_or(self, tokenizer: Any = None) -> Any:
        """``tokenizer`` when given (a loaded one), else :attr:`tokenizer` (a path or name).

        Raises:
            ConfigError: Neither is set.
        """
        if tokenizer is not None:
            return tokenizer
        if self.tokenizer is None:
            raise ConfigError("`tokenizer` is not set: give its path or name in the config, or pass one")
        return self.tokenizer

    def model_setup(self, tokenizer: Any = None, *, processor: Any = None) -> ModelSetup:
        """The :class:`~tito_core.model_setup.ModelSetup` of this config, as every front builds it.

        ``tokenizer`` is a loaded one to use instead of :attr:`tokenizer`; ``processor`` (a directory, a Hugging
        Face image processor, ``False``) overrides the config's ``processor``.
        """
        changed = {"processor": processor} if processor is not None else {}
        return ModelSetup.build(self.tokenizer_or(tokenizer), self.settings(), **changed)

    def create_model(
        self,
        backend: Backend | None = None,
        *,
        tokenizer: Any = None,
        rollout_id: str | None = None,
        model_class: type[TitoModel] | None = None,
    ) -> TitoModel:
        """Create a :class:`~tito_core.strands_front.model.TitoModel` from this configuration.

        Args:
            backend: A backend to share between models; None creates the configured one.
            tokenizer: An already-loaded tokenizer; None loads :attr:`tokenizer` with
                :func:`~tito_core.tokenizers.load_tokenizer`, so every model built from one config (or
                from configs naming the same tokenizer) shares one tokenizer object.
            rollout_id: Id of the model's first rollout (random when None).
            model_class: A :class:`~tito_core.strands_front.model.TitoModel` subclass to build instead (e.g. one
                that adds the attributes a library reads from its models).

        Raises:
            ConfigError: No tokenizer is set, or it cannot be loaded (see
                :func:`~tito_core.tokenizers.load_tokenizer`), or a plugin option is wrong.

        """
        from tito_core.strands_front.model import TitoModel  # Strands, only for the Strands front

        loaded = self.tokenizer_or(tokenizer)
        if isinstance(loaded, (str, os.PathLike)):
            loaded = load_tokenizer(loaded)
        model_type = model_class or TitoModel
        backend = backend if backend is not None else self.create_backend()
        return model_type(backend, loaded, rollout_id=rollout_id, settings=self.settings())


def load_config(source: str | os.PathLike[str] | Mapping[str, Any] | None = None) -> TitoConfig:
    """Load a :class:`TitoConfig`.

    Args:
        source: A TOML file path, a mapping of config keys, or None for the file named by the
            ``TITO_CONFIG`` environment variable. ``TITO_BACKEND``, when set, overrides ``backend``;
            with no source and no ``TITO_CONFIG`` it is enough on its own.

    Raises:
        ConfigError: The file is missing or not valid TOML, a key is unknown, or a value has the wrong
            type; the message names the file and the key.

    """
    if source is None:
        env_path = os.environ.get("TITO_CONFIG", "").strip()
        if env_path:
            source = env_path
        elif os.environ.get("TITO_BACKEND", "").strip():
            source = {}
        else:
            raise ConfigError("no tito configuration: pass a file or a mapping, or set TITO_CONFIG or TITO_BACKEND")
    if isinstance(source, Mapping):
        data, origin, prefix = dict(source), "config", ""
    else:
        origin = os.fspath(source)
        data, prefix = _read_toml(Path(source))
    backend = os.environ.get("TITO_BACKEND", "").strip()
    if backend:
        data["backend"] = backend
    return _build(data, origin, prefix)


def with_overrides(config: TitoConfig, overrides: Mapping[str, Any], *, origin: str = "overrides") -> TitoConfig:
    """A copy of ``config`` with some keys replaced.

    Keys of :class:`TitoConfig`, or of :class:`RolloutSettings` (which go into the ``rollout`` table). None
    values are ignored, so unset command-line flags change nothing; ``backend_options`` are merged into the
    config's own. A dotted key sets one entry inside a table: ``sampling.temperature``,
    ``backend_options.retry.max_attempts``, ``rollout.forced_tool_calls``.

    Raises:
        ConfigError: An unknown key or a bad value, named.
    """
    data = msgspec.structs.asdict(config)  # not to_builtins: backend options may hold Python objects
    data["rollout"] = msgspec.structs.asdict(config.rollout)
    for name in _ROLLOUT_TABLES:
        table = getattr(config.rollout, name)
        if table is not None:
            data["rollout"][name] = msgspec.structs.asdict(table)
    rollout_keys = RolloutSettings.__struct_fields__
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:
            head, *path = key.split(".")
            if head not in data or not isinstance(data[head], dict):
                tables = sorted(k for k, v in data.items() if isinstance(v, dict))
                raise ConfigError(f"{origin}: cannot set {key!r}: {head!r} is not a table ({', '.join(tables)})")
            data[head] = _set_in(data[head], path, value, key, origin)
        elif key in rollout_keys and key not in TitoConfig.__struct_fields__:
            data["rollout"][key] = value
        elif key == "backend_options" and isinstance(value, Mapping):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return _build(data, origin, "")


_ROLLOUT_TABLES: dict[str, type[msgspec.Struct]] = {
    "agent": AgentSettings,
    "tasks": TaskSource,
    "gateway": GatewaySettings,
}
"""The tables inside ``[rollout]``, by key."""


def _set_in(table: dict[str, Any], path: list[str], value: Any, key: str, origin: str) -> dict[str, Any]:
    """A copy of ``table`` with ``value`` at ``path`` (dotted key parts), making missing inner tables."""
    name, rest = path[0], path[1:]
    if not rest:
        return {**table, name: value}
    inner = table.get(name, {})
    if not isinstance(inner, dict):
        raise ConfigError(f"{origin}: cannot set {key!r}: {name!r} holds {inner!r}, not a table")
    return {**table, name: _set_in(inner, rest, value, key, origin)}


def _read_toml(path: Path) -> tuple[dict[str, Any], str]:
    """Read a config file; return its tito table and that table's dotted prefix."""
    try:
        with path.open("rb") as f:
            document = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file: {exc}") from exc
    if isinstance(document.get("tito"), dict):
        return dict(document["tito"]), "tito."
    tool = document.get("tool")
    if isinstance(tool, dict) and isinstance(tool.get("tito"), dict):
        return dict(tool["tito"]), "tool.tito."
    if path.name == "pyproject.toml":
        raise ConfigError(f"{path}: no [tool.tito] table")
    return document, ""


def _build(data: dict[str, Any], origin: str, prefix: str) -> TitoConfig:
    fields = TitoConfig.__struct_fields__
    for key in data:
        if key not in fields:
            raise ConfigError(f"{origin}: unknown key `{prefix}{key}`{did_you_mean(str(key), fields)}")
    rollout = data.get("rollout")
    if isinstance(rollout, Mapping):
        known = RolloutSettings.__struct_fields__
        for key in rollout:
            if key not in known:
                hint = did_you_mean(str(key), known)
                raise ConfigError(f"{origin}: unknown key `{prefix}rollout.{key}`{hint}")
        for name, kind in _ROLLOUT_TABLES.items():
            table = rollout.get(name)
            if isinstance(table, Mapping):
                for key in table:
                    if key not in kind.__struct_fields__:
                        hint = did_you_mean(str(key), kind.__struct_fields__)
                        raise ConfigError(f"{origin}: unknown key `{prefix}rollout.{name}.{key}`{hint}")
    if "backend" not in data:
        raise ConfigError(f"{origin}: missing required key `{prefix}backend` (or set TITO_BACKEND)")
    try:
        return msgspec.convert(data, TitoConfig)
    except msgspec.ValidationError as exc:
        # Errors raised in __post_init__ (ConfigError is a ValueError) arrive here wrapped in a
        # ValidationError; show the ConfigError's own message, once.
        if isinstance(exc.__cause__, ConfigError):
            raise ConfigError(f"{origin}: {exc.__cause__}") from exc.__cause__
        raise ConfigError(f"{origin}: {at_key(exc, prefix.rstrip('.'))}") from exc
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc
