"""The rollout state machine: what enters a trajectory, and the status every model call leaves behind.

:class:`Rollout` owns the live :class:`~tito_core.trajectory.Trajectory` of one rollout and every rule
about it, in the order of one model call:

1. **Sync**: match the incoming Strands conversation with the messages the tokens already cover; the
   assistant message Strands appended must be the one tito emitted. A rewritten history (a trimming
   conversation manager, a retried call, an edited message) forks a new branch keeping the longest
   consistent token prefix.
2. **Prompt**: render only the new messages (after the template's boundary), clamp ``max_new_tokens`` to
   the room left in the context window, build the :class:`~tito_core.backend.GenerateRequest`.
3. **Validate**: the engine's answer is checked (:func:`check_result`) before anything is recorded: ids in
   the tokenizer's vocabulary, one finite logprob <= 0 per output id, a known finish reason, the echoed
   prompt equal to what was sent.
4. **Record**: boundary, prompt and output segments and the turn record are appended atomically.
5. **Finish**: every way out of a call sets a status: ``running`` (tool calls, the loop goes on),
   ``completed``, ``truncated`` (token limit, context window), ``aborted`` (cancelled, engine abort,
   discarded output) or ``failed`` (any other error, inside or outside the backend), with the reason.

:class:`~tito_core.model.TitoModel` turns a :class:`CallResult` into Strands events and nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
import weakref
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import msgspec
from strands.types.content import Message, Messages
from strands.types.exceptions import ContextWindowOverflowException
from strands.types.tools import ToolSpec

from .backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from .chat import ChatMessage, ChatRenderer, first_difference, system_text, to_chat_messages, tool_specs_to_chat
from .errors import (
    BackendResponseError,
    ConfigError,
    GenerationAbortedError,
    PrefixMismatchError,
    TemplateError,
    TitoError,
)
from .grammar import ToolChoiceError, forced_tools, tool_call_grammar
from .partial import cannot_continue, continuation, finished_anyway, joined
from .tool_parsers.base import ParsedOutput, ToolCall, ToolParser
from .trajectory import Status, Trajectory, Turn, Usage
from .versions import check_spans
from .weights import aborted_by_update, aborting_updates, wait_for_resume

if TYPE_CHECKING:
    from strands.types.content import SystemContentBlock

__all__ = ["CallOptions", "CallResult", "PrefixPolicy", "RenderMode", "Rollout", "check_result", "exit_status"]

logger = logging.getLogger("tito")

PrefixPolicy = Literal["fork", "warn", "error"]
RenderMode = Literal["auto", "incremental", "full"]
"""How the new prompt of a later call is rendered.

``incremental``: only the new messages, after a dummy prefix (exact and cheap; a :class:`TemplateError` when
the template cannot render them that way). ``full``: the whole conversation is rendered and tokenized, the
longest common prefix with the trajectory is kept and the rollout forks where they differ (for templates
that are not prefix-preserving or not incremental). ``auto`` (default): incremental, falling back to full
for a call whose messages the template cannot render incrementally or whose tools block moves."""
_MarkKind = Literal["prompt", "output"]
_FINISH_REASONS = frozenset({"stop", "length", "abort"})
_LOGPROB_SLACK = 1e-6  # float error of a log-softmax at a token of probability ~1
_SHOWN = 8  # ids shown in an error message


class CallOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Per-call settings of a model (sampling, limits, what to ask the engine for)."""

    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    context_window_limit: int | None = None
    return_logprobs: bool = True
    return_prompt_logprobs: bool = False
    return_routed_experts: bool = False
    tool_choice: dict[str, Any] | None = None
    """Strands' ``tool_choice`` for calls whose agent passes none (``{"any": {}}`` forces a tool call)."""


class CallResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one recorded model call gives the Strands side: the parsed output and its accounting."""

    parsed: ParsedOutput
    stop_reason: str
    usage: Usage
    latency_ms: int

    @property
    def malformed_calls(self) -> list[ToolCall]:
        """The tool calls that could not be parsed (shown back to the model instead of being run)."""
        return [call for call in self.parsed.calls if call.is_error]


class _Mark(msgspec.Struct, frozen=True, gc=False):
    """After ``count`` messages, the trajectory stood at ``offset`` tokens, at the end of a ``kind`` chunk."""

    count: int
    offset: int
    kind: _MarkKind


class _Progress:
    """A call's result so far, and the ids of the continuations joined into it (after weight-update aborts)."""

    def __init__(self, result: GenerateResult) -> None:
        self.result = result
        self.rids: list[str] = []


class _Pending(msgspec.Struct, frozen=True):
    """The last output, waiting for Strands to append it to the conversation."""

    expected: list[tuple[Any, ...]]
    call_ids: list[str]


class _Plan(msgspec.Struct, frozen=True):
    """What to send: the whole conversation (``initial``) or only the messages after ``count``."""

    initial: bool
    count: int
    chat: list[ChatMessage]


_JSON = msgspec.json.Encoder()


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
        # one join: each ``+`` of a long body would copy all of it again (~0.4 ms per copy at 137k tokens)
        return b"".join((b"[", self.body, b"]" if len(new) == 2 else b"," + new[1:]))


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


_SEEN = msgspec.json.Encoder(order="sorted")
_Seen = bytes | Message
"""What a rollout keeps of a message it consumed: see :func:`_seen`."""


def _seen(message: Message) -> _Seen:
    """What determines a message's tokens (role and content) as canonical JSON, to tell later if it was rewritten.

    Strands hands every model call a fresh deep copy of the conversation; keeping those copies would leave
    ~13 containers per message for the garbage collector to walk in every full collection (at 512 rollouts in
    one process, full collections took ~30 % of the run). Bytes are never walked. Content msgspec cannot
    encode is kept as the message itself. Strands' bookkeeping keys (``metadata``, ``tracking_id``) render
    to no token and are left out.
    """
    try:
        return _SEEN.encode((message.get("role"), message.get("content")))
    except (TypeError, ValueError, OverflowError):
        return message


def _same(message: Message, seen: _Seen) -> bool:
    """Whether ``message`` still has the role and content that ``seen`` (:func:`_seen`) recorded."""
    if isinstance(seen, bytes):
        return _seen(message) == seen
    return message is seen or (
        message.get("role") == seen.get("role") and message.get("content") == seen.get("content")
    )


def _common_prefix(messages: Sequence[Message], seen: Sequence[_Seen]) -> int:
    """How many leading ``messages`` agree with the consumed ones in what determines their tokens."""
    n = min(len(messages), len(seen))
    for i in range(n):
        if not _same(messages[i], seen[i]):
            return i
    return n


def exit_status(exc: BaseException) -> tuple[Status, str]:
    """The status (and reason) a trajectory takes when ``exc`` ends a model call."""
    if isinstance(exc, ContextWindowOverflowException):
        return "truncated", f"{type(exc).__name__}: {exc}"
    if isinstance(exc, asyncio.CancelledError):
        return "aborted", "the model call was cancelled"
    if isinstance(exc, GenerationAbortedError):
        return "aborted", str(exc)
    if isinstance(exc, Exception):
        return "failed", f"{type(exc).__name__}: {exc}"
    return "aborted", f"the model call was interrupted ({type(exc).__name__})"


def _end_sequence(backend: Backend, box: list[Any]) -> None:
    """End the backend sequence held in ``box`` (``[name, trajectory]``), if any; never raises."""
    name = box[0]
    box[0] = box[1] = None
    if name is None:
        return
    try:
        backend.end_sequence(name)
    except Exception as exc:  # a hook that raises must not hide the call's own outcome
        logger.warning("%s backend: end_sequence(%r) failed: %r", backend.name, name, exc)


# ---------------------------------------------------------------------------------------- validation
def _bad(backend: str, field: str, value: object, detail: str) -> BackendResponseError:
    return BackendResponseError(f"{backend}: invalid {field}: {detail}", field=field, value=value, backend=backend)


def _check_ids(ids: Sequence[int], vocab_size: int, backend: str, field: str) -> None:
    if not len(ids):
        return
    try:
        packed = array("q", ids)
    except TypeError:
        wrong = next(i for i in ids if not isinstance(i, int))
        raise _bad(backend, field, wrong, f"token ids must be integers, got {wrong!r}") from None
    except OverflowError:
        huge = next(i for i in ids if not -(2**63) <= i < 2**63)
        raise _bad(backend, field, huge, f"token id {huge} is outside the tokenizer's vocabulary") from None
    values = ids if isinstance(ids, list) else packed  # min / max walk a list faster than an array
    low, high = min(values), max(values)
    if low < 0:
        raise _bad(backend, field, low, f"negative token id {low}")
    if high >= vocab_size:
        raise _bad(backend, field, high, f"token id {high} is outside the tokenizer's vocabulary (size {vocab_size})")


_NUMBERS = frozenset({float, int})


def _plainly_valid(values: Sequence[float | None]) -> bool:
    """True when every value is a finite float or int <= the slack, checked in C (a 9k-token output: ~0.4 ms).

    All finite and <= 0 makes the sum finite; a NaN or an infinity makes it NaN or infinite. False (also for
    None entries or a huge sum that overflows) only means "look closer": the loop names the culprit.
    """
    if not set(map(type, values)) <= _NUMBERS:
        return False
    numbers = cast("Sequence[float]", values)
    try:
        return math.isfinite(sum(numbers)) and max(numbers) <= _LOGPROB_SLACK
    except OverflowError:  # ints too large for a float
        return False


def _check_logprobs(values: Sequence[float | None], backend: str, field: str, *, allow_none: bool) -> None:
    if len(values) and _plainly_valid(values):
        return
    for position, value in enumerate(values):
        if value is None:
            if allow_none:
                continue
            raise _bad(backend, field, None, f"no logprob at position {position}")
        if type(value) not in (float, int) or not math.isfinite(value) or value > _LOGPROB_SLACK:
            raise _bad(backend, field, value, f"logprob {value!r} at position {position} is not a finite number <= 0")


def check_result(request: GenerateRequest, result: GenerateResult, *, vocab_size: int, backend: str) -> None:
    """Check that an engine answer is self-consistent and fits the request before anything is recorded.

    Raises:
        BackendResponseError: naming the field and the value at fault.
    """
    if not isinstance(result, GenerateResult):
        raise _bad(backend, "result", type(result).__name__, "generate() must return a GenerateResult")
    output_ids = result.output_ids
    _check_ids(output_ids, vocab_size, backend, "output_ids")
    if result.finish_reason not in _FINISH_REASONS:
        raise _bad(backend, "finish_reason", result.finish_reason, "expected 'stop', 'length' or 'abort'")
    lps = result.output_logprobs
    if lps is not None:
        if len(lps) != len(output_ids):
            raise _bad(backend, "output_logprobs", len(lps), f"{len(lps)} logprobs for {len(output_ids)} output ids")
        _check_logprobs(lps, backend, "output_logprobs", allow_none=False)
    elif request.return_logprobs and output_ids:
        raise _bad(backend, "output_logprobs", None, "logprobs were requested but the engine returned none")
    if result.prompt_ids is not None:
        _check_ids(result.prompt_ids, vocab_size, backend, "prompt_ids")
        if request.messages is None:  # token-in: the engine must have consumed exactly what was sent
            try:
                same = array("i", result.prompt_ids) == request.input_ids
            except OverflowError:
                same = False
            if not same:
                at = first_difference(result.prompt_ids, request.input_ids)
                sent = list(request.input_ids[at : at + _SHOWN])
                raise _bad(
                    backend,
                    "prompt_ids",
                    list(result.prompt_ids[at : at + _SHOWN]),
                    f"the engine consumed a different prompt (first difference at token {at}: sent {sent})",
                )
    new_prompt = len(request.input_ids) - request.prefix_len
    if result.prompt_logprobs is not None and request.messages is None:
        if len(result.prompt_logprobs) != new_prompt:
            raise _bad(
                backend,
                "prompt_logprobs",
                len(result.prompt_logprobs),
                f"{len(result.prompt_logprobs)} prompt logprobs for {new_prompt} new prompt tokens",
            )
        _check_logprobs(result.prompt_logprobs, backend, "prompt_logprobs", allow_none=True)
    for field in ("prompt_tokens", "cached_tokens"):
        count = getattr(result, field)
        if count is not None and (type(count) is not int or count < 0):
            raise _bad(backend, field, count, "a token count must be a non-negative integer")
    if result.weight_versions is not None:
        check_spans(result.weight_versions, len(output_ids), backend=backend)


# ------------------------------------------------------------------------------------------ the rollout
class Rollout:
    """The bookkeeping of one rollout: conversation sync, forks, requests, recording and statuses.

    Args:
        backend: The engine client.
        renderer: Chat template + tokenizer of the model.
        tool_parser: Parses tool calls out of each output.
        on_prefix_mismatch: For backends that render the prompt server-side: ``fork``, ``warn`` (and fork)
            or ``error`` when the server's prompt does not extend the trajectory.
        rollout_id: Id of the first rollout (random when None).
        render_mode: How later prompts are rendered (:data:`RenderMode`).
    """

    def __init__(
        self,
        backend: Backend,
        renderer: ChatRenderer,
        tool_parser: ToolParser,
        *,
        on_prefix_mismatch: PrefixPolicy = "fork",
        rollout_id: str | None = None,
        render_mode: RenderMode = "auto",
    ) -> None:
        if render_mode not in ("auto", "incremental", "full"):
            raise ConfigError(f"render_mode must be 'auto', 'incremental' or 'full', not {render_mode!r}")
        self.render_mode: RenderMode = render_mode
        self.backend = backend
        self.renderer = renderer
        self.tool_parser = tool_parser
        self.on_prefix_mismatch: PrefixPolicy = on_prefix_mismatch
        self.vocab_size = renderer.vocab_size
        self._engine_limit: int | None = None
        self._engine_limit_known = False
        self._grammars: dict[tuple[tuple[bytes, ...], int], str] = {}
        # The backend sequence of the live branch: [name, trajectory it belongs to]; a fork or reset ends it.
        self._sequence: list[Any] = [None, None]
        finalizer = weakref.finalize(self, _end_sequence, backend, self._sequence)
        finalizer.atexit = False  # at exit the backend closes what it still holds itself
        self._start(Trajectory(rollout_id))

    @property
    def trajectory(self) -> Trajectory:
        """The live trajectory (its latest branch)."""
        return self._traj

    def _start(self, traj: Trajectory) -> None:
        self._traj = traj
        self._consumed: list[_Seen] = []
        self._marks: list[_Mark] = []
        self._pending: _Pending | None = None
        self._call_ids: list[str] = []
        self._system: str | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._tools_move: dict[tuple[str, ...], bool] = {}  # by the roles of the new messages, for _tools
        self._ids_json: _IdsJson | None = None

    def reset(self, rollout_id: str | None = None) -> Trajectory:
        """Close the current trajectory, start a new rollout, and return the closed trajectory."""
        closed = self._traj.close()
        _end_sequence(self.backend, self._sequence)
        self._start(Trajectory(rollout_id))
        return closed

    def _sequence_name(self) -> str:
        """The backend sequence of the live branch; a new branch (fork, reset) ends the previous one."""
        box = self._sequence
        if box[1] is not self._traj:
            _end_sequence(self.backend, box)
            box[0], box[1] = f"{self._traj.rollout_id}/{self._traj.branch}/{uuid.uuid4().hex[:12]}", self._traj
        return str(box[0])

    # ------------------------------------------------------------------------------------- one call
    async def call(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        options: CallOptions,
        *,
        system_prompt_content: Sequence[SystemContentBlock] | None = None,
        tool_choice: Any = None,
    ) -> CallResult:
        """Run one model call token-in/token-out and record it.

        ``tool_choice`` (Strands' form; ``options.tool_choice`` when None) that forces a call constrains
        decoding to one call in the tool parser's syntax (:mod:`tito_core.grammar`); the output is recorded
        verbatim like any other, its logprobs as the engine reports them under the constraint.

        Whatever raises out of the call leaves the trajectory with a status and its reason first
        (:func:`exit_status`); a call is recorded whole or not at all.
        """
        choice = options.tool_choice if tool_choice is None else tool_choice
        try:
            return await self._call(messages, tool_specs, system_prompt, system_prompt_content, options, choice)
        except BaseException as exc:
            # Engine-side state of the branch may hold what was not recorded: the next call starts afresh.
            _end_sequence(self.backend, self._sequence)
            if not self._traj.closed:
                self._traj.set_status(*exit_status(exc))
            raise

    async def _call(
        self,
        messages: Messages,
        tool_specs: list[ToolSpec] | None,
        system_prompt: str | None,
        system_prompt_content: Sequence[SystemContentBlock] | None,
        options: CallOptions,
        tool_choice: Any,
    ) -> CallResult:
        grammar = self._grammar(tool_specs, tool_choice)
        system = system_text(system_prompt, system_prompt_content)
        tools = tool_specs_to_chat(tool_specs)
        plan = self._sync(messages, system, tools)
        renders = self.backend.renders_prompt
        new_ids, n_boundary = ([], 0) if renders else await self._prompt(plan, messages, system)
        request = await self._request(messages, system, tools, new_ids, options, grammar)
        started = time.perf_counter()
        updates = aborting_updates(self.backend)
        result = await self.backend.generate(request)
        check_result(request, result, vocab_size=self.vocab_size, backend=self.backend.name)
        progress = _Progress(result)
        if result.finish_reason == "abort" and aborted_by_update(self.backend, updates):
            try:
                await self._go_on(request, progress)
            except BaseException:
                # The continuation failed or was cancelled: keep every token generated so far, as an aborted turn.
                cut = progress.result
                parsed = self.tool_parser.parse(self.renderer.decode(cut.output_ids), tool_specs)
                with contextlib.suppress(GenerationAbortedError):
                    self._record(messages, plan, request, cut, new_ids, n_boundary, parsed, started, progress.rids)
                raise
        result = progress.result
        if renders:
            new_ids, n_boundary = self._server_prompt(result)
        parsed = await self._parse(result, tool_specs, request.sampling)
        return self._record(messages, plan, request, result, new_ids, n_boundary, parsed, started, progress.rids)

    async def _go_on(self, request: GenerateRequest, progress: _Progress) -> None:
        """Continue an output a weight update aborted, after the resume, until it ends for another reason.

        Each continuation (:mod:`tito_core.partial`) sends the prompt and the tokens so far and asks for the rest;
        ``progress`` holds the joined result and the continuations' ids after each one that was checked.
        """
        backend = self.backend
        reason = cannot_continue(request, backend)
        if reason is not None:
            logger.warning(
                "rollout %s: a weight update aborted a call after %d tokens, which is not continued: %s",
                self._traj.rollout_id,
                len(progress.result.output_ids),
                reason,
            )
            return
        while True:
            so_far = progress.result
            ended = finished_anyway(request, so_far, self.renderer.end_of_turn_ids)
            if ended is not None:
                progress.result = ended  # the abort raced the end of the output: nothing is left to generate
                return
            await wait_for_resume(backend)
            follow = continuation(request, so_far, len(progress.rids) + 1)
            if follow is None:
                return
            logger.info(
                "rollout %s: a weight update aborted request %s after %d tokens; continuing it as %s",
                self._traj.rollout_id,
                request.rid,
                len(so_far.output_ids),
                follow.rid,
            )
            updates = aborting_updates(backend)
            more = await backend.generate(follow)
            check_result(follow, more, vocab_size=self.vocab_size, backend=backend.name)
            progress.rids.append(follow.rid)
            progress.result = joined(so_far, more)
            if more.finish_reason != "abort" or not aborted_by_update(backend, updates):
                return

    async def _request(
        self,
        messages: Messages,
        system: str | None,
        tools: list[dict[str, Any]] | None,
        new_ids: list[int],
        options: CallOptions,
        grammar: str | None,
    ) -> GenerateRequest:
        traj = self._traj
        prefix_len = len(traj)
        sampling = options.sampling
        limit = options.context_window_limit or await self._context_limit()
        if limit is not None:
            needed = prefix_len + len(new_ids)
            room = limit - needed
            if room <= 0:
                raise ContextWindowOverflowException(
                    f"context window full: the prompt ({needed} tokens) leaves no room in the {limit}-token window"
                )
            if sampling.max_new_tokens is None or sampling.max_new_tokens > room:
                sampling = msgspec.structs.replace(sampling, max_new_tokens=room)
        input_ids = traj.ids_array()
        if isinstance(new_ids, list):
            input_ids.fromlist(new_ids)  # twice as fast as extend() for a list
        else:
            input_ids.extend(new_ids)
        ids_json: bytes | None = None
        if self.backend.json_input_ids:
            cache = self._ids_json
            if cache is None or cache.traj is not traj or cache.count > len(traj):
                cache = self._ids_json = _IdsJson(traj)
            ids_json = cache.request_json(new_ids)
        renders = self.backend.renders_prompt
        return GenerateRequest(
            rid=f"tito-{uuid.uuid4().hex}",
            input_ids=input_ids,
            prefix_len=prefix_len,
            sampling=sampling,
            return_logprobs=options.return_logprobs,
            return_prompt_logprobs=options.return_prompt_logprobs,
            return_routed_experts=options.return_routed_experts,
            messages=to_chat_messages(messages, system_prompt=system) if renders else None,
            tools=tools if renders else None,
            input_ids_json=ids_json,
            grammar=grammar,
            sequence=self._sequence_name(),
        )

    def _grammar(self, tool_specs: Sequence[ToolSpec] | None, tool_choice: Any) -> str | None:
        """The grammar forcing a tool call, or None when ``tool_choice`` forces none."""
        forced = forced_tools(tool_specs, tool_choice)
        if forced is None:
            return None
        if not self.backend.supports_grammar:
            raise ToolChoiceError(
                f"tool_choice {tool_choice!r} forces a tool call, but the {self.backend.name} backend cannot "
                "constrain decoding (Backend.supports_grammar is False)"
            )
        key = (tuple(msgspec.json.encode(spec) for spec in forced), id(self.tool_parser))
        cached = self._grammars.get(key)
        if cached is None:
            cached = self._grammars[key] = tool_call_grammar(self.tool_parser, forced)
        return cached

    async def _context_limit(self) -> int | None:
        """The engine's context window; a failed lookup is logged and asked again on the next call."""
        if self._engine_limit_known:
            return self._engine_limit
        try:
            limit = await self.backend.max_context_length()
        except TitoError as exc:
            logger.warning(
                "could not read the context length from the %s backend (asking again next call): %s",
                self.backend.name,
                exc,
            )
            return None
        self._engine_limit, self._engine_limit_known = limit, True
        return limit

    def _record(
        self,
        messages: Messages,
        plan: _Plan,
        request: GenerateRequest,
        result: GenerateResult,
        new_ids: list[int],
        n_boundary: int,
        parsed: ParsedOutput,
        started: float,
        continued: Sequence[str] = (),
    ) -> CallResult:
        """Append the call's prompt, output and turn record atomically, then set the status it ends with."""
        latency_ms = int((time.perf_counter() - started) * 1000)
        traj = self._traj
        prefix_len = len(traj)
        turn_index = len(traj.turns)
        if result.finish_reason == "length":
            stop = "max_tokens"
        elif parsed.calls:
            stop = "tool_use"
        else:
            stop = "end_turn"
        bad = [call for call in parsed.calls if call.is_error]
        usage = Usage(
            prompt_tokens=result.prompt_tokens if result.prompt_tokens is not None else len(request.input_ids),
            completion_tokens=len(result.output_ids),
            cached_tokens=result.cached_tokens,
        )
        turn = Turn(
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
            constrained=request.grammar is not None,
            continued_rids=tuple(continued),
            weight_versions=(
                None
                if result.weight_versions is None
                else check_spans(result.weight_versions, len(result.output_ids), backend=self.backend.name)
            ),
        )
        prompt_lps = result.prompt_logprobs
        with traj.atomic():
            traj.append(
                "boundary", new_ids[:n_boundary], prompt_lps[:n_boundary] if prompt_lps else None, turn=turn_index
            )
            traj.append(
                "prompt", new_ids[n_boundary:], prompt_lps[n_boundary:] if prompt_lps else None, turn=turn_index
            )
            traj.append("output", result.output_ids, result.output_logprobs, turn=turn_index)
            traj.add_turn(turn)
            for call in bad:
                traj.tool_parse_errors[call.name] = traj.tool_parse_errors.get(call.name, 0) + 1
        if plan.initial:
            self._consumed = [_seen(m) for m in messages]
        else:
            self._consumed.extend(_seen(m) for m in messages[plan.count :])
        self._marks.append(_Mark(len(self._consumed), prefix_len + len(new_ids), "prompt"))
        # Until Strands appends this output to the conversation, it is pending: a conversation that comes
        # back without it (a retry, a consumer that stopped early, an engine abort) forks the rollout.
        expected: list[tuple[Any, ...]] = []
        if parsed.reasoning:
            expected.append(("reasoning", parsed.reasoning))
        if parsed.content:
            expected.append(("text", parsed.content))
        expected.extend(("toolUse", call.id, call.name, call.input) for call in parsed.calls)
        self._pending = _Pending(expected=expected, call_ids=[call.id for call in parsed.calls])
        if stop != "tool_use":
            self._ids_json = None  # the agent loop ends here: free the text (rebuilt if the rollout goes on)
        if result.finish_reason == "abort":
            raise GenerationAbortedError(
                f"the engine aborted the request after {len(result.output_ids)} tokens (they are kept)",
                backend=self.backend.name,
            )
        if stop == "max_tokens":
            traj.set_status("truncated", f"generation hit the token limit after {len(result.output_ids)} tokens")
        elif stop == "tool_use":
            traj.set_status("running")
        else:
            traj.set_status("completed")
        return CallResult(parsed=parsed, stop_reason=stop, usage=usage, latency_ms=latency_ms)

    # ---------------------------------------------------------------------------- conversation sync
    def _sync(self, messages: Messages, system: str | None, tools: list[dict[str, Any]] | None) -> _Plan:
        """Match the incoming conversation with what the trajectory holds; fork when history was rewritten."""
        if self._traj.last_segment is None:
            self._system, self._tools, self._tools_move = system, tools, {}
            return _Plan(initial=True, count=0, chat=to_chat_messages(messages, system_prompt=system))
        if system != self._system or tools != self._tools:
            return self._fork(messages, system, tools, 0, "the system prompt or the tool list changed")
        n = len(self._consumed)
        agree = _common_prefix(messages, self._consumed)
        pending = self._pending
        if pending is not None and agree == n and len(messages) == n:
            reason = "the previous output was discarded (model call retried)"
            return self._fork(messages, system, tools, n, reason, discarded=True)
        output_back = (
            pending is not None
            and agree == n
            and messages[n].get("role") == "assistant"  # len(messages) > n: the retry case returned above
            and _assistant_signature(messages[n]) == pending.expected
        )
        if agree < n or (pending is not None and not output_back):
            return self._fork(
                messages, system, tools, agree, f"the conversation history was rewritten at message {agree}"
            )
        if pending is not None:  # its output came back as the next message
            self._consumed.append(_seen(messages[n]))
            self._marks.append(_Mark(n + 1, len(self._traj), "output"))
            self._call_ids = pending.call_ids
            self._pending = None
            n += 1
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
            self._system, self._tools, self._tools_move = system, tools, {}
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
            # messages agree with the consumed ones up to keep.count (<= agree)
            block["toolUse"]["toolUseId"]
            for block in messages[keep.count - 1]["content"]
            if "toolUse" in block
        ]
        return _Plan(
            initial=False,
            count=keep.count,
            chat=to_chat_messages(messages[keep.count :], call_order=self._call_ids),
        )

    def _last_kind(self) -> str | None:
        last = self._traj.last_segment
        return last.kind if last is not None else None

    # ---------------------------------------------------------------------------------- rendering
    async def _prompt(self, plan: _Plan, messages: Messages, system: str | None) -> tuple[list[int], int]:
        """The new prompt of this call in the configured render mode (see :data:`RenderMode`)."""
        if plan.initial or self.render_mode == "incremental":
            return await self._new_prompt(plan)
        if self.render_mode == "full":
            return await self._full_prompt(messages, system)
        roles = tuple(m.get("role", "") for m in plan.chat)
        moves = self._tools_move.get(roles)
        if moves is None and (self._tools or self._system is not None) and plan.chat:
            moves = self._tools_move[roles] = self.renderer.tools_move(plan.chat, self._tools)
        if moves:
            logger.warning(
                "rollout %s: the chat template moves the tools block (or the system prompt) when messages are added; "
                "rendering the whole conversation for this call (render_mode='full' does that for every call)",
                self._traj.rollout_id,
            )
            return await self._full_prompt(messages, system)
        try:
            return await self._new_prompt(plan)
        except TemplateError as exc:
            logger.warning(
                "rollout %s: %s; rendering the whole conversation for this call instead", self._traj.rollout_id, exc
            )
            return await self._full_prompt(messages, system)

    async def _full_prompt(self, messages: Messages, system: str | None) -> tuple[list[int], int]:
        """Render the whole conversation; keep the longest common prefix with the trajectory, fork where they differ.

        The model's own tokens may not survive a re-render (decode -> encode is not identity, templates drop
        or rewrite earlier turns); where the render first differs from the trajectory, a new branch keeps
        the tokens up to the last segment boundary before that point, and the rest of the render becomes
        its new prompt. A warning names the first differing token.
        """
        renderer = self.renderer
        chat = to_chat_messages(messages, system_prompt=system)
        ids = await renderer.initial_ids(chat, self._tools)
        traj = self._traj
        have = traj.ids_array()
        at = first_difference(ids, have)
        if at < len(have):
            keep = max((seg.end for seg in traj.segments if seg.end <= at), default=0)
            recorded, rendered = have[at], ids[at] if at < len(ids) else None
            reason = (
                f"the full render differs from the trajectory at token {at}: recorded {recorded} "
                f"({renderer.decode([recorded])!r}), rendered "
                + (f"{rendered} ({renderer.decode([rendered])!r})" if rendered is not None else "nothing")
            )
            logger.warning("rollout %s: %s; forking at token %d", traj.rollout_id, reason, keep)
            self._traj = traj.fork(keep, reason)
            self._marks = [m for m in self._marks if m.offset <= keep]
            return ids[keep:], 0
        new = ids[len(have) :]
        return new, self._leading_boundary(new)

    async def _new_prompt(self, plan: _Plan) -> tuple[list[int], int]:
        """Token ids of the new prompt, and how many of them (leading) are boundary tokens."""
        renderer = self.renderer
        if plan.initial:
            return await renderer.initial_ids(plan.chat, self._tools), 0
        last_output = self._traj.last_segment
        if last_output is None or last_output.kind != "output":
            return [], 0
        ended = self._traj.tokens(last_output)[-1:]
        # a model that did not end its turn itself gets it closed as the template would
        return await renderer.continuation_ids(
            plan.chat, close_turn=not (ended and ended[0] in renderer.end_of_turn_ids)
        )

    def _server_prompt(self, result: GenerateResult) -> tuple[list[int], int]:
        """For prompt-rendering backends: check the server's prompt extends the trajectory; return the new part."""
        if result.prompt_ids is None:
            raise _bad(self.backend.name, "prompt_ids", None, "a prompt-rendering backend must return the prompt ids")
        prompt = list(result.prompt_ids)
        traj = self._traj
        have = traj.token_ids
        if prompt[: len(have)] != have:
            at = first_difference(prompt, have)
            message = (
                f"the server-rendered prompt does not extend the trajectory: first difference at token {at} "
                f"(recorded {have[at : at + _SHOWN]}, server {prompt[at : at + _SHOWN]})"
            )
            if self.on_prefix_mismatch == "error":
                raise PrefixMismatchError(
                    message, position=at, expected=have[at : at + _SHOWN], actual=prompt[at : at + _SHOWN]
                )
            if self.on_prefix_mismatch == "warn":
                logger.warning("%s; forking a new branch", message)
            self._traj = traj.fork(0, message)
            self._marks = []
            return prompt, 0
        new = prompt[len(have) :]
        return new, self._leading_boundary(new)

    def _leading_boundary(self, ids: Sequence[int]) -> int:
        """How many leading ``ids`` are the template's boundary after the last output (``turn_tail``'s).

        Zero when the trajectory does not end with an output or ``ids`` do not start with the boundary's tokens.
        """
        if self._last_kind() != "output":
            return 0
        boundary = self.renderer.turn_tail[1]
        if not boundary:
            return 0
        boundary_ids = self.renderer.encode(boundary)
        return len(boundary_ids) if list(ids[: len(boundary_ids)]) == boundary_ids else 0

    async def _parse(
        self, result: GenerateResult, tool_specs: Sequence[ToolSpec] | None, sampling: SamplingParams
    ) -> ParsedOutput:
        """Split the output (without the token it stopped on) into reasoning, content and tool calls."""
        ids = result.output_ids
        if result.finish_reason == "stop" and ids:
            last = ids[-1]
            if (
                last in self.renderer.end_of_turn_ids
                or last in sampling.stop_token_ids
                or (isinstance(result.matched_stop, int) and result.matched_stop == last)
            ):
                ids = ids[:-1]
        return self.tool_parser.parse(await self.renderer.adecode(ids), tool_specs)
