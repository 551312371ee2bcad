"""Images through a rollout: placeholders expanded to the model's count, spans recorded, requests carrying images.

The reference is Hugging Face's own processor (``Qwen2_5_VLProcessor`` over the tiny image processor and the
Qwen3.5 template, :mod:`tito_testing.vision`): the ids tito sends equal its full render, and each span's grid is
its ``image_grid_thw``. No torch: the Pillow image processor and the offline Qwen3 tokenizer only.
"""

from __future__ import annotations

import asyncio
import io

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("PIL")
from PIL import Image as PILImage

from tito_core.backend import GenerateResult
from tito_core.conversation import Conversation
from tito_core.errors import BackendResponseError, ContextWindowFullError
from tito_core.media import Image, ImageError, image_part
from tito_core.model_setup import vision_processor
from tito_core.plugins import get_tool_parser
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.trajectory import Trajectory
from tito_testing.scripted import ScriptedBackend
from tito_testing.tokenizers import load_qwen_tokenizer
from tito_testing.vision import hf_processor, tiny_image_processor, vl_chat_template

PAD, VSTART, VEND, VIDEO = 151655, 151652, 151653, 151656
CALL = "<tool_call>\n<function=shot>\n</function>\n</tool_call>"
NO_THINK = {"enable_thinking": False}


def png(width: int, height: int, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (width, height), ((seed * 37) % 256, (seed * 91) % 256, 128)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vl():
    tok = load_qwen_tokenizer("qwen3")
    template = vl_chat_template()
    renderer = ChatRenderer(tok, chat_template=template, template_kwargs=NO_THINK)
    vision = vision_processor(tiny_image_processor(), tok)
    return tok, renderer, vision, hf_processor(tok, template)


def rollout(vl, replies, *, backend=None, render_mode="auto", vision=True, **kw) -> tuple[Rollout, ScriptedBackend]:
    tok, renderer, processor, _ = vl
    backend = backend or ScriptedBackend(tok, replies, **kw)
    return (
        Rollout(
            backend,
            renderer,
            get_tool_parser("qwen_xml"),
            render_mode=render_mode,
            vision=processor if vision else None,
        ),
        backend,
    )


def parts(text: str, images: list[Image]) -> list[dict]:
    return [*(image_part(i) for i in images), {"type": "text", "text": text}]


def to_pil(messages: list[dict]) -> list[dict]:
    """The conversation with PIL images, as the HF processor takes it."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "image", "image": p["image"].to_pil()} if p["type"] == "image" else p for p in content]
        out.append({**m, "content": content})
    return out


TOOLS = [{"name": "shot", "description": "take a screenshot", "inputSchema": {"json": {"type": "object"}}}]
sizes = st.tuples(st.integers(8, 520), st.integers(8, 520))
image_lists = st.lists(sizes, min_size=0, max_size=2)


@settings(max_examples=12)
@given(
    first=st.lists(sizes, min_size=1, max_size=2),
    tool_results=st.lists(image_lists, min_size=1, max_size=3),
    render_mode=st.sampled_from(["auto", "full"]),
)
def test_ids_equal_the_hf_processors_full_render(vl, first, tool_results, render_mode):
    tok, _, _, hf = vl
    seed = iter(range(1000))
    calls = len(tool_results) + 1
    run, backend = rollout(vl, [CALL] * calls, render_mode=render_mode)
    pictures = [Image(png(w, h, next(seed))) for w, h in first]
    messages: list[dict] = [{"role": "user", "content": parts("look", pictures)}]

    async def go() -> None:
        for i in range(calls):
            result = await run.call(Conversation(messages=list(messages), tool_specs=TOOLS), CallOptions())
            if i == calls - 1:
                break
            reply = result.reply()
            messages.append(reply)
            shots = [Image(png(w, h, next(seed))) for w, h in tool_results[i]]
            content = parts(f"result {i}", shots) if shots else f"result {i}"
            messages.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": content})

    asyncio.run(go())
    last = backend.requests[-1]
    tools = [{"type": "function", "function": {"name": "shot", "description": "take a screenshot",
                                               "parameters": {"type": "object"}}}]  # fmt: skip
    ref = hf.apply_chat_template(
        to_pil(messages), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True, **NO_THINK
    )
    assert list(last.input_ids) == list(ref["input_ids"][0])
    grids = [tuple(int(x) for x in row) for row in ref.get("image_grid_thw", [])]
    assert [p.span.grid_thw for p in last.media] == grids
    traj = run.trajectory
    # the trajectory (whose last output the reference render does not hold) has every image of the prompt
    assert traj.media == tuple(p.span for p in last.media)
    ids = traj.token_ids
    for span in traj.media:
        assert ids[span.start - 1] == VSTART and ids[span.end] == VEND
        assert set(ids[span.start : span.end]) == {PAD}
        assert span.length == span.grid_thw[1] * span.grid_thw[2] // 4
        assert traj.image(span.sha256).sha256 == span.sha256
    assert last.never_sample == (VSTART, VEND, PAD, VIDEO)


def test_text_only_requests_carry_no_images_but_never_sample(vl):
    run, backend = rollout(vl, ["hi"])
    asyncio.run(run.call(Conversation(messages=[{"role": "user", "content": "hello"}]), CallOptions()))
    request = backend.requests[0]
    assert request.media == () and request.never_sample == (VSTART, VEND, PAD, VIDEO)
    assert run.trajectory.media == ()


def test_a_changed_image_forks_and_the_branch_keeps_the_spans_before(vl):
    run, backend = rollout(vl, [CALL, "done", "again"])
    a, b, c = Image(png(60, 60, 1)), Image(png(60, 60, 2)), Image(png(60, 60, 3))
    messages: list[dict] = [{"role": "user", "content": parts("look", [a])}]

    async def go() -> None:
        reply = (await run.call(Conversation(messages=messages, tool_specs=TOOLS), CallOptions())).reply()
        tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": parts("shot", [b])}
        messages.extend([reply, tool])
        await run.call(Conversation(messages=messages, tool_specs=TOOLS), CallOptions())
        assert [s.sha256 for s in run.trajectory.media] == [a.sha256, b.sha256]
        # the same size, another picture: the same ids, but a rewritten history
        messages[-1] = {**tool, "content": parts("shot", [c])}
        await run.call(Conversation(messages=messages, tool_specs=TOOLS), CallOptions())

    asyncio.run(go())
    traj = run.trajectory
    assert traj.branch == 1 and [s.sha256 for s in traj.media] == [a.sha256, c.sha256]
    old = traj.branches[0]
    assert [s.sha256 for s in old.media] == [a.sha256, b.sha256]
    assert [p.span.sha256 for p in backend.requests[-1].media] == [a.sha256, c.sha256]
    with pytest.raises(Exception, match="no image"):
        traj.image(b.sha256)


def test_json_round_trip_keeps_spans_and_bytes(vl):
    run, _ = rollout(vl, ["ok"])
    image = Image(png(100, 70, 5))
    conv = Conversation(messages=[{"role": "user", "content": parts("look", [image, image])}])
    asyncio.run(run.call(conv, CallOptions()))
    traj = run.trajectory.close()
    assert len(traj.media) == 2 and len(traj.image_bytes()) == 1
    back = Trajectory.from_json(traj.to_json())
    assert back == traj and back.media == traj.media
    assert back.image(image.sha256).data == image.data
    assert [p.span for p in back.prompt_media()] == list(traj.media)
    assert Trajectory.from_msgpack(traj.to_msgpack()).media == traj.media


# ------------------------------------------------------------------------------------------------ bad input
def one_image_call(vl, size=(80, 80), **kw):
    run, backend = rollout(vl, ["ok"], **kw)
    conv = Conversation(messages=[{"role": "user", "content": parts("look", [Image(png(*size))])}])
    return run, backend, conv


def test_no_vision_processor_is_an_image_error_before_any_request(vl):
    run, backend, conv = one_image_call(vl, vision=False)
    with pytest.raises(ImageError, match="no vision processor"):
        asyncio.run(run.call(conv, CallOptions()))
    assert backend.requests == [] and len(run.trajectory) == 0 and run.trajectory.status == "failed"


def test_a_backend_without_images_is_an_image_error(vl):
    tok = vl[0]

    class TextOnly(ScriptedBackend):
        input_kinds = frozenset()

    run, backend, conv = one_image_call(vl, backend=TextOnly(tok, ["ok"]))
    with pytest.raises(ImageError, match="takes no images"):
        asyncio.run(run.call(conv, CallOptions()))
    assert backend.requests == [] and len(run.trajectory) == 0


def test_a_text_only_template_is_an_image_error(vl):
    tok, _, vision, _ = vl
    backend = ScriptedBackend(tok, ["ok"])
    run = Rollout(backend, ChatRenderer(tok), get_tool_parser("hermes"), vision=vision)  # qwen3's own template
    conv = Conversation(messages=[{"role": "user", "content": parts("look", [Image(png(80, 80))])}])
    with pytest.raises(ImageError, match="placeholder"):
        asyncio.run(run.call(conv, CallOptions()))
    assert backend.requests == [] and len(run.trajectory) == 0


def test_more_images_than_max_images(vl):
    tok, renderer, _, _ = vl
    backend = ScriptedBackend(tok, ["ok"])
    vision = vision_processor(tiny_image_processor(), tok, max_images=2)
    run = Rollout(backend, renderer, get_tool_parser("qwen_xml"), vision=vision)
    images = [Image(png(40, 40, i)) for i in range(3)]
    with pytest.raises(ImageError, match="max_images=2"):
        asyncio.run(run.call(Conversation(messages=[{"role": "user", "content": parts("x", images)}]), CallOptions()))
    assert backend.requests == []


def test_an_image_too_large_for_the_context_window(vl):
    # 448x448: a 32x32 grid, 256 pads; the unexpanded prompt (~15 tokens) fits, the expanded one does not
    run, backend, conv = one_image_call(vl, size=(448, 448), context_length=200)
    with pytest.raises(ContextWindowFullError):
        asyncio.run(run.call(conv, CallOptions()))
    assert backend.requests == [] and len(run.trajectory) == 0


def test_text_spelling_the_placeholder_is_an_image_error(vl):
    run, backend = rollout(vl, ["ok"])
    conv = Conversation(messages=[{"role": "user", "content": "see <|image_pad|>"}])
    with pytest.raises(ImageError, match="placeholder"):
        asyncio.run(run.call(conv, CallOptions()))
    assert backend.requests == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda r: msgspec.structs.replace(r, output_ids=[PAD, *r.output_ids[1:]]), "output_ids"),
        (lambda r: msgspec.structs.replace(r, prompt_tokens=(r.prompt_tokens or 0) - 8), "prompt_tokens"),
    ],
)
def test_answers_that_sample_a_placeholder_or_expand_differently_are_rejected(vl, change, field):
    tok = vl[0]

    class Wrong(ScriptedBackend):
        async def generate(self, request):
            result: GenerateResult = await super().generate(request)
            return change(result)

    run, _, conv = one_image_call(vl, backend=Wrong(tok, ["ok there"]))
    with pytest.raises(BackendResponseError) as info:
        asyncio.run(run.call(conv, CallOptions()))
    assert info.value.field == field and len(run.trajectory) == 0


# ---------------------------------------------------------------------------------------------- configuration
def test_a_tokenizer_directory_with_a_preprocessor_config_gives_the_model_vision(vl, tmp_path):
    from tito_core.config import TitoConfig
    from tito_core.media.processor import load_image_processor
    from tito_core.strands_front.model import TitoModel

    tok = vl[0]
    tok.save_pretrained(tmp_path)
    tiny_image_processor().save_pretrained(tmp_path)
    assert load_image_processor(tmp_path) is load_image_processor(str(tmp_path))  # loaded once per path
    model = TitoModel(ScriptedBackend(tok, ["ok"]), str(tmp_path), tool_parser="qwen_xml")
    vision = model._rollout.prompts.vision
    assert vision is not None and vision.placeholder_ids["image"] == PAD and vision.family.merge_size == 2
    assert TitoModel(ScriptedBackend(tok), str(tmp_path), processor=False)._rollout.prompts.vision is None
    assert TitoModel(ScriptedBackend(tok), tok)._rollout.prompts.vision is None  # no directory with a processor
    config = TitoConfig(backend="scripted", tokenizer=str(tmp_path), processor=str(tmp_path), max_images=3)
    assert config.processor == str(tmp_path) and config.max_images == 3
    assert vision_processor(str(tmp_path), tok, max_images=3).max_images == 3


def test_a_processor_of_another_family_is_a_named_error_not_a_guess(vl):
    from tito_core.errors import ConfigError
    from tito_core.media.families import QwenVLFamily
    from tito_core.model_setup import family_of

    tok = vl[0]

    class SiglipImageProcessor:  # another family's processor that happens to have a `merge_size`
        merge_size = 2
        patch_size = 14

    with pytest.raises(ConfigError, match="does not know the image placeholders of SiglipImageProcessor"):
        family_of(SiglipImageProcessor(), tok)
    assert isinstance(family_of(tiny_image_processor(), tok), QwenVLFamily)  # Qwen2VLImageProcessorPil
