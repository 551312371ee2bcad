"""A tiny random-weight Qwen3 model for real-engine tests, built offline and cached on disk.

The model is a ``Qwen3ForCausalLM`` with hidden size 64, 2 layers, 2 attention heads, 1 KV head, head
dim 64, intermediate size 128, tied embeddings and a vocabulary exactly as long as the offline Qwen3
tokenizer (151,669 ids, so it can never sample an id the tokenizer lacks). Weights are bf16 and seeded:
a rebuild with the same torch / transformers versions is byte-identical. Its output is gibberish and it
rarely stops on its own, so tests bound ``max_new_tokens`` or force the text with constrained decoding.

Building needs ``torch`` and ``transformers``, which exist only in the inference-engine environments;
they are imported inside :func:`build_tiny_qwen3`. Command line::

    python -m tito_testing.tiny_model OUT_DIR
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tito_testing.tokenizers import cache_root, qwen_tokenizer_dir

__all__ = ["TINY_QWEN3", "build_tiny_qwen3"]

TINY_QWEN3: dict[str, int] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
}
"""Architecture of the tiny model (the vocabulary size comes from the tokenizer)."""

_SEED = 0
_BUILD_VERSION = "1"
_ENDOFTEXT, _IM_END = 151643, 151645
_ROPE_THETA = 1_000_000.0
_MARKER = "model.safetensors"


def build_tiny_qwen3(out_dir: str | os.PathLike[str] | None = None, *, seed: int = _SEED) -> Path:
    """Build (once) the tiny random Qwen3 model and return its directory.

    The directory holds ``config.json``, ``generation_config.json`` (eos ids ``[151645, 151643]``, no
    sampling defaults), ``model.safetensors`` and the offline Qwen3 tokenizer files, so an engine can
    serve it with ``--model DIR`` and nothing else.

    Args:
        out_dir: Where to put it. ``None`` uses the shared cache,
            ``cache_root() / "models" / "tiny-qwen3-v<N>"`` (``...-seed<S>`` for another seed). An existing
            complete build is reused.
        seed: The weights' random seed: another seed gives another checkpoint of the same architecture and
            tokenizer (a weight update to load in a test).

    Returns:
        The model directory.

    """
    name = f"tiny-qwen3-v{_BUILD_VERSION}" + ("" if seed == _SEED else f"-seed{seed}")
    target = Path(out_dir) if out_dir is not None else cache_root() / "models" / name
    return _build_once(target, lambda staging, tokenizer_dir: _build(staging, tokenizer_dir, seed))


def _build_once(target: Path, build: Callable[[Path, Path], None]) -> Path:
    """Return ``target`` once it holds a model: reuse a complete build, else ``build(staging, tokenizer_dir)`` it.

    The build writes into a staging directory beside ``target`` (the offline Qwen3 tokenizer directory is given
    to copy from), which is then published whole (:func:`_publish`), so readers never see a half-written model.
    """
    if (target / _MARKER).is_file():
        return target
    tokenizer_dir = qwen_tokenizer_dir("qwen3")  # outside the staging dir: it has its own cache
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging, tokenizer_dir)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _publish(staging: Path, target: Path) -> None:
    """Move a finished build to ``target`` so that readers never see a half-written model."""
    try:
        staging.rename(target)  # atomic when target does not exist (or is an empty directory)
        return
    except OSError:
        if (target / _MARKER).is_file():  # a concurrent builder won the race
            return
    # target is a non-empty directory without a model (a caller-chosen folder): fill it, weights last.
    target.mkdir(parents=True, exist_ok=True)
    files = sorted(staging.iterdir(), key=lambda p: p.name == _MARKER)
    for path in files:
        os.replace(path, target / path.name)


def _build(out: Path, tokenizer_dir: Path, seed: int) -> None:
    from transformers import Qwen3Config

    settings: dict[str, Any] = {**TINY_QWEN3, **_text_settings(out, tokenizer_dir, Qwen3Config)}
    _write_model(out, Qwen3Config(**settings), seed)


def _text_settings(out: Path, tokenizer_dir: Path, config_class: Any) -> dict[str, Any]:
    """Copy the offline Qwen3 tokenizer into ``out``; the config settings every tiny Qwen3-family model shares.

    The vocabulary is the tokenizer's length, the embeddings tied, the special ids Qwen3's, RoPE Qwen3's (under the
    argument name ``config_class`` takes).
    """
    for path in sorted(tokenizer_dir.iterdir()):
        if path.is_file():
            shutil.copyfile(path, out / path.name)
    settings: dict[str, Any] = {
        "vocab_size": _tokenizer_length(out),
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "bos_token_id": _ENDOFTEXT,
        "eos_token_id": _IM_END,
        "pad_token_id": _ENDOFTEXT,
        "use_sliding_window": False,
    }
    if "rope_parameters" in inspect.signature(config_class.__init__).parameters:  # transformers >= 5
        settings["rope_parameters"] = {"rope_type": "default", "rope_theta": _ROPE_THETA}
    else:
        settings["rope_theta"] = _ROPE_THETA
    return settings


def _write_model(out: Path, config: Any, seed: int) -> None:
    """Seeded random weights for ``config``, saved to ``out`` in bf16 with a generation config of eos/pad ids only."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    # eos/pad ids only: no sampling defaults, so an engine's own defaults (temperature 1, no top-k/p) apply.
    GenerationConfig(
        bos_token_id=_ENDOFTEXT, eos_token_id=[_IM_END, _ENDOFTEXT], pad_token_id=_ENDOFTEXT
    ).save_pretrained(str(out))


def _tokenizer_length(tokenizer_dir: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))


def main(argv: list[str] | None = None) -> None:
    """Command line: build the tiny model into OUT_DIR (or the cache) and print its directory."""
    parser = argparse.ArgumentParser(prog="python -m tito_testing.tiny_model")
    parser.add_argument("out_dir", nargs="?", help="target directory (default: the tito cache)")
    parser.add_argument("--seed", type=int, default=_SEED, help="the weights' random seed (another checkpoint)")
    args = parser.parse_args(argv)
    print(build_tiny_qwen3(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
