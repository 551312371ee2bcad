"""TitoModel: the Strands model that records every call as exact tokens.

The model keeps Strands' agent loop untouched. It is the Strands front and nothing more: it converts each call's
Strands messages into tito's :class:`~tito_core.conversation.Conversation`
(:func:`~tito_core.strands_front.messages.to_conversation`) and hands it to a :class:`~tito_core.rollout_core.Rollout`,
which renders the new messages, asks the backend, validates and records the answer in the live
:class:`~tito_core.trajectory.Trajectory` and sets its status; the model turns the result into Strands events,
and shows malformed tool calls back to the model instead of running them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel
from strands.models.model import Model
from strands.types.content import Messages
from strands.types.exceptions import ContextWindowOverflowException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolSpec

from .. import plugins
from ..backend import Backend, SamplingParams, sampling_params
from ..conversation import ChatCache
from ..errors import ConfigError, ContextLengthError, ContextWindowFullError, TitoError
from ..grammar import GrammarToolParser
from ..model_setup import ModelSettings, ModelSetup, call_options
from ..rollout_core import CallOptions, CallResult
from ..rollout_core.labels import parse_label
from ..status import end_with
from ..tokenizers import aload_tokenizer, is_tokenizer_cached
from ..tool_parsers.base import ToolParser
from ..trajectory import Trajectory
from .messages import to_conversation

if TYPE_CHECKING:
    from strands.hooks import BeforeToolCallEvent
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger("tito")
T = TypeVar("T", bound=BaseModel)
_CONFIG_KEYS = frozenset(CallOptions.__struct_fields__)
end_with(ContextWindowOverflowException, "truncated")  # Strands' own overflow ends a rollout truncated


class StrandsContextLengthError(ContextLengthError, ContextWindowOverflowException):
    """A :class:`~tito_core.errors.ContextLengthError` that is also Strands' context overflow (``TitoModel``)."""


class StrandsContextWindowFullError(ContextWindowFullError, ContextWindowOverflowException):
    """A :class:`~tito_core.errors.ContextWindowFullError` that is also Strands' context overflow (``TitoModel``)."""


def for_strands(exc: ContextLengthError | ContextWindowFullError) -> TitoError:
    """``exc`` as the same error that is also Strands' ``ContextWindowOverflowException`` (same message, fields)."""
    kind = StrandsContextLengthError if isinstance(exc, ContextLengthError) else StrandsContextWindowFullError
    error = kind.__new__(kind)
    error.__dict__.update(exc.__dict__)
    error.args = exc.args
    return error


class TitoModel(Model):
    """A Strands ``Model`` whose every call is token-in/token-out.

    One instance per agent (per rollout). :attr:`trajectory` is the live record; :meth:`reset` closes
    it and starts a new one.

    Args:
        backend: A :class:`Backend` instance, or a backend name (``"vllm"``, ``"sglang"``, a plugin's)
            built with ``backend_options``.
        tokenizer: A Hugging Face tokenizer, or a local path / hub name loaded with
            :func:`tito_core.tokenizers.load_tokenizer` (once per process per path; local files first, a
            clear error for a missing path, no hub retries when offline).
        rollout_id: Id of the first rollout (random when None).
        backend_options: Options for a backend given by name.
        settings: The model's :class:`~tito_core.model_setup.ModelSettings` (a
            :class:`~tito_core.config.TitoConfig` is one); None: the defaults.
        **options: Settings replacing those of ``settings``, by name: ``tool_parser``, ``sampling``,
            ``chat_template``, ``processor``, ``tool_choice``, ... (every field of
            :class:`~tito_core.model_setup.ModelSettings`, documented there). An unknown name is a
            :class:`ConfigError`. ``tool_choice`` can be changed between calls with ``update_config``.
    """

    def __init__(
        self,
        backend: Backend | str,
        tokenizer: PreTrainedTokenizerBase | str,
        *,
        rollout_id: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
        settings: ModelSettings | None = None,
        **options: Any,
    ) -> None:
        if isinstance(backend, str):
            backend = plugins.get_backend(backend, **dict(backend_options or {}))
        elif backend_options:
            raise ConfigError("backend_options are only used when the backend is given by name")
        if not isinstance(backend, Backend):
            raise ConfigError(f"backend must be a tito Backend or a backend name, got {type(backend).__name__}")
        if isinstance(tokenizer, (str, os.PathLike)) and _in_event_loop() and not is_tokenizer_cached(tokenizer):
            logger.warning(
                "loading tokenizer %s on the event loop (seconds); in async code use `await TitoModel.create(...)`"
                " or `await aload_tokenizer(...)` first",
                tokenizer,
            )
        self.setup = ModelSetup.build(tokenizer, settings, **options)
        self.backend: Backend = backend
        self.tokenizer = self.setup.tokenizer
        self.tool_parser: ToolParser = self.setup.tool_parser
        self.renderer = self.setup.renderer
        self._options = self.setup.options
        self._rollout = self.setup.rollout(backend, rollout_id)
        self._malformed: dict[str, str] = {}
        self._chat = ChatCache()
        self._guarded: weakref.ref[Any] | None = None  # the agent whose tool calls are guarded (one, mostly)
        self._guarded_more: weakref.WeakSet[Any] | None = None  # any other agent on this model

    @classmethod
    async def create(
        cls, backend: Backend | str, tokenizer: PreTrainedTokenizerBase | str, **options: Any
    ) -> TitoModel:
        """Build a model from async code: a tokenizer given by path is loaded on a worker thread (once per process).

        Takes the same arguments as the constructor.
        """
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = await aload_tokenizer(tokenizer)
        return cls(backend, tokenizer, **options)

    # ------------------------------------------------------------------------------ configuration
    def update_config(self, **model_config: Any) -> None:
        """Update sampling / limits / logprob options (unknown keys are an error)."""
        unknown = set(model_config) - _CONFIG_KEYS
        if unknown:
            raise ConfigError(f"unknown TitoModel config keys: {sorted(unknown)}; known: {sorted(_CONFIG_KEYS)}")
        if "sampling" in model_config:
            model_config["sampling"] = sampling_params(model_config["sampling"])
        values = {key: getattr(self._options, key) for key in _CONFIG_KEYS}
        values.update(model_config)
        self._options = call_options(**values)

    def get_config(self) -> dict[str, Any]:
        """The current configuration (a copy)."""
        return {key: getattr(self._options, key) for key in sorted(_CONFIG_KEYS)}

    @property
    def sampling(self) -> SamplingParams:
        """The sampling parameters used for every call."""
        return self._options.sampling

    # -------------------------------------------------------------------------------- trajectory
    @property
    def trajectory(self) -> Trajectory:
        """The current rollout: the branch of the last call, with every other branch in its ``branches``."""
        return self._rollout.trajectory

    def reset(self, rollout_id: str | None = None) -> Trajectory:
        """Close every branch of the current rollout, start a new one, and return the closed trajectory."""
        self._malformed.clear()
        self._chat.clear()
        return self._rollout.reset(rollout_id)

    # ------------------------------------------------------------------------------------ calling
    def _attach_guard(self, invocation_state: Mapping[str, Any] | None) -> None:
        agent = (invocation_state or {}).get("agent")
        first = self._guarded() if self._guarded is not None else None
        if agent is None or agent is first or (self._guarded_more is not None and agent in self._guarded_more):
            return
        from strands.hooks import BeforeToolCallEvent

        agent.hooks.add_callback(BeforeToolCallEvent, self._refuse_malformed_call)
        if first is None:
            self._guarded = weakref.ref(agent)
        else:
            self._guarded_more = self._guarded_more if self._guarded_more is not None else weakref.WeakSet()
            self._guarded_more.add(agent)

    def _refuse_malformed_call(self, event: BeforeToolCallEvent) -> None:
        message = self._malformed.pop(event.tool_use["toolUseId"], None)
        if message is not None:
            event.cancel_tool = message

    async def stream(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None = None,
        system_prompt: str | None = None,
        *,
        tool_choice: Any = None,
        system_prompt_content: Any = None,
        invocation_state: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncIterable[StreamEvent]:
        """Run one model call token-in/token-out and stream its result as Strands events.

        A ``tool_choice`` that forces a call (``{"any": {}}``, ``{"tool": {"name": ...}}``; the model's
        ``tool_choice`` option when Strands passes none) constrains decoding to one call in the tool
        parser's syntax, on backends that support grammars. Calls may run at once (parallel sub-agents on one
        model, each on its own lineage of the rollout). ``invocation_state["tito_lineage"]`` (an agent's
        ``invoke_async(prompt, tito_lineage="sub-agent")``) labels the call's lineage
        (:mod:`~tito_core.rollout_core.labels`; a :class:`~tito_core.errors.LineageLabelError` when it is none).
        """
        label = parse_label((invocation_state or {}).get("tito_lineage"), "invocation_state['tito_lineage']")
        self._attach_guard(invocation_state)
        try:
            conversation = to_conversation(messages, tool_specs, system_prompt, system_prompt_content, cache=self._chat)
        except Exception as exc:  # content tito cannot render ends the call like any other failure
            self._rollout.fail(exc)
            raise
        try:
            result = await self._rollout.call(conversation, self._options, tool_choice=tool_choice, label=label)
        except (ContextLengthError, ContextWindowFullError) as exc:  # the rollout has its status already
            raise for_strands(exc) from exc
        for call in result.malformed_calls:
            self._malformed[call.id] = (
                f"Error: your tool call could not be parsed, so it was not run.\nReason: {call.error}\n"
                f"You generated:\n{call.raw}"
            )
        for event in _stream_events(result):
            yield event

    # ------------------------------------------------------------------------------ structured output
    async def structured_output(
        self, output_model: type[T], prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, T | Any], None]:
        """Ask for ``output_model`` as a tool call; the call is recorded in the trajectory like any other.

        The call is forced (``tool_choice``) when the backend supports grammars and the tool parser gives
        one; otherwise the model is asked and a :class:`TitoError` says so when it does not call the tool.
        """
        from strands.tools.structured_output.structured_output_utils import convert_pydantic_to_tool_spec

        spec = convert_pydantic_to_tool_spec(output_model)
        if self._rollout.capabilities.supports_grammar and isinstance(self.tool_parser, GrammarToolParser):
            kwargs.setdefault("tool_choice", {"tool": {"name": spec["name"]}})
        found: dict[str, Any] | None = None
        async for event in self.stream(prompt, [spec], system_prompt, **kwargs):
            delta = event.get("contentBlockDelta", {}).get("delta", {})
            if "toolUse" in delta and found is None:
                found = json.loads(delta["toolUse"]["input"])
            yield cast(dict[str, Any], event)
        if found is None:
            raise TitoError(f"the model did not call the {spec['name']!r} tool for structured output")
        yield {"output": output_model(**found)}


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _stream_events(result: CallResult) -> list[StreamEvent]:
    """The Strands events of one recorded call: reasoning, text, tool uses, stop and usage."""
    parsed = result.parsed
    events: list[dict[str, Any]] = [{"messageStart": {"role": "assistant"}}]
    if parsed.reasoning:
        events.append({"contentBlockDelta": {"delta": {"reasoningContent": {"text": parsed.reasoning}}}})
        events.append({"contentBlockStop": {}})
    if parsed.content or not (parsed.reasoning or parsed.calls):
        events.append({"contentBlockDelta": {"delta": {"text": parsed.content}}})
        events.append({"contentBlockStop": {}})
    for call in parsed.calls:
        events.append({"contentBlockStart": {"start": {"toolUse": {"name": call.name, "toolUseId": call.id}}}})
        events.append(
            {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(call.input, ensure_ascii=False)}}}}
        )
        events.append({"contentBlockStop": {}})
    events.append({"messageStop": {"stopReason": result.stop_reason}})
    usage = result.usage
    strands_usage: dict[str, int] = {
        "inputTokens": usage.prompt_tokens,
        "outputTokens": usage.completion_tokens,
        "totalTokens": usage.prompt_tokens + usage.completion_tokens,
    }
    if usage.cached_tokens is not None:
        strands_usage["cacheReadInputTokens"] = usage.cached_tokens
    events.append({"metadata": {"usage": strands_usage, "metrics": {"latencyMs": result.latency_ms}}})
    return cast(list[StreamEvent], events)
