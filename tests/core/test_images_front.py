"""Images in tito's conversation form: the Strands front's image blocks, and canonical() encoding an image by hash."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tito_core.conversation import canonical
from tito_core.errors import UnsupportedContentError
from tito_core.media import Image, ImageError
from tito_core.strands_front.messages import to_chat_messages


def png(width: int = 20, height: int = 10, color: tuple[int, int, int] = (255, 0, 0)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), color).save(buf, format="PNG")
    return buf.getvalue()


def block(data: bytes, fmt: str = "png") -> dict:
    return {"image": {"format": fmt, "source": {"bytes": data}}}


def test_user_image_blocks_become_image_parts_in_block_order():
    data = png()
    chat = to_chat_messages([{"role": "user", "content": [{"text": "a"}, {"text": "b"}, block(data), {"text": "c"}]}])
    assert len(chat) == 1
    parts = chat[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text"]
    assert parts[0]["text"] == "a\nb" and parts[2]["text"] == "c"
    image = parts[1]["image"]
    assert isinstance(image, Image) and image.data == data and image.format == "png" and image.size == (20, 10)


def test_text_only_messages_keep_string_content():
    chat = to_chat_messages([{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}])
    assert chat == [{"role": "user", "content": "a\nb"}]


def test_tool_result_images_sit_beside_the_text():
    data = png(30, 30, (0, 0, 255))
    messages = [
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "shot", "input": {}}}]},
        {
            "role": "user",
            "content": [
                {"toolResult": {"toolUseId": "t1", "content": [{"text": "here"}, block(data), {"json": {"k": 1}}]}}
            ],
        },
    ]
    tool = to_chat_messages(messages)[1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "t1"
    assert [p["type"] for p in tool["content"]] == ["text", "image", "text"]
    assert tool["content"][1]["image"].sha256 == Image(data).sha256
    assert tool["content"][2]["text"] == '{"k": 1}'


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ([block(b"not an image")], "do not decode"),
        ([block(png(), "tiff")], "not supported"),
        ([block(png(), "jpeg")], "declared 'jpeg'"),
        ([{"image": {"format": "png", "source": {"location": "s3://x"}}}], "source.bytes"),
    ],
)
def test_bad_images_are_image_errors(content, match):
    with pytest.raises(ImageError, match=match):
        to_chat_messages([{"role": "user", "content": content}])


def test_images_in_assistant_messages_are_rejected():
    with pytest.raises(UnsupportedContentError, match="user messages and tool results"):
        to_chat_messages([{"role": "assistant", "content": [block(png())]}])


def test_canonical_encodes_an_image_by_its_hash_not_its_bytes():
    data = png(64, 64)
    image = Image(data)
    message = {"role": "user", "content": [{"type": "image", "image": image}]}
    encoded = canonical(message)
    assert isinstance(encoded, bytes) and image.sha256.encode() in encoded and len(encoded) < 200
    same = {"role": "user", "content": [{"type": "image", "image": Image(bytes(data))}]}
    other = {"role": "user", "content": [{"type": "image", "image": Image(png(64, 64, (0, 255, 0)))}]}
    assert canonical(same) == encoded and canonical(other) != encoded
