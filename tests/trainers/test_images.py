"""Images in every export, checked on the trainers' own code: a two-call rollout on the scripted backend with an
image in the user message and two in the tool result (the tiny Qwen-VL image processor and the Qwen3.5 template).

Each export's images must decode to the rollout's pixels, in token order; the pixel inputs the trainer builds
from them must have the recorded grids (``image_grid_thw``) and fit the placeholder runs of the ids.
"""

from __future__ import annotations

import asyncio
import io

import pytest

pytest.importorskip("PIL")
np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
from PIL import Image as PILImage  # noqa: E402

from tito_core.conversation import Conversation  # noqa: E402
from tito_core.export import (  # noqa: E402
    model_request_events,
    to_slime,
    to_trl,
    to_verl,
    training_branches,
    verl_multi_modal_inputs,
)
from tito_core.export.media import pixel_inputs  # noqa: E402
from tito_core.media import Image, ImageError, image_part  # noqa: E402
from tito_core.model_setup import vision_processor  # noqa: E402
from tito_core.plugins import get_tool_parser  # noqa: E402
from tito_core.render.renderer import ChatRenderer  # noqa: E402
from tito_core.rollout_core import CallOptions, Rollout  # noqa: E402
from tito_testing.scripted import ScriptedBackend  # noqa: E402
from tito_testing.vision import TINY_VISION, hf_processor, tiny_image_processor, vl_chat_template  # noqa: E402

from ..slime_stand_in import Sample  # noqa: E402

PAD = 151655
MERGE = TINY_VISION["merge_size"]
CALL = "<tool_call>\n<function=shot>\n</function>\n</tool_call>"
TOOLS = [{"name": "shot", "description": "take a screenshot", "inputSchema": {"json": {"type": "object"}}}]
SIZES = [(120, 90), (64, 200), (300, 140)]  # the user's image, then the tool result's two


def png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    PILImage.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vl(qwen3_tokenizer):
    """The offline Qwen3 tokenizer (the session's) and the full Qwen-VL processor over it."""
    return qwen3_tokenizer, hf_processor(qwen3_tokenizer, vl_chat_template())


@pytest.fixture(scope="module")
def rollout(vl):
    """The closed trajectory and the images in the order the conversation holds them."""
    tok, _ = vl
    renderer = ChatRenderer(tok, chat_template=vl_chat_template(), template_kwargs={"enable_thinking": False})
    run = Rollout(
        ScriptedBackend(tok, [CALL, "Two shapes."]),
        renderer,
        get_tool_parser("qwen_xml"),
        vision=vision_processor(tiny_image_processor(), tok),
    )
    pictures = [Image(png(w, h, i)) for i, (w, h) in enumerate(SIZES)]
    messages: list[dict] = [{"role": "user", "content": [image_part(pictures[0]), {"type": "text", "text": "look"}]}]

    async def go() -> None:
        reply = (await run.call(Conversation(messages=list(messages), tool_specs=TOOLS), CallOptions())).reply()
        shots = [image_part(p) for p in pictures[1:]]
        content = [*shots, {"type": "text", "text": "ok"}]
        tool = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": content}
        messages.extend([reply, tool])
        await run.call(Conversation(messages=list(messages), tool_specs=TOOLS), CallOptions())

    asyncio.run(go())
    return run.trajectory.close(), pictures


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"))


def check_same_pictures(exported, pictures) -> None:
    """The exported images are the rollout's, in token order, pixel for pixel."""
    assert len(exported) == len(pictures)
    for got, want in zip(exported, pictures, strict=True):
        assert np.array_equal(pixels(got), pixels(want.to_pil()))


def check_fits_the_ids(ids, grid, traj) -> None:
    """The trainer's ``image_grid_thw`` is the recorded one, and its patches fill the placeholder runs."""
    rows = [tuple(int(x) for x in row) for row in grid.tolist()]
    assert rows == [span.grid_thw for span in traj.media]
    assert sum(t * h * w // MERGE**2 for t, h, w in rows) == list(ids).count(PAD)
    for span, (t, h, w) in zip(traj.media, rows, strict=True):
        assert span.length == t * h * w // MERGE**2 and set(ids[span.start : span.end]) == {PAD}


def test_the_rollout_has_images_in_the_prompt_and_the_response(rollout):
    traj, _ = rollout
    assert len(traj.media) == 3 and traj.media[0].end <= traj.prompt_length < traj.media[1].start


# ------------------------------------------------------------------------------------------------ verl
class StandInWorker:
    """What verl's ``AgentLoopWorker._compute_multi_modal_inputs`` reads of its worker (a full worker needs Ray)."""

    def __init__(self, processor, tokenizer):
        self.processor, self.tokenizer = processor, tokenizer

    def _get_mm_processor_kwargs(self, audio_data=None):
        return {}  # data.mm_processor_kwargs unset


def test_verl_agent_loop_output_and_verls_own_multi_modal_inputs(rollout, vl):
    verl_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="verl is not installed")
    traj, pictures = rollout
    tok, processor = vl
    out = verl_loop.AgentLoopOutput(**to_verl(traj), reward_score=1.0)
    check_same_pictures(out.multi_modal_data["images"], pictures)
    ids = out.prompt_ids + out.response_ids
    assert ids == traj.token_ids
    # verl's own postprocessing step, on this output: it re-runs its processor over multi_modal_data
    worker = StandInWorker(processor, tok)
    verls = verl_loop.AgentLoopWorker._compute_multi_modal_inputs(worker, out, torch.tensor([ids]))
    check_fits_the_ids(ids, verls["image_grid_thw"], traj)
    ours = verl_multi_modal_inputs(traj, tiny_image_processor())
    assert set(ours) == {"pixel_values", "image_grid_thw", "images_seqlens"}
    for key in ours:
        assert torch.equal(ours[key], verls[key]), key


def test_verl_mrope_positions_over_the_exported_ids(rollout, vl):
    """verl's own position step (the model's ``get_rope_index`` bound onto the processor, as verl's
    ``hf_processor`` does): each image's run gets its grid's 2-D positions, the text after it goes on from there."""
    verl_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop", reason="verl is not installed")
    import copy
    import types

    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl import Qwen2_5_VLModel

    from tito_testing import tiny_vl

    traj, _ = rollout
    tok, processor = vl
    processor = copy.copy(processor)
    processor.config = Qwen2_5_VLConfig(
        vision_config=dict(tiny_vl.TINY_QWEN25_VL_VISION),
        image_token_id=tiny_vl.IMAGE_PAD_ID,
        video_token_id=tiny_vl.VIDEO_PAD_ID,
        vision_start_token_id=tiny_vl.VISION_START_ID,
        vision_end_token_id=tiny_vl.VISION_END_ID,
    )
    for name in ("get_rope_index", "get_vision_position_ids"):  # what verl's hf_processor binds
        if hasattr(Qwen2_5_VLModel, name):
            setattr(processor, name, types.MethodType(getattr(Qwen2_5_VLModel, name), processor))
    out = verl_loop.AgentLoopOutput(**to_verl(traj))
    worker = StandInWorker(processor, tok)
    ids = torch.tensor([out.prompt_ids + out.response_ids])
    inputs = verl_loop.AgentLoopWorker._compute_multi_modal_inputs(worker, out, ids)
    mask = torch.ones_like(ids)
    positions = verl_loop.AgentLoopWorker._compute_position_ids(worker, ids, mask, inputs)
    assert positions.shape == (1, 4, len(traj))  # verl's layout: the text positions, then MRoPE's t, h, w
    _, t_pos, h_pos, w_pos = positions[0].tolist()
    for span in traj.media:
        _, h, w = span.grid_thw
        rows, cols = h // MERGE, w // MERGE
        base = t_pos[span.start]
        assert t_pos[span.start : span.end] == [base] * span.length
        assert h_pos[span.start : span.end] == [base + i // cols for i in range(span.length)]
        assert w_pos[span.start : span.end] == [base + i % cols for i in range(span.length)]
        after = base + max(rows, cols)
        assert t_pos[span.end] == h_pos[span.end] == w_pos[span.end] == after  # <|vision_end|>


def test_verl_text_only_output_has_no_multi_modal_data(rollout):
    from tito_core import Trajectory

    traj = Trajectory("t")
    traj.append("prompt", [1, 2], turn=0)
    traj.append("output", [3], [-0.5], turn=0)
    assert "multi_modal_data" not in to_verl(traj) and verl_multi_modal_inputs(traj, tiny_image_processor()) == {}


# ------------------------------------------------------------------------------------------------ slime
def test_slime_sample_multimodal_inputs_and_train_inputs(rollout):
    traj, pictures = rollout
    sample = Sample()
    fields = to_slime(traj, processor=tiny_image_processor())
    fields.pop("status")
    for name, value in fields.items():
        setattr(sample, name, value)  # slots: a field slime's Sample lacks is an AttributeError
    check_same_pictures(sample.multimodal_inputs["images"], pictures)
    train = sample.multimodal_train_inputs
    assert isinstance(train["pixel_values"], torch.Tensor) and set(train) == {"pixel_values", "image_grid_thw"}
    check_fits_the_ids(sample.tokens, train["image_grid_thw"], traj)
    # what slime's rollout gets from its processor over the same images (processor_output minus the text keys)
    ref = tiny_image_processor()(images=[p.to_pil() for p in pictures], return_tensors="pt")
    assert torch.equal(train["pixel_values"], ref["pixel_values"])
    assert "multimodal_train_inputs" not in to_slime(traj)  # no processor: slime's processor computes them


def test_slimes_generate_hook_fills_both_with_the_models_processor(vl):
    """``run_agent`` renders with the processor it is given and exports pixel inputs with the same one."""
    from strands import Agent

    from tito_core.trainers import slime as slime_hook

    tok, _ = vl
    picture = Image(png(90, 120, 7))

    async def run(model):
        blocks = [{"image": {"format": "png", "source": {"bytes": picture.data}}}, {"text": "What is it?"}]
        await Agent(model=model, callback_handler=None).invoke_async(blocks)

    sample = Sample(prompt="What is it?")
    asyncio.run(
        slime_hook.run_agent(
            sample, {"max_new_tokens": 16}, backend=ScriptedBackend(tok, ["Noise."]), tokenizer=tok, run=run,
            status_enum=Sample.Status, processor=tiny_image_processor(), tool_parser="qwen_xml",
            chat_template=vl_chat_template(), chat_template_kwargs={"enable_thinking": False},
        )
    )  # fmt: skip
    assert sample.status is Sample.Status.COMPLETED
    check_same_pictures(sample.multimodal_inputs["images"], [picture])
    grid = sample.multimodal_train_inputs["image_grid_thw"]
    assert grid.tolist() == [[1, 8, 6]] and sample.tokens.count(PAD) == 8 * 6 // MERGE**2


def test_a_processor_other_than_the_rollouts_is_an_image_error(rollout):
    traj, _ = rollout
    other = tiny_image_processor()
    other.size = {"shortest_edge": 56 * 56, "longest_edge": 56 * 56}  # every image shrinks to a 4x4 grid
    with pytest.raises(ImageError, match="grid"):
        pixel_inputs(traj, other)


# ------------------------------------------------------------------------------------------------ TRL
def test_trl_images_column(rollout):
    pytest.importorskip("trl", reason="trl is not installed")
    from trl.data_utils import prepare_multimodal_messages

    from tito_core import Trajectory

    traj, pictures = rollout
    text = Trajectory("t")
    text.append("prompt", [1, 2], turn=0)
    text.append("output", [3], [-0.5], turn=0)
    columns = to_trl([traj, text])
    images = columns["images"]
    assert images[1] == [] and len(columns["prompt_ids"]) == 2
    check_same_pictures(images[0], pictures)
    # TRL's vision-language form: its own helper puts one image per placeholder into a prompt
    prompt = [{"role": "user", "content": [{"type": "image"}] * len(images[0]) + [{"type": "text", "text": "look"}]}]
    filled = prepare_multimodal_messages(prompt, images=images[0])
    assert [part["image"] for part in filled[0]["content"] if part["type"] == "image"] == images[0]
    assert "images" not in to_trl([text]) and "images" not in to_trl(text)


# ------------------------------------------------------------------------------------------------ Agent Lightning
def test_agentlightning_reads_each_calls_images(rollout, vl):
    pytest.importorskip("agentlightning.verl.rollout_adapter", reason="agentlightning is not installed")
    from agentlightning.verl import agl_rollout_manager as manager
    from agentlightning.verl import rollout_adapter as adapter

    traj, pictures = rollout
    first, second = model_request_events(traj)
    # Agent Lightning's own readers (its rollout manager fills Triplet.image_urls with them; its verl adapter
    # loads them and runs the processor): the first call saw the user's image, the second all three
    urls = [manager._extract_image_urls_from_messages(e["request"]["messages"]) for e in (first, second)]
    assert [len(u) for u in urls] == [1, 3]
    check_same_pictures([adapter._load_pil_image(u) for u in urls[1]], pictures)
    inputs, _ = adapter._build_multi_modal_inputs(vl[1], urls[1])
    check_fits_the_ids(traj.token_ids, inputs["image_grid_thw"], traj)
    # rows written to a file name the images by hash (their bytes are next to the records)
    rows = model_request_events(traj, images="sha256")
    assert rows[1]["request"]["messages"][0]["content"][2]["image_url"]["url"] == f"sha256:{pictures[2].sha256}"


def test_branches_export_their_own_images(rollout):
    traj, _ = rollout
    (only,) = training_branches(traj, branch_reward="last")
    assert len(to_verl(only)["multi_modal_data"]["images"]) == 3
    assert to_verl(only, images="sha256")["multi_modal_data"]["images"] == [s.sha256 for s in traj.media]
