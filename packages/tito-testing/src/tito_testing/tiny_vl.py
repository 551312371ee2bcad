"""A tiny random-weight Qwen2.5-VL model for multimodal tests on real engines, built offline and cached on disk.

The model is a ``Qwen2_5_VLForConditionalGeneration``: a text decoder like :mod:`tito_testing.tiny_model`'s
(hidden size 64, 2 layers, 2 heads, 1 KV head, tied embeddings, MRoPE sections ``[4, 6, 6]`` summing to half
the head dim 32, a vocabulary exactly as long as the offline Qwen3 tokenizer, which has the vision tokens) and
a vision tower of depth 2, hidden size 32, projected to 64 (patch 14, spatial merge 2, temporal patch 2,
window 112, full attention in block 1). Weights are bf16 and seeded: a rebuild with the same torch /
transformers versions is byte-identical. Its output is gibberish.

The directory also holds the offline Qwen3 tokenizer with tito-testing's Qwen3.5 chat template (images in
user and tool messages, tools in the qwen_xml syntax, ``<think>``) as the tokenizer's template and as
``chat_template.jinja``, the image processor's ``preprocessor_config.json``
(:func:`tito_testing.vision.tiny_image_processor`: 56*56 to 448*448 pixels, so an image is 4 to 256 placeholder
tokens), the video processor's ``video_preprocessor_config.json`` (:data:`tito_testing.vision.TINY_VIDEO`) and
``generation_config.json``.

Building needs ``torch`` and ``transformers``, which exist only in the inference-engine environments; they are
imported inside :func:`build_tiny_qwen25_vl`. Command line::

    python -m tito_testing.tiny_vl OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tito_testing.tiny_model import _publish
from tito_testing.tokenizers import cache_root, qwen_tokenizer_dir
from tito_testing.vision import TINY_VIDEO, TINY_VISION, tiny_image_processor, vl_chat_template

__all__ = [
    "IMAGE_PAD_ID",
    "TINY_QWEN25_VL_TEXT",
    "TINY_QWEN25_VL_VISION",
    "VISION_END_ID",
    "VISION_START_ID",
    "VIDEO_PAD_ID",
    "build_tiny_qwen25_vl",
]

VISION_START_ID, VISION_END_ID, IMAGE_PAD_ID, VIDEO_PAD_ID = 151652, 151653, 151655, 151656
"""The Qwen vision token ids (``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``)."""

TINY_QWEN25_VL_TEXT: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
}
"""The text decoder (head dim 64 / 2 = 32; the vocabulary size comes from the tokenizer)."""

_MROPE_SECTION = [4, 6, 6]  # temporal, height, width rotary pairs: sums to head_dim / 2 = 16

TINY_QWEN25_VL_VISION: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [1],
    "in_chans": 3,
}
"""The vision tower (``out_hidden_size`` is the text hidden size: merged patches become text embeddings)."""

_SEED = 0
_BUILD_VERSION = "2"  # 2: video_preprocessor_config.json
_ENDOFTEXT, _IM_END = 151643, 151645
_ROPE_THETA = 1_000_000.0
_MARKER = "model.safetensors"  # written last (see tiny_model._publish)


def build_tiny_qwen25_vl(out_dir: str | os.PathLike[str] | None = None, *, seed: int = _SEED) -> Path:
    """Build (once) the tiny random Qwen2.5-VL model and return its directory.

    The directory holds ``config.json``, ``generation_config.json`` (eos ids ``[151645, 151643]``, no sampling
    defaults), ``model.safetensors``, ``preprocessor_config.json`` (``processor_class: Qwen2_5_VLProcessor``),
    the offline Qwen3 tokenizer files and ``chat_template.jinja`` (the Qwen3.5 template), so an engine can serve
    it with ``--model DIR`` and nothing else.

    Args:
        out_dir: Where to put it. ``None`` uses the shared cache,
            ``cache_root() / "models" / "tiny-qwen2.5-vl-v<N>"`` (``...-seed<S>`` for another seed). An existing
            complete build is reused.
        seed: The weights' random seed (another checkpoint of the same architecture).

    Returns:
        The model directory.

    """
    name = f"tiny-qwen2.5-vl-v{_BUILD_VERSION}" + ("" if seed == _SEED else f"-seed{seed}")
    target = Path(out_dir) if out_dir is not None else cache_root() / "models" / name
    if (target / _MARKER).is_file():
        return target
    tokenizer_dir = qwen_tokenizer_dir("qwen3")  # outside the staging dir: it has its own cache
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _build(staging, tokenizer_dir, seed)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _build(out: Path, tokenizer_dir: Path, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    template = vl_chat_template()
    for path in sorted(tokenizer_dir.iterdir()):
        if path.is_file() and path.name != "chat_template.jinja":
            shutil.copyfile(path, out / path.name)
    _write_template(out, template)
    vocab_size = _tokenizer_length(out)
    ids: dict[str, Any] = {"bos_token_id": _ENDOFTEXT, "eos_token_id": _IM_END, "pad_token_id": _ENDOFTEXT}
    text = {
        **TINY_QWEN25_VL_TEXT,
        **ids,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": _ROPE_THETA, "mrope_section": _MROPE_SECTION},
    }
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(TINY_QWEN25_VL_VISION),
        image_token_id=IMAGE_PAD_ID,
        video_token_id=VIDEO_PAD_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        tie_word_embeddings=True,
        **ids,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=_ENDOFTEXT, eos_token_id=[_IM_END, _ENDOFTEXT], pad_token_id=_ENDOFTEXT
    ).save_pretrained(str(out))
    _write_json(out / "preprocessor_config.json", _preprocessor_config())
    _write_json(out / "video_preprocessor_config.json", dict(TINY_VIDEO))


def _write_template(out: Path, template: str) -> None:
    """The chat template as ``chat_template.jinja`` and in ``tokenizer_config.json`` (older loaders read that)."""
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = template
    _write_json(config_path, config)


def _preprocessor_config() -> dict[str, Any]:
    """The image processor's config: transformers 5's ``size`` and the older ``min_pixels`` / ``max_pixels``."""
    config: dict[str, Any] = json.loads(tiny_image_processor().to_json_string())
    config.update(TINY_VISION)
    config["processor_class"] = "Qwen2_5_VLProcessor"
    return config


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def _tokenizer_length(tokenizer_dir: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))


def main(argv: list[str] | None = None) -> None:
    """Command line: build the tiny VL model into OUT_DIR (or the cache) and print its directory."""
    parser = argparse.ArgumentParser(prog="python -m tito_testing.tiny_vl")
    parser.add_argument("out_dir", nargs="?", help="target directory (default: the tito cache)")
    parser.add_argument("--seed", type=int, default=_SEED, help="the weights' random seed (another checkpoint)")
    args = parser.parse_args(argv)
    print(build_tiny_qwen25_vl(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
