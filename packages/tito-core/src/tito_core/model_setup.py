"""One model setup: the tokenizer, template, tool parser, vision and call options every front builds a rollout from.

:class:`ModelSettings` declares a model's settings once: their names, defaults, checks and documentation. A
:class:`~tito_core.config.TitoConfig` is one (it extends the struct, so a config file holds them at its top
level), and ``TitoModel(**options)`` and :meth:`ModelSetup.build` take them as keyword arguments
(:func:`model_settings`). :meth:`ModelSetup.build` is the only place that turns them into the parts (a tokenizer
path loaded once per process, ``tool_parser="auto"`` inferred from the template, the shared renderer, the vision
processor, checked call options). The Strands front (:class:`~tito_core.strands_front.model.TitoModel`),
``config.create_model`` and the gateway (``config.model_setup``) all go through both, so one config gives one
setup whatever the front.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from . import plugins
from ._suggest import did_you_mean
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

__all__ = ["ModelSettings", "ModelSetup", "call_options", "family_of", "model_settings", "vision_processor"]

_PREFIX_POLICIES = ("fork", "warn", "error")
_RENDER_MODES = ("auto", "incremental", "full")


class ModelSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Every setting of a model, declared once: a config's keys, ``TitoModel``'s and :meth:`ModelSetup.build`'s options.

    A setting that takes a Python object from code (a :class:`~tito_core.tool_parsers.base.ToolParser`,
    :class:`~tito_core.backend.SamplingParams`, an image processor) takes its plain form in a config file (a
    name, a table, a directory). Each value is checked when the settings are made (a :class:`ConfigError`).

    Attributes:
        tool_parser: A registered parser name (``"hermes"``, ``"qwen_xml"``, ``"llama3_json"``, ``"mistral"``,
            ...), ``"auto"`` to infer it from the chat template and the tokenizer's special tokens (a
            :class:`ConfigError` when it cannot be inferred), or (from code) a ``ToolParser``.
        tool_parser_options: Keyword arguments for a tool parser given by name.
        chat_template: A chat template overriding the tokenizer's (e.g. a prefix-preserving variant).
        chat_template_kwargs: Extra template variables (e.g. ``{"enable_thinking": False}``).
        escape_special_text: Encode system, user and tool message content as plain text, so text that spells a
            control token (``<|im_end|>`` in a tool result) stays text. Off by default: with a chat template such
            text becomes the control token, as it does in vLLM / SGLang. mistral-common tokenizers always keep it
            as text, as their engines do.
        processor: The image processor of a vision model (docs/multimodal.md): a directory, (from code) a Hugging
            Face image processor or a :class:`~tito_core.media.processor.VisionProcessor`; None takes the
            tokenizer's directory when it holds a ``preprocessor_config.json``; False: none (images are then an
            ``ImageError``).
        max_images: The most images and videos one prompt may hold.
        sampling: Default sampling parameters: a mapping of :class:`~tito_core.backend.SamplingParams` fields (a
            table in a config) or, from code, a ``SamplingParams``.
        context_window_limit: Context window in tokens; None asks the backend.
        return_logprobs: Record the logprob of every generated token.
        return_prompt_logprobs: Also record logprobs of prompt tokens.
        return_routed_experts: Record MoE routing decisions (routing replay).
        sampling_masks: ``exact`` (default): a call that truncates sampling (top-k, top-p, min-p) records the kept
            set of every output token, and is refused on a backend that cannot return them
            (:class:`~tito_core.errors.SamplingMaskError`); ``allow_missing`` runs it there and records why each
            such turn has none (docs/exactness.md).
        tool_choice: Strands' ``tool_choice`` for calls whose agent passes none: ``"auto"`` / None (the model
            decides), ``"any"`` (alias ``"required"``: one call to one of the offered tools) or
            ``{"tool": {"name": NAME}}``. A forced call is constrained by the tool parser's grammar
            (:mod:`tito_core.grammar`, docs/tool-choice.md).
        render_mode: How later prompts are rendered: ``"auto"`` (only the new messages, falling back to a full
            render for calls the template cannot render incrementally or that move its tools block),
            ``"incremental"`` or ``"full"`` (:data:`tito_core.rollout_core.RenderMode`).
        on_prefix_mismatch: For backends that render the prompt server-side, what a server prompt that does not
            extend the trajectory does: ``fork`` a new branch, ``warn`` and fork, or raise ``error``.
    """

    tool_parser: Any = "hermes"
    tool_parser_options: dict[str, Any] = msgspec.field(default_factory=dict)
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    escape_special_text: bool = False
    processor: Any = None
    max_images: int = DEFAULT_MAX_IMAGES
    sampling: Any = msgspec.field(default_factory=dict)
    context_window_limit: int | None = None
    return_logprobs: bool = True
    return_prompt_logprobs: bool = False
    return_routed_experts: bool = False
    sampling_masks: Literal["exact", "allow_missing"] = "exact"
    tool_choice: str | dict[str, Any] | None = None
    render_mode: RenderMode = "auto"
    on_prefix_mismatch: PrefixPolicy = "fork"

    def __post_init__(self) -> None:
        parser = self.tool_parser
        if isinstance(parser, str):
            if not parser.strip():
                raise ConfigError("`tool_parser` must name a tool parser plugin, got an empty string")
        elif not isinstance(parser, ToolParser):
            raise ConfigError(f"`tool_parser` must name a tool parser plugin or be a ToolParser, got {parser!r}")
        elif self.tool_parser_options:
            raise ConfigError("tool_parser_options are only used when the tool parser is given by name")
        limit = self.context_window_limit
        if limit is not None and (type(limit) is not int or limit <= 0):
            raise ConfigError(f"`context_window_limit` must be a positive integer or None, got {limit!r}")
        if self.render_mode not in _RENDER_MODES:
            raise ConfigError(f"render_mode must be 'auto', 'incremental' or 'full', not {self.render_mode!r}")
        if self.on_prefix_mismatch not in _PREFIX_POLICIES:
            raise ConfigError(f"on_prefix_mismatch must be 'fork', 'warn' or 'error', not {self.on_prefix_mismatch!r}")
        sampling_params(self.sampling)  # keys, types and ranges now rather than at the first model call
        tool_choice_option(self.tool_choice)


SETTINGS: frozenset[str] = frozenset(ModelSettings.__struct_fields__)
"""The names of the model settings."""
_DEFAULTS = ModelSettings()


def model_settings(settings: ModelSettings | None = None, /, **options: Any) -> ModelSettings:
    """``settings`` (None: the defaults) with some settings replaced by ``options``, checked.

    Raises:
        ConfigError: an unknown setting (named, with the closest one), or a bad value.
    """
    for name in options:
        if name not in SETTINGS:
            raise ConfigError(f"unknown model setting `{name}`{did_you_mean(name, SETTINGS)}")
    base = settings if settings is not None else _DEFAULTS
    return msgspec.structs.replace(base, **options) if options else base


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
    def build(cls, tokenizer: Any, settings: ModelSettings | None = None, /, **options: Any) -> ModelSetup:
        """Build the setup of ``settings`` with ``options`` replacing some (:func:`model_settings`).

        ``tokenizer`` is a Hugging Face tokenizer, or a path or hub name loaded once per process.

        Raises:
            ConfigError: A bad or unknown setting, an unknown tool parser, a tool parser ``"auto"`` cannot infer, a
                tokenizer or image processor that cannot be loaded.
        """
        settings = model_settings(settings, **options)
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(tokenizer)  # once per process per path, shared by every model
        tool_parser = settings.tool_parser
        if tool_parser == "auto":
            from .tool_parsers.infer import infer_tool_parser

            tool_parser = infer_tool_parser(tokenizer, settings.chat_template)
        renderer = shared_renderer(
            tokenizer,
            chat_template=settings.chat_template,
            template_kwargs=settings.chat_template_kwargs,
            escape_special_text=settings.escape_special_text,
        )
        return cls(
            tokenizer=tokenizer,
            renderer=renderer,
            tool_parser=plugins.get_tool_parser(tool_parser, **dict(settings.tool_parser_options or {})),
            vision=vision_processor(settings.processor, tokenizer, max_images=settings.max_images),
            options=call_options(
                sampling=sampling_params(settings.sampling),
                context_window_limit=settings.context_window_limit,
                return_logprobs=settings.return_logprobs,
                return_prompt_logprobs=settings.return_prompt_logprobs,
                return_routed_experts=settings.return_routed_experts,
                sampling_masks=settings.sampling_masks,
                tool_choice=settings.tool_choice,
            ),
            render_mode=settings.render_mode,
            on_prefix_mismatch=settings.on_prefix_mismatch,
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
