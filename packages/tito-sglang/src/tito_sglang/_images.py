"""The image part of an SGLang ``/generate`` request: one unexpanded placeholder per image plus ``image_data``.

A trajectory holds every image's placeholder EXPANDED (the ids the model's forward pass consumes). SGLang 0.5.23
takes a pre-tokenized prompt with ONE placeholder per image and the images themselves (``image_data``); with
``SGLANG_MM_AVOID_RETOKENIZE`` (on by default) its processor keeps every other id as sent and expands the
placeholder of image *i* into the count its own image processor gives that image
(``BaseMultimodalProcessor._expand_input_ids``). So tito collapses each :class:`~tito_core.media.MediaSpan` to
its first token and sends the bytes as a ``data:`` URL; the engine's ``prompt_tokens`` (the expanded length)
must then equal ``len(input_ids)``, which :func:`tito_sglang._wire.decode_generate` checks for every answer.
In a session only the new ids go, with the images among them: SGLang keeps the parent request's images and
shifts the new ones' offsets (checked on the real server: the same output logprobs as a stateless call).

Sending the expanded ids instead would make SGLang see more placeholders than images: it falls back to
decoding the ids and re-tokenizing the text (drift), or expands them again (strands-sglang's issue #31).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from tito_core.backend import GenerateRequest
from tito_core.errors import BackendError, BackendRequestError
from tito_core.media import ImageError, PromptMedia

__all__ = ["NEVER_SAMPLE_BIAS", "collapse_placeholders", "image_data", "logit_bias", "placeholder_refusal"]

NEVER_SAMPLE_BIAS: Final = -1.0e9
"""The logit bias of a token that must never be sampled (JSON has no ``-inf``; this is as good after softmax)."""


def collapse_placeholders(
    input_ids: Sequence[int], images: Sequence[PromptMedia], start: int = 0
) -> tuple[list[int], list[PromptMedia]]:
    """``input_ids[start:]`` with each image's span of placeholder ids replaced by one placeholder, and its images.

    ``start`` is where the ids sent begin (in a session: the tokens the engine holds already); the images before
    it are the engine's already and are not sent again.

    Raises:
        ImageError: a span is out of range, overlaps the previous one or ``start``, holds another id than its
            placeholder, or a placeholder id of the request also stands outside every span sent (SGLang would
            then count more placeholders than images and re-tokenize the prompt).
    """
    ids = input_ids[start:]
    ids = ids if isinstance(ids, list) else list(ids)
    sent = [image for image in images if image.span.end > start]
    out: list[int] = []
    cursor = 0
    for image in sent:
        span = image.span
        first, end = span.start - start, span.end - start
        if span.length < 1 or first < cursor or end > len(ids):
            raise ImageError(
                f"sglang: an image spans [{span.start}, {span.end}) of a {len(input_ids)}-token prompt, after "
                f"position {cursor + start}: the spans must be in token order, inside the prompt, non-empty and "
                f"not across the {start} tokens the engine holds"
            )
        if ids[first:end].count(span.placeholder_id) != span.length:
            raise ImageError(
                f"sglang: the image span [{span.start}, {span.end}) is not all placeholder id {span.placeholder_id}"
            )
        out.extend(ids[cursor:first])
        out.append(span.placeholder_id)
        cursor = end
    out.extend(ids[cursor:])
    placeholders = {image.span.placeholder_id for image in images}
    stray = sum(out.count(p) for p in placeholders) - len(sent)
    if stray:
        raise ImageError(
            f"sglang: the prompt holds {stray} image placeholder id(s) outside its {len(sent)} image span(s); "
            "SGLang would count them as images"
        )
    return out, sent


def image_data(images: Sequence[PromptMedia]) -> list[str]:
    """The request's images as ``data:`` URLs, in token order (SGLang decodes them with its own image loader)."""
    return [image.image.data_url for image in images]


def logit_bias(request: GenerateRequest, user_bias: Any) -> dict[str, float]:
    """SGLang's ``logit_bias`` (token id as a string -> additive bias): ``never_sample`` ids banned.

    A bias the caller put in ``sampling.extra`` is kept for every other id; a never-sample id stays banned.
    """
    bias: dict[str, float] = dict(user_bias) if isinstance(user_bias, dict) else {}
    for token in request.never_sample:
        bias[str(int(token))] = NEVER_SAMPLE_BIAS
    return bias


_PLACEHOLDER_MISMATCH: Final = re.compile(r"Prompt has (\d+) image placeholders but (\d+) image inputs were provided")
"""SGLang 0.5.23's 400 when the decoded prompt matches its image pattern more often than there are images."""


def placeholder_refusal(exc: BackendError, images: int) -> BackendRequestError | None:
    """A :class:`BackendRequestError` naming the cause when ``exc`` is SGLang refusing the prompt's image count.

    SGLang's Qwen-VL processor counts images in the *decoded* prompt by a pattern that also matches its legacy
    sentinel ``<image>``: a conversation whose text holds that string cannot be sent with images (HTTP 400
    before anything is generated; nothing is recorded). None for any other error.
    """
    match = _PLACEHOLDER_MISMATCH.search(exc.body or "") if exc.status == 400 else None
    if match is None:
        return None
    return BackendRequestError(
        f"sglang refused a prompt with {images} image(s): it counted {match.group(1)} image placeholders in the "
        "decoded text. SGLang also reads the literal text '<image>' as an image placeholder; a conversation whose "
        "text holds it cannot carry images on SGLang",
        field="input_ids",
        value=match.group(0),
        status=exc.status,
        body=exc.body,
        backend="sglang",
    )
