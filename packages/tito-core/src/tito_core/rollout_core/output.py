"""Recording: a checked answer becomes the call's boundary, prompt and output segments and its turn record.

The output is parsed (reasoning, content, tool calls) without the token it stopped on; the segments and the
:class:`~tito_core.trajectory.Turn` are appended atomically (all or nothing); the call's end is what
:func:`~tito_core.status.status_of` turns into the trajectory's status.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..backend import GenerateRequest, GenerateResult, SamplingParams
from ..conversation import ChatMessage, ToolSpec, reply_message
from ..media import PromptMedia
from ..render.renderer import ChatRenderer
from ..sampling_mask import SamplingMask
from ..tool_parsers._reasoning import ThinkAwareParser
from ..tool_parsers.base import ParsedOutput, ToolCall, ToolParser
from ..trajectory import Trajectory, Turn, Usage
from ..versions import check_spans

__all__ = ["CallResult", "parse_output", "parse_text", "record_call", "stop_reason"]


class CallResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one recorded model call gives the front: the parsed output, its tokens as recorded, its accounting.

    A front answers from this alone; it never reads the trajectory back.

    Attributes:
        parsed: The output's content, reasoning and tool calls.
        stop_reason: Why it ended (Strands' names: ``end_turn``, ``tool_use``, ``max_tokens``, ...).
        usage: Prompt, completion and cached token counts.
        latency_ms: The engine call's time.
        output_ids: The output's token ids, as recorded (the engine's, verbatim).
        output_logprobs: Their logprobs, as recorded (empty when the engine returned none).
        matched_stop: The stop string or token id that ended generation, when the engine says (as recorded).
        rid: The request id of the call (the first one when a weight update cut and continued it).
        turn: The call's index among the branch's turns.
        branch: The branch it was recorded on.
        sampling_mask: The output's kept sets, as recorded (None when the call did not truncate or has none).
        sampling_mask_missing: Why a truncating call has no kept sets (as recorded), else None.
        routed_experts: Whether routing decisions were recorded for the call.
        routed_experts_missing: Why a call that asked for routing has none (as recorded), else None.
    """

    parsed: ParsedOutput
    stop_reason: str
    usage: Usage
    latency_ms: int
    output_ids: tuple[int, ...] = ()
    output_logprobs: tuple[float | None, ...] = ()
    matched_stop: str | int | None = None
    rid: str = ""
    turn: int = 0
    branch: int = 0
    sampling_mask: SamplingMask | None = None
    sampling_mask_missing: str | None = None
    routed_experts: bool = False
    routed_experts_missing: str | None = None

    @property
    def malformed_calls(self) -> list[ToolCall]:
        """The tool calls that could not be parsed (shown back to the model instead of being run)."""
        return [call for call in self.parsed.calls if call.is_error]

    def reply(self) -> ChatMessage:
        """The assistant message the front hands back to the rollout after this output."""
        parsed = self.parsed
        return reply_message(parsed.content, parsed.reasoning, [(c.id, c.name, c.input) for c in parsed.calls])


def parse_text(
    renderer: ChatRenderer,
    parser: ToolParser,
    text: str,
    tool_specs: Sequence[ToolSpec] | None,
    prompt_ids: Sequence[int],
) -> ParsedOutput:
    """Parse a decoded output, telling a think-aware parser whether its prompt left reasoning open.

    The prompt's tokens say so, not the output's text: an output of a prompt that opened no reasoning block
    starts outside reasoning, so a ``</think>`` quoted in a call's arguments stays argument text.
    """
    if isinstance(parser, ThinkAwareParser):
        opened = renderer.opens_reasoning(prompt_ids, parser.think_start, parser.think_end)
        return parser.parse(text, tool_specs, reasoning_open=opened)
    return parser.parse(text, tool_specs)


async def parse_output(
    renderer: ChatRenderer,
    parser: ToolParser,
    result: GenerateResult,
    tool_specs: Sequence[ToolSpec] | None,
    sampling: SamplingParams,
    prompt_ids: Sequence[int] = (),
) -> ParsedOutput:
    """Split the output (without the token it stopped on) into reasoning, content and tool calls."""
    ids = result.output_ids
    if result.finish_reason == "stop" and ids:
        last = ids[-1]
        if (
            last in renderer.end_of_turn_ids
            or last in sampling.stop_token_ids
            or (isinstance(result.matched_stop, int) and result.matched_stop == last)
        ):
            ids = ids[:-1]
    return parse_text(renderer, parser, await renderer.adecode(ids), tool_specs, prompt_ids)


def stop_reason(result: GenerateResult, parsed: ParsedOutput) -> str:
    """Strands' stop reason of a call: ``max_tokens``, ``tool_use`` or ``end_turn``."""
    if result.finish_reason == "length":
        return "max_tokens"
    return "tool_use" if parsed.calls else "end_turn"


def record_call(
    traj: Trajectory,
    request: GenerateRequest,
    result: GenerateResult,
    new_ids: list[int],
    n_boundary: int,
    parsed: ParsedOutput,
    latency_ms: int,
    *,
    backend: str,
    continued: Sequence[str] = (),
    media: Sequence[PromptMedia] = (),
    mask_missing: str | None = None,
    label: str | None = None,
) -> CallResult:
    """Append the call's boundary, prompt and output segments, its new media and its turn record, atomically.

    ``mask_missing`` says why a truncating call has no kept sets (the backend cannot return them); a call that asked
    for routing and got none records why in ``routed_experts_missing``; ``label`` is the call's lineage label, kept in
    its turn.
    """
    prefix_len = len(traj)
    turn_index = len(traj.turns)
    stop = stop_reason(result, parsed)
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
        routed_experts_missing=_routing_missing(request, result, backend),
        sampling_mask=_stamped(result.sampling_mask, request) if request.return_sampling_mask else None,
        sampling_mask_missing=mask_missing,
        constrained=request.grammar is not None,
        continued_rids=tuple(continued),
        label=label,
        weight_versions=(
            None
            if result.weight_versions is None
            else check_spans(result.weight_versions, len(result.output_ids), backend=backend)
        ),
    )
    prompt_lps = result.prompt_logprobs
    with traj.atomic():
        traj.append("boundary", new_ids[:n_boundary], prompt_lps[:n_boundary] if prompt_lps else None, turn=turn_index)
        traj.append("prompt", new_ids[n_boundary:], prompt_lps[n_boundary:] if prompt_lps else None, turn=turn_index)
        traj.append("output", result.output_ids, result.output_logprobs, turn=turn_index)
        traj.add_turn(turn)
        if media:
            traj.add_media(media)
        for call in bad:
            traj.tool_parse_errors[call.name] = traj.tool_parse_errors.get(call.name, 0) + 1
    return CallResult(
        parsed=parsed,
        stop_reason=stop,
        usage=usage,
        latency_ms=latency_ms,
        output_ids=tuple(result.output_ids),
        output_logprobs=tuple(result.output_logprobs or ()),
        matched_stop=result.matched_stop,
        rid=request.rid,
        turn=turn_index,
        branch=traj.branch,
        sampling_mask=turn.sampling_mask,
        sampling_mask_missing=mask_missing,
        routed_experts=turn.routed_experts is not None,
        routed_experts_missing=turn.routed_experts_missing,
    )


def _stamped(mask: SamplingMask | None, request: GenerateRequest) -> SamplingMask | None:
    """``mask`` with the temperature its sets were kept at (the request's; 1.0 when it left the engine's default)."""
    t = request.sampling.temperature
    if mask is None or t is None or mask.temperature == t:
        return mask
    return msgspec.structs.replace(mask, temperature=float(t))


def _routing_missing(request: GenerateRequest, result: GenerateResult, backend: str) -> str | None:
    """Why a call that asked for routing decisions has none (None when it has them or did not ask)."""
    if not request.return_routed_experts or result.routed_experts is not None or not result.output_ids:
        return None
    return (
        f"routing replay asked for routed experts, but the {backend} backend's answer has none "
        "(an engine without routing capture, or a proxy between that dropped the field)"
    )
