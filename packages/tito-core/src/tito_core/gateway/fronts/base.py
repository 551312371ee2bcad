"""What a front is: the codec of one wire API over the gateway's neutral call.

A :class:`Front` decodes its wire request into a :class:`~tito_core.gateway.call.CallRequest` (with whatever it
needs to answer, its *echo*) and encodes the :class:`~tito_core.gateway.call.CallAnswer` as its JSON answer, its
stream events and its errors. It declares its :class:`Route` s; the gateway's app serves each under a rollout's
path and by token alone, and knows no front by name. Fronts are registered through the plugin manager
(``tito_fronts``), so a third party adds one as a plugin.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from ..history import History
from ..images import ImageReader

if TYPE_CHECKING:
    from ..call import CallAnswer, CallRequest
    from ..errors import GatewayError
    from ..matching import ReplyBook
    from ..sse import Event

__all__ = ["Context", "Decoded", "Front", "Route"]


class Route(msgspec.Struct, frozen=True):
    """One route of a front.

    Attributes:
        path: The path after a rollout's prefix (``/v1/chat/completions``), an aiohttp path pattern.
        kind: ``call`` answers a model call; ``count`` counts a prompt's tokens (nothing recorded).
        stream: Whether the route streams; None when the request body says (its ``stream`` field).
    """

    path: str
    kind: Literal["call", "count"] = "call"
    stream: bool | None = None


class Decoded(msgspec.Struct, frozen=True):
    """A decoded request: the neutral call, and what the front keeps to answer it (its own, opaque here)."""

    request: CallRequest
    echo: Any = None


class Context:
    """What a front may use of the rollout a request is for.

    Attributes:
        images: The rollout's image reader (its last request's images kept).
        state: The front's own state for this rollout (:meth:`Front.new_state`), e.g. its past responses.
        route: The route the request came in on.
        path: The route's path parameters (``{model}``).
    """

    def __init__(
        self, book: ReplyBook, images: ImageReader, state: Any, route: Route, path: dict[str, str] | None = None
    ) -> None:
        self._book = book
        self.images = images
        self.state = state
        self.route = route
        self.path = path or {}

    def history(self, field: str) -> History:
        """A new history for this request, its messages in the caller's field ``field`` (``messages``)."""
        return History(self._book, field)


class Front(ABC):
    """The codec of one wire API.

    Attributes:
        name: The front's name (``chat_completions``), unique among the registered fronts.
        routes: The routes it answers.
        key_headers: More request headers its clients send the key in, besides ``Authorization: Bearer`` and
            ``x-api-key`` (Gemini's ``x-goog-api-key``).
    """

    name: ClassVar[str]
    routes: ClassVar[tuple[Route, ...]]
    key_headers: ClassVar[tuple[str, ...]] = ()

    def new_state(self) -> Any:
        """The front's state for a new rollout (None: it keeps none)."""
        return None

    @abstractmethod
    def decode(self, body: Any, context: Context) -> Decoded:
        """The neutral call of a decoded JSON ``body``.

        Raises:
            GatewayError: 400 naming the caller's field for anything tito cannot honour exactly.
        """

    @abstractmethod
    def encode(self, answer: CallAnswer, decoded: Decoded, context: Context) -> Any:
        """The JSON answer (a msgspec struct or plain data) of a recorded call."""

    @abstractmethod
    def events(self, answer: CallAnswer, decoded: Decoded, context: Context) -> list[Event]:
        """The recorded call as the front's stream of server-sent events."""

    @abstractmethod
    def error(self, error: GatewayError) -> Any:
        """The front's JSON error body for ``error`` (its status is ``error.status``)."""

    def count(self, tokens: int) -> Any:
        """The JSON answer of a ``count`` route: the prompt is ``tokens`` long."""
        raise NotImplementedError(f"the {self.name} front has no count route")
