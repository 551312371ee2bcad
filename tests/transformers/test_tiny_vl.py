"""The tiny VL test model: the architecture asked for, its image processor and template, a byte-identical rebuild."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path


def test_tiny_vl_config(tiny_vl_dir: Path) -> None:
    config = json.loads((tiny_vl_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    text, vision = config["text_config"], config["vision_config"]
    assert text["vocab_size"] == 151669
    assert (text["hidden_size"], text["num_hidden_layers"], text["intermediate_size"]) == (64, 2, 128)
    assert (text["num_attention_heads"], text["num_key_value_heads"]) == (2, 1)
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    assert sum(text["rope_parameters"]["mrope_section"]) == head_dim // 2
    assert config["tie_word_embeddings"] is True and config["dtype"] == "bfloat16"
    assert (vision["depth"], vision["hidden_size"], vision["out_hidden_size"]) == (2, 32, 64)
    assert (vision["patch_size"], vision["spatial_merge_size"], vision["temporal_patch_size"]) == (14, 2, 2)
    assert (vision["window_size"], vision["fullatt_block_indexes"]) == (112, [1])
    ids = [config[k] for k in ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")]
    assert ids == [151652, 151653, 151655, 151656]
    assert json.loads((tiny_vl_dir / "generation_config.json").read_text())["eos_token_id"] == [151645, 151643]


def test_tiny_vl_processor_and_template(tiny_vl_dir: Path) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor, AutoTokenizer

    shipped = Path(__import__("tito_testing").__file__).parent / "templates" / "qwen3_5.jinja"
    assert (tiny_vl_dir / "chat_template.jinja").read_text() == shipped.read_text()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_vl_dir))
    assert tokenizer.chat_template == shipped.read_text()
    messages = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "look<|vision_start|><|image_pad|><|vision_end|><|im_end|>" in text
    config = json.loads((tiny_vl_dir / "preprocessor_config.json").read_text())
    assert config["processor_class"] == "Qwen2_5_VLProcessor"
    assert (config["min_pixels"], config["max_pixels"]) == (56 * 56, 448 * 448)
    processor = AutoImageProcessor.from_pretrained(str(tiny_vl_dir))
    # 100x80 resizes to 112x84 (multiples of 28): 8x6 patches of 14, 4x3 = 12 tokens after the 2x2 merge
    out = processor(images=[Image.new("RGB", (100, 80), (255, 0, 0))], return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 6, 8]]
    assert tuple(out["pixel_values"].shape) == (48, 3 * 2 * 14 * 14)
    big = processor(images=[Image.new("RGB", (1000, 1000))], return_tensors="pt")["image_grid_thw"]
    assert int(big.prod()) // 4 <= 256  # max_pixels bounds an image to 256 placeholder tokens


def test_tiny_vl_rebuild_is_byte_identical(tiny_vl_dir: Path, tmp_path: Path) -> None:
    """Two builds in this environment are the same files; the cached one may come from another environment (the
    SGLang or vLLM suite, in a parallel lane, with its own transformers), which writes its config otherwise (it
    left out the top-level token ids): the cache holds the same files, and the same weights."""
    from tito_testing.tiny_vl import build_tiny_qwen25_vl

    first, again = build_tiny_qwen25_vl(tmp_path / "first"), build_tiny_qwen25_vl(tmp_path / "again")
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in again.iterdir()) == sorted(p.name for p in tiny_vl_dir.iterdir())
    for name in names:
        assert filecmp.cmp(first / name, again / name, shallow=False), f"{name} differs on rebuild"
        if name not in _VERSIONED:  # the weights, the tokenizer and the templates: the same in every environment
            assert filecmp.cmp(tiny_vl_dir / name, first / name, shallow=False), f"{name} differs from the cache"


_VERSIONED = ("config.json", "generation_config.json")
