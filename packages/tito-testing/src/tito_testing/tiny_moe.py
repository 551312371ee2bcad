"""A tiny random-weight Qwen3-MoE model for routing-replay tests, built offline and cached on disk.

The model is a ``Qwen3MoeForCausalLM`` with hidden size 16, 4 layers (every one a sparse MoE block), 2 attention
heads, 1 KV head, 8 experts of intermediate size 32 with 2 routed per token (``norm_topk_prob``: the two gate weights
renormalised to sum to 1, as Qwen3-30B-A3B does) and a vocabulary exactly as long as the offline Qwen3 tokenizer
(151,669 ids). The output head is not tied to the embeddings, as in the real Qwen3-MoE models (SGLang's Qwen3-MoE
ignores ``tie_word_embeddings`` and would leave a tied head unloaded). Weights are bf16 (about 10 MB, nearly all of it
the embeddings and the head), drawn ten times wider than transformers' default so that the experts a token goes to
change its logprobs (:data:`TINY_QWEN3_MOE`), and seeded: a rebuild with the same torch / transformers versions is
byte-identical. Its output is gibberish and it rarely stops, so tests bound ``max_new_tokens``.

Building needs ``torch`` and ``transformers``; they are imported inside :func:`build_tiny_qwen3_moe`. Command
line::

    python -m tito_testing.tiny_moe OUT_DIR
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from tito_testing.tiny_model import _build_once, _text_settings, _write_model
from tito_testing.tokenizers import cache_root

__all__ = ["TINY_QWEN3_MOE", "build_tiny_qwen3_moe"]

TINY_QWEN3_MOE: dict[str, Any] = {
    "hidden_size": 16,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 32,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 4096,
    "initializer_range": 0.2,
    "tie_word_embeddings": False,
}
"""Architecture of the tiny MoE (the vocabulary size comes from the tokenizer): routing rows are ``4 x 2``.

Weights are drawn with std 0.2 (transformers' default is 0.02) so that routing matters. At 0.02 the experts barely
touch the residual stream: sending every token to other experts moves its logprob by 0.002 nats on average, and the
router's second and third choices came within 3e-6 of each other on 40 tokens. At 0.2 other experts move logprobs by
0.8 nats on average (up to 3.1), and the closest such gap was 3e-4.
"""


_SEED = 0
_BUILD_VERSION = "1"


def build_tiny_qwen3_moe(out_dir: str | os.PathLike[str] | None = None, *, seed: int = _SEED) -> Path:
    """Build (once) the tiny random Qwen3-MoE model and return its directory.

    The directory holds ``config.json``, ``generation_config.json`` (eos ids ``[151645, 151643]``, no sampling
    defaults), ``model.safetensors`` and the offline Qwen3 tokenizer files, as :func:`tito_testing.tiny_model.
    build_tiny_qwen3` writes them.

    Args:
        out_dir: Where to put it. ``None`` uses the shared cache, ``cache_root() / "models" / "tiny-qwen3-moe-v<N>"``
            (``...-seed<S>`` for another seed). An existing complete build is reused.
        seed: The weights' random seed.

    Returns:
        The model directory.

    """
    name = f"tiny-qwen3-moe-v{_BUILD_VERSION}" + ("" if seed == _SEED else f"-seed{seed}")
    target = Path(out_dir) if out_dir is not None else cache_root() / "models" / name
    return _build_once(target, lambda staging, tokenizer_dir: _build(staging, tokenizer_dir, seed))


def _build(out: Path, tokenizer_dir: Path, seed: int) -> None:
    from transformers import Qwen3MoeConfig

    settings: dict[str, Any] = {**_text_settings(out, tokenizer_dir, Qwen3MoeConfig), **TINY_QWEN3_MOE}
    _write_model(out, Qwen3MoeConfig(**settings), seed)


def main(argv: list[str] | None = None) -> None:
    """Command line: build the tiny MoE into OUT_DIR (or the cache) and print its directory."""
    parser = argparse.ArgumentParser(prog="python -m tito_testing.tiny_moe")
    parser.add_argument("out_dir", nargs="?", help="target directory (default: the tito cache)")
    parser.add_argument("--seed", type=int, default=_SEED, help="the weights' random seed (another checkpoint)")
    args = parser.parse_args(argv)
    print(build_tiny_qwen3_moe(args.out_dir, seed=args.seed))


if __name__ == "__main__":
    main()
