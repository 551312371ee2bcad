"""vLLM's JSON, decoded: read-only msgspec views of the responses tito uses.

Each Struct names only the fields tito reads; every other field of vLLM's answer is skipped while
decoding (unknown fields are never an error, so newer servers keep working). Field shapes were taken
from vLLM 0.32 responses recorded against a real server.
"""

from __future__ import annotations

import ast
import base64
import binascii
import sys
from array import array

import msgspec

from tito_core.errors import BackendResponseError

__all__ = [
    "ChatResponse",
    "CompletionResponse",
    "GenerateResponse",
    "ModelList",
    "decode_npy_int32",
]

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM spells a token in logprobs when asked with ``return_tokens_as_token_ids``."""


class _View(msgspec.Struct, kw_only=True):
    """Base of the views: decode-only, unknown fields ignored."""


# -- logprobs --------------------------------------------------------------------------------------


class TokenLogprob(_View):
    """One generated token in OpenAI chat logprobs (``token`` is ``"token_id:N"`` when asked)."""

    logprob: float
    token: str | None = None


class ChatLogprobs(_View):
    content: list[TokenLogprob] | None = None


class CompletionLogprobs(_View):
    """Legacy completions logprobs: parallel lists."""

    tokens: list[str] | None = None
    token_logprobs: list[float | None] | None = None


class IdLogprob(_View):
    """One generated token in ``/inference/v1/generate`` logprobs (ids, no text)."""

    token_id: int
    logprob: float


class GenerateLogprobs(_View):
    content: list[IdLogprob] | None = None


class PromptLogprob(_View):
    logprob: float


PromptLogprobs = list[dict[int, PromptLogprob] | None]
"""Per prompt position: ``{token_id: {logprob, ...}}`` (the first position is null)."""


# -- usage -----------------------------------------------------------------------------------------


class PromptTokensDetails(_View):
    cached_tokens: int | None = None


class Usage(_View):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


# -- responses -------------------------------------------------------------------------------------


class WeightVersionSpan(_View):
    """Output tokens ``[start, end)`` were sampled by the weights labelled ``version`` (``"default"`` at start)."""

    version: str | int
    start: int
    end: int


class _Choice(_View):
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: str | None = None
    weight_versions: list[WeightVersionSpan] | None = None
    """Sent by ``/inference/v1/generate`` (vLLM >= 0.32); the OpenAI endpoints send none."""


class CompletionChoice(_Choice):
    logprobs: CompletionLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None


class CompletionResponse(_View):
    """``POST /v1/completions``: the prompt echo and prompt logprobs sit inside the choice."""

    choices: list[CompletionChoice]
    id: str | None = None
    usage: Usage | None = None


class ChatChoice(_Choice):
    logprobs: ChatLogprobs | None = None


class ChatResponse(_View):
    """``POST /v1/chat/completions``: the server-rendered prompt ids sit at the top level."""

    choices: list[ChatChoice]
    id: str | None = None
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None


class GenerateChoice(_Choice):
    logprobs: GenerateLogprobs | None = None


class PlaceholderRange(_View):
    """Where one image's placeholder tokens sit in the prompt."""

    offset: int
    length: int


class GenerateResponse(_View):
    """``POST /inference/v1/generate`` (``output_mode: "tokens"``)."""

    choices: list[GenerateChoice]
    request_id: str | None = None
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobs | None = None
    mm_placeholders: dict[str, list[PlaceholderRange]] | None = None
    """Echoed with the prompt ids (``return_token_ids``) for a prompt with images: the ranges the engine used."""


class ModelCard(_View):
    id: str
    max_model_len: int | None = None


class ModelList(_View):
    """``GET /v1/models``."""

    data: list[ModelCard]


# -- routed experts --------------------------------------------------------------------------------

_NPY_MAGIC = b"\x93NUMPY"
_NPY_CODES = {"u1": "B", "i1": "b", "u2": "H", "i2": "h", "u4": "I", "i4": "i", "u8": "Q", "i8": "q"}


def decode_npy_int32(data: str, *, backend: str) -> tuple[bytes, tuple[int, ...]]:
    """Decode vLLM's base64 ``.npy`` integer array into little-endian int32 bytes and its shape.

    vLLM sends routed experts as ``numpy.save`` output, base64-encoded, with the smallest integer
    dtype that fits (uint8 / uint16 / int32). numpy is not needed to read that format.
    """
    try:
        raw = base64.b64decode(data, validate=True)
        if not raw.startswith(_NPY_MAGIC) or len(raw) < 10:
            raise ValueError("not an .npy payload")
        major = raw[6]
        if major == 1:
            header_len, start = int.from_bytes(raw[8:10], "little"), 10
        else:
            header_len, start = int.from_bytes(raw[8:12], "little"), 12
        header = ast.literal_eval(raw[start : start + header_len].decode("latin-1"))
        descr, shape = header["descr"], tuple(int(n) for n in header["shape"])
        if header.get("fortran_order") and len([n for n in shape if n != 1]) > 1:
            raise ValueError("Fortran-ordered arrays are not supported")
        order, code = descr[0], _NPY_CODES[descr[1:]]
    except (binascii.Error, ValueError, KeyError, IndexError, SyntaxError, TypeError) as exc:
        raise BackendResponseError(
            f"{backend}: cannot decode routed_experts: {exc}", field="routed_experts", body=data[:200], backend=backend
        ) from exc
    values = array(code)
    values.frombytes(raw[start + header_len :])
    if (order == ">") != (sys.byteorder == "big") and values.itemsize > 1:
        values.byteswap()
    expected = 1
    for n in shape:
        expected *= n
    if len(values) != expected:
        raise BackendResponseError(
            f"{backend}: routed_experts holds {len(values)} values, its shape {shape} needs {expected}",
            field="routed_experts",
            backend=backend,
        )
    out = values if code == "i" else array("i", values)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes(), shape
