"""A rollout file for the viewer's tests (HTTP in tests/viewer, a real browser in tests/browser).

Four records on the offline Qwen3 tokenizer, each built as tito records one: the first prompt rendered by the
template, outputs as exact ids with logprobs and weight versions, boundaries and tool results from the
incremental render. ``calc:0`` is a forced tool call then a free answer (weights 1 then 2); ``look:0`` has a
picture in its tool result; ``fork:0`` has two branches (weights 2 only); ``broken:0`` failed before any output.

:func:`write_audit` writes a real ``tito audit --json --per-token`` report of such a file, its gaps chosen.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tito_core.media import Image, MediaSpan, PromptMedia
from tito_core.records import open_writer, rollout_record
from tito_core.render.renderer import ChatRenderer
from tito_core.trajectory import Trajectory, Turn, Usage
from tito_core.versions import VersionSpan

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
IMAGE_PADS = 4


def png(width: int = 56, height: int = 40) -> bytes:
    """A small opaque PNG: red left half, blue right half."""
    from PIL import Image as PILImage

    picture = PILImage.new("RGB", (width, height), (220, 30, 30))
    picture.paste((30, 60, 220), (width // 2, 0, width, height))
    out = io.BytesIO()
    picture.save(out, format="png")
    return out.getvalue()


def _output(traj: Trajectory, renderer: ChatRenderer, text: str, turn: int, **fields: Any) -> None:
    ids = [*renderer.encode(text), *renderer.encode("<|im_end|>")]
    start = len(traj)
    traj.append("output", ids, [-0.05 * (k % 7) - 0.01 for k in range(len(ids))], turn=turn)
    version = fields.pop("version", None)
    spans = (VersionSpan(version=version, start=0, end=len(ids)),) if version is not None else None
    traj.add_turn(Turn(index=turn, rid=f"r{turn}", prompt_start=0, prompt_len=start, output_len=len(ids),
                       finish_reason="stop", stop_reason="end_turn", matched_stop=ids[-1],
                       usage=Usage(prompt_tokens=start, completion_tokens=len(ids)), weight_versions=spans,
                       **fields))  # fmt: skip


def _prompt(traj: Trajectory, renderer: ChatRenderer, chat: list[dict[str, Any]], turn: int) -> None:
    ids, boundary = asyncio.run(renderer.continuation_ids(chat, close_turn=False))
    traj.append("boundary", ids[:boundary], turn=turn)
    traj.append("prompt", ids[boundary:], turn=turn)


def _first(renderer: ChatRenderer, rollout_id: str, question: str) -> Trajectory:
    traj = Trajectory(rollout_id)
    chat = [{"role": "system", "content": "You add."}, {"role": "user", "content": question}]
    traj.append("prompt", asyncio.run(renderer.initial_ids(chat, None)), turn=0)
    return traj


def write_rollouts(path: Path, tokenizer: Any) -> Path:
    """Write the four records to ``path`` (JSONL or Parquet; the picture into ``<path>.images/``)."""
    renderer = ChatRenderer(tokenizer)
    records = []

    calc = _first(renderer, "calc:0", "What is 2 + 3?")
    _output(calc, renderer, CALL, 0, constrained=True, tool_calls=1, version="1")
    _prompt(calc, renderer, [{"role": "tool", "tool_call_id": "c0", "content": "5"}], 1)
    _output(calc, renderer, "The answer is 5.", 1, version="2")
    records.append((calc.close("completed"), "calc", 1.0, [0.25, 1.0]))

    look = _first(renderer, "look:0", "What colour is on the left?")
    _output(look, renderer, '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>', 0, tool_calls=1)
    _prompt(look, renderer, [{"role": "tool", "tool_call_id": "c0", "content": "here"}], 1)
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    start = len(look)
    look.append("prompt", [pad] * IMAGE_PADS, turn=1)
    image = Image(png())
    span = MediaSpan(start=start, length=IMAGE_PADS, sha256=image.sha256, format="png", size=image.size,
                     grid_thw=(1, 2, 2), placeholder_id=pad)  # fmt: skip
    look.add_media([PromptMedia(span=span, item=image)])
    look.append("prompt", renderer.encode("<|im_end|>\n<|im_start|>assistant\n"), turn=1)
    _output(look, renderer, "Red.", 1)
    records.append((look.close("completed"), "look", 1.0, None))

    fork = _first(renderer, "fork:0", "Say hi twice.")
    _output(fork, renderer, "hi", 0, version="2")
    keep = len(fork)
    _prompt(fork, renderer, [{"role": "user", "content": "again"}], 1)
    _output(fork, renderer, "hi hi", 1, version="2")
    child = fork.fork(keep, "the client rewrote the history", kind="rewrite")
    child.label = "main"
    _prompt(child, renderer, [{"role": "user", "content": "once more, louder"}], 1)
    _output(child, renderer, "HI", 1, version="2")
    records.append((child.close("truncated", "max_model_calls reached (2)"), "fork", 0.0, None))

    broken = _first(renderer, "broken:0", "Fail.")
    records.append((broken.close("failed", "the engine refused the request: 400 bad request"), "broken", None, None))

    with open_writer(path) as writer:
        for group, (traj, task, reward, turn_rewards) in enumerate(records):
            writer.write(rollout_record(traj, task_id=task, sample=0, group=group, reward=reward, server="http://e",
                                        started=0.0, wall_s=1.0, agent_s=1.0, tool_calls=1,
                                        turn_rewards=turn_rewards))  # fmt: skip
    return path


class ShiftScorer:
    """Re-scores each branch as its recorded logprobs plus ``shift(task_id, position)``: every gap is known."""

    takes_images = True
    description = "test scorer"

    def __init__(self, records: Sequence[Any], shift: Callable[[str, int], float]) -> None:
        from tito_core.trajectory import Trajectory

        self.shift = shift
        self.table = {
            tuple(branch.token_ids): (record.task_id, branch.logprobs)
            for record in records
            for branch in Trajectory.from_record(record.trajectory).all_branches
        }

    async def score(self, token_ids: Sequence[int], media: Sequence[Any] = ()) -> list[float | None]:
        task, old = self.table[tuple(token_ids)]
        return [None if lp is None else lp + self.shift(task, i) for i, lp in enumerate(old)]


def write_audit(rollouts: Path, out: Path, shift: Callable[[str, int], float]) -> Path:
    """Audit ``rollouts`` with a :class:`ShiftScorer` and write the report as ``tito audit --json --per-token`` does."""
    from tito_core.analysis.audit import audit
    from tito_core.records import read_records

    records = list(read_records(rollouts))
    report = asyncio.run(audit(records, ShiftScorer(records, shift), per_token=True))
    out.write_bytes(report.to_json())
    return out
