"""A Strands agent on the embedded tiny Qwen2.5-VL whose tool returns a picture (examples/look_agent): the record.

The trajectory holds the picture's span (expanded placeholders, its grid, its bytes once), the model never
sampled a vision placeholder, and a plain forward pass of the model over the trajectory's ids with the
picture's pixel inputs (transformers' own MRoPE positions) reproduces the free turn's recorded logprobs within
bf16 noise (the backend decodes in bf16 with a KV cache; the re-score is one bf16 forward). The forced first
turn was decoded under a grammar: its recorded logprobs are post-constraint, never below the re-score.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from tito_core.analysis.drift import logprob_gap

pytest.importorskip("strands")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "look_agent" / "look_agent.py"
IMAGE_PAD, VISION_IDS = 151655, {151652, 151653, 151655, 151656}
BF16_MEAN, BF16_MAX = 5e-3, 2e-2  # as the engines' weight-update suite (tests/integration/weight_updates.py)


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("look_agent", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def agent_run(tiny_vl_dir: Path) -> Any:
    import asyncio

    return asyncio.run(_example().run(0, model_dir=tiny_vl_dir))


def _rescore(model_dir: Path, trajectory: Any) -> list[float]:
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()
    processor = AutoImageProcessor.from_pretrained(str(model_dir))
    pixels = processor(images=[p.image.to_pil() for p in trajectory.prompt_media()], return_tensors="pt")
    ids = torch.tensor([list(trajectory.token_ids)])
    with torch.inference_mode():
        logits = model(
            input_ids=ids,
            pixel_values=pixels["pixel_values"].to(torch.bfloat16),
            image_grid_thw=pixels["image_grid_thw"],
            mm_token_type_ids=(ids == IMAGE_PAD).int(),
        ).logits[0, :-1]
    scored = torch.log_softmax(logits.float(), dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return [float("nan"), *scored.tolist()]  # aligned with token_ids: position 0 has none


def test_the_tool_picture_is_recorded_as_an_image_span(agent_run: Any, tiny_vl_dir: Path) -> None:
    task, trajectory, _ = agent_run
    (span,) = trajectory.media
    assert (span.format, span.size, span.grid_thw, span.length) == ("png", (224, 224), (1, 16, 16), 64)
    assert trajectory.image(span.sha256).data == task.picture
    ids = list(trajectory.token_ids)
    assert ids[span.start : span.end] == [IMAGE_PAD] * 64 and ids.count(IMAGE_PAD) == 64
    assert ids[span.start - 1] == 151652 and ids[span.end] == 151653  # <|vision_start|> ... <|vision_end|>
    assert not any(m for m in trajectory.loss_mask[span.start - 1 : span.end + 1])  # the tool's, not the model's
    call, answer = trajectory.turns
    assert call.constrained and call.tool_calls == 1 and not answer.constrained
    assert call.prompt_start + call.prompt_len + call.output_len <= span.start < answer.prompt_start + answer.prompt_len
    generated = [t for t, m in zip(ids, trajectory.loss_mask, strict=True) if m]
    assert len(generated) == call.output_len + answer.output_len and not set(generated) & VISION_IDS


def test_a_plain_forward_with_the_picture_reproduces_the_recorded_logprobs(agent_run: Any, tiny_vl_dir: Path) -> None:
    _, trajectory, _ = agent_run
    rescored = _rescore(tiny_vl_dir, trajectory)
    call, answer = trajectory.turns
    start = answer.prompt_start + answer.prompt_len
    free = range(start, start + answer.output_len)
    gap = logprob_gap((trajectory.logprobs[i], rescored[i]) for i in free)
    assert gap.tokens == answer.output_len >= 8
    print(f"free turn re-scored: {gap}")
    assert gap.mean_abs < BF16_MEAN and gap.max_abs < BF16_MAX, gap
    forced_start = call.prompt_start + call.prompt_len
    forced = [(trajectory.logprobs[i], rescored[i]) for i in range(forced_start, forced_start + call.output_len)]
    assert all(recorded >= plain - BF16_MAX for recorded, plain in forced)  # the grammar's mask only raises them


def test_the_example_prints_the_image_span(
    tiny_vl_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tito_core import Trajectory

    out = tmp_path / "trajectory.json"
    _example().main(["--seed", "1", "--out", str(out)])  # in process: the model is cached, torch imported
    printed = capsys.readouterr().out
    assert "image 0: tokens [" in printed and "grid [1, 16, 16], png 224x224" in printed
    assert "random weights: gibberish" in printed
    assert len(Trajectory.from_json(out.read_bytes()).media) == 1
