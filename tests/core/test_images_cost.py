"""What an image costs tito: each distinct image is decoded once, measured from its size, base64-encoded once.

The grid from the size must equal the Hugging Face processor's own ``image_grid_thw`` (the reference), for the
tiny processor and for Qwen2.5-VL's published settings, at sizes that hit each branch of ``smart_resize``
(rounding, the pixel floor, the pixel ceiling, extreme aspect ratios). No torch: the Pillow processor only.
"""

from __future__ import annotations

import base64
import io

import pytest

pytest.importorskip("PIL")
from PIL import Image as PILImage

import tito_core.media.image as media
from tito_core.media import Image, ImageError
from tito_core.media.families import QwenVLFamily
from tito_core.model_setup import vision_processor
from tito_testing.tokenizers import load_qwen_tokenizer
from tito_testing.vision import TINY_VISION, tiny_image_processor

PUBLISHED = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, "patch_size": 14, "merge_size": 2}
"""Qwen2.5-VL's preprocessor_config.json settings."""

SIZES = [(448, 448), (449, 447), (20, 20), (1, 150), (57, 3), (1000, 300), (2000, 2000), (3000, 17), (640, 480)]


def png(width: int, height: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), ((seed * 37) % 256, (seed * 91) % 256, 128)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def tok():
    return load_qwen_tokenizer("qwen3")


def processor(settings: dict[str, int]):
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(**settings)


@pytest.mark.parametrize("settings", [TINY_VISION, PUBLISHED], ids=["tiny", "published"])
def test_the_grid_from_the_size_is_the_processors_grid(tok, settings):
    hf = processor(settings)
    family = QwenVLFamily(hf, tok)
    assert family._sizer is not None  # the size path is taken
    for width, height in SIZES:
        image = Image(png(width, height))
        expected = tuple(int(x) for x in hf(images=[image.to_pil()], return_tensors=None)["image_grid_thw"][0])
        grid, count = family.measure(image)
        assert grid == expected, (width, height)
        assert count == hf.get_number_of_image_patches(height, width) // settings["merge_size"] ** 2


def test_a_processor_that_does_not_resize_runs_on_the_pixels(tok):
    hf = tiny_image_processor()
    hf.do_resize = False
    family = QwenVLFamily(hf, tok)
    assert family._sizer is None
    assert family.measure(Image(png(56, 84))) == ((1, 6, 4), 6)  # 56x84 pixels: 4x6 patches, merged 2x2


def test_an_aspect_ratio_the_processor_refuses_is_an_image_error(tok):
    vision = vision_processor(tiny_image_processor(), tok)
    with pytest.raises(ImageError, match="aspect ratio"):
        vision.measure(Image(png(402, 2)))


def test_measuring_never_decodes_the_image(tok, monkeypatch):
    vision = vision_processor(tiny_image_processor(), tok)
    image = Image(png(448, 448, seed=1))
    monkeypatch.setattr(Image, "to_pil", lambda self: pytest.fail("the image was decoded to be measured"))
    assert vision.measure(image) == ((1, 32, 32), 256)


def test_the_same_bytes_are_decoded_once(monkeypatch):
    data = png(64, 48, seed=2)
    decoded: list[bytes] = []
    probe = media._probe
    monkeypatch.setattr(media, "_probe", lambda d: (decoded.append(d), probe(d))[1])
    first, again = Image(data), Image(bytearray(data), "png")
    assert decoded == [data]
    assert again == first and (again.format, again.size) == ("png", (64, 48))
    with pytest.raises(ImageError, match="declared 'jpeg'"):  # the remembered format is still checked
        Image(data, "jpeg")
    assert Image(png(64, 48, seed=3)).size == (64, 48) and len(decoded) == 2  # other bytes are decoded


def test_bytes_that_do_not_decode_are_refused_every_time():
    data = png(32, 32)[:40]  # the header and part of IHDR: truncated
    for _ in range(2):
        with pytest.raises(ImageError, match="do not decode"):
            Image(data)


def test_an_image_already_in_the_conversation_is_not_hashed_again(monkeypatch):
    """Strands keeps each image's bytes object from call to call: the front's second conversion costs a lookup."""
    from tito_core.strands_front.messages import to_conversation

    data = png(64, 48, seed=5)
    hashed: list[int] = []
    sha256 = media.hashlib.sha256
    monkeypatch.setattr(media.hashlib, "sha256", lambda d: (hashed.append(len(d)), sha256(d))[1])
    message = {"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": data}}}]}
    images = []
    for _ in range(3):
        content = to_conversation([message], None, None, None).messages[0]["content"]
        images += [part["image"] for part in content if part["type"] == "image"]
    assert images[0] is images[1] is images[2] and hashed == [len(data)]
    with pytest.raises(ImageError, match="declared 'jpeg'"):  # the declared format is still checked
        Image.of(data, "jpeg")
    copy = Image.of(bytes(bytearray(data)))  # equal bytes in another object: hashed (not decoded) again
    assert copy == images[0] and copy is not images[0] and len(hashed) == 2


def test_base64_is_encoded_once():
    image = Image(png(40, 40, seed=4))
    assert image.base64 == base64.b64encode(image.data).decode("ascii")
    assert image.base64 is image.base64


def test_the_family_does_not_build_the_whole_vocabulary(tok, monkeypatch):
    monkeypatch.setattr(type(tok), "get_vocab", lambda self: pytest.fail("get_vocab() called"))
    family = QwenVLFamily(tiny_image_processor(), tok)
    assert family.placeholder_ids == {"image": 151655}  # no model directory: no video processor config
    assert family.never_sample == (151652, 151653, 151655, 151656)
