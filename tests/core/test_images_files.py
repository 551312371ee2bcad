"""Image bytes next to a rollout file: written once per distinct image, before the record; read back by read_records."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tito_core.media import Image, MediaSpan, PromptMedia
from tito_core.records import open_writer, read_records
from tito_core.records.schema import RolloutRecord, Timings, TokenCounts
from tito_core.trajectory import Trajectory
from tito_core.trajectory.media import images_dir


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (16, 16), (seed, 0, 0)).save(buf, format="PNG")
    return buf.getvalue()


def traj_with_images(rollout_id: str, images: list[Image]) -> Trajectory:
    traj = Trajectory(rollout_id)
    spans, ids = [], [1]
    for image in images:
        spans.append(
            PromptMedia(
                span=MediaSpan(start=len(ids), length=2, sha256=image.sha256, format=image.format,
                               size=image.size, grid_thw=(1, 2, 4), placeholder_id=9),
                item=image,
            )
        )  # fmt: skip
        ids += [9, 9, 2]
    with traj.atomic():
        traj.append("prompt", ids, turn=0)
        traj.add_media(spans)
    return traj.close("completed")


def record(traj: Trajectory, sample: int) -> RolloutRecord:
    return RolloutRecord(
        task_id="t",
        sample=sample,
        group=0,
        status="completed",
        status_reason=None,
        reward=None,
        trajectory=traj.to_record(),
        timings=Timings(started=0.0, wall_s=0.0, agent_s=0.0),
        tokens=TokenCounts(total=len(traj), output=0, prompt=len(traj), model_calls=0, tool_calls=0),
    )


@pytest.mark.parametrize("name", ["out.jsonl", "out.parquet"])
def test_images_are_stored_once_next_to_the_output_and_resolved_on_read(tmp_path, name):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    a, b = Image(png(1)), Image(png(2))
    trajs = [traj_with_images("r0", [a, b, a]), traj_with_images("r1", [b])]
    output = tmp_path / name
    with open_writer(output) as writer:
        for i, traj in enumerate(trajs):
            writer.write(record(traj, i))
            stored = images_dir(output) / f"{traj.media[0].sha256}.png"
            assert stored.exists()  # written before the record
    files = sorted(p.name for p in images_dir(output).iterdir())
    assert files == sorted({f"{a.sha256}.png", f"{b.sha256}.png"})
    if name.endswith(".jsonl"):
        text = output.read_text()
        assert a.sha256 in text and "image_paths" in text and "image_data" not in text  # no bytes in the record
    back = list(read_records(output))
    assert [Trajectory.from_record(r.trajectory) for r in back] == trajs
    assert Trajectory.from_record(back[0].trajectory).image(a.sha256).data == a.data
    with open_writer(output) as writer:  # resume: the lock and the finished keys still work
        assert writer.finished() == {("t", 0), ("t", 1)}


def test_a_missing_image_file_is_a_clear_error(tmp_path):
    from tito_core.errors import TrajectoryError

    output = tmp_path / "out.jsonl"
    traj = traj_with_images("r0", [Image(png(3))])
    with open_writer(output) as writer:
        writer.write(record(traj, 0))
    for path in images_dir(output).iterdir():
        path.unlink()
    with pytest.raises(TrajectoryError, match="cannot be read"):
        list(read_records(output))


def test_inspect_shows_the_image_spans(tmp_path, capsys):
    from tito_core.cli import main

    output = tmp_path / "out.jsonl"
    image = Image(png(4))
    with open_writer(output) as writer:
        writer.write(record(traj_with_images("r0", [image]), 0))
    assert main(["inspect", str(output), "--id", "t"]) == 0
    shown = capsys.readouterr().out
    assert "image 0: tokens 1-3 (2), 16x16 png, grid 1x2x4" in shown and image.sha256[:12] in shown
