"""Which renderer a tokenizer gets, and the per-process cache that shares it between models.

:func:`shared_renderer` gives a Hugging Face tokenizer a :class:`~tito_core.render.renderer.ChatRenderer`
and a mistral-common one (transformers' ``MistralCommonBackend``) a
:class:`~tito_core.render.mistral.MistralCommonRenderer`; it is the one place that knows both, so the base class
never names its subclass.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tito_core.errors import ConfigError
from tito_core.render.mistral import MistralCommonRenderer, is_mistral_common
from tito_core.render.renderer import ChatRenderer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["shared_renderer"]

_SHARED_RENDERERS = 16
_shared: OrderedDict[tuple[int, str | None, str, bool], ChatRenderer] = OrderedDict()
_lock = threading.Lock()  # guards _shared


def shared_renderer(
    tokenizer: PreTrainedTokenizerBase,
    *,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    escape_special_text: bool = False,
) -> ChatRenderer:
    """The renderer for ``tokenizer``, shared by every model with the same tokenizer object and settings.

    A renderer learns a few things about its template once (the dummy-prefix text, the end-of-turn
    tokens, whether the Rust shortcut is exact); sharing it spares every new rollout that work. The
    cache holds the last 16 combinations. A mistral-common tokenizer (transformers'
    ``MistralCommonBackend``) gets a :class:`~tito_core.render.mistral.MistralCommonRenderer`, which encodes
    with mistral-common as vLLM and SGLang do for Mistral models.

    Raises:
        ConfigError: ``chat_template`` given with a mistral-common tokenizer (it has no template).
    """
    make: Callable[[], ChatRenderer]
    if is_mistral_common(tokenizer):
        if chat_template is not None:
            raise ConfigError(
                "chat_template= cannot be used with a mistral-common tokenizer (MistralCommonBackend): it "
                "encodes conversations with mistral-common, which has no chat template, as vLLM and SGLang "
                "do in their mistral tokenizer mode. Drop chat_template= (tito then encodes with "
                "mistral-common too), or load the model's Hugging Face tokenizer (tokenizer.json) to render "
                "with a template"
            )
        make = lambda: MistralCommonRenderer(tokenizer, template_kwargs=template_kwargs)  # noqa: E731
    else:
        make = lambda: ChatRenderer(  # noqa: E731
            tokenizer,
            chat_template=chat_template,
            template_kwargs=template_kwargs,
            escape_special_text=escape_special_text,
        )
    try:
        kwargs_key = json.dumps(dict(template_kwargs or {}), sort_keys=True)
    except (TypeError, ValueError):  # unusual template variables: no sharing
        return make()
    key = (id(tokenizer), chat_template, kwargs_key, escape_special_text)
    with _lock:
        renderer = _shared.get(key)
        if renderer is not None and renderer.tokenizer is tokenizer:
            _shared.move_to_end(key)
            return renderer
    renderer = make()
    with _lock:
        _shared[key] = renderer  # the renderer holds the tokenizer, so its id stays unique while cached
        while len(_shared) > _SHARED_RENDERERS:
            _shared.popitem(last=False)
    return renderer
