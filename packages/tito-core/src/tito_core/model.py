"""TitoModel: the Strands model that records every call as exact tokens.

The model keeps Strands' agent loop untouched. On each call it turns the conversation into token ids
(incrementally, never re-encoding what the model generated), asks a :class:`~tito_core.backend.Backend`
to generate, appends prompt and output tokens to the live :class:`~tito_core.trajectory.Trajectory`,
parses tool calls from the output and streams Strands events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

import msgspec
from pydantic import BaseModel
from strands.models.model import Model
from strands.types.content import Message, Messages
from strands.types.exceptions import ContextWindowOverflowException
from strands.types.streaming import StreamEvent
from strands.types.tools import ToolSpec

from .backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from .chat import (
    ChatMessage,
    ChatRenderer,
    first_difference,
    system_text,
    to_chat_messages,
    tool_specs_to_chat,
)
from .errors import BackendError, BackendResponseError, ConfigError, PrefixMismatchError, TitoError
from .tool_parsers.base import ParsedOutput, ToolParser
from .trajectory import Status, Trajectory, Turn, Usage

if TYPE_CHECKING:
    from strands.hooks import BeforeToolCallEvent
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger("tito")

T = TypeVar("T", bound=BaseModel)
PrefixPolicy = Literal["fork", "warn", "error"]
_MarkKind = Literal["prompt", "output"]
_CONFIG_KEYS = frozenset(
    {"sampling", "context_window_limit", "return_logprobs", "return_prompt_logprobs", "return_routed_experts"}
)


class _Mark(msgspec.Struct, frozen=True):
    """After ``count`` messages, the trajectory stood at ``offset`` tokens, at the end of a ``kind`` chunk."""

    count: int
    offset: int
    kind: _MarkKind


class _Pending(msgspec.Struct, frozen=True):
    """The last output, waiting for Strands to append it to the conversation."""

    expected: list[tuple[Any, ...]]
    call_ids: list[str]


class _IdsJson:
    """The JSON text of a live trajectory's ids, extended as it grows: O(new tokens) per call, not O(all).

    ``body`` is the ids joined by commas (no brackets), covering the first ``count`` ids of ``traj``. A
    trajectory only grows, and a fork or reset makes a new one, so the text stays exact.
    """

    __slots__ = ("body", "count", "traj")

    def __init__(self, traj: Trajectory) -> None:
        self.traj = traj
        self.body = bytearray()
        self.count = 0

    def request_json(self, new_ids: Sequence[int]) -> bytes:
        """``traj`` ids followed by ``new_ids`` as a JSON array (what msgspec gives for the whole list)."""
        if self.count < len(self.traj):
            tail = _JSON.encode(self.traj.ids_array(self.count).tolist())[1:-1]
            if self.body:
                self.body += b","
            self.body += tail
            self.count = len(self.traj)
        new = _JSON.encode(list(new_ids))
        if not self.body:
            return new
        if len(new) == 2:
            return b"[" + self.body + b"]"
        return b"[" + self.body + b"," + new[1:]


_JSON = msgspec.json.Encoder()


class _Plan(msgspec.Struct, frozen=True):
    """What to send: the whole conversation (``initial``) or only the messages after ``count``."""

    initial: bool
    count: int
    chat: list[ChatMessage]


def _assistant_signature(message: Message) -> list[tuple[Any, ...]]:
    """The parts of an assistant message that determine its tokens, for comparing with what we emitted."""
    sig: list[tuple[Any, ...]] = []
    for block in message.get("content", []):
        if "text" in block:
            if block["text"]:
                sig.append(("text", block["text"]))
        elif "toolUse" in block:
            use = block["toolUse"]
            sig.append(("toolUse", use.get("toolUseId"), use.get("name"), use.get("input")))
        elif "reasoningContent" in block:
            sig.append(("reasoning", block["reasoningContent"].get("reasoningText", {}).get("text")))
    return sig


def _common_prefix(a: Sequence[Message], b: Sequence[Message]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TitoModel(Model):
    """A Strands ``Model`` whose every call is token-in/token-out.

    One instance per agent (per rollout). :attr:`trajectory` is the live record; :meth:`reset` closes
    it and starts a new one.

    Args:
        backend: A :class:`Backend` instance, or a backend name (``"vllm"``, ``"sglang"``, a plugin's)
            built with ``backend_options``.
        tokenizer: A Hugging Face tokenizer, or a path/name for ``AutoTokenizer.from_pretrained``.
        tool_parser: A :class:`ToolParser` or a registered parser name (``"hermes"``, ``"qwen_xml"``).
        sampling: Sampling parameters (a :class:`SamplingParams` or a dict of its fields).
        chat_template: A chat template overriding the tokenizer's (e.g. a prefix-preserving variant).
        chat_template_kwargs: Extra template variables (e.g. ``{"enable_thinking": False}``).
        context_window_limit: Context window in tokens; when None the backend is asked.
        return_logprobs: Record the logprob of every generated token.
        return_prompt_logprobs: Also record logprobs of prompt tokens.
        return_routed_experts: Record MoE routing decisions for routing replay.
        on_prefix_mismatch: For backends that render the prompt server-side: what to do when the
            server's prompt does not extend the trajectory: ``fork`` a new branch, ``warn`` and fork,
            or raise ``error``.
        rollout_id: Id of the first rollout (random when None).
        backend_options: Options for a backend given by name.
    """

    def __init__(
        self,
        backend: Backend | str,
        tokenizer: PreTrainedTokenizerBase | str,
        *,
        tool_parser: ToolParser | str = "hermes",
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        chat_template: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        context_window_limit: int | None = None,
        return_logprobs: bool = True,
        return_prompt_logprobs: bool = False,
        return_routed_experts: bool = False,
        on_prefix_mismatch: PrefixPolicy = "fork",
        rollout_id: str | None = None,
        backend_options: Mapping[str, Any] | None = None,
    ) -> None:
        from . import plugins

        if isinstance(backend, str):
            backend = plugins.get_backend(backend, **dict(backend_options or {}))
        elif backend_options:
            raise ConfigError("backend_options are only used when the backend is given by name")
        if not isinstance(backend, Backend):
            raise ConfigError(f"backend must be a tito Backend or a backend name, got {type(backend).__name__}")
        if isinstance(tokenizer, str):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        if on_prefix_mismatch not in ("fork", "warn", "error"):
            raise ConfigError(f"on_prefix_mismatch must be 'fork', 'warn' or 'error', not {on_prefix_mismatch!r}")
        self.backend: Backend = backend
        self.tokenizer = tokenizer
        self.tool_parser: ToolParser = plugins.get_tool_parser(tool_parser)
        self.renderer = ChatRenderer.shared(
            tokenizer, chat_template=chat_template, template_kwargs=chat_template_kwargs
        )
        self.on_prefix_mismatch: PrefixPolicy = on_prefix_mismatch
        self._config: dict[str, Any] = {
            "sampling": self._coerce_sampling(sampling),
            "context_window_limit": context_window_limit,
            "return_logprobs": return_logprobs,
            "return_prompt_logprobs": return_prompt_logprobs,
            "return_routed_experts": return_routed_experts,
        }
        self._engine_limit: int | Literal[False] | None = False  # False: not asked yet
        self._malformed: dict[str, str] = {}
        self._guarded_agents: weakref.WeakSet[Any] = weakref.WeakSet()
        self._busy = False
        self._start(Trajectory(rollout_id))

    # ------------------------------------------------------------------------------ configuration
    @staticmethod
    def _coerce_sampling(sampling: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
        if sampling is None:
            return SamplingParams()
        if isinstance(sampling, SamplingParams):
            return sampling
        try:
            return msgspec.convert(dict(sampling), SamplingParams)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid sampling parameters: {exc}") from exc

    def update_config(self, **model_config: Any) -> None:
        """Update sampling / limits / logprob options (unknown keys are an error)."""
        unknown = set(model_config) - _CONFIG_KEYS
        if unknown:
            raise ConfigError(f"unknown TitoModel config keys: {sorted(unknown)}; known: {sorted(_CONFIG_KEYS)}")
        if "sampling" in model_config:
            model_config["sampling"] = self._coerce_sampling(model_config["sampling"])
        self._config.update(model_config)

    def get_config(self) -> dict[str, Any]:
        """The current configuration (a copy)."""
        return dict(self._config)

    @property
    def sampling(self) -> SamplingParams:
        """The sampling parameters used for every call."""
        params: SamplingParams = self._config["sampling"]
        return params

    # -------------------------------------------------------------------------------- trajectory
    @property
    def trajectory(self) -> Trajectory:
        """The live trajectory of the current rollout (its latest branch)."""
        return self._traj

    def _start(self, traj: Trajectory) -> None:
        self._traj = traj
        self._consumed: list[Message] = []
        self._marks: list[_Mark] = []
        self._pending: _Pending | None = None
        self._call_ids: list[str] = []
        self._system: str | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._ids_json: _IdsJson | None = None

    def reset(self, rollout_id: str | None = None) -> Trajectory:
        """Close the current trajectory, start a new rollout, and return the closed trajectory."""
        closed = self._traj.close()
        self._malformed.clear()
        self._start(Trajectory(rollout_id))
        return closed

    # ------------------------------------------------------------------------------ conversation sync
    def _plan(self, messages: Messages, system: str | None, tools: list[dict[str, Any]] | None) -> _Plan:
        """Match the incoming conversation with what the trajectory holds; fork when history was rewritten."""
        if self._traj.last_segment is None:
            self._system, self._tools = system, tools
            return _Plan(initial=True, count=0, chat=to_chat_messages(messages, system_prompt=system))
        if system != self._system or tools != self._tools:
            return self._fork(messages, system, tools, 0, "the system prompt or the tool list changed")
        n = len(self._consumed)
        same_history = len(messages) >= n and _common_prefix(messages, self._consumed) == n
        if self._pending is not None:
            if (
                same_history
                and len(messages) > n
                and messages[n].get("role") == "assistant"
                and _assistant_signature(messages[n]) == self._pending.expected
            ):
                self._consumed.append(messages[n])
                self._marks.append(_Mark(n + 1, len(self._traj), "output"))
                self._call_ids = self._pending.call_ids
                self._pending = None
                n += 1
            elif same_history and len(messages) == n:
                return self._fork(
                    messages,
                    system,
                    tools,
                    n,
                    "the previous output was discarded (model call retried)",
                    discarded=True,
                )
            else:
                at = _common_prefix(messages, self._consumed)
                return self._fork(
                    messages, system, tools, at, f"the conversation history was rewritten at message {at}"
                )
        elif not same_history:
            at = _common_prefix(messages, self._consumed)
            return self._fork(messages, system, tools, at, f"the conversation history was rewritten at message {at}")
        new = messages[n:]
        if any(m.get("role") == "assistant" for m in new):
            return self._fork(messages, system, tools, n, "assistant messages were inserted into the history")
        if new and self._last_kind() != "output":
            # The trajectory ends with a generation prompt that got no output; messages cannot follow it.
            return self._fork(messages, system, tools, n, "messages were added after a prompt that got no output")
        if not new and self._last_kind() != "output":
            return _Plan(initial=False, count=n, chat=[])  # a retry of a call that failed before output
        return _Plan(initial=False, count=n, chat=to_chat_messages(new, call_order=self._call_ids))

    def _fork(
        self,
        messages: Messages,
        system: str | None,
        tools: list[dict[str, Any]] | None,
        agree: int,
        reason: str,
        *,
        discarded: bool = False,
    ) -> _Plan:
        """Start a new branch that keeps the longest token prefix still consistent with ``messages``."""
        self._pending = None
        keep: _Mark | None = None
        if system == self._system and tools == self._tools:
            for mark in reversed(self._marks):
                rest = messages[mark.count :]
                if mark.count > agree or any(m.get("role") == "assistant" for m in rest):
                    continue
                if mark.kind == "prompt" and rest:
                    continue  # the prompt chunk already ends with the generation header
                keep = mark
                break
        old = self._traj
        status: Status | None = "aborted" if discarded else None
        if keep is None:
            self._traj = old.fork(0, reason, status=status)
            self._consumed, self._marks, self._call_ids = [], [], []
            self._system, self._tools = system, tools
            logger.info("rollout %s: forked to branch %d from scratch: %s", old.rollout_id, self._traj.branch, reason)
            return _Plan(initial=True, count=0, chat=to_chat_messages(messages, system_prompt=system))
        self._traj = old.fork(keep.offset, reason, status=status)
        self._consumed = self._consumed[: keep.count]
        self._marks = [m for m in self._marks if m.offset <= keep.offset]
        logger.info(
            "rollout %s: forked to branch %d keeping %d tokens: %s",
            old.rollout_id,
            self._traj.branch,
            keep.offset,
            reason,
        )
        if keep.kind == "prompt":
            return _Plan(initial=False, count=keep.count, chat=[])
        self._call_ids = [
            block["toolUse"]["toolUseId"] for block in self._consumed[-1]["content"] if "toolUse" in block
        ]
        return _Plan(
            initial=False,
            count=keep.count,
            chat=to_chat_messages(messages[keep.count :], call_order=self._call_ids),
        )

    def _last_kind(self) -> str | None:
        last = self._traj.last_segment
        return last.kind if last is not None else None

    async def _new_prompt(self, plan: _Plan) -> tuple[list[int], int]:
        """Token ids of the new prompt, and how many of them (leading) are boundary tokens."""
        if plan.initial:
            return await self.renderer.aencode(self.renderer.initial_text(plan.chat, self._tools)), 0
        last_output = self._traj.last_segment
        if last_output is None or last_output.kind != "output":
            return [], 0
        eot, boundary = self.renderer.turn_tail
        ended = self._traj.tokens(last_output)[-1:]
        if not (ended and ended[0] in self.renderer.end_of_turn_ids):
            boundary = eot + boundary  # the model did not end its turn itself: close it as the template would
        text = boundary + self.renderer.continuation_text(plan.chat)
        ids = await self.renderer.aencode(text)
        n_boundary = 0
        if boundary:
            boundary_ids = self.renderer.encode(boundary)
            if ids[: len(boundary_ids)] == boundary_ids:
                n_boundary = len(boundary_ids)
        return ids, n_boundary

    # ------------------------------------------------------------------------------------ calling
    async def _context_limit(self) -> int | None:
        configured = self._config.get("context_window_limit")
        if configured:
            return int(configured)
        if self._engine_limit is False:
            try:
                self._engine_limit = await self.backend.max_context_length()
            except TitoError as exc:
                logger.warning("could not read the context length from the %s backend: %s", self.backend.name, exc)
                self._engine_limit = None
        return self._engine_limit

    def _attach_guard(self, invocation_state: Mapping[str, Any] | None) -> None:
        agent = (invocation_state or {}).get("agent")
        if agent is None or agent in self._guarded_agents:
            return
        from strands.hooks import BeforeToolCallEvent

        agent.hooks.add_callback(BeforeToolCallEvent, self._refuse_malformed_call)
        self._guarded_agents.add(agent)

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
        """Run one model call token-in/token-out and stream its result as Strands events."""
        if self._busy:
            raise TitoError("this TitoModel is already generating: use one TitoModel per agent / rollout")
        self._busy = True
        try:
            self._attach_guard(invocation_state)
            async for event in self._call(messages, tool_specs, system_text(system_prompt, system_prompt_content)):
                yield event
        finally:
            self._busy = False

    async def _call(
        self, messages: Messages, tool_specs: list[ToolSpec] | None, system: str | None
    ) -> AsyncGenerator[StreamEvent, None]:
        tools = tool_specs_to_chat(tool_specs)
        plan = self._plan(messages, system, tools)
        traj = self._traj
        renders = self.backend.renders_prompt
        new_ids, n_boundary = ([], 0) if renders else await self._new_prompt(plan)
        prefix_len = len(traj)
        sampling = self.sampling
        limit = await self._context_limit()
        if limit is not None:
            room = limit - prefix_len - len(new_ids)
            if room <= 0:
                traj.set_status(
                    "truncated",
                    f"context window full: {prefix_len + len(new_ids)} prompt tokens, limit {limit}",
                )
                needed = prefix_len + len(new_ids)
                raise ContextWindowOverflowException(
                    f"the prompt ({needed} tokens) leaves no room in the {limit}-token context window"
                )
            if sampling.max_new_tokens is None or sampling.max_new_tokens > room:
                sampling = msgspec.structs.replace(sampling, max_new_tokens=room)
        input_ids = traj.ids_array()
        input_ids.extend(new_ids)
        ids_json: bytes | None = None
        if self.backend.json_input_ids:
            cache = self._ids_json
            if cache is None or cache.traj is not traj or cache.count > len(traj):
                cache = self._ids_json = _IdsJson(traj)
            ids_json = cache.request_json(new_ids)
        request = GenerateRequest(
            rid=f"tito-{uuid.uuid4().hex}",
            input_ids=input_ids,
            prefix_len=prefix_len,
            sampling=sampling,
            return_logprobs=self._config["return_logprobs"],
            return_prompt_logprobs=self._config["return_prompt_logprobs"],
            return_routed_experts=self._config["return_routed_experts"],
            messages=to_chat_messages(messages, system_prompt=system) if renders else None,
            tools=tools if renders else None,
            input_ids_json=ids_json,
        )
        started = time.perf_counter()
        try:
            result = await self.backend.generate(request)
        except ContextWindowOverflowException as exc:
            traj.set_status("truncated", f"{type(exc).__name__}: {exc}")
            raise
        except asyncio.CancelledError:
            traj.set_status("aborted", "the model call was cancelled")
            raise
        except Exception as exc:
            traj.set_status("failed", f"{type(exc).__name__}: {exc}")
            raise
        latency_ms = int((time.perf_counter() - started) * 1000)
        self._check_result(request, result)
        if renders:
            new_ids, n_boundary = self._server_prompt(result)
            traj = self._traj
            prefix_len = len(traj)
        turn_index = len(traj.turns)
        prompt_lps = result.prompt_logprobs
        boundary_lps = prompt_lps[:n_boundary] if prompt_lps is not None else None
        rest_lps = prompt_lps[n_boundary:] if prompt_lps is not None else None
        traj.append("boundary", new_ids[:n_boundary], boundary_lps, turn=turn_index)
        traj.append("prompt", new_ids[n_boundary:], rest_lps, turn=turn_index)
        self._consumed = list(messages) if plan.initial else [*self._consumed, *messages[plan.count :]]
        self._marks.append(_Mark(len(self._consumed), len(traj), "prompt"))
        traj.append("output", result.output_ids, result.output_logprobs, turn=turn_index)

        parsed = await self._parse(result, tool_specs)
        if result.finish_reason == "length":
            stop = "max_tokens"
            traj.set_status("truncated", f"generation hit the token limit after {len(result.output_ids)} tokens")
        elif parsed.calls:
            stop = "tool_use"
            traj.set_status("running")
        else:
            stop = "end_turn"
            traj.set_status("completed" if result.finish_reason == "stop" else "aborted", None)
        if stop != "tool_use":
            self._ids_json = None  # the agent loop ends here: free the text (rebuilt if the rollout goes on)
        bad = [call for call in parsed.calls if call.is_error]
        for call in bad:
            traj.tool_parse_errors[call.name] = traj.tool_parse_errors.get(call.name, 0) + 1
            self._malformed[call.id] = (
                f"Error: your tool call could not be parsed, so it was not run.\nReason: {call.error}\n"
                f"You generated:\n{call.raw}"
            )
        usage = Usage(
            prompt_tokens=result.prompt_tokens if result.prompt_tokens is not None else len(request.input_ids),
            completion_tokens=len(result.output_ids),
            cached_tokens=result.cached_tokens,
        )
        traj.add_turn(
            Turn(
                index=turn_index,
                rid=request.rid,
                prompt_start=prefix_len,
                prompt_len=len(new_ids),
                output_len=len(result.output_ids),
                finish_reason=result.finish_reason,
                stop_reason=stop,
                matched_stop=result.matched_stop,
                usage=usage,
                tool_calls=len(parsed.calls),
                tool_parse_errors=len(bad),
                routed_experts=result.routed_experts,
                routed_experts_start=result.routed_experts_start,
                routed_experts_shape=result.routed_experts_shape,
            )
        )
        # Until Strands appends this output to the conversation, it is pending: a conversation that comes
        # back without it (a retry, a consumer that stopped early, an engine abort) forks the rollout.
        expected: list[tuple[Any, ...]] = []
        if parsed.reasoning:
            expected.append(("reasoning", parsed.reasoning))
        if parsed.content:
            expected.append(("text", parsed.content))
        expected.extend(("toolUse", call.id, call.name, call.input) for call in parsed.calls)
        self._pending = _Pending(expected=expected, call_ids=[call.id for call in parsed.calls])
        if result.finish_reason == "abort":
            raise BackendError("the engine aborted the request", backend=self.backend.name)

        yield {"messageStart": {"role": "assistant"}}
        if parsed.reasoning:
            yield {"contentBlockDelta": {"delta": {"reasoningContent": {"text": parsed.reasoning}}}}
            yield {"contentBlockStop": {}}
        if parsed.content or not (parsed.reasoning or parsed.calls):
            yield {"contentBlockDelta": {"delta": {"text": parsed.content}}}
            yield {"contentBlockStop": {}}
        for call in parsed.calls:
            yield {"contentBlockStart": {"start": {"toolUse": {"name": call.name, "toolUseId": call.id}}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(call.input, ensure_ascii=False)}}}}
            yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": cast(Any, stop)}}
        strands_usage: dict[str, int] = {
            "inputTokens": usage.prompt_tokens,
            "outputTokens": usage.completion_tokens,
            "totalTokens": usage.prompt_tokens + usage.completion_tokens,
        }
        if usage.cached_tokens is not None:
            strands_usage["cacheReadInputTokens"] = usage.cached_tokens
        yield cast(StreamEvent, {"metadata": {"usage": strands_usage, "metrics": {"latencyMs": latency_ms}}})

    def _check_result(self, request: GenerateRequest, result: GenerateResult) -> None:
        name = self.backend.name
        if result.output_logprobs is not None:
            if len(result.output_logprobs) != len(result.output_ids):
                raise BackendResponseError(
                    f"{len(result.output_ids)} output tokens but {len(result.output_logprobs)} logprobs",
                    backend=name,
                )
            lps = result.output_logprobs
            if lps and (any(map(math.isnan, lps)) or max(lps) > 1e-6):
                raise BackendResponseError("output logprobs must be finite and <= 0", backend=name)
        elif request.return_logprobs:
            raise BackendResponseError("logprobs were requested but the engine returned none", backend=name)
        if self.backend.renders_prompt:
            if result.prompt_ids is None:
                raise BackendResponseError("a prompt-rendering backend must return the prompt token ids", backend=name)
        elif result.prompt_ids is not None and list(result.prompt_ids) != list(request.input_ids):
            at = first_difference(result.prompt_ids, request.input_ids)
            raise BackendResponseError(
                f"the engine consumed a different prompt (first difference at token {at})", backend=name
            )
        if (
            result.prompt_logprobs is not None
            and len(result.prompt_logprobs) != len(request.input_ids) - request.prefix_len
        ):
            raise BackendResponseError(
                f"{len(request.input_ids) - request.prefix_len} new prompt tokens but "
                f"{len(result.prompt_logprobs)} prompt logprobs",
                backend=name,
            )

    def _server_prompt(self, result: GenerateResult) -> tuple[list[int], int]:
        """For prompt-rendering backends: check the server's prompt extends the trajectory; return the new part."""
        prompt = list(result.prompt_ids or [])
        traj = self._traj
        have = traj.token_ids
        if prompt[: len(have)] != have:
            at = first_difference(prompt, have)
            message = (
                f"the server-rendered prompt does not extend the trajectory: first difference at token {at} "
                f"(recorded {have[at : at + 8]}, server {prompt[at : at + 8]})"
            )
            if self.on_prefix_mismatch == "error":
                traj.set_status("failed", message)
                raise PrefixMismatchError(message, position=at, expected=have[at : at + 8], actual=prompt[at : at + 8])
            if self.on_prefix_mismatch == "warn":
                logger.warning("%s; forking a new branch", message)
            self._traj = traj.fork(0, message)
            self._marks = []
            return prompt, 0
        new = prompt[len(have) :]
        _, boundary = self.renderer.turn_tail
        n_boundary = 0
        if boundary and self._last_kind() == "output":
            boundary_ids = self.renderer.encode(boundary)
            if new[: len(boundary_ids)] == boundary_ids:
                n_boundary = len(boundary_ids)
        return new, n_boundary

    async def _parse(self, result: GenerateResult, tool_specs: Sequence[ToolSpec] | None) -> ParsedOutput:
        ids = result.output_ids
        if result.finish_reason == "stop" and ids and self._is_stop_token(ids[-1], result):
            ids = ids[:-1]
        return self.tool_parser.parse(await self.renderer.adecode(ids), tool_specs)

    def _is_stop_token(self, token_id: int, result: GenerateResult) -> bool:
        """Did generation end on this token as a stop token (not as content)?"""
        return (
            token_id in self.renderer.end_of_turn_ids
            or token_id in self.sampling.stop_token_ids
            or (isinstance(result.matched_stop, int) and result.matched_stop == token_id)
        )

    # ------------------------------------------------------------------------------ structured output
    async def structured_output(
        self, output_model: type[T], prompt: Messages, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, T | Any], None]:
        """Ask for ``output_model`` as a tool call; the call is recorded in the trajectory like any other."""
        from strands.tools.structured_output.structured_output_utils import convert_pydantic_to_tool_spec

        spec = convert_pydantic_to_tool_spec(output_model)
        found: dict[str, Any] | None = None
        async for event in self.stream(prompt, [spec], system_prompt, **kwargs):
            delta = event.get("contentBlockDelta", {}).get("delta", {})
            if "toolUse" in delta and found is None:
                found = json.loads(delta["toolUse"]["input"])
            yield cast(dict[str, Any], event)
        if found is None:
            raise TitoError(f"the model did not call the {spec['name']!r} tool for structured output")
        yield {"output": output_model(**found)}
