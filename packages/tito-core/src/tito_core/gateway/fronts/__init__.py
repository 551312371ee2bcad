"""The gateway's fronts: one codec per wire API over the neutral call (:mod:`tito_core.gateway.call`).

- ``chat_completions`` (:mod:`~tito_core.gateway.fronts.chat_completions`): ``POST /v1/chat/completions``;
- ``responses`` (:mod:`~tito_core.gateway.fronts.responses`): ``POST /v1/responses``;
- ``messages`` (:mod:`~tito_core.gateway.fronts.messages`): ``POST /v1/messages`` and ``/v1/messages/count_tokens``.
- ``gemini`` (:mod:`~tito_core.gateway.fronts.gemini`): ``POST /v1beta/models/{model}:generateContent``,
  ``:streamGenerateContent`` and ``:countTokens`` (and the same under ``/v1/models/``).

Each route is served under ``/rollouts/<id>`` and by token alone. Each front is registered through the plugin
manager (``tito_fronts``, :class:`~tito_core.plugins.FrontSpec`), as a third party's front is; :func:`load_fronts`
builds the ones a gateway serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...errors import ConfigError
from .base import Context, Decoded, Front, Route

if TYPE_CHECKING:
    from ...plugins import TitoPluginManager

__all__ = ["Context", "Decoded", "Front", "Route", "load_fronts"]


def load_fronts(names: Sequence[str] | None = None, manager: TitoPluginManager | None = None) -> list[Front]:
    """The registered fronts (or those of ``names``), built.

    Raises:
        ConfigError: An unknown front name, a factory that builds no :class:`Front`, or two fronts on one route.
    """
    from ...plugins import plugin_manager

    manager = manager or plugin_manager()
    specs = manager.fronts()
    chosen = list(specs) if names is None else [n.strip().lower() for n in names]
    fronts: list[Front] = []
    owners: dict[str, str] = {}
    for name in chosen:
        spec = specs.get(name)
        if spec is None:
            raise ConfigError(f"unknown gateway front {name!r}; registered: {', '.join(specs) or 'none'}")
        front = manager.resolve("front", spec)()
        if not isinstance(front, Front):
            raise ConfigError(f"front {name!r}: its factory built a {type(front).__name__}, not a Front")
        for route in front.routes:
            if route.path in owners:
                raise ConfigError(f"fronts {owners[route.path]!r} and {name!r} both answer {route.path}")
            owners[route.path] = name
        fronts.append(front)
    return fronts
