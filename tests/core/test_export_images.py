"""Images in the exports, without the trainers: each export's image field on a hand-built trajectory, the same
fields absent on a text-only one, and the rows ``tito export`` writes naming images by hash (plain data).

The trainers' own classes read these fields in tests/trainers/test_images.py (``nox -s trainers``).
"""

from __future__ import annotations

import io

import msgspec
import pytest

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tito_core import Trajectory
from tito_core.export import model_request_events, to_slime, to_trl, to_verl
from tito_core.export.media import data_url, image_values
from tito_core.media import Image, MediaSpan, PromptMedia
from tito_core.records.schema import RolloutRecord, Timings, TokenCounts
from tito_core.runner.samples import training_rows
from tito_core.trajectory import Turn, Usage

PAD, VSTART, VEND = 151655, 151652, 151653


def png(width: int, height: int, colour: tuple[int, int, int]) -> Image:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), colour).save(buf, format="PNG")
    return Image(buf.getvalue())


def span(image: Image, start: int, grid: tuple[int, int, int]) -> PromptMedia:
    length = grid[0] * grid[1] * grid[2] // 4
    s = MediaSpan(start=start, length=length, sha256=image.sha256, format=image.format, size=image.size,
                  grid_thw=grid, placeholder_id=PAD)  # fmt: skip
    return PromptMedia(span=s, item=image)


def turn(traj: Trajectory, index: int, prompt_start: int, output_len: int) -> None:
    prompt_len = len(traj) - output_len - prompt_start
    usage = Usage(prompt_tokens=len(traj) - output_len, completion_tokens=output_len)
    traj.add_turn(Turn(index=index, rid=f"c{index}", prompt_start=prompt_start, prompt_len=prompt_len,
                       output_len=output_len, finish_reason="stop", stop_reason=None, usage=usage))  # fmt: skip


def image_trajectory() -> tuple[Trajectory, list[Image]]:
    """Two calls: an image in the first prompt, two (one of them the first again) in the tool result."""
    red, blue = png(56, 56, (255, 0, 0)), png(112, 56, (0, 0, 255))
    traj = Trajectory("r-img")
    with traj.atomic():
        traj.append("prompt", [1, VSTART, *[PAD] * 4, VEND, 2], turn=0)
        traj.add_media([span(red, 2, (1, 4, 4))])
    traj.append("output", [3, 4], [-0.5, -0.25], turn=0)
    turn(traj, 0, 0, 2)
    with traj.atomic():
        start = len(traj)
        traj.append("prompt", [5, VSTART, *[PAD] * 8, VEND, VSTART, *[PAD] * 4, VEND, 6], turn=1)
        traj.add_media([span(blue, start + 2, (1, 4, 8)), span(red, start + 12, (1, 4, 4))])
    traj.append("output", [7], [-0.125], turn=1)
    turn(traj, 1, start, 1)
    return traj.close(), [red, blue, red]


def text_trajectory() -> Trajectory:
    traj = Trajectory("r-text")
    traj.append("prompt", [1, 2], turn=0)
    traj.append("output", [3], [-0.5], turn=0)
    turn(traj, 0, 0, 1)
    return traj.close()


def same_pixels(pils, images) -> bool:
    return [p.tobytes() for p in pils] == [i.to_pil().tobytes() for i in images]


def test_each_export_carries_the_images_in_token_order():
    traj, images = image_trajectory()
    assert same_pixels(to_verl(traj)["multi_modal_data"]["images"], images)
    assert same_pixels(to_slime(traj)["multimodal_inputs"]["images"], images)
    assert same_pixels(to_trl(traj)["images"], images)
    first, second = model_request_events(traj)
    urls = [[p["image_url"]["url"] for p in e["request"]["messages"][0]["content"]] for e in (first, second)]
    assert urls == [[data_url(p) for p in traj.prompt_media()[:1]], [data_url(p) for p in traj.prompt_media()]]
    assert urls[1][0].startswith("data:image/png;base64,")


def test_text_only_exports_are_unchanged():
    traj = text_trajectory()
    assert "multi_modal_data" not in to_verl(traj)
    assert not {"multimodal_inputs", "multimodal_train_inputs"} & set(to_slime(traj))
    assert "images" not in to_trl(traj) and "images" not in to_trl([traj])
    assert "messages" not in model_request_events(traj)[0]["request"]
    assert image_values(traj) == []


def test_a_trl_batch_gives_an_empty_list_to_a_rollout_without_images():
    traj, images = image_trajectory()
    columns = to_trl([text_trajectory(), traj])
    assert columns["images"][0] == [] and same_pixels(columns["images"][1], images)


def test_rows_name_images_by_hash_and_encode_as_plain_data():
    traj, images = image_trajectory()
    record = RolloutRecord(
        task_id="t", sample=0, group=0, status="completed", status_reason=None, reward=1.0,
        trajectory=traj.to_record(), timings=Timings(started=0.0, wall_s=1.0, agent_s=1.0),
        tokens=TokenCounts(total=len(traj), output=3, prompt=len(traj) - 3, model_calls=2, tool_calls=1),
    )  # fmt: skip
    hashes = [i.sha256 for i in images]
    verl, slime, trl, agl = (next(training_rows([record], to)) for to in ("verl", "slime", "trl", "agl"))
    assert verl["multi_modal_data"] == {"images": hashes}
    assert slime["multimodal_inputs"] == {"images": hashes}
    assert trl["images"] == hashes
    last = agl["model_request_events"][-1]["request"]["messages"][0]["content"]
    assert [p["image_url"]["url"] for p in last] == [f"sha256:{h}" for h in hashes]
    for row in (verl, slime, trl, agl):
        msgspec.json.encode(row)  # plain data: what `tito export` writes


def test_an_unknown_image_form_is_a_value_error():
    traj, _ = image_trajectory()
    with pytest.raises(ValueError, match="images must be one of"):
        to_verl(traj, images="bytes")  # type: ignore[arg-type]
