"""The cost of images: tito's client time per call of an agent whose tool returns pictures, against the same agent.

Both agents run in one run on one fake engine, the second without pictures.

The agent (Strands, one ``lookup`` tool, ``--calls`` model calls) runs on the offline Qwen3 tokenizer with the
Qwen3.5 chat template (images in tool messages, ``qwen_xml`` tool calls) and the tiny Qwen-VL image processor
(14-pixel patches merged 2x2: a 448x448 picture is a 32x32 grid, 256 tokens, as with Qwen2.5-VL's published
settings). With images, each tool result holds one distinct ``--size`` PNG beside its text (a new picture per
call and per rollout, as screenshots are; generated before the timed rollouts); without, the same text only.

The engine is the fake SGLang server (``fake_sglang.py``, its own process): it takes images as SGLang does (one
placeholder per image plus base64 ``data:`` URLs in ``image_data``), decodes them and counts the expanded prompt.
tito sends through ``SGLangBackend`` with ``--session off`` (the default: every call sends the whole prompt and
every image so far, so the bytes on the wire grow with every picture) or ``--session on`` (SGLang sessions: a
call sends only its new ids and its new images, so what still grows is the agent framework's own work). An
``SGLangBackend`` without ``input_kinds`` (before the SGLang image adapter) falls back to the scripted backend
in-process: no HTTP, no base64, no JSON (the row says which).

Figures per call: ``stream()`` wall time (first event asked for to the last consumed) minus the server's handler
time; medians over the calls of ``--repeats`` rollouts of each agent, run in turn. ``--profile`` adds a cProfile
of the image agent and splits its time: building the images of the converted conversation (hashing, decoding),
measuring grids, placeholder expansion, base64, request JSON.

Usage:
    python benchmarks/images.py                       # 8 calls, 448x448, 7 repeats, profile
    python benchmarks/images.py --calls 3 --repeats 1 --size 112 --no-profile   # seconds (bench_smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import os
import platform
import pstats
import statistics
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from run import fake_server, fmt, post_json  # noqa: E402
from workload import Workload, filler, tool_blob, tool_query  # noqa: E402

SYSTEM = "You are a visual research assistant. Use the lookup tool until you know the answer."
USER = "Find the answer, looking at several items."

# cProfile rows: (label, file suffix, function) -> cumulative ms per call (the largest of same-named functions)
PROFILE_ROWS = (
    ("images of the converted conversation (Image(): hash + decode)", "tito_core/media.py", "__init__"),
    ("  of which decoding (Pillow)", "tito_core/media.py", "_probe"),
    ("grid measurement (VisionProcessor.measure)", "tito_core/render/vision.py", "measure"),
    ("placeholder expansion (VisionProcessor.expand, measure included)", "tito_core/render/vision.py", "expand"),
    ("base64 of the images (image_data)", "tito_sglang/_images.py", "image_data"),
    ("collapsing placeholders for SGLang", "tito_sglang/_images.py", "collapse_placeholders"),
    ("request JSON (encode_generate, base64 included)", "tito_sglang/_wire.py", "encode_generate"),
    ("answer checks (check_result)", "tito_core/rollout_core/checks.py", "check_result"),
    ("all of TitoModel.stream", "tito_core/strands_front/model.py", "stream"),
)


def answers(tokenizer: Any, workload: Workload) -> list[str]:
    """What the model answers at each turn: a thought, then a ``qwen_xml`` tool call (the last: the answer)."""
    out = []
    for turn in range(workload.calls):
        thought = filler(tokenizer, workload.think, seed=turn)
        if turn < workload.calls - 1:
            call = f"<function=lookup>\n<parameter=query>\n{tool_query(turn)}\n</parameter>\n</function>"
            out.append(f"{thought}\n\n<tool_call>\n{call}\n</tool_call>")
        else:
            out.append(f"{thought}\n\nThe answer is 42.")
    return out


def picture(seed: int, size: int) -> bytes:
    """A deterministic ``size`` x ``size`` PNG: gradients, boxes and a little noise (compresses like a screenshot)."""
    import numpy as np
    from PIL import Image as PILImage
    from PIL import ImageDraw

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([(x * (seed % 7 + 1)) % 256, (y * 3) % 256, ((x + y) // 2) % 256], -1)
    pixels = (base + rng.integers(0, 8, base.shape)).clip(0, 255).astype(np.uint8)
    image = PILImage.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    for i in range(12):
        x0, y0 = (i * 37 + seed) % size, (i * 23 + seed * 5) % size
        draw.rectangle([x0, y0, x0 + size // 8, y0 + size // 12], fill=(255, 255, 255), outline=(0, 0, 0))
    out = io.BytesIO()
    image.save(out, format="png")
    return out.getvalue()


class Agents:
    """Builds the agent of one rollout; keeps the tokenizer, the processor and the HTTP backend for the run."""

    def __init__(self, workload: Workload, size: int, url: str | None, session: str = "off") -> None:
        from tito_core.model_setup import vision_processor
        from tito_testing.tokenizers import load_qwen_tokenizer
        from tito_testing.vision import tiny_image_processor

        self.tokenizer = load_qwen_tokenizer("qwen3")
        self.vision = vision_processor(tiny_image_processor(), self.tokenizer)
        self.workload, self.size = workload, size
        self.answers = answers(self.tokenizer, workload)
        self.blob = tool_blob(self.tokenizer, workload)
        self.shared: Any = None
        if url is not None:
            from tito_sglang import SGLangBackend

            if "image" in getattr(SGLangBackend, "input_kinds", ()):
                self.shared = SGLangBackend(url, timeout=600.0, session=session)
        self.engine = "fake SGLang server (HTTP)" if self.shared is not None else "scripted backend (in-process)"
        self._pictures: list[list[bytes]] = []

    def pictures(self, rollouts: int) -> None:
        """Make the distinct pictures of the next ``rollouts`` image rollouts (outside the timed part)."""
        per = self.workload.calls - 1
        start = len(self._pictures)
        self._pictures += [
            [picture(1000 * r + t, self.size) for t in range(per)] for r in range(start, start + rollouts)
        ]

    async def rollout(self, images: bool) -> tuple[list[float], list[float], Any]:
        """One rollout: per call (stream wall seconds, server handler seconds), and the trajectory."""
        from strands import Agent, tool

        from tito_core import TitoModel
        from tito_testing.scripted import ScriptedBackend
        from tito_testing.vision import vl_chat_template

        backend = self.shared if self.shared is not None else ScriptedBackend(self.tokenizer, self.answers)
        model = TitoModel(
            backend,
            self.tokenizer,
            tool_parser="qwen_xml",
            chat_template=vl_chat_template(),
            chat_template_kwargs={"enable_thinking": False},
            processor=self.vision,
        )
        walls: list[float] = []
        inner = model.stream

        async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            started = time.perf_counter()
            async for event in inner(*args, **kwargs):
                yield event
            walls.append(time.perf_counter() - started)

        model.stream = stream  # type: ignore[method-assign]
        shots = iter(self._pictures.pop(0) if images else ())
        blob = self.blob

        @tool
        def lookup(query: str) -> dict[str, Any]:
            """Look an item up.

            Args:
                query: what to look up.
            """
            content: list[dict[str, Any]] = [{"text": f"Result for {query}: {blob}"}]
            if images:
                content.insert(0, {"image": {"format": "png", "source": {"bytes": next(shots)}}})
            return {"status": "success", "content": content}

        agent = Agent(model=model, tools=[lookup], system_prompt=SYSTEM, callback_handler=None)
        await agent.invoke_async(USER)
        server = self._server_times() if self.shared is not None else [0.0] * len(walls)
        if len(server) != len(walls):
            raise RuntimeError(f"{len(walls)} calls but {len(server)} server handler times")
        return walls, server, model.trajectory

    def _server_times(self) -> list[float]:
        import json

        with urllib.request.urlopen(self.shared.base_url.rstrip("/") + "/stats", timeout=30) as answer:
            times: list[float] = json.loads(answer.read())
        return times

    async def aclose(self) -> None:
        """Close the shared backend."""
        if self.shared is not None:
            await self.shared.aclose()


@contextlib.contextmanager
def engine(args: argparse.Namespace, workload: Workload, tokenizer_dir: str, image_tokens: int) -> Iterator[str | None]:
    """The fake server set to the workload's answers and image size (None: in-process, ``--scripted``)."""
    if args.scripted:
        yield None
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with fake_server(tokenizer_dir, workload) as url:
        body = {**workload.as_dict(), "answers": answers(tokenizer, workload), "image_tokens": image_tokens}
        post_json(url + "/configure", body)
        yield url


def median_ms(values: list[float]) -> float:
    """Median in ms (nan when empty)."""
    return 1e3 * statistics.median(values) if values else float("nan")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up, then ``repeats`` rollouts of each agent in turn; per-call figures; optionally a profile."""
    from tito_testing.tokenizers import qwen_tokenizer_dir

    workload = Workload(calls=args.calls, think=args.think, tool=args.tool)
    tokenizer_dir = str(qwen_tokenizer_dir("qwen3"))
    from tito_core.media import Image
    from tito_testing.vision import tiny_image_processor

    _grid, tokens = _count(tiny_image_processor(), Image(picture(0, args.size)))
    figures: dict[str, Any] = {"size": args.size, "image_tokens": tokens, "png_bytes": len(picture(0, args.size))}
    with engine(args, workload, tokenizer_dir, tokens) as url:
        agents = Agents(workload, args.size, url, args.session)
        figures["engine"] = agents.engine
        try:
            agents.pictures(1 + args.repeats + (args.profile_rollouts if args.profile else 0))
            rows: dict[bool, list[tuple[list[float], list[float], Any]]] = {False: [], True: []}
            for images in (False, True):  # warm-up
                await agents.rollout(images)
            for repeat in range(args.repeats):
                for images in (False, True) if repeat % 2 == 0 else (True, False):
                    rows[images].append(await agents.rollout(images))
            for images, runs in rows.items():
                per_call = [1e3 * (w - s) for walls, server, _ in runs for w, s in zip(walls, server, strict=True)]
                by_turn = [median_ms([walls[t] - server[t] for walls, server, _ in runs]) for t in range(args.calls)]
                traj = runs[-1][2]
                figures["images" if images else "text"] = {
                    "client_ms_per_call": statistics.median(per_call) if per_call else float("nan"),
                    "by_call_ms": by_turn,
                    "server_ms_per_call": median_ms([s for _, server, _ in runs for s in server]),
                    "tokens": len(traj),
                    "images": len(traj.media),
                }
            if args.profile:
                figures["profile"] = await profile(agents, args)
        finally:
            await agents.aclose()
    return figures


def _count(processor: Any, image: Any) -> tuple[Any, int]:
    out = processor(images=[image.to_pil()], return_tensors=None)
    grid = tuple(int(x) for x in out["image_grid_thw"][0])
    return grid, int(grid[0] * grid[1] * grid[2]) // processor.merge_size**2


async def profile(agents: Agents, args: argparse.Namespace) -> dict[str, float]:
    """Profile ``--profile-rollouts`` image rollouts; cumulative ms per call of each :data:`PROFILE_ROWS` entry."""
    profiler = cProfile.Profile()
    calls = 0
    profiler.enable()
    for _ in range(args.profile_rollouts):
        walls, _server, _traj = await agents.rollout(True)
        calls += len(walls)
    profiler.disable()
    stats = pstats.Stats(profiler)
    out: dict[str, float] = {}
    for label, suffix, name in PROFILE_ROWS:
        found = [row[3] for (path, _line, func), row in stats.stats.items() if func == name and path.endswith(suffix)]  # type: ignore[attr-defined]
        seconds = max(found, default=0.0)  # the outermost of same-named functions (measure calls measure)
        out[label] = 1e3 * seconds / max(1, calls)
    if args.profile_out:
        stats.dump_stats(args.profile_out)
        text = io.StringIO()
        pstats.Stats(args.profile_out, stream=text).sort_stats("cumulative").print_stats(40)
        Path(args.profile_out + ".txt").write_text(text.getvalue())
    return out


def render(figures: dict[str, Any], args: argparse.Namespace) -> str:
    """The tables of a run (Markdown)."""
    text, images = figures["text"], figures["images"]
    lines = [
        f"{args.calls}-call agent, one {args.size}x{args.size} PNG per tool result ({figures['png_bytes']} bytes, "
        f"{figures['image_tokens']} tokens each), {args.repeats} repeats; engine: {figures['engine']}; "
        f"Python {platform.python_version()}",
        "",
        "| agent | trajectory tokens | images | client ms/call (median) | server handler ms/call |",
        "|---|---|---|---|---|",
    ]
    for name, row in (("text only", text), ("one image per tool result", images)):
        lines.append(
            f"| {name} | {row['tokens']} | {row['images']} | {fmt(row['client_ms_per_call'])} | "
            f"{fmt(row['server_ms_per_call'])} |"
        )
    lines += ["", "| call | " + " | ".join(str(i + 1) for i in range(args.calls)) + " |"]
    lines.append("|---" * (args.calls + 1) + "|")
    for name, row in (("text only, ms", text), ("with images, ms", images)):
        lines.append(f"| {name} | " + " | ".join(fmt(v) for v in row["by_call_ms"]) + " |")
    if "profile" in figures:
        lines += ["", "| where the time goes (cProfile, image agent) | ms/call |", "|---|---|"]
        lines += [f"| {label} | {fmt(ms)} |" for label, ms in figures["profile"].items()]
    extra = images["client_ms_per_call"] - text["client_ms_per_call"]
    ratio = images["client_ms_per_call"] / text["client_ms_per_call"]
    lines += ["", f"image_extra_ms_per_call={extra:.2f} image_over_text={ratio:.2f}"]
    by_call = images["by_call_ms"]
    if len(by_call) >= 3:  # one new picture per call: the extra is the cost of a new image; does it stay flat?
        lines.append(f"last_call_over_call_2={by_call[-1] / by_call[1]:.2f} (call {len(by_call)} vs call 2)")
    return "\n".join(lines)


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--size", type=int, default=448, help="picture width and height, pixels")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--think", type=int, default=60, help="tokens of thought before each tool call")
    parser.add_argument("--tool", type=int, default=120, help="text tokens of each tool result")
    parser.add_argument("--scripted", action="store_true", help="the scripted backend in-process, no server")
    parser.add_argument("--session", choices=("off", "on"), default="off", help="SGLang sessions (see above)")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--profile-rollouts", type=int, default=5)
    parser.add_argument("--profile-out", default="", help="also write the .pstats (and a .txt of the top 40)")
    parser.add_argument("--json", default="", help="also write the figures as JSON")
    args = parser.parse_args()
    figures = asyncio.run(measure(args))
    print(render(figures, args))
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
