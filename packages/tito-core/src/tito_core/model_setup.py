"""One model setup: the tokenizer, template, tool parser, vision and call options every front builds a rollout from.

:meth:`ModelSetup.build` is the only place that turns model settings into these parts (a tokenizer path loaded
once per process, ``tool_parser="auto"`` inferred from the template, the shared renderer, the vision processor,
checked call options); :meth:`TitoConfig.setup_options <tito_core.config.TitoConfig.setup_options>` is the only
place that reads them out of a config. The Strands front (:class:`~tito_core.strands_front.model.TitoModel`),
``config.create_model`` and the gateway (``config.model_setup``) all go through both, so one config gives one
setup whatever the front.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from . import plugins
from .backend import Backend, sampling_params
from .errors import ConfigError
from .grammar import tool_choice_option
from .media.families import VisionFamily
from .media.processor import (
    DEFAULT_MAX_IMAGES,
    ProcessorSpec,
    VisionProcessor,
    directory_key,
    has_preprocessor,
    load_image_processor,
)
from .render import shared_renderer
from .render.renderer import ChatRenderer
from .rollout_core import CallOptions, PrefixPolicy, RenderMode, Rollout
from .tokenizers import load_tokenizer
from .tool_parsers.base import ToolParser

__all__ = ["ModelSetup", "call_options", "family_of", "vision_processor"]

_PREFIX_POLICIES = ("fork", "warn", "error")


@dataclass(frozen=True, eq=False)
class ModelSetup:
    """The parts of one configured model, shared by every rollout built from it.

    Attributes:
        tokenizer: The Hugging Face tokenizer.
        renderer: Chat template + tokenizer (one per tokenizer, template and options in the process).
        tool_parser: Parses tool calls out of each output (``"auto"`` resolved).
        vision: The vision processor; None for a text-only model.
        options: The per-call options (sampling, limits, logprobs, default ``tool_choice``).
        render_mode: How later prompts are rendered.
        on_prefix_mismatch: What a server-rendered prompt that does not extend the trajectory does.
    """

    tokenizer: Any
    renderer: ChatRenderer
    tool_parser: ToolParser
    vision: VisionProcessor | None
    options: CallOptions
    render_mode: RenderMode = "auto"
    on_prefix_mismatch: PrefixPolicy = "fork"

    @classmethod
    def build(
        cls,
        tokenizer: Any,
        *,
        tool_parser: ToolParser | str = "hermes",
        tool_parser_options: Mapping[str, Any] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        escape_special_text: bool = False,
        processor: ProcessorSpec = None,
        max_images: int = DEFAULT_MAX_IMAGES,
        sampling: Any = None,
        context_window_limit: int | None = None,
        return_logprobs: bool = True,
        return_prompt_logprobs: bool = False,
        return_routed_experts: bool = False,
        tool_choice: Mapping[str, Any] | str | None = None,
        render_mode: RenderMode = "auto",
        on_prefix_mismatch: PrefixPolicy = "fork",
    ) -> ModelSetup:
        """Build the setup (the arguments are ``TitoModel``'s; a tokenizer path is loaded).

        Raises:
            ConfigError: A bad option, an unknown tool parser, a tool parser ``"auto"`` cannot infer, a
                tokenizer or image processor that cannot be loaded.
        """
        if on_prefix_mismatch not in _PREFIX_POLICIES:
            raise ConfigError(f"on_prefix_mismatch must be 'fork', 'warn' or 'error', not {on_prefix_mismatch!r}")
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(tokenizer)  # once per process per path, shared by every model
        if tool_parser == "auto":
            from .tool_parsers.infer import infer_tool_parser

            tool_parser = infer_tool_parser(tokenizer, chat_template)
        if tool_parser_options and not isinstance(tool_parser, str):
            raise ConfigError("tool_parser_options are only used when the tool parser is given by name")
        renderer = shared_renderer(
            tokenizer,
            chat_template=chat_template,
            template_kwargs=chat_template_kwargs,
            escape_special_text=escape_special_text,
        )
        return cls(
            tokenizer=tokenizer,
            renderer=renderer,
            tool_parser=plugins.get_tool_parser(tool_parser, **dict(tool_parser_options or {})),
            vision=vision_processor(processor, tokenizer, max_images=max_images),
            options=call_options(
                sampling=sampling_params(sampling),
                context_window_limit=context_window_limit,
                return_logprobs=return_logprobs,
                return_prompt_logprobs=return_prompt_logprobs,
                return_routed_experts=return_routed_experts,
                tool_choice=tool_choice,
            ),
            render_mode=render_mode,
            on_prefix_mismatch=on_prefix_mismatch,
        )

    def rollout(self, backend: Backend, rollout_id: str | None = None) -> Rollout:
        """A new rollout of this model on ``backend``."""
        return Rollout(
            backend,
            self.renderer,
            self.tool_parser,
            on_prefix_mismatch=self.on_prefix_mismatch,
            rollout_id=rollout_id,
            render_mode=self.render_mode,
            vision=self.vision,
        )

    @property
    def never_sample(self) -> tuple[int, ...]:
        """The token ids an engine must never sample (the vision placeholders)."""
        return self.vision.never_sample if self.vision is not None else ()


def call_options(**values: Any) -> CallOptions:
    """Checked :class:`~tito_core.rollout_core.CallOptions` (``tool_choice`` in Strands' or OpenAI's form).

    Raises:
        ConfigError: A value of the wrong type, or a context window that is not a positive integer.
    """
    if "tool_choice" in values:
        values["tool_choice"] = tool_choice_option(values["tool_choice"])
    limit = values.get("context_window_limit")
    if limit is not None and (type(limit) is not int or limit <= 0):
        raise ConfigError(f"context_window_limit must be a positive integer or None, got {limit!r}")
    try:
        return msgspec.convert(values, CallOptions, from_attributes=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid model option: {exc}") from exc


def family_of(image_processor: Any, tokenizer: Any, directory: str | os.PathLike[str] | None = None) -> VisionFamily:
    """The :class:`~tito_core.media.families.VisionFamily` of a Hugging Face image processor, by its class name.

    The registered family (``tito_vision_families``) that serves the processor's class; ``directory`` is the model
    directory, where the family reads its video processor config.

    Raises:
        ConfigError: no registered family serves this processor.
    """
    factory = plugins.vision_family_factory(type(image_processor).__name__)
    family: VisionFamily = factory(image_processor, tokenizer, directory)
    return family


_shared: dict[tuple[int, int, int, str | None], tuple[VisionProcessor, weakref.ref[Any]]] = {}
"""Vision processors by (processor, tokenizer, max_images, directory), each with a weak reference to its tokenizer:
the cache neither keeps a tokenizer alive nor hands a dead tokenizer's processor to a new one given its id."""
_shared_lock = threading.Lock()


def vision_processor(
    processor: ProcessorSpec, tokenizer: Any, *, max_images: int = DEFAULT_MAX_IMAGES
) -> VisionProcessor | None:
    """The :class:`~tito_core.media.processor.VisionProcessor` of a model's ``processor`` setting (None: text-only).

    One per processor and tokenizer, with the family registered for the processor (:func:`family_of`).

    Raises:
        ConfigError: a directory without a loadable image processor, or a processor of an unknown family.
    """
    if processor is False:
        return None
    if isinstance(processor, VisionProcessor):
        return processor
    directory: str | None = None
    if processor is None:
        named = getattr(tokenizer, "name_or_path", None)
        if not named or not has_preprocessor(named):
            return None
        processor = named
    if isinstance(processor, (str, os.PathLike)):
        directory = directory_key(processor)
        processor = load_image_processor(directory)
    key = (id(processor), id(tokenizer), max_images, directory)
    with _shared_lock:
        cached = _shared.get(key)
        if cached is not None and cached[0].image_processor is processor and cached[1]() is tokenizer:
            return cached[0]
        shared = VisionProcessor(processor, family_of(processor, tokenizer, directory), max_images=max_images)
        with contextlib.suppress(TypeError):  # a tokenizer without weak references is not shared
            _shared[key] = (shared, weakref.ref(tokenizer, lambda _: _shared.pop(key, None)))
        return shared
