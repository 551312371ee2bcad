"""The vLLM adapter against a real vLLM server: exact tokens, Strands agents, cancellation, costs.

The tiny random model's text is gibberish, so tool calls and answers are forced with vLLM's structured
outputs (``structured_outputs: {"regex": ...}``): the tokens are still the model's own samples.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
import pytest

from tito_core.backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import ContextLengthError
from tito_core.trajectory import Trajectory
from tito_core.versions import VersionSpan
from tito_vllm import VLLMBackend, VLLMChatBackend, vllm_backend

from ..forced_calls import forced_first_call, forced_structured_output
from .conftest import REPORT

pytestmark = pytest.mark.integration

CALL_RX = r'<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9], "b": [1-9]\}\}\n</tool_call>'
ANSWER_RX = r"The sum is [0-9]{1,2}\."
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]


def _ids(encoded: Any) -> list[int]:
    ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
    return [int(i) for i in ids]


def qwen25_template() -> str:
    from tito_testing.tokenizers import chat_template

    return chat_template("qwen2_5")


class Recording(Backend):
    """Wraps a backend and keeps every (request, result) pair it served."""

    name = "vllm"

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.calls: list[tuple[GenerateRequest, GenerateResult]] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await self.inner.generate(request)
        self.calls.append((request, result))
        return result

    async def max_context_length(self) -> int | None:
        return await self.inner.max_context_length()

    async def aclose(self) -> None:
        await self.inner.aclose()


def recording(inner: Backend) -> Recording:
    cls = type("RecordingBackend", (Recording,), {"renders_prompt": inner.renders_prompt})
    recorder: Recording = cls(inner)
    return recorder


def sampling(regex: str, *, temperature: float = 1.0, seed: int = 11, **extra: Any) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=96,
        temperature=temperature,
        seed=seed,
        extra={"structured_outputs": {"regex": regex}, **extra},
    )


async def run_agent(model: Any, *, calls_before_answer: int = 2, **extra: Any) -> tuple[Any, list[tuple[int, int]]]:
    """A Strands agent with a real ``add`` tool: forced calls first, then a forced final answer."""
    from strands import Agent, tool

    seen: list[tuple[int, int]] = []
    temperature = model.sampling.temperature

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        seen.append((a, b))
        if len(seen) >= calls_before_answer:
            model.update_config(sampling=sampling(ANSWER_RX, temperature=temperature, **extra))
        return a + b

    agent = Agent(model=model, tools=[add], callback_handler=None, system_prompt="Use the add tool.")
    result = await agent.invoke_async("What is 2 + 3? Then add 4.")
    return result, seen


def check_tokens_mode_trajectory(model: Any, recorder: Recording, *, echo: bool) -> None:
    """Each call sent exactly trajectory-so-far + new prompt; outputs and logprobs are recorded as returned."""
    traj = model.trajectory
    assert traj.branch == 0, "tokens mode never forks on an append-only conversation"
    assert len(traj.turns) == len(recorder.calls)
    previous: list[int] = []
    for (request, result), turn in zip(recorder.calls, traj.turns, strict=True):
        sent = list(request.input_ids)
        assert sent[: request.prefix_len] == traj.token_ids[: request.prefix_len]
        assert sent[: len(previous)] == previous, "the prompt does not extend the previous call"
        assert sent == traj.token_ids[: turn.prompt_start + turn.prompt_len]
        if echo:
            assert result.prompt_ids == sent, "the engine consumed other ids than were sent"
        start, end = turn.output_start, turn.output_start + turn.output_len
        assert traj.token_ids[start:end] == result.output_ids
        assert traj.loss_mask[start:end] == [1] * len(result.output_ids)
        assert traj.logprobs[start:end] == result.output_logprobs
        assert sum(traj.loss_mask[:start]) == sum(t.output_len for t in traj.turns[: turn.index])
        previous = sent + result.output_ids


def check_forced_conversation(result: Any, seen: list[tuple[int, int]], recorder: Recording, tokenizer: Any) -> None:
    assert len(seen) == 2, f"tool calls: {seen}"
    assert re.fullmatch(ANSWER_RX, str(result).strip()), str(result)
    assert result.stop_reason == "end_turn"
    # Every tool result went back into the next prompt.
    for (a, b), (request, _) in zip(seen, recorder.calls[1:], strict=True):
        new_prompt = tokenizer.decode(list(request.input_ids)[request.prefix_len :])
        assert "<tool_response>" in new_prompt and str(a + b) in new_prompt, new_prompt


# -- tokens mode -----------------------------------------------------------------------------------


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_agent_tokens_mode_is_exact(vllm_url: str, qwen3: Any, endpoint: str) -> None:
    from tito_core import TitoModel

    recorder = recording(VLLMBackend(vllm_url, endpoint=endpoint, return_prompt_ids=True))  # type: ignore[arg-type]
    model = TitoModel(recorder, qwen3, sampling=sampling(CALL_RX))
    result, seen = await run_agent(model)
    check_forced_conversation(result, seen, recorder, qwen3)
    check_tokens_mode_trajectory(model, recorder, echo=True)
    traj = model.trajectory
    assert traj.status == "completed"
    assert [t.stop_reason for t in traj.turns] == ["tool_use", "tool_use", "end_turn"]
    assert all(t.finish_reason == "stop" for t in traj.turns)
    # The engine's stop token is part of each output (never re-added by a template).
    assert all(result.output_ids[-1] in (151645, 151643) for _, result in recorder.calls)
    await recorder.aclose()


@pytest.mark.parametrize("parser", ["hermes", "qwen_xml"])
@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_tool_choice_forces_a_call_with_the_parsers_grammar(
    vllm_url: str, qwen3: Any, parser: str, endpoint: str
) -> None:
    async with VLLMBackend(vllm_url, endpoint=endpoint) as backend:  # type: ignore[arg-type]
        largest, mean = await forced_first_call(
            backend, qwen3, parser=parser, answer_extra={"structured_outputs": {"regex": ANSWER_RX}}
        )
    REPORT.append(
        f"forced {parser} call ({endpoint}) re-scored without its grammar: max {largest:.2f}, mean {mean:.2f} nats"
    )


async def test_structured_output_is_forced(vllm_url: str, qwen3: Any) -> None:
    async with VLLMBackend(vllm_url) as backend:
        await forced_structured_output(backend, qwen3)


async def test_agent_tokens_mode_reproducible(vllm_url: str, qwen3: Any) -> None:
    from tito_core import TitoModel

    records = []
    for temperature in (0.0, 0.0, 1.0, 1.0):
        backend = VLLMBackend(vllm_url)
        model = TitoModel(backend, qwen3, sampling=sampling(CALL_RX, temperature=temperature, seed=5))
        await run_agent(model)
        records.append((model.trajectory.token_ids, model.trajectory.logprobs, model.trajectory.loss_mask))
        await backend.aclose()
    greedy_a, greedy_b, seeded_a, seeded_b = records
    assert greedy_a == greedy_b, "greedy twice gave different trajectories"
    assert seeded_a == seeded_b, "the same seed twice gave different trajectories"


async def test_truncation_keeps_tokens(vllm_url: str, qwen3: Any) -> None:
    from strands import Agent
    from strands.types.exceptions import MaxTokensReachedException

    from tito_core import TitoModel

    recorder = recording(VLLMBackend(vllm_url))
    model = TitoModel(recorder, qwen3, sampling=SamplingParams(max_new_tokens=6, temperature=1.0, seed=3))
    with pytest.raises(MaxTokensReachedException):
        await Agent(model=model, callback_handler=None).invoke_async("Hello")
    traj = model.trajectory
    ((_, result),) = recorder.calls
    assert traj.status == "truncated"
    assert result.finish_reason == "length" and len(result.output_ids) == 6
    assert traj.token_ids[-6:] == result.output_ids
    assert traj.loss_mask[-6:] == [1] * 6
    assert traj.logprobs[-6:] == result.output_logprobs


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_server_clamps_to_the_context_window(vllm_url: str, endpoint: str) -> None:
    backend = VLLMBackend(vllm_url, endpoint=endpoint)  # type: ignore[arg-type]
    request = GenerateRequest(
        rid=f"clamp-{endpoint}",
        input_ids=[9707] * 4000,
        prefix_len=0,
        sampling=SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True),
    )
    result = await backend.generate(request)
    assert result.finish_reason == "length" and len(result.output_ids) == 96
    too_long = GenerateRequest(rid=f"long-{endpoint}", input_ids=[9707] * 4100, prefix_len=0, sampling=SamplingParams())
    with pytest.raises(ContextLengthError):
        await backend.generate(too_long)
    await backend.aclose()


async def test_same_tokens_from_both_endpoints_and_chat(vllm_url: str, qwen3: Any) -> None:
    """Greedy output ids and logprobs agree across /inference/v1/generate, /v1/completions and chat."""
    messages = [{"role": "user", "content": "Hello"}]
    ids = _ids(qwen3.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    params = SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True)
    results = []
    for backend in (
        VLLMBackend(vllm_url, endpoint="generate"),
        VLLMBackend(vllm_url, endpoint="completions"),
        VLLMChatBackend(vllm_url),
    ):
        request = GenerateRequest(rid="same", input_ids=ids, prefix_len=0, sampling=params, messages=messages)
        results.append(await backend.generate(request))
        await backend.aclose()
    assert results[0].output_ids == results[1].output_ids == results[2].output_ids
    assert results[1].prompt_ids == results[2].prompt_ids == ids
    for other in results[1:]:
        assert other.output_logprobs == pytest.approx(results[0].output_logprobs, abs=1e-4)


# -- weight versions -------------------------------------------------------------------------------


class Relabelling(Recording):
    """Before model call ``at`` (0-based), relabels the server's weights ``version`` (``/update_weight_version``,
    a route of the server's dev mode): what a trainer does after pushing new weights, between two turns."""

    def __init__(self, inner: Backend, url: str, *, at: int, version: str) -> None:
        super().__init__(inner)
        self.url, self.at, self.version = url, at, version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if len(self.calls) == self.at:
            await set_weight_version(self.url, self.version)
        return await super().generate(request)


async def set_weight_version(url: str, version: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        (await client.post("/update_weight_version", json={"new_version": version})).raise_for_status()
        assert (await client.get("/weight_info")).json() == {"weight_version": version}


async def test_a_rollout_records_weight_versions_over_every_output_token(vllm_url: str, qwen3: Any) -> None:
    """A 3-call rollout on /inference/v1/generate; the weights are relabelled "1" after the first call."""
    from tito_core import TitoModel

    async with httpx.AsyncClient(base_url=vllm_url, timeout=30.0) as client:
        before = (await client.get("/weight_info")).json()["weight_version"]
    assert before == "default"  # what vLLM labels its weights until a trainer sets a version
    recorder = Relabelling(VLLMBackend(vllm_url, endpoint="generate"), vllm_url, at=1, version="1")
    model = TitoModel(recorder, qwen3, sampling=sampling(CALL_RX))
    try:
        result, seen = await run_agent(model)
    finally:
        await set_weight_version(vllm_url, before)
    check_forced_conversation(result, seen, recorder, qwen3)
    traj = model.trajectory
    assert [t.weight_versions for t in traj.turns] == [
        (VersionSpan(version=v, start=0, end=t.output_len),)
        for v, t in zip(["default", "1", "1"], traj.turns, strict=True)
    ]
    assert [t.weight_versions for t in traj.turns] == [r.weight_versions for _, r in recorder.calls]
    spans = traj.weight_versions()
    assert spans is not None
    covered = [i for span in spans for i in range(span.start, span.end)]
    assert covered == [i for i, m in enumerate(traj.loss_mask) if m]  # every output token exactly once
    assert traj.weight_version_range() == ("default", "1")
    back = Trajectory.from_json(traj.to_json())
    assert back.turns == traj.turns
    REPORT.append(
        "weight versions of a 3-call rollout on /inference/v1/generate (relabelled after call 1): "
        + "; ".join(
            f"call {t.index}: {[(s.version, s.start, s.end) for s in t.weight_versions or ()]}" for t in traj.turns
        )
    )
    await recorder.aclose()


# -- chat mode -------------------------------------------------------------------------------------


async def test_agent_chat_mode_prompts_match_local_render(vllm_url: str, qwen3: Any) -> None:
    """Chat mode with the prefix-preserving Qwen2.5 template: the server's prompt ids equal the local
    render of the same messages on every call, and the trajectory holds exactly what the server used."""
    from tito_core import TitoModel

    template = qwen25_template()
    backend = VLLMChatBackend(vllm_url)
    assert isinstance(backend, VLLMChatBackend)
    recorder = recording(backend)
    model = TitoModel(recorder, qwen3, chat_template=template, sampling=sampling(CALL_RX, chat_template=template))
    result, seen = await run_agent(model, chat_template=template)
    assert len(seen) == 2 and re.fullmatch(ANSWER_RX, str(result).strip())
    for request, call in recorder.calls:
        assert request.messages is not None
        local = _ids(
            qwen3.apply_chat_template(
                request.messages, tools=request.tools, chat_template=template, add_generation_prompt=True, tokenize=True
            )
        )
        assert call.prompt_ids == local, "the server rendered the messages differently from the local template"
    traj = model.trajectory
    last_request, last = recorder.calls[-1]
    assert last.prompt_ids is not None
    assert traj.token_ids == last.prompt_ids + last.output_ids
    assert traj.logprobs[-len(last.output_ids) :] == last.output_logprobs
    assert all(turn.weight_versions is None for turn in traj.turns)  # vLLM 0.32's chat answers carry none
    REPORT.append(
        f"chat mode agent (Qwen2.5 template): {len(recorder.calls)} calls, trajectory branches: {traj.branch + 1} "
        f"(a fork means the server's re-render did not extend the sampled tokens); last fork: "
        f"{traj.to_record().fork_reason}"
    )
    await recorder.aclose()


async def test_chat_mode_default_qwen3_template_matches_local_render(vllm_url: str, qwen3: Any) -> None:
    messages = [
        {"role": "system", "content": "You add."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]  # fmt: skip
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    tools = [
        {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": schema}}
    ]
    local = _ids(qwen3.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True))
    backend = VLLMChatBackend(vllm_url)
    request = GenerateRequest(
        rid="chat-q3", input_ids=local, prefix_len=0, messages=messages, tools=tools,
        sampling=SamplingParams(max_new_tokens=4, temperature=0.0),
    )  # fmt: skip
    result = await backend.generate(request)
    assert result.prompt_ids == local
    await backend.aclose()


# -- cancellation, logprobs mode -------------------------------------------------------------------


async def _generated_tokens(url: str) -> float:
    """vLLM's count of generated tokens so far (a counter: exact once the engine is idle)."""
    async with httpx.AsyncClient(base_url=url) as client:
        text = (await client.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:generation_tokens_total")
    )


@pytest.mark.parametrize("kind", ["generate", "completions", "chat"])
async def test_cancel_aborts_on_the_server(vllm_url: str, kind: str) -> None:
    """A cancelled call is aborted on the engine, not left to generate its 3,500 tokens.

    Deterministic, whatever the machine's speed: the engine is paused (keep) before the request is sent, so the
    request waits in the engine and cannot finish before the cancel; after the cancel and the resume, the engine
    goes idle having generated nothing. (Watching ``num_requests_running`` mid-generation raced: vLLM's API server
    may answer ``/metrics`` only once a CPU generation is done, and a fast one finished before the cancel.)
    """
    from ..servers import left_busy

    backend: VLLMBackend | VLLMChatBackend = (
        VLLMChatBackend(vllm_url) if kind == "chat" else VLLMBackend(vllm_url, endpoint=kind)  # type: ignore[arg-type]
    )
    request = GenerateRequest(
        rid=f"cancel-{kind}-{time.time_ns()}",
        input_ids=PROMPT,
        prefix_len=0,
        messages=[{"role": "user", "content": "Hello"}],
        sampling=SamplingParams(max_new_tokens=3500, ignore_eos=True),
    )
    before = await _generated_tokens(vllm_url)
    await backend.pause_generation("keep")
    try:
        task = asyncio.create_task(backend.generate(request))
        await asyncio.sleep(1.0)  # the request on its way to the paused engine (if it is not there yet, the cancel
        task.cancel()  # stops it in the client: the assertion below holds either way)
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await backend.resume_generation()
    assert await asyncio.to_thread(left_busy, vllm_url, "vllm") is None
    generated = await _generated_tokens(vllm_url) - before
    assert generated < 100, f"vLLM generated {generated:g} tokens for a cancelled request: it was not aborted"
    await backend.aclose()


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
async def test_logprobs_are_pre_temperature(vllm_url: str, endpoint: str) -> None:
    """With the default --logprobs-mode, sampled logprobs at temperature 0.5 are the unscaled model
    logprobs: re-scoring the same tokens as a prompt (temperature plays no part there) gives them back."""
    backend = VLLMBackend(vllm_url, endpoint=endpoint)  # type: ignore[arg-type]
    hot = SamplingParams(max_new_tokens=8, temperature=0.5, seed=1, ignore_eos=True)
    sampled = await backend.generate(GenerateRequest(rid="hot", input_ids=PROMPT, prefix_len=0, sampling=hot))
    assert sampled.output_logprobs is not None
    rescored = await backend.generate(
        GenerateRequest(
            rid="rescore",
            input_ids=PROMPT + sampled.output_ids,
            prefix_len=len(PROMPT),
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
            return_prompt_logprobs=True,
        )
    )
    assert rescored.prompt_logprobs == pytest.approx(sampled.output_logprobs, abs=0.05)
    await backend.aclose()


async def test_logprobs_mode_is_reported(vllm_url: str) -> None:
    backend = VLLMBackend(vllm_url)
    assert await backend.logprobs_mode() == "raw_logprobs"
    await backend.aclose()


# -- measured costs of the modes -------------------------------------------------------------------


class CountingTransport(httpx.AsyncHTTPTransport):
    """Counts request and response body bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[int] = []
        self.received: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        body = await response.aread()
        self.sent.append(len(request.content))
        self.received.append(len(body))
        return response


class TestModeCosts:
    """Per-call client CPU time and bytes on the wire for each mode, on 0.3k- and 3.3k-token prompts."""

    calls: ClassVar[int] = 6

    @pytest.fixture
    async def transports(self) -> AsyncIterator[list[VLLMBackend]]:
        backends: list[VLLMBackend] = []
        yield backends
        for backend in backends:
            await backend.aclose()

    @pytest.mark.parametrize("words", [330, 3300])
    async def test_measure(self, vllm_url: str, qwen3: Any, words: int, transports: list[VLLMBackend]) -> None:
        messages = [{"role": "user", "content": " ".join(["hello world again"] * (words // 3))}]
        ids = _ids(qwen3.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
        variants: list[tuple[str, dict[str, Any]]] = [
            ("tokens /inference/v1/generate", {"endpoint": "generate"}),
            ("tokens /inference/v1/generate + echo", {"endpoint": "generate", "return_prompt_ids": True}),
            ("tokens /v1/completions", {"endpoint": "completions"}),
            ("chat /v1/chat/completions", {"mode": "chat"}),
        ]
        for label, options in variants:
            transport = CountingTransport()
            backend = vllm_backend(vllm_url, transport=transport, **options)
            transports.append(backend)
            await backend.max_context_length()
            transport.sent.clear()
            transport.received.clear()
            cpu, wall = [], []
            for i in range(self.calls):
                request = GenerateRequest(
                    rid=f"cost-{i}-{time.time_ns()}", input_ids=ids, prefix_len=0, sampling=params, messages=messages
                )
                c0, w0 = time.process_time(), time.perf_counter()
                result = await backend.generate(request)
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
                assert len(result.output_ids) == 16
            REPORT.append(
                f"{len(ids):>5}-token prompt, {label:<38} request {statistics.median(transport.sent):>8.0f} B, "
                f"response {statistics.median(transport.received):>7.0f} B, client CPU "
                f"{statistics.median(cpu) * 1000:5.2f} ms, wall {statistics.median(wall) * 1000:6.1f} ms "
                f"(median of {self.calls})"
            )


async def test_same_greedy_ids_as_sglang(vllm_url: str, tiny_model_dir: Any, qwen3: Any) -> None:
    """The same tiny model and greedy prompt give the same ids on vLLM and SGLang (when both ran here), but where
    the two tokens are a near-tie under a bf16 forward pass (which one a kernel picks depends on the CPU)."""
    from ..cross_engine import greedy_ids, record_and_compare

    backend = VLLMBackend(vllm_url)
    try:
        prompt, output = await greedy_ids(backend, qwen3)
    finally:
        await backend.aclose()
    reason = record_and_compare("vllm", tiny_model_dir, prompt, output)
    if reason:
        pytest.skip(reason)


async def test_a_weight_update_in_keep_mode_loses_no_rollout_in_flight(vllm_url: str, qwen3: Any) -> None:
    """Eight 3-call agents; ``weight_update`` pauses vLLM (``/pause?mode=keep``) mid-run, relabels, resumes."""
    from ..weight_updates import check_versions, keep_mode_update

    backend = VLLMBackend(vllm_url, endpoint="generate", timeout=300.0)
    try:
        trajectories = await keep_mode_update(backend, qwen3, lambda rx: {"structured_outputs": {"regex": rx}})
    finally:
        await backend.aclose()
    REPORT.append("weight update in keep mode, 8 rollouts in flight: " + check_versions(trajectories))


async def test_a_reload_from_disk_of_a_tied_checkpoint_is_judged_by_the_weight_probe(
    vllm_url: str, tiny_model_dir: Any, qwen3: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """vLLM 0.32's CPU build on ``/collective_rpc`` ``reload_weights`` of a checkpoint with tied embeddings (the
    tiny model) serves the new checkpoint on some CPUs and, on others, the new checkpoint with the **old** output
    layer (docs/async.md: a GEMM handle packed at startup that the reload never packs again). Which one this machine
    gives is measured, not assumed: the engine's prompt logprobs of a fixed sequence (plain HTTP, not tito's
    ``score``) against transformers forward passes of A, B and B with A's output layer. What tito promises holds
    either way: ``weight_update(..., probe=B's)`` with the reload of B in its block passes exactly when the engine
    serves B, and otherwise raises ``WeightUpdateError`` naming the engine and leaves it paused. Reloading A (the
    weights the server started with) serves A on any CPU, and A's probe passes."""
    import subprocess

    from safetensors.torch import load_file, save_file

    from tito_core import weight_update
    from tito_core.errors import WeightUpdateError

    from ..reference import Reference, trainer_probe, untied_checkpoint
    from ..weight_updates import BF16_MAX, BF16_MEAN, OTHER_MEAN
    from .conftest import SERVED_NAME, SERVER_PYTHON

    built = subprocess.run([SERVER_PYTHON, "-m", "tito_testing.tiny_model", "--seed", "1"],
                           capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    second = built.stdout.strip().splitlines()[-1]
    # B with A's output layer: what the engine serves where the reload keeps the packed output layer
    stale = untied_checkpoint(second, tmp_path_factory.mktemp("stale") / "ckpt")
    tensors = load_file(str(stale / "model.safetensors"))
    tensors["lm_head.weight"] = load_file(str(tiny_model_dir / "model.safetensors"))["model.embed_tokens.weight"]
    save_file(tensors, str(stale / "model.safetensors"), metadata={"format": "pt"})
    ids = list(qwen3.encode("The engine reloads its weights from disk; a forward pass of the files says which."))
    reference = Reference()
    checkpoints = {"A": tiny_model_dir, "B": second}
    expected = {"A": reference.score(tiny_model_dir, ids), "B": reference.score(second, ids),
                "B with A's output layer": reference.score(stale, ids)}  # fmt: skip

    def diffs(got: list[float], name: str) -> tuple[float, float]:
        d = [abs(a - b) for a, b in zip(got, expected[name], strict=True)]
        return sum(d) / len(d), max(d)

    for one, other in itertools.combinations(expected, 2):  # the three candidates are told apart by far
        assert diffs(expected[one], other)[0] > OTHER_MEAN, (one, other)

    async def reload(path: Any) -> None:
        async with httpx.AsyncClient(base_url=vllm_url, timeout=120.0) as client:
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            (await client.post("/collective_rpc", json=body)).raise_for_status()

    async def served() -> list[float]:
        """The engine's logprob of each of ``ids[1:]``: one plain ``/v1/completions`` prefill, no tito code."""
        body = {"model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        async with httpx.AsyncClient(base_url=vllm_url, timeout=120.0) as client:
            response = await client.post("/v1/completions", json=body)
        response.raise_for_status()
        entries = response.json()["choices"][0]["prompt_logprobs"]
        assert entries[0] is None and len(entries) == len(ids), entries[:2]
        return [float(entry[str(token)]["logprob"]) for entry, token in zip(entries[1:], ids[1:], strict=True)]

    async def paused() -> bool:
        async with httpx.AsyncClient(base_url=vllm_url, timeout=30.0) as client:
            return bool((await client.get("/is_paused")).json().get("is_paused"))

    backend = VLLMBackend(vllm_url, endpoint="generate", timeout=300.0)
    lines = []
    try:
        for name in ("B", "A"):
            probe = trainer_probe(reference, checkpoints[name], qwen3)  # the trainer pushes `name`
            refused: WeightUpdateError | None = None
            try:
                async with weight_update([backend], version=name, probe=probe) as update:
                    await reload(checkpoints[name])
                (score,) = update.probes
            except WeightUpdateError as error:
                refused, (score,) = error, error.probes
                assert error.paused == [vllm_url] and vllm_url in str(error), str(error)
                assert await paused()
                await backend.resume_generation()  # the weights the probe judged stay loaded: measure them
            got = await served()
            figures = {candidate: diffs(got, candidate) for candidate in expected}
            mean, most = figures[name]
            serves = mean < BF16_MEAN and most < BF16_MAX
            assert serves or mean > OTHER_MEAN, figures  # the truth is clear: bf16 noise from it, or far
            near = [c for c, (m, x) in figures.items() if m < BF16_MEAN and x < BF16_MAX] or ["none of them"]
            verdict = "refused" if refused else "passed"
            assert (refused is None) == serves == score.passed, (name, verdict, score, figures)
            assert serves or name == "B", figures  # reloading the weights the server started with gives them back
            lines.append(
                f"reload of {name}: serves {near[0]} (mean/max |engine - forward pass| over {len(got)} tokens: "
                + ", ".join(f"vs {c} {m:.1e}/{x:.1e}" for c, (m, x) in figures.items())
                + f"); probe of {name} {verdict}: {score.describe()}"
            )
    finally:
        await backend.resume_generation()
        await reload(tiny_model_dir)
        await backend.set_weight_version("default")
        await backend.aclose()
    REPORT.append("reload from disk of a tied checkpoint (vLLM CPU): " + " | ".join(lines))
