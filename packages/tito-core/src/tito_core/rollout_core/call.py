"""The call loop of one rollout: sync, prompt, request, continuation after an abort, check, record, status.

:class:`Rollout` runs one model call at a time on tito's own :class:`~tito_core.conversation.Conversation`
and owns nothing but the parts that each own their state: the open lineages, each a branch with its conversation
and its backend sequence (:class:`Lineages`, which picks the one a call goes on), the prompt builder
(:class:`PromptBuilder`) and the backend's capabilities (read once). Every way out of a call sets a status on the
branch it ran on (:func:`~tito_core.status.status_of`); a call is recorded whole or not at all.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import Any, Literal

import msgspec

from ..backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from ..conversation import Conversation, tool_specs_to_chat
from ..errors import ContextWindowFullError, GenerationAbortedError, SamplingMaskError, TitoError
from ..media import PromptMedia
from ..media.processor import VisionProcessor
from ..partial import Progress, go_on
from ..render.renderer import ChatRenderer
from ..status import CallEnd, status_of
from ..tool_parsers.base import ParsedOutput, ToolParser
from ..trajectory import Trajectory
from ..trajectory.record import CallRef
from ..weights import aborted_by_update, aborting_updates
from .checks import check_result
from .compaction import find_summary, link_compaction
from .labels import Label
from .lineages import Lineage, Lineages
from .output import CallResult, parse_output, parse_text, record_call
from .prompt import NewPrompt, PrefixPolicy, PromptBuilder, RenderMode, chat_media, error_for
from .sync import Plan

__all__ = ["CallOptions", "Rollout"]

logger = logging.getLogger("tito")


def unchanged_or(new: Any, last: Any) -> Any:
    """``last`` when it equals ``new``: a call keeps nothing new alive while the engine generates, when it can."""
    return last if new == last else new


class CallOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Per-call settings of a model (sampling, limits, what to ask the engine for)."""

    sampling: SamplingParams = msgspec.field(default_factory=SamplingParams)
    context_window_limit: int | None = None
    return_logprobs: bool = True
    return_prompt_logprobs: bool = False
    return_routed_experts: bool = False
    tool_choice: dict[str, Any] | None = None
    """tito's ``tool_choice`` (``{"any": {}}``, ``{"tool": {"name": NAME}}``) for calls that pass none."""
    sampling_masks: Literal["exact", "allow_missing"] = "exact"
    """A call that truncates sampling (top-k, top-p, min-p) records the kept set of every output token. ``exact``
    refuses such a call on a backend that cannot return them (:class:`~tito_core.errors.SamplingMaskError`);
    ``allow_missing`` runs it and records why its turn has none (``Turn.sampling_mask_missing``)."""


class Rollout:
    """One rollout: each :meth:`call` renders, asks the backend, checks and records one model call.

    Args:
        backend: The engine client.
        renderer: Chat template + tokenizer of the model.
        tool_parser: Parses tool calls out of each output.
        on_prefix_mismatch: For backends that render the prompt server-side: ``fork``, ``warn`` (and fork)
            or ``error`` when the server's prompt does not extend the trajectory.
        rollout_id: Id of the first rollout (random when None).
        render_mode: How later prompts are rendered (:data:`RenderMode`).
        vision: The model's vision processor (images and videos in prompts need it); None for a text-only model.
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
        vision: VisionProcessor | None = None,
    ) -> None:
        self.backend = backend
        self.capabilities = backend.capabilities()
        self.renderer = renderer
        self.tool_parser = tool_parser
        self.vocab_size = renderer.vocab_size
        self.prompts = PromptBuilder(
            renderer,
            tool_parser,
            render_mode=render_mode,
            on_prefix_mismatch=on_prefix_mismatch,
            backend_name=self.capabilities.name,
            supports_grammar=self.capabilities.supports_grammar,
            vision=vision,
            input_kinds=self.capabilities.input_kinds,
        )
        self._lineages = Lineages(backend, rollout_id)
        self._tools: list[dict[str, Any]] | None = None  # the last call's, in chat form

    @property
    def trajectory(self) -> Trajectory:
        """The rollout: the branch of the last call, with every other branch in its ``branches``."""
        return self._lineages.trajectory

    def reset(self, rollout_id: str | None = None) -> Trajectory:
        """Close every open branch, start a new rollout, and return the closed trajectory."""
        closed = self._lineages.close()
        self._lineages.restart(rollout_id)
        return closed

    async def call(
        self,
        conversation: Conversation,
        options: CallOptions,
        *,
        tool_choice: Any = None,
        answer_schema: Any = None,
        label: Label | None = None,
    ) -> CallResult:
        """Run one model call token-in/token-out and record it.

        ``tool_choice`` (``options.tool_choice`` when None) that forces a call constrains decoding to one call in
        the tool parser's syntax (:mod:`tito_core.grammar`); else ``answer_schema`` (a JSON schema: a structured
        answer) constrains it to one canonical JSON value of that schema, or one call to the offered tools. The
        output is recorded verbatim like any other, its logprobs as the engine reports them under the constraint.

        ``label`` names the call's lineage (:mod:`~tito_core.rollout_core.labels`): it goes on no branch labelled
        otherwise, and ``; compaction`` marks the branch it starts a compaction continuation.

        Calls may run concurrently on one rollout: each holds the lineage it goes on until it ends, and a call that
        would go on a lineage with a call in flight branches off it (:meth:`Lineages.choose`). Whatever raises out of
        the call leaves its branch with a status and its reason first; a call is recorded whole or not at all.
        """
        choice = options.tool_choice if tool_choice is None else tool_choice
        held: list[Lineage] = []
        try:
            return await self._call(conversation, options, choice, answer_schema, label, held)
        except BaseException as exc:
            self.fail(exc, held[0] if held else None)
            raise
        finally:
            if held:
                self._lineages.release(held[0])

    def fail(self, exc: BaseException, lineage: Lineage | None = None) -> None:
        """A call ended with ``exc`` (here, or in the front before the call): set the status, end the sequence.

        On the branch the call ran on (``lineage``; before it chose one, the last call's, unless a call is in flight
        there). Engine-side state of that branch may hold what was not recorded: its next call starts afresh.
        """
        if lineage is None:
            lineage = self._lineages.last
            if lineage.running:
                return  # a call in flight there sets its status itself
        lineage.sequence.end()
        traj = lineage.trajectory
        if not traj.closed:
            traj.set_status(*status_of(exc))

    def _check(self, request: GenerateRequest, result: GenerateResult) -> None:
        check_result(request, result, vocab_size=self.vocab_size, backend=self.capabilities.name)

    async def _call(
        self,
        conversation: Conversation,
        options: CallOptions,
        tool_choice: Any,
        answer_schema: Any,
        label: Label | None,
        held: list[Lineage],
    ) -> CallResult:
        prompts, backend = self.prompts, self.backend
        grammar = prompts.grammar(conversation.tool_specs, tool_choice, answer_schema)
        tools = self._tools = unchanged_or(tool_specs_to_chat(conversation.tool_specs), self._tools)
        lineage, plan = self._lineages.choose(conversation, tools, label.name if label is not None else None)
        held.append(lineage)
        sync = lineage.sync
        renders = self.capabilities.renders_prompt
        items = chat_media(plan.chat) if renders else ()
        if items:
            raise error_for({item.kind for item in items})(
                f"the {self.capabilities.name} backend renders prompts itself; tito sends it no images or videos"
            )
        new: NewPrompt = ([], 0, ()) if renders else await prompts.build(plan, conversation, sync)
        new_ids, n_boundary, media = new
        self._compaction(lineage.trajectory, conversation, new_ids, label)
        request = await self._request(lineage, conversation, tools, new_ids, media, options, grammar)
        started = time.perf_counter()
        updates = aborting_updates(backend)
        result = await backend.generate(request)
        self._check(request, result)
        progress = Progress(result)
        if result.finish_reason == "abort" and aborted_by_update(backend, updates):
            try:
                await go_on(
                    backend,
                    self.capabilities,
                    request,
                    progress,
                    end_of_turn_ids=self.renderer.end_of_turn_ids,
                    check=self._check,
                    rollout_id=sync.trajectory.rollout_id,
                )
            except BaseException:
                # The continuation failed or was cancelled: keep every token generated so far, as an aborted turn.
                cut = progress.result
                text = self.renderer.decode(cut.output_ids)
                parsed = parse_text(self.renderer, self.tool_parser, text, conversation.tool_specs, request.input_ids)
                with contextlib.suppress(GenerationAbortedError):
                    self._record(lineage, conversation, plan, request, cut, new, parsed, started, progress.rids, label)
                raise
        result = progress.result
        if renders:
            new_ids, n_boundary = prompts.server_prompt(result, sync)
            new = (new_ids, n_boundary, ())
        parsed = await parse_output(
            self.renderer, self.tool_parser, result, conversation.tool_specs, request.sampling, request.input_ids
        )
        return self._record(lineage, conversation, plan, request, result, new, parsed, started, progress.rids, label)

    def _compaction(
        self, traj: Trajectory, conversation: Conversation, new_ids: list[int], label: Label | None
    ) -> None:
        """Link a branch that starts here from a prompt carrying an earlier call's output (:mod:`.compaction`)."""
        explicit = label is not None and label.compaction
        if traj.first_output_from(traj.fork_at) < len(traj) or not (
            explicit or traj.fork_kind in ("new_lineage", "rewrite", "compaction")
        ):
            return  # the branch has output of its own, or did not start from a new prompt
        lineages = self._lineages
        skip = lineages.replayed(conversation.messages)  # replayed as assistant turns: history, not a summary
        found = find_summary(lineages.branches, new_ids, self.renderer.end_of_turn_ids, skip)
        link_compaction(traj, found or (lineages.recorded if explicit else None), explicit=explicit)

    async def _request(
        self,
        lineage: Lineage,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
        new_ids: list[int],
        media: tuple[PromptMedia, ...],
        options: CallOptions,
        grammar: str | None,
    ) -> GenerateRequest:
        traj = lineage.trajectory
        prefix_len = len(traj)
        sampling = options.sampling.with_defaults(self.backend.sampling_defaults())
        if sampling.seed is not None and traj.turns:  # call k samples with seed + k: no two calls share a stream
            sampling = msgspec.structs.replace(sampling, seed=(sampling.seed + len(traj.turns)) % 2**63)
        limit = options.context_window_limit or await self._context_limit()
        if limit is not None:
            needed = prefix_len + len(new_ids)
            room = limit - needed
            if room <= 0:
                raise ContextWindowFullError(
                    f"context window full: the prompt ({needed} tokens) leaves no room in the {limit}-token window"
                )
            if sampling.max_new_tokens is None or sampling.max_new_tokens > room:
                sampling = msgspec.structs.replace(sampling, max_new_tokens=room)
        input_ids = traj.ids_array()
        input_ids.fromlist(new_ids)  # twice as fast as extend() for a list
        renders = self.capabilities.renders_prompt
        vision = self.prompts.vision
        masks = sampling.truncates(self.vocab_size)
        if masks and not self.capabilities.supports_sampling_mask and options.sampling_masks == "exact":
            raise SamplingMaskError(
                f"{self._no_mask()}; this call truncates sampling (top_k={sampling.top_k}, top_p={sampling.top_p}, "
                f"min_p={sampling.extra.get('min_p')}), so its logprobs would be off by the kept mass. Sample "
                "without truncation, use a backend that returns sampling masks, or opt out with "
                'sampling_masks="allow_missing" (each turn then records sampling_mask_missing)'
            )
        return GenerateRequest(
            rid=f"tito-{uuid.uuid4().hex}",
            input_ids=input_ids,
            prefix_len=prefix_len,
            sampling=sampling,
            return_logprobs=options.return_logprobs,
            return_prompt_logprobs=options.return_prompt_logprobs,
            return_routed_experts=options.return_routed_experts,
            return_sampling_mask=masks and self.capabilities.supports_sampling_mask,
            messages=conversation.chat() if renders else None,
            tools=tools if renders else None,
            grammar=grammar,
            sequence=lineage.sequence.name(traj),
            media=(*traj.prompt_media(), *media) if media or traj.media else (),
            never_sample=vision.never_sample if vision is not None else (),
        )

    def _no_mask(self) -> str:
        """Why this rollout's backend records no kept sets."""
        reason = getattr(self.backend, "no_sampling_mask_reason", "")
        return f"the {self.capabilities.name} backend cannot return sampling masks" + (f" ({reason})" if reason else "")

    def _mask_missing(self, request: GenerateRequest) -> str | None:
        """Why a truncating call has no kept sets ("no kept set"), or None when it has them or needs none."""
        if request.return_sampling_mask or not request.sampling.truncates(self.vocab_size):
            return None
        return f"no kept set: {self._no_mask()}; the logprobs are the engine's as reported"

    async def _context_limit(self) -> int | None:
        """The engine's context window (the backend caches it); a failed lookup is logged and asked again."""
        try:
            return await self.backend.max_context_length()
        except TitoError as exc:
            logger.warning(
                "could not read the context length from the %s backend (asking again next call): %s",
                self.capabilities.name,
                exc,
            )
            return None

    def _record(
        self,
        lineage: Lineage,
        conversation: Conversation,
        plan: Plan,
        request: GenerateRequest,
        result: GenerateResult,
        new: NewPrompt,
        parsed: ParsedOutput,
        started: float,
        continued: list[str],
        label: Label | None,
    ) -> CallResult:
        """Record the call, note what it consumed and what must come back, then set the status it ends with."""
        sync = lineage.sync
        traj = sync.trajectory
        new_ids, n_boundary, media = new
        prompt_end = len(traj) + len(new_ids)
        latency_ms = int((time.perf_counter() - started) * 1000)
        done = record_call(
            traj,
            request,
            result,
            new_ids,
            n_boundary,
            parsed,
            latency_ms,
            backend=self.capabilities.name,
            continued=continued,
            media=media,
            mask_missing=self._mask_missing(request),
            label=label.name if label is not None else None,
        )
        self._lineages.replied(CallRef(traj.branch, done.turn), done.reply())
        if done.routed_experts_missing:
            logger.warning("rollout %s, turn %d: %s", traj.rollout_id, done.turn, done.routed_experts_missing)
        sync.consumed(plan, conversation, prompt_end)
        sync.expect(done.reply())
        if result.finish_reason == "abort":
            raise GenerationAbortedError(
                f"the engine aborted the request after {len(result.output_ids)} tokens (they are kept)",
                backend=self.capabilities.name,
            )
        traj.set_status(*status_of(CallEnd(result.finish_reason, len(parsed.calls), len(result.output_ids))))
        return done
