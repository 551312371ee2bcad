"""Images through verl's agent loop: ``TitoAgentLoop`` on verl's processor, ``VerlServerBackend`` sending
``image_data``, checked by a stand-in server manager that does what verl's vLLM server does with the ids
(its own ``qwen2_5_vl_dedup_image_tokens``, then one expansion per image by the processor's grid)."""

from __future__ import annotations

import asyncio
import io

import pytest

pytest.importorskip("PIL")
np = pytest.importorskip("numpy")
from PIL import Image as PILImage  # noqa: E402

from tito_core.errors import UnsupportedContentError  # noqa: E402
from tito_core.media import Image, ImageError  # noqa: E402
from tito_core.trainers.verl_images import chat_messages, strands_content, verl_image  # noqa: E402

PAD = 151655
IM_END = 151645
CALL = "<tool_call>\n<function=shot>\n</function>\n</tool_call>"


def pil(width: int, height: int, seed: int) -> PILImage.Image:
    rng = np.random.default_rng(seed)
    return PILImage.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def png(picture: PILImage.Image) -> bytes:
    buf = io.BytesIO()
    picture.save(buf, format="PNG")
    return buf.getvalue()


def same_pixels(a: PILImage.Image, b: PILImage.Image) -> bool:
    return np.array_equal(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB")))


# ------------------------------------------------------------------------------------------------ verl rows
def test_verl_images_in_every_form_a_verl_row_holds(tmp_path):
    picture = pil(30, 20, 0)
    data = png(picture)
    path = tmp_path / "a.png"
    path.write_bytes(data)
    import base64

    url = "data:image/png;base64," + base64.b64encode(data).decode()
    for value in (picture, data, {"bytes": data}, {"image": picture}, str(path), f"file://{path}", path, url):
        assert same_pixels(verl_image(value).to_pil(), picture), type(value)
    with pytest.raises(ImageError, match="does not fetch"):
        verl_image("https://example.com/a.png")
    with pytest.raises(ImageError, match="cannot read"):
        verl_image(str(tmp_path / "missing.png"))
    with pytest.raises(ImageError, match="not int"):
        verl_image(3)


def test_raw_prompt_messages_as_strands_content_and_chat_messages():
    picture = pil(30, 20, 1)
    raw = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": "What is it?"}]},
    ]
    blocks = strands_content(raw[-1])
    assert list(blocks[0]) == ["image"] and blocks[1] == {"text": "What is it?"}
    assert blocks[0]["image"]["format"] == "png"
    assert same_pixels(Image(blocks[0]["image"]["source"]["bytes"]).to_pil(), picture)
    assert strands_content("hi") == [{"text": "hi"}]
    chat = chat_messages(raw)
    assert chat[0] == raw[0]  # text-only messages keep their string content
    assert [p["type"] for p in chat[1]["content"]] == ["image", "text"]
    assert same_pixels(chat[1]["content"][0]["image"].to_pil(), picture)
    with pytest.raises(UnsupportedContentError, match="'video' part"):
        strands_content({"role": "user", "content": [{"type": "video", "video": "v.mp4"}]})


# ------------------------------------------------------------------------------------------------ the agent loop
@pytest.fixture(scope="module")
def verl():
    loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="verl is not installed")
    pytest.importorskip("torch")
    return loop


@pytest.fixture(scope="module")
def processor(qwen3_tokenizer):
    """verl's processor for a Qwen-VL model: the full HF processor (tiny image processor, Qwen3.5 template)."""
    from tito_testing.vision import hf_processor, vl_chat_template

    return hf_processor(qwen3_tokenizer, vl_chat_template())


class VerlLikeServer:
    """verl 0.9.1's ``LLMServerClient.generate`` signature; checks what verl's vLLM server would do with the ids:
    collapse each placeholder run (verl's own function) and expand it again by that image's grid."""

    def __init__(self, tokenizer, processor, texts):
        self.tokenizer, self.processor, self.texts = tokenizer, processor, list(texts)
        self.calls: list[tuple[list[int], list]] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None, **kw):
        from verl.workers.rollout.utils import qwen2_5_vl_dedup_image_tokens

        images = list(image_data or [])
        self.calls.append((list(prompt_ids), images))
        collapsed = qwen2_5_vl_dedup_image_tokens(list(prompt_ids), self.processor)
        assert collapsed.count(PAD) == len(images)  # one placeholder per image reaches the engine
        grids = self.processor.image_processor(images=images)["image_grid_thw"] if images else []
        merge = self.processor.image_processor.merge_size
        counts = iter(int(np.prod(g)) // merge**2 for g in grids)
        engine = [t for tok in collapsed for t in ([tok] * next(counts) if tok == PAD else [tok])]
        assert engine == list(prompt_ids)  # the engine's expansion is exactly the ids tito records
        from verl.workers.rollout.replica import TokenOutput

        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) + [IM_END]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


class TextOnlyServer:
    """A server manager whose ``generate`` takes no ``image_data`` (``**kwargs`` does not count)."""

    def __init__(self):
        self.calls = 0

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.calls += 1
        raise AssertionError("no request may be sent")


SHOTS = [pil(64, 200, 2)]


async def look_and_shoot(model, raw_prompt, **row):
    """A verl row's rollout: the user's image and question, a tool returning a screenshot, an answer."""
    from strands import tool

    from tests.helpers import agent_for

    @tool
    def shot() -> dict:
        """Take a screenshot."""
        block = {"image": {"format": "png", "source": {"bytes": png(SHOTS[0])}}}
        return {"status": "success", "content": [block, {"text": "ok"}]}

    await agent_for(model, [shot]).invoke_async(strands_content(raw_prompt[-1]))
    return 1.0


def agent_loop(verl, server, tokenizer, processor, model_type="qwen2_5_vl"):
    from hydra import utils as hydra_utils
    from omegaconf import OmegaConf

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"response_length": 1024}}, "data": {}})
    entry = {
        "_target_": "tito_core.trainers.verl_agent_loop.TitoAgentLoop",
        "rollout": "tests.trainers.test_verl_images.look_and_shoot",
        "tool_parser": "qwen_xml",
        "model_options": {"chat_template_kwargs": {"enable_thinking": False}},
    }
    return hydra_utils.instantiate(
        config=entry,
        trainer_config=verl.DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=processor,
        hf_model_type=model_type,
        dataset_cls=object,
        data_config=verl.DictConfigWrap(config.data),
        tools=verl.ToolListWrap([]),
    )


def row(picture):
    """A row as verl's RLHFDataset gives it: the image column's PIL image in the raw prompt's image part."""
    content = [{"type": "image", "image": picture}, {"type": "text", "text": "What is it?"}]
    return {"raw_prompt": [{"role": "user", "content": content}], "extra_info": {}, "index": 0}


def test_agent_loop_sends_images_as_verl_does_and_outputs_multi_modal_data(verl, qwen3_tokenizer, processor):
    import torch

    user = pil(120, 90, 3)
    server = VerlLikeServer(qwen3_tokenizer, processor, [CALL, "Two shapes."])
    loop = agent_loop(verl, server, qwen3_tokenizer, processor)
    out = asyncio.run(loop.run({"temperature": 0.6}, **row(user)))
    assert isinstance(out, verl.AgentLoopOutput)
    (first, first_images), (second, second_images) = server.calls
    assert len(first_images) == 1 and len(second_images) == 2  # each call sends every image of its prompt
    assert same_pixels(first_images[0], user) and same_pixels(second_images[1], SHOTS[0])
    assert out.prompt_ids == first and second[: len(first)] == first  # token in, images included
    full = out.prompt_ids + out.response_ids
    assert full[: len(second)] == second and full.count(PAD) == second.count(PAD) > first.count(PAD) > 0
    images = out.multi_modal_data["images"]
    assert [same_pixels(a, b) for a, b in zip(images, [user, SHOTS[0]], strict=True)] == [True, True]
    # verl's own postprocessing over this output: its processor's grids fill the placeholder runs exactly
    worker = type("Worker", (), {"processor": processor, "tokenizer": qwen3_tokenizer})()
    worker._get_mm_processor_kwargs = lambda audio_data=None: {}
    inputs = verl.AgentLoopWorker._compute_multi_modal_inputs(worker, out, torch.tensor([full]))
    merge = processor.image_processor.merge_size
    assert sum(int(g.prod()) // merge**2 for g in inputs["image_grid_thw"]) == full.count(PAD)


def test_a_server_manager_without_image_data_is_refused_before_any_request(verl, qwen3_tokenizer, processor):
    server = TextOnlyServer()
    loop = agent_loop(verl, server, qwen3_tokenizer, processor)
    with pytest.raises(ImageError, match="verl backend takes no images"):
        asyncio.run(loop.run({}, **row(pil(40, 40, 4))))
    assert server.calls == 0


def test_a_placeholder_run_that_is_not_one_image_is_refused(verl, qwen3_tokenizer, processor):
    """Two images' runs side by side would be collapsed into one by verl's server: refused, nothing sent."""
    from tito_core.backend import GenerateRequest, SamplingParams
    from tito_core.media import MediaSpan, PromptMedia
    from tito_core.trainers.verl import VerlServerBackend

    server = VerlLikeServer(qwen3_tokenizer, processor, [])
    backend = VerlServerBackend(server)
    assert backend.input_kinds == {"image"} and not VerlServerBackend(TextOnlyServer()).input_kinds
    picture = Image(png(pil(28, 28, 5)))

    def image(start: int, length: int) -> PromptMedia:
        span = MediaSpan(
            start=start,
            length=length,
            sha256=picture.sha256,
            format="png",
            size=picture.size,
            grid_thw=None,
            placeholder_id=PAD,
        )
        return PromptMedia(span=span, item=picture)

    adjacent = GenerateRequest(
        rid="r",
        input_ids=[1, PAD, PAD, PAD, PAD, 2],
        prefix_len=0,
        sampling=SamplingParams(),
        media=(image(1, 2), image(3, 2)),
    )
    stray = GenerateRequest(
        rid="r", input_ids=[1, PAD, PAD, 2, PAD, 3], prefix_len=0, sampling=SamplingParams(), media=(image(1, 2),)
    )
    with pytest.raises(ImageError, match="not a run of its own"):
        asyncio.run(backend.generate(adjacent))
    with pytest.raises(ImageError, match="outside its images' spans"):
        asyncio.run(backend.generate(stray))
    assert server.calls == []


def test_a_processor_of_an_unknown_family_leaves_the_loop_text_only(verl, qwen3_tokenizer, caplog):
    """A VL model tito has no vision family for still trains on text rows; its images are refused, logged why."""
    unknown = type("AudioProcessor", (), {"chat_template": None})()
    with caplog.at_level("WARNING", logger="tito_core.trainers.verl_agent_loop"):
        loop = agent_loop(verl, TextOnlyServer(), qwen3_tokenizer, unknown, "qwen3")
    assert loop.model_options["processor"] is False and "chat_template" not in loop.model_options
    assert "images are off" in caplog.text and "AudioProcessor" in caplog.text
    with pytest.raises(ImageError, match="no vision processor"):
        asyncio.run(loop.run({}, **row(pil(40, 40, 6))))
