"""Images are loaded as the engines load them: upright by their EXIF orientation (transformers' ``load_image``,
vLLM's loader) and with transparency composited onto white (transformers' ``convert_to_rgb``, which its image
processors apply, and vLLM). A plain ``convert("RGB")`` keeps a transparent pixel's hidden colour and ignores
the orientation: the model would be recorded as seeing a picture it never saw."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tito_core.media import Image

np = pytest.importorskip("numpy")
image_utils = pytest.importorskip("transformers.image_utils")
image_transforms = pytest.importorskip("transformers.image_transforms")


def encoded(picture: PILImage.Image, fmt: str = "PNG", **options: object) -> bytes:
    buf = io.BytesIO()
    picture.save(buf, format=fmt, **options)
    return buf.getvalue()


def transparent(mode: str) -> bytes:
    """A 12x8 picture whose left half is fully transparent over a hidden red, its right half opaque blue."""
    rgba = PILImage.new("RGBA", (12, 8), (255, 0, 0, 0))
    rgba.paste((0, 0, 255, 255), (6, 0, 12, 8))
    rgba.putpixel((0, 0), (0, 255, 0, 128))  # and one half-transparent green pixel
    if mode == "RGBA":
        return encoded(rgba)
    if mode == "LA":
        return encoded(rgba.convert("LA"))
    palette = rgba.convert("RGB").quantize(colors=4)  # P, with the hidden red as the transparent index
    red = palette.getpixel((0, 1))
    return encoded(palette, transparency=red)


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P"])
def test_transparency_is_composited_onto_white_as_transformers_does(mode: str) -> None:
    data = transparent(mode)
    with PILImage.open(io.BytesIO(data)) as opened:
        expected = np.asarray(image_transforms.convert_to_rgb(opened, return_numpy=True))
        hidden = np.asarray(opened.convert("RGB"))
    got = np.asarray(Image(data).to_pil())
    assert got.shape == expected.shape and (got == expected).all()
    assert (got != hidden).any()  # the old loading differed: the test can fail
    assert tuple(got[1, 0]) == (255, 255, 255)  # a transparent pixel is white, not its hidden red


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_is_applied_as_transformers_load_image_does(orientation: int) -> None:
    picture = PILImage.new("RGB", (20, 6), (10, 20, 30))
    picture.paste((250, 250, 0), (0, 0, 5, 3))  # a corner that shows which way is up
    exif = PILImage.Exif()
    exif[0x0112] = orientation
    data = encoded(picture, "JPEG", exif=exif.tobytes(), quality=95)
    with PILImage.open(io.BytesIO(data)) as opened:
        expected = image_utils.load_image(opened)
    image = Image(data)
    got = image.to_pil()
    assert got.size == expected.size == image.size
    assert (np.asarray(got) == np.asarray(expected)).all()
    assert image.size == ((6, 20) if orientation >= 5 else (20, 6))
