"""SGLang's native ``/generate`` wire format: request building and response decoding.

Only the fields tito reads are declared; every struct ignores unknown fields, so newer servers that add
fields keep working. Shapes were checked against responses recorded from a real SGLang 0.5.23 server.
"""

from __future__ import annotations

import array
import base64
import binascii
import sys
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Final

import msgspec

from tito_core.backend import FinishReason, GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import BackendResponseError
from tito_core.http.ids_json import IdsJson
from tito_core.media import PromptMedia
from tito_core.sampling_mask import SamplingMask
from tito_core.versions import VersionSpan, clip_spans, decode_spans
from tito_sglang import _images
from tito_sglang._sessions import Session

BACKEND_NAME: Final = "sglang"

_encoder = msgspec.json.Encoder()
_LOGPROB, _ID = attrgetter("logprob"), attrgetter("id")

# -- request ---------------------------------------------------------------------------------------


def sampling_params(params: SamplingParams, grammar: str | None = None) -> dict[str, Any]:
    """Map engine-neutral sampling parameters onto SGLang's ``sampling_params`` object.

    Stop tokens are never trimmed (``no_stop_trim``) and special tokens are never skipped, so the output
    ids are exactly the generated ids. A ``grammar`` goes to ``ebnf`` (SGLang's grammar backend, xgrammar
    by default). ``extra`` is merged last and may override anything (e.g. ``regex``, ``json_schema``,
    ``ebnf``, ``min_p``, penalties).
    """
    out: dict[str, Any] = {"no_stop_trim": True, "skip_special_tokens": False}
    out.update(params.engine_fields(seed="sampling_seed"))
    if grammar is not None:
        out["ebnf"] = grammar
    out.update(params.extra)
    return out


def _as_list(ids: Sequence[int]) -> list[int]:
    if isinstance(ids, list):
        return ids
    if isinstance(ids, array.array):
        return ids.tolist()
    return list(ids)


def prompt_logprob_start(request: GenerateRequest) -> int:
    """Where SGLang should start computing input logprobs.

    One token before the new prompt: the position ``prefix_len - 1`` is still in the radix cache from the
    previous turn, and the logprob of ``input_ids[prefix_len]`` needs its hidden state, so SGLang can
    reuse the cached prefix and recompute only the tail.
    """
    return max(0, request.prefix_len - 1)


def routed_experts_start(request: GenerateRequest) -> int:
    """First routed-experts row wanted: rows before it were returned by the previous turn.

    A sequence of N tokens has N - 1 routing rows (the last token is never fed to the model). After a turn
    of N1 tokens the rows 0..N1-2 are known, so the next turn (``prefix_len == N1``) starts at N1 - 1.
    """
    return max(0, request.prefix_len - 1)


def encode_generate(request: GenerateRequest, session: Session | None = None, ids_json: IdsJson | None = None) -> bytes:
    """Encode ``request`` as the JSON body of ``POST /generate``.

    In a ``session`` only the ids it does not hold yet are sent (``input_ids[session.length:]``), with
    ``session_params`` naming the session and the request to continue from. Without one, the whole prompt:
    from ``ids_json``'s per-sequence text when given (O(new ids) per call).

    A prompt with images is sent with one placeholder per image and the images as ``image_data``
    (:mod:`tito_sglang._images`); in a session, only the images among the ids sent. ``never_sample`` ids get a
    ``logit_bias`` that bans them.
    """
    ids: Any
    images: list[PromptMedia] = []
    if request.media:
        ids, images = _images.collapse_placeholders(
            request.input_ids, request.media, session.length if session is not None else 0
        )
    elif session is not None:
        ids = _as_list(request.input_ids[session.length :])
    elif ids_json is not None:
        ids = msgspec.Raw(ids_json.encode(request))
    else:
        ids = _as_list(request.input_ids)
    sampling = sampling_params(request.sampling, request.grammar)
    if request.never_sample:
        sampling["logit_bias"] = _images.logit_bias(request, sampling.get("logit_bias"))
    body: dict[str, Any] = {
        "rid": request.rid,
        "input_ids": ids,
        "sampling_params": sampling,
        "return_logprob": request.return_logprobs or request.return_prompt_logprobs,
        "stream": False,
    }
    if images:
        body["image_data"] = _images.image_data(images)
    if request.return_prompt_logprobs:
        body["logprob_start_len"] = prompt_logprob_start(request)
    elif body["return_logprob"]:
        body["logprob_start_len"] = -1  # output logprobs only: no prompt recomputation, full cache reuse
    if request.return_routed_experts:
        body["return_routed_experts"] = True
        body["routed_experts_start_len"] = routed_experts_start(request)
    if request.return_sampling_mask:  # each token's kept set and its logprob over it ("selected" mode)
        body["return_sampling_mask"] = True
    if session is not None:
        params: dict[str, str] = {"id": session.id}
        if session.parent is not None:
            params["rid"] = session.parent
        body["session_params"] = params
    return _encoder.encode(body)


def encode_abort(rid: str) -> bytes:
    """Encode the JSON body of ``POST /abort_request`` for one request id."""
    return _encoder.encode({"rid": rid})


_PAUSE_MODES: Final = {
    "keep": b'{"mode":"in_place"}',
    "recompute": b'{"mode":"retract"}',
    "abort": b'{"mode":"abort"}',
}


def encode_pause(mode: str) -> bytes:
    """``POST /pause_generation``: ``in_place`` keeps the running requests' KV cache, ``retract`` requeues them.

    ``abort`` ends them with the tokens generated so far.
    """
    try:
        return _PAUSE_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown pause mode {mode!r}; expected 'keep', 'recompute' or 'abort'") from None


def encode_weight_version(version: str) -> bytes:
    """``POST /update_weight_version``: relabel the weights without aborting anything (SGLang's default aborts)."""
    return _encoder.encode({"new_version": version, "abort_all_requests": False})


# -- response --------------------------------------------------------------------------------------


class LogprobEntry(msgspec.Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    """One ``[logprob, id, text]`` triple of ``meta_info.*_token_logprobs``.

    A struct outside the garbage collector: a long output has one triple per token, and as tuples they made the
    collector sweep the whole process every few thousand tokens.
    """

    logprob: float | None
    id: int
    text: str | None


class FinishReasonView(msgspec.Struct):
    """``meta_info.finish_reason``: ``{"type": "stop", "matched": 151645}``, ``{"type": "length", ...}``."""

    type: str
    matched: int | str | None = None
    message: str | None = None


class WeightVersionView(msgspec.Struct):
    """One entry of ``meta_info.weight_versions``: output tokens ``[start, end)`` came from weights ``version``."""

    version: str | int
    start: int
    end: int


class MetaInfoView(msgspec.Struct):
    """The part of ``meta_info`` tito reads."""

    id: str | None = None
    finish_reason: FinishReasonView | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_token_logprobs: list[LogprobEntry] | None = None
    input_token_logprobs: list[LogprobEntry] | None = None
    routed_experts: str | None = None
    weight_versions: list[WeightVersionView] | None = None
    output_token_sampling_mask: list[list[int]] | None = None
    output_token_sampling_logprobs: list[float] | None = None


class GenerateResponseView(msgspec.Struct):
    """A non-streaming ``/generate`` answer for one prompt."""

    output_ids: list[int]
    meta_info: MetaInfoView


_decoder = msgspec.json.Decoder(GenerateResponseView)


class ServerInfoView(msgspec.Struct):
    """``GET /server_info`` (fields tito reads)."""

    context_length: int | None = None
    model_path: str | None = None


def _response_error(message: str, field: str, value: object = None) -> BackendResponseError:
    return BackendResponseError(f"{BACKEND_NAME}: {message}", field=field, value=value, backend=BACKEND_NAME)


_FINISH_REASONS: Final[dict[str, FinishReason]] = {"stop": "stop", "length": "length", "abort": "abort"}


def decode_generate(
    body: bytes, request: GenerateRequest, *, routed_experts_shape: tuple[int, int] | None = None
) -> GenerateResult:
    """Turn a ``/generate`` answer into a :class:`GenerateResult`, checking it is self-consistent."""
    try:
        view = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        # UnicodeDecodeError: invalid UTF-8 inside a JSON string (msgspec raises it, not a DecodeError)
        snippet = body[:300].decode("utf-8", errors="replace")
        raise _response_error(f"malformed /generate response ({exc}): {snippet}", "body", snippet) from exc
    meta = view.meta_info
    if meta.id is not None and meta.id != request.rid:
        # SGLang answers with the rid it was given; another id means this answer belongs to another request
        # (a connection or proxy mixing answers up): nothing of it may be recorded.
        raise BackendResponseError(
            f"{BACKEND_NAME}: the answer is for request {meta.id!r}, not {request.rid!r}",
            field="meta_info.id",
            value=meta.id,
            backend=BACKEND_NAME,
        )
    if meta.prompt_tokens is not None and meta.prompt_tokens != len(request.input_ids):
        # The engine ran on another prompt than the trajectory + new ids (in a session: it holds other tokens).
        raise BackendResponseError(
            f"{BACKEND_NAME}: the engine counted {meta.prompt_tokens} prompt tokens, tito expected "
            f"{len(request.input_ids)} (the trajectory so far and the new prompt)",
            field="meta_info.prompt_tokens",
            value=meta.prompt_tokens,
            backend=BACKEND_NAME,
        )
    output_ids = view.output_ids

    output_logprobs: list[float] | None = None
    if request.return_logprobs:
        entries = meta.output_token_logprobs
        if entries is None:
            raise _response_error(
                "logprobs were requested but meta_info.output_token_logprobs is missing",
                "meta_info.output_token_logprobs",
            )
        logprobs, entry_ids = _split_entries(entries)
        if entry_ids != output_ids:
            raise _response_error(
                f"output_token_logprobs ids {entry_ids[:8]}... do not match output_ids "
                f"{output_ids[:8]}... ({len(entries)} vs {len(output_ids)} tokens)",
                "meta_info.output_token_logprobs",
                entry_ids[:8],
            )
        if None in logprobs:
            raise _response_error("output_token_logprobs holds a null logprob", "meta_info.output_token_logprobs")
        output_logprobs = logprobs  # type: ignore[assignment]
    mask_rows: list[list[int]] | None = None
    if request.return_sampling_mask:
        mask_rows, sampled = _sampling_mask(meta, len(output_ids))
        if output_logprobs is not None:
            output_logprobs = sampled  # the distribution each token was sampled from: renormalised over its kept set

    prompt_logprobs = _prompt_logprobs(meta, request) if request.return_prompt_logprobs else None

    reason = meta.finish_reason
    if reason is None:
        raise _response_error(
            "meta_info.finish_reason is missing (is the request still running?)", "meta_info.finish_reason"
        )
    finish = _FINISH_REASONS.get(reason.type)
    if finish is None:
        raise _response_error(f"unknown finish_reason type {reason.type!r}", "meta_info.finish_reason", reason.type)

    matched: int | str | None = reason.matched
    returned_len = len(output_ids)
    cut = _stop_token_cut(request, output_ids) if finish != "abort" else None
    if cut is not None:
        output_ids = output_ids[:cut]
        if output_logprobs is not None:
            output_logprobs = output_logprobs[:cut]
        if mask_rows is not None:
            mask_rows = mask_rows[:cut]
        finish, matched = "stop", output_ids[-1]

    routed: bytes | None = None
    routed_start = 0
    shape: tuple[int, int] | None = None
    if request.return_routed_experts:
        if meta.routed_experts is None:
            raise _response_error(
                "routed experts were requested but meta_info.routed_experts is missing", "meta_info.routed_experts"
            )
        routed, routed_start, shape = decode_routed_experts(
            meta.routed_experts,
            start=routed_experts_start(request),
            total_tokens=len(request.input_ids) + returned_len,
            shape=routed_experts_shape,
        )
        if cut is not None and routed:
            rows = len(request.input_ids) + returned_len - 1 - routed_start
            keep = len(request.input_ids) + cut - 1 - routed_start
            if rows > 0:
                routed = routed[: len(routed) // rows * keep]

    versions: tuple[VersionSpan, ...] | None = None
    if meta.weight_versions is not None:
        # SGLang >= 0.5.x: spans over the answer's output tokens (``weight_version`` alone, as older servers send,
        # is the version when the answer was built, not necessarily the one of every token: not recorded).
        versions = decode_spans(
            meta.weight_versions, returned_len, backend=BACKEND_NAME, field="meta_info.weight_versions"
        )
        if cut is not None:
            versions = clip_spans(versions, cut)

    return GenerateResult(
        output_ids=output_ids,
        output_logprobs=output_logprobs,
        finish_reason=finish,
        matched_stop=matched,
        prompt_logprobs=prompt_logprobs,
        prompt_tokens=meta.prompt_tokens,
        cached_tokens=meta.cached_tokens,
        routed_experts=routed,
        routed_experts_start=routed_start,
        routed_experts_shape=shape,
        weight_versions=versions,
        sampling_mask=SamplingMask.from_rows(mask_rows) if mask_rows is not None else None,
    )


def _sampling_mask(meta: MetaInfoView, n: int) -> tuple[list[list[int]], list[float]]:
    """The kept set of each of ``n`` output tokens and its logprob over it (``return_sampling_mask``)."""
    rows, logprobs = meta.output_token_sampling_mask, meta.output_token_sampling_logprobs
    field = "meta_info.output_token_sampling_mask"
    if rows is None or logprobs is None:
        raise _response_error(
            "sampling masks were requested but meta_info.output_token_sampling_mask / _logprobs is missing "
            "(an SGLang older than 0.5.23, or a proxy that dropped it)",
            field,
        )
    if len(rows) != n or len(logprobs) != n:
        raise _response_error(f"{len(rows)} kept sets and {len(logprobs)} sampling logprobs for {n} tokens", field, n)
    return rows, logprobs


def _split_entries(entries: list[LogprobEntry]) -> tuple[list[float | None], list[int]]:
    """The logprobs and the ids of ``[logprob, id, text]`` triples (picked in C, not per entry in Python)."""
    return list(map(_LOGPROB, entries)), list(map(_ID, entries))


def _stop_token_cut(request: GenerateRequest, output_ids: list[int]) -> int | None:
    """Output length up to the first stop token id, when SGLang could not stop there itself.

    SGLang's ``ignore_eos`` also disables ``stop_token_ids`` (it skips every token-based stop), while
    tito's :class:`SamplingParams` means "do not stop at EOS" only. With both set, the server generates
    past the stop token; the ids up to and including it are exactly what the engine generated, so the
    answer is cut there and reported as a stop on that token.
    """
    sampling = request.sampling
    if not (sampling.ignore_eos and sampling.stop_token_ids):
        return None
    stops = set(sampling.stop_token_ids)
    for index, token in enumerate(output_ids):
        if token in stops:
            return index + 1
    return None


def _prompt_logprobs(meta: MetaInfoView, request: GenerateRequest) -> list[float | None]:
    """Logprobs of ``input_ids[prefix_len:]`` out of ``input_token_logprobs`` (which starts earlier)."""
    entries = meta.input_token_logprobs
    if entries is None:
        raise _response_error(
            "prompt logprobs were requested but meta_info.input_token_logprobs is missing",
            "meta_info.input_token_logprobs",
        )
    input_ids = request.input_ids
    start = prompt_logprob_start(request)
    if len(entries) != len(input_ids) - start:
        raise _response_error(
            f"input_token_logprobs has {len(entries)} entries for {len(input_ids) - start} prompt tokens "
            f"from position {start}",
            "meta_info.input_token_logprobs",
            len(entries),
        )
    in_image = _image_positions(request, start)
    for offset, entry in enumerate(entries):
        # SGLang 0.5 reports the ids from vocab_size - 1 up as 0 (it clips image hashes with `x < vocab_size - 1`):
        # the model's last id, a real token when the vocabulary is not padded (the tiny Qwen3's </think>)
        clipped = entry.id == 0
        if entry.id != input_ids[start + offset] and offset not in in_image and not clipped:
            raise _response_error(
                f"input_token_logprobs id {entry.id} at position {start + offset} does not match the "
                f"prompt id {input_ids[start + offset]}",
                "meta_info.input_token_logprobs",
                entry.id,
            )
    skip = request.prefix_len - start
    return [entry.logprob for entry in entries[skip:]]


def _image_positions(request: GenerateRequest, start: int) -> frozenset[int]:
    """Offsets from ``start`` of the image placeholders (SGLang reports its own pad ids there, not the prompt's)."""
    return frozenset(
        position - start for image in request.media for position in range(max(start, image.span.start), image.span.end)
    )


def decode_routed_experts(
    encoded: str, *, start: int, total_tokens: int, shape: tuple[int, int] | None
) -> tuple[bytes, int, tuple[int, int] | None]:
    """Decode SGLang's base64 routed-experts blob into little-endian int32 rows.

    Servers differ: some honour ``routed_experts_start_len`` and return rows ``start..total_tokens-2``,
    others return every row of the request (``0..total_tokens-2``). The row count tells which; the
    returned start says where the first row belongs. Element width (int32, or int8 on some builds) is
    inferred from the byte count when ``shape`` is known.

    Returns:
        ``(int32 little-endian bytes, first row position, (layers, top_k) or None when unknown)``.

    """
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        message = f"meta_info.routed_experts is not valid base64: {exc}"
        raise _response_error(message, "meta_info.routed_experts") from exc
    cropped_rows = max(0, total_tokens - 1 - start)
    full_rows = max(0, total_tokens - 1)
    if shape is not None:
        per_row = shape[0] * shape[1]
        for width in (4, 1, 2):
            for rows, first in ((cropped_rows, start), (full_rows, 0)):
                if len(raw) == rows * per_row * width:
                    return _to_int32(raw, width), first, shape
        raise _response_error(
            f"routed experts blob of {len(raw)} bytes fits neither {cropped_rows} rows from {start} nor "
            f"{full_rows} rows of shape {shape}",
            "meta_info.routed_experts",
        )
    # Unknown shape: assume int32 and infer the row layout from the row count.
    if len(raw) % 4:
        raise _response_error(f"routed experts blob of {len(raw)} bytes is not int32 data", "meta_info.routed_experts")
    count = len(raw) // 4
    for rows, first in ((cropped_rows, start), (full_rows, 0)):
        if rows and count % rows == 0:
            return raw, first, None
    if count == 0:
        return raw, start, None
    raise _response_error(
        f"routed experts blob of {count} values fits neither {cropped_rows} nor {full_rows} rows",
        "meta_info.routed_experts",
    )


def _to_int32(raw: bytes, width: int) -> bytes:
    """Little-endian ints of ``width`` bytes (as the server wrote them) to little-endian int32."""
    if width == 4:
        return raw
    values = array.array("b" if width == 1 else "h", raw)
    if width > 1 and sys.byteorder != "little":
        values.byteswap()
    out = array.array("i", values)
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()
