"""The images of a prompt as vLLM's ``/inference/v1/generate`` takes them: ``features`` over tito's own ids.

vLLM 0.32's generate route takes the prompt's token ids, placeholders already expanded, plus ``features``: per
modality, each item's hash (``mm_hashes``), where its placeholder tokens sit (``mm_placeholders``: offset and
length in ``token_ids``) and its processed tensors (``kwargs_data``: base64 of vLLM's own msgpack encoding of a
``MultiModalKwargsItem``). With ``features`` the server runs no processor and expands nothing: the engine
consumes the ids as sent.

``kwargs_data`` is vLLM's internal tensor format, so tito lets the server make it. One
``POST /v1/chat/completions/render`` of a message holding only the image gives its hash, its placeholder length
and its ``kwargs_data`` (vLLM renders without its processor cache, so the same image always gets the same
answer). :class:`ImageFeatures` keeps that answer per image (by content hash, least recently used dropped past
a byte budget) and lays it over the request's own spans. A placeholder length that differs from the span tito
expanded means the server's image processor disagrees with tito's renderer: a ``BackendResponseError`` before
any generation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from tito_core.backend import GenerateRequest
from tito_core.errors import BackendResponseError
from tito_core.media import PromptMedia

__all__ = ["RENDER_PATH", "ImageFeatures", "Rendered"]

RENDER_PATH = "/v1/chat/completions/render"
_MODALITY = "image"


class _Placeholder(msgspec.Struct, kw_only=True):
    offset: int
    length: int


class _Features(msgspec.Struct, kw_only=True):
    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[_Placeholder]]
    kwargs_data: dict[str, list[str | None]] | None = None


class _RenderAnswer(msgspec.Struct, kw_only=True):
    """The render route's answer (a generate request): only the fields read here."""

    token_ids: list[int]
    features: _Features | None = None


class Rendered(msgspec.Struct, frozen=True, kw_only=True):
    """vLLM's render of one image: its hash, how many placeholder tokens it takes, its tensors."""

    mm_hash: str
    length: int
    placeholder_id: int
    kwargs_data: str


Post = Callable[[str, dict[str, Any], int], Awaitable[bytes]]
"""POSTs a JSON body to a path with an answer byte limit; returns the answer's body."""


class ImageFeatures:
    """Builds the ``features`` of requests with images; remembers each image's render (LRU, by bytes)."""

    cache_bytes: int = 256 * 1024 * 1024
    """How many bytes of rendered tensors (base64) to keep; the least recently used go first."""

    def __init__(self, backend: str, post: Post) -> None:
        self._backend = backend
        self._post = post
        self._cache: OrderedDict[str, Rendered] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()  # a backend may serve several event loops (threads)

    async def features(self, request: GenerateRequest, model: str | None) -> dict[str, Any]:
        """The ``features`` field for ``request`` (which has images), in vLLM 0.32's shape."""
        hashes: list[str] = []
        placeholders: list[dict[str, int]] = []
        kwargs: list[str] = []
        for image in request.media:
            rendered = await self._rendered(image, model)
            span = image.span
            if rendered.length != span.length or rendered.placeholder_id != span.placeholder_id:
                raise BackendResponseError(
                    f"{self._backend}: the server's image processor gives image {image.image.sha256[:12]} "
                    f"{rendered.length} placeholder tokens of id {rendered.placeholder_id}; the prompt expanded it "
                    f"to {span.length} of id {span.placeholder_id} (the server and tito's renderer process "
                    "images differently: same model directory and processor settings?)",
                    field="mm_placeholders",
                    value=rendered.length,
                    backend=self._backend,
                )
            hashes.append(rendered.mm_hash)
            placeholders.append({"offset": span.start, "length": span.length})
            kwargs.append(rendered.kwargs_data)
        return {
            "mm_hashes": {_MODALITY: hashes},
            "mm_placeholders": {_MODALITY: placeholders},
            "kwargs_data": {_MODALITY: kwargs},
        }

    async def _rendered(self, image: PromptMedia, model: str | None) -> Rendered:
        key = image.image.sha256
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        rendered = await self.render(image, model)
        self._remember(key, rendered)
        return rendered

    async def render(self, image: PromptMedia, model: str | None) -> Rendered:
        """Ask the server to render a message holding only ``image``; read the image's features from it."""
        data = image.image
        url = data.data_url
        body = {
            "model": model,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        }
        width, height = data.size
        # The tensors of a Qwen-VL image take ~32 bytes of base64 per processed pixel; a large image is
        # shrunk by the processor, a small one grown to at most its minimum size.
        limit = 16 * 1024 * 1024 + 64 * width * height
        raw = await self._post(RENDER_PATH, body, limit)
        try:
            answer = msgspec.json.decode(raw, type=_RenderAnswer)
        except msgspec.DecodeError as exc:
            raise self._bad(f"cannot read the answer: {exc}", raw[:200].decode(errors="replace")) from exc
        features = answer.features
        if features is None or features.kwargs_data is None:
            raise self._bad("the answer has no image features (a text-only model or template?)")
        hashes = features.mm_hashes.get(_MODALITY, [])
        spans = features.mm_placeholders.get(_MODALITY, [])
        tensors = features.kwargs_data.get(_MODALITY, [])
        if len(hashes) != 1 or len(spans) != 1 or len(tensors) != 1 or tensors[0] is None:
            raise self._bad(f"expected one image item, got {len(hashes)} hashes and {len(spans)} placeholders")
        span = spans[0]
        ids = answer.token_ids[span.offset : span.offset + span.length]
        if len(ids) != span.length or span.length < 1 or len(set(ids)) != 1:
            raise self._bad(f"the image's placeholder range {span.offset}+{span.length} is not one repeated token")
        return Rendered(mm_hash=hashes[0], length=span.length, placeholder_id=ids[0], kwargs_data=tensors[0])

    def _remember(self, key: str, rendered: Rendered) -> None:
        size = len(rendered.kwargs_data)
        if size > self.cache_bytes:
            return
        with self._lock:
            if key in self._cache:  # rendered meanwhile by another call: the same answer
                return
            self._cache[key] = rendered
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes:
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= len(dropped.kwargs_data)

    def _bad(self, detail: str, body: str | None = None) -> BackendResponseError:
        return BackendResponseError(
            f"{self._backend}: {RENDER_PATH}: {detail}", field="features", body=body, backend=self._backend
        )
