"""Prompt building: the new prompt ids of a call (incremental, full, or the server's), and a forced call's grammar.

Only the new messages are rendered, after the template's boundary (:meth:`ChatRenderer.continuation_ids`). A
template that cannot render them that way, or that moves its tools block when messages are added, gets the
whole conversation rendered instead (:data:`RenderMode`); where a full render differs from the tokens, the
rollout forks (:meth:`ConversationSync.fork`). For backends that render the prompt themselves, the server's
prompt must extend the trajectory.

Images, videos and other input kinds: a template renders each media part as one placeholder; every render
(initial, incremental, full) is expanded by the model's :class:`~tito_core.media.processor.VisionProcessor`,
which gives each new item its span (:class:`~tito_core.media.PromptMedia`). A prompt whose kinds the model or
the backend cannot take (:func:`~tito_core.media.processor.refusal`), or with more than ``max_images`` items, is a
:class:`~tito_core.media.MediaError` before any request. Text-only prompts skip all of it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from ..backend import GenerateResult
from ..conversation import ChatMessage, Conversation, ToolSpec
from ..errors import ConfigError, PrefixMismatchError, TemplateError
from ..grammar import GrammarToolParser, ToolChoiceError, answer_grammar, forced_tools, tool_call_grammar
from ..media import MediaError, MediaItem, PromptMedia
from ..media.processor import VisionProcessor, refusal
from ..plugins.registry import input_kinds
from ..render.renderer import ChatRenderer, first_difference
from ..tool_parsers.base import ToolParser
from .checks import SHOWN, bad_answer
from .sync import ConversationSync, Plan

__all__ = ["NewPrompt", "PrefixPolicy", "PromptBuilder", "RenderMode", "chat_media", "error_for"]

logger = logging.getLogger("tito")

PrefixPolicy = Literal["fork", "warn", "error"]
RenderMode = Literal["auto", "incremental", "full"]
"""How the new prompt of a later call is rendered.

``incremental``: only the new messages, after a dummy prefix (exact and cheap; a :class:`TemplateError` when
the template cannot render them that way). ``full``: the whole conversation is rendered and tokenized, the
longest common prefix with the trajectory is kept and the rollout forks where they differ (for templates
that are not prefix-preserving or not incremental). ``auto`` (default): incremental, falling back to full
for a call whose messages the template cannot render incrementally or whose tools block moves."""


NewPrompt = tuple[list[int], int, tuple[PromptMedia, ...]]
"""A call's new prompt: its ids (placeholders expanded), how many leading ones are boundary, its new media."""


def chat_media(chat: Iterable[Mapping[str, Any]]) -> list[MediaItem]:
    """The items of chat messages' media parts, in the order a template renders them (message, then part).

    A media part is ``{"type": kind, kind: item}`` for a registered input kind (``tito_input_kinds``).

    Raises:
        MediaError: a part of a registered kind does not hold that kind's item.
    """
    kinds: Mapping[str, type[MediaItem]] | None = None
    found: list[MediaItem] = []
    for message in chat:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind is None or kind == "text":
                continue
            kinds = input_kinds() if kinds is None else kinds  # looked up once a part that is not text is seen
            item_type = kinds.get(kind) if isinstance(kind, str) else None
            if item_type is None:
                continue
            item = part.get(kind)
            if not isinstance(item, item_type):
                name = f"{item_type.__module__}.{item_type.__name__}"
                raise item_type.error(f"the {kind} part must hold a {name}, not {type(item).__name__}")
            found.append(item)
    return found


def error_for(kinds: Collection[str]) -> type[MediaError]:
    """The error to raise about inputs of ``kinds``: the registered kind's own (``ImageError``) when there is one."""
    if len(kinds) == 1:
        item_type = input_kinds().get(next(iter(kinds)))
        if item_type is not None:
            return item_type.error
    return MediaError


class PromptBuilder:
    """Renders the new prompt of each call for one rollout, in its render mode.

    Args:
        renderer: Chat template + tokenizer of the model.
        tool_parser: Gives the grammar of a forced call.
        render_mode: See :data:`RenderMode`.
        on_prefix_mismatch: What a server prompt that does not extend the trajectory does (:data:`PrefixPolicy`).
        backend_name: Named in errors.
        supports_grammar: Whether the backend can constrain decoding (a forced call needs it).
        vision: The model's vision processor (None: a text-only model; a prompt with media is a MediaError).
        input_kinds: The input kinds the backend sends to its engine.
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        tool_parser: ToolParser,
        *,
        render_mode: RenderMode = "auto",
        on_prefix_mismatch: PrefixPolicy = "fork",
        backend_name: str,
        supports_grammar: bool,
        vision: VisionProcessor | None = None,
        input_kinds: frozenset[str] = frozenset(),
    ) -> None:
        if render_mode not in ("auto", "incremental", "full"):
            raise ConfigError(f"render_mode must be 'auto', 'incremental' or 'full', not {render_mode!r}")
        self.renderer = renderer
        self.tool_parser = tool_parser
        self.render_mode: RenderMode = render_mode
        self.on_prefix_mismatch: PrefixPolicy = on_prefix_mismatch
        self._backend = backend_name
        self._supports_grammar = supports_grammar
        self.vision = vision
        self._input_kinds = input_kinds
        self._grammars: dict[tuple[tuple[bytes, ...], int, bytes | None], str] = {}
        # whether the template moves its tools block, by the roles of the new messages, for the tools in _moves_for
        self._moves: dict[tuple[str, ...], bool] = {}
        self._moves_for: tuple[str | None, list[dict[str, Any]] | None] = (None, None)

    # ---------------------------------------------------------------------------------------------- grammar
    def grammar(self, tool_specs: Sequence[ToolSpec] | None, tool_choice: Any, answer_schema: Any = None) -> str | None:
        """The grammar of this call's output, or None when nothing constrains it.

        A ``tool_choice`` that forces a call gives the grammar of one call (a structured answer waits for a later
        call); else an ``answer_schema`` (a JSON schema) gives the grammar of one JSON answer, or of one call to
        the offered tools.
        """
        forced = forced_tools(tool_specs, tool_choice)
        if forced is None and answer_schema is None:
            return None
        if not self._supports_grammar:
            what = (
                f"tool_choice {tool_choice!r} forces a tool call"
                if forced is not None
                else "a structured answer (a JSON schema the output must follow) was asked for"
            )
            raise ToolChoiceError(
                f"{what}, but the {self._backend} backend cannot constrain decoding (Backend.supports_grammar is False)"
            )
        key = (
            tuple(msgspec.json.encode(spec) for spec in forced or tool_specs or ()),
            id(self.tool_parser),
            None if forced is not None else msgspec.json.encode(answer_schema),
        )
        cached = self._grammars.get(key)
        if cached is None:
            if forced is not None:
                cached = tool_call_grammar(self.tool_parser, forced)
            else:
                if tool_specs and not isinstance(self.tool_parser, GrammarToolParser):
                    parser = getattr(self.tool_parser, "name", type(self.tool_parser).__name__)
                    raise ToolChoiceError(
                        f"a structured answer was asked for with tools offered, but the {parser!r} "
                        "tool parser gives no grammar of its calls, so the constraint cannot admit a tool call: "
                        "leave the tools out of this call or use a parser with call_grammar()"
                    )
                call = tool_call_grammar(self.tool_parser, tool_specs) if tool_specs else None
                cached = answer_grammar(answer_schema, call=call)
            self._grammars[key] = cached
        return cached

    # ------------------------------------------------------------------------------------------- new prompt
    async def build(self, plan: Plan, conversation: Conversation, sync: ConversationSync) -> NewPrompt:
        """The new prompt ids of this call, how many of them (leading) are boundary tokens, and its new images."""
        if plan.initial or self.render_mode == "incremental":
            return await self._new_prompt(plan, sync)
        if self.render_mode == "full":
            return await self._full_prompt(conversation, sync)
        if self._tools_move(plan, sync):
            logger.warning(
                "rollout %s: the chat template moves the tools block (or the system prompt) when messages are added; "
                "rendering the whole conversation for this call (render_mode='full' does that for every call)",
                sync.trajectory.rollout_id,
            )
            return await self._full_prompt(conversation, sync)
        try:
            return await self._new_prompt(plan, sync)
        except TemplateError as exc:
            logger.warning(
                "rollout %s: %s; rendering the whole conversation for this call instead",
                sync.trajectory.rollout_id,
                exc,
            )
            return await self._full_prompt(conversation, sync)

    def _tools_move(self, plan: Plan, sync: ConversationSync) -> bool:
        tools, system = sync.tools, sync.system
        if not plan.chat or not (tools or system is not None):
            return False
        if self._moves_for[0] is not system or self._moves_for[1] is not tools:  # a new branch or rollout
            self._moves, self._moves_for = {}, (system, tools)
        roles = tuple(m.get("role", "") for m in plan.chat)
        moves = self._moves.get(roles)
        if moves is None:
            moves = self._moves[roles] = self.renderer.tools_move(plan.chat, tools)
        return moves

    def media_of(self, ids: list[int], chat: list[ChatMessage], start: int, held: int) -> NewPrompt:
        """Expand the media placeholders of ``ids`` (rendered from ``chat``, starting at token ``start``).

        ``held`` items are already in the trajectory; the prompt's total may not pass ``max_images``.
        """
        vision = self.vision
        items = chat_media(chat)
        if not items:
            if vision is not None:
                spelled = [kind for kind, token in vision.placeholder_ids.items() if token in ids]
                if spelled:
                    raise error_for(spelled)(
                        f"the rendered prompt holds a {spelled[0]} placeholder token but no {spelled[0]} "
                        "(a text spells it)"
                    )
            return ids, 0, ()
        kinds = {item.kind for item in items}
        refused = refusal(kinds, vision, self._backend, self._input_kinds)
        if refused is not None or vision is None:
            raise error_for(kinds)(refused or "no vision processor")
        if held + len(items) > vision.max_images:
            raise error_for(kinds)(
                f"the prompt would hold {held + len(items)} images and videos, more than max_images={vision.max_images}"
            )
        expanded, spans = vision.expand(ids, items, start)
        return expanded, 0, tuple(spans)

    async def _new_prompt(self, plan: Plan, sync: ConversationSync) -> NewPrompt:
        renderer = self.renderer
        traj = sync.trajectory
        if plan.initial:
            return self.media_of(await renderer.initial_ids(plan.chat, sync.tools), plan.chat, 0, 0)
        last_output = traj.last_segment
        if last_output is None or last_output.kind != "output":
            return [], 0, ()
        ended = traj.tokens(last_output)[-1:]
        # a model that did not end its turn itself gets it closed as the template would
        ids, n_boundary = await renderer.continuation_ids(
            plan.chat, close_turn=not (ended and ended[0] in renderer.end_of_turn_ids)
        )
        expanded, _, media = self.media_of(ids, plan.chat, len(traj), len(traj.media))
        return expanded, n_boundary, media

    async def _full_prompt(self, conversation: Conversation, sync: ConversationSync) -> NewPrompt:
        """Render the whole conversation; keep the longest common prefix with the trajectory, fork where they differ.

        The model's own tokens may not survive a re-render (decode -> encode is not identity, templates drop
        or rewrite earlier turns); where the render first differs from the trajectory, a new branch keeps
        the tokens up to the last segment boundary before that point, and the rest of the render becomes
        its new prompt. A warning names the first differing token.
        """
        renderer = self.renderer
        chat = conversation.chat()
        ids, _, media = self.media_of(await renderer.initial_ids(chat, sync.tools), chat, 0, 0)
        traj = sync.trajectory
        have = traj.ids_array()
        at = first_difference(ids, have)
        held = traj.media
        for mine, theirs in zip(media, held, strict=False):  # same ids, another item: differs at its span
            if mine.span != theirs:
                at = min(at, mine.span.start, theirs.start)
                break
        else:
            if len(held) > len(media):
                at = min(at, held[len(media)].start)
        if at < len(have):
            keep = max((seg.end for seg in traj.segments if seg.end <= at), default=0)
            recorded, rendered = have[at], ids[at] if at < len(ids) else None
            reason = (
                f"the full render differs from the trajectory at token {at}: recorded {recorded} "
                f"({renderer.decode([recorded])!r}), rendered "
                + (f"{rendered} ({renderer.decode([rendered])!r})" if rendered is not None else "nothing")
            )
            logger.warning("rollout %s: %s; forking at token %d", traj.rollout_id, reason, keep)
            sync.fork(keep, reason)
            return ids[keep:], 0, tuple(i for i in media if i.span.start >= keep)
        new = ids[len(have) :]
        return new, self.leading_boundary(new, sync), tuple(i for i in media if i.span.start >= len(have))

    def server_prompt(self, result: GenerateResult, sync: ConversationSync) -> tuple[list[int], int]:
        """For prompt-rendering backends: check the server's prompt extends the trajectory; return the new part."""
        if result.prompt_ids is None:
            raise bad_answer(self._backend, "prompt_ids", None, "a prompt-rendering backend must return the prompt ids")
        prompt = list(result.prompt_ids)
        have = sync.trajectory.token_ids
        if prompt[: len(have)] != have:
            at = first_difference(prompt, have)
            message = (
                f"the server-rendered prompt does not extend the trajectory: first difference at token {at} "
                f"(recorded {have[at : at + SHOWN]}, server {prompt[at : at + SHOWN]})"
            )
            if self.on_prefix_mismatch == "error":
                raise PrefixMismatchError(
                    message, position=at, expected=have[at : at + SHOWN], actual=prompt[at : at + SHOWN]
                )
            if self.on_prefix_mismatch == "warn":
                logger.warning("%s; forking a new branch", message)
            sync.fork(0, message)
            return prompt, 0
        new = prompt[len(have) :]
        return new, self.leading_boundary(new, sync)

    def leading_boundary(self, ids: Sequence[int], sync: ConversationSync) -> int:
        """How many leading ``ids`` are the template's boundary after the last output (``turn_tail``'s).

        Zero when the trajectory does not end with an output or ``ids`` do not start with the boundary's tokens.
        """
        if sync.last_kind() != "output":
            return 0
        boundary = self.renderer.turn_tail[1]
        if not boundary:
            return 0
        boundary_ids = self.renderer.encode(boundary)
        return len(boundary_ids) if list(ids[: len(boundary_ids)]) == boundary_ids else 0
