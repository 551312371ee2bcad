"""An agent that must look: its tool returns a picture of coloured shapes and the task asks how many of one colour.

It runs on the embedded backend (tito-transformers) with the tiny random Qwen2.5-VL of tito-testing, built
offline on first use: no server, no hub. The first model call is forced to call the ``look`` tool (the random
model would never write a tool call by itself); the tool's result is the picture, a Strands image block, which
tito templates and expands into the model's image placeholders; the second call answers freely. With random
weights the answer is gibberish: the point is the record, which holds the picture's token span, its vision
grid and its bytes. Run::

    python examples/look_agent/look_agent.py [--seed N] [--out trajectory.json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 80, 220), "yellow": (235, 200, 40)}
SIZE = 224  # pixels: 8x8 placeholder tokens after the tiny processor's 14-pixel patches and 2x2 merge


@dataclass(frozen=True)
class Task:
    """One picture and its question: how many shapes of ``colour`` it shows (``answer``)."""

    picture: bytes  # PNG
    colour: str
    answer: int

    @property
    def question(self) -> str:
        return f"How many {self.colour} shapes are in the picture? Call `look` to see it, then answer with a number."


def make_task(seed: int) -> Task:
    """A 224x224 PNG of 3 to 7 circles and squares in a 3x3 grid, with a colour to count (1 to 4 of them)."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    colour = rng.choice(sorted(COLOURS))
    answer = rng.randint(1, 4)
    others = [rng.choice([c for c in sorted(COLOURS) if c != colour]) for _ in range(rng.randint(2, 3))]
    cells = rng.sample(range(9), answer + len(others))
    canvas = Image.new("RGB", (SIZE, SIZE), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    step = SIZE // 3
    for cell, name in zip(cells, [colour] * answer + others, strict=True):
        x, y = (cell % 3) * step + 12, (cell // 3) * step + 12
        box = (x, y, x + step - 24, y + step - 24)
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=COLOURS[name])
    out = io.BytesIO()
    canvas.save(out, format="PNG")
    return Task(out.getvalue(), colour, answer)


async def run(seed: int = 0, *, model_dir: Path | None = None, max_new_tokens: int = 48) -> tuple[Task, Any, str]:
    """Run the agent once; returns the task, the trajectory and how the agent ended (its answer, or why not)."""
    from strands import Agent, tool
    from strands.types.exceptions import MaxTokensReachedException

    from tito_core import TitoModel
    from tito_testing.tiny_vl import build_tiny_qwen25_vl
    from tito_transformers import TransformersBackend

    task = make_task(seed)
    model_dir = model_dir or build_tiny_qwen25_vl()
    backend = TransformersBackend(model_dir, dtype="bfloat16", num_threads=1)
    model = await TitoModel.create(
        backend,
        str(model_dir),  # the tokenizer, its Qwen3.5 chat template and the image processor's config
        tool_parser="qwen_xml",
        chat_template_kwargs={"enable_thinking": False},
        sampling={"temperature": 1.0, "max_new_tokens": max_new_tokens, "seed": seed},
        tool_choice={"tool": {"name": "look"}},  # the first call: random weights never call a tool on their own
    )

    @tool
    def look() -> dict[str, Any]:
        """Look at the picture the question is about."""
        model.update_config(tool_choice="auto")  # the answer after it is the model's own
        return {
            "status": "success",
            "content": [{"image": {"format": "png", "source": {"bytes": task.picture}}}, {"text": "The picture."}],
        }

    agent = Agent(model=model, tools=[look], callback_handler=None)
    try:
        ended = f"answered {str(await agent.invoke_async(task.question)).strip()!r}"
    except MaxTokensReachedException:
        ended = f"stopped at the {max_new_tokens}-token limit"
    finally:
        await backend.aclose()
    return task, model.trajectory, ended


def summary(task: Task, trajectory: Any, ended: str) -> str:
    """The trajectory in a few lines: tokens, calls, and each image's span."""
    lines = [
        f"question: {task.question} (expected: {task.answer})",
        f"trajectory: {len(trajectory.token_ids)} tokens, {sum(trajectory.loss_mask)} generated, "
        f"{len(trajectory.turns)} model calls; the agent {ended} (random weights: gibberish)",
    ]
    for turn in trajectory.turns:
        how = turn.finish_reason + (", forced" if turn.constrained else "")
        lines.append(f"  call {turn.index}: prompt +{turn.prompt_len} tokens, output {turn.output_len} ({how})")
    for index, span in enumerate(trajectory.media):
        width, height = span.size
        lines.append(
            f"  image {index}: tokens [{span.start}, {span.end}) = {span.length} x id {span.placeholder_id}, "
            f"grid {list(span.grid_thw or ())}, {span.format} {width}x{height}, sha256 {span.sha256[:12]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Command line: run the agent and print the trajectory's summary (and write it as JSON with ``--out``)."""
    parser = argparse.ArgumentParser(prog="look_agent.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seed", type=int, default=0, help="the picture's and the sampler's seed")
    parser.add_argument("--out", type=Path, help="write the trajectory (with the picture's bytes) as JSON here")
    args = parser.parse_args(argv)
    task, trajectory, ended = asyncio.run(run(args.seed))
    print(summary(task, trajectory, ended))
    if args.out:
        args.out.write_bytes(trajectory.to_json())
        print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
