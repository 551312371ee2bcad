"""The SGLang adapter against a real SGLang 0.5.23 server (CPU, tiny random Qwen3).

What this proves, on the real engine:
* every request's ``input_ids`` are exactly the trajectory so far plus the new prompt;
* output ids and logprobs land in the trajectory exactly as the server returned them;
* greedy decoding twice gives the same trajectory;
* a length-truncated turn gives status ``truncated`` with its tokens kept;
* prompt logprobs (radix-cache reuse from ``prefix_len - 1``) line up with the prompt tokens;
* cancelling a long generation aborts it on the server (the scheduler has no running request after);
* a Strands ``Agent`` with a real ``@tool`` runs several real turns (tool calls forced with ``regex``).
* each turn records the server's weight-version spans, covering every output token exactly once.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from array import array
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_sglang import SGLangBackend

from ..forced_calls import forced_first_call, forced_structured_output
from ..servers import left_busy
from .conftest import REPORT

pytestmark = pytest.mark.integration

IM_END = 151645
TOOL_CALL_RX = r'<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9][0-9]?, "b": [1-9][0-9]?\}\}\n</tool_call>'
FINAL_RX = r"The sum is [0-9]{1,3}\."


class RecordingTransport(httpx.AsyncBaseTransport):
    """A real TCP transport that keeps every ``/generate`` request body and response body."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.raw: list[bytes] = []  # the request bodies of those exchanges, as sent

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        if request.url.path == "/generate" and response.status_code == 200:
            self.exchanges.append((json.loads(request.content), json.loads(content)))
            self.raw.append(bytes(request.content))
        headers = [
            (k, v) for k, v in response.headers.items() if k.lower() not in {"content-length", "content-encoding"}
        ]
        return httpx.Response(response.status_code, headers=headers, content=content)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from tito_testing.tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer()


@pytest.fixture
async def recorded(sglang_url: str) -> AsyncIterator[tuple[SGLangBackend, RecordingTransport]]:
    transport = RecordingTransport()
    backend = SGLangBackend(sglang_url, timeout=180.0, transport=transport)
    yield backend, transport
    await backend.aclose()


def prompt_ids(tokenizer: Any, text: str = "Say something.") -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def request(ids: list[int], prefix_len: int = 0, **sampling: Any) -> GenerateRequest:
    return GenerateRequest(
        rid=f"test-{uuid.uuid4().hex}",
        input_ids=array("i", ids),
        prefix_len=prefix_len,
        sampling=SamplingParams(**{"max_new_tokens": 8, "temperature": 0.0, **sampling}),
    )


async def running_requests(url: str) -> int:
    """Requests the scheduler is running or has queued (SGLang's ``/v1/loads``)."""
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        loads = (await client.get("/v1/loads", params={"include": "core"})).json()["loads"]
    return sum(int(load.get("num_running_reqs", 0)) + int(load.get("num_waiting_reqs", 0)) for load in loads)


# -- the backend alone -----------------------------------------------------------------------------


async def test_discovery(sglang_backend: SGLangBackend) -> None:
    assert await sglang_backend.health()
    assert await sglang_backend.max_context_length() == 4096
    info = await sglang_backend.model_info()
    assert info["is_generation"] is True


async def test_generate_returns_server_ids_and_logprobs_exactly(
    recorded: tuple[SGLangBackend, RecordingTransport], tokenizer: Any
) -> None:
    backend, transport = recorded
    ids = prompt_ids(tokenizer)
    result = await backend.generate(request(ids, max_new_tokens=12, ignore_eos=True))
    ((sent, answer),) = transport.exchanges
    assert sent["input_ids"] == ids
    assert sent["sampling_params"]["no_stop_trim"] is True
    assert sent["sampling_params"]["skip_special_tokens"] is False
    assert result.output_ids == answer["output_ids"] and len(result.output_ids) == 12
    assert result.output_logprobs == [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
    assert result.finish_reason == "length"
    assert result.prompt_tokens == len(ids)


async def test_greedy_is_repeatable_and_reuses_the_cache(sglang_backend: SGLangBackend, tokenizer: Any) -> None:
    ids = prompt_ids(tokenizer, "Repeat after me.")
    first = await sglang_backend.generate(request(ids, max_new_tokens=10))
    second = await sglang_backend.generate(request(ids, max_new_tokens=10))
    assert first.output_ids == second.output_ids
    assert first.output_logprobs == pytest.approx(second.output_logprobs, abs=1e-3)
    assert second.cached_tokens is not None and second.cached_tokens >= len(ids) - 1


async def test_prompt_logprobs_line_up_with_prompt_tokens(sglang_backend: SGLangBackend, tokenizer: Any) -> None:
    first_prompt = prompt_ids(tokenizer, "First question.")
    first = await sglang_backend.generate(
        GenerateRequest(
            rid=f"test-{uuid.uuid4().hex}",
            input_ids=array("i", first_prompt),
            prefix_len=0,
            sampling=SamplingParams(max_new_tokens=6, temperature=0.0),
            return_prompt_logprobs=True,
        )
    )
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(first_prompt)
    assert first.prompt_logprobs[0] is None and all(lp is not None for lp in first.prompt_logprobs[1:])

    history = first_prompt + first.output_ids
    new_prompt = [IM_END, 198, *prompt_ids(tokenizer, "Second question.")]
    full = history + new_prompt
    second = await sglang_backend.generate(
        GenerateRequest(
            rid=f"test-{uuid.uuid4().hex}",
            input_ids=array("i", full),
            prefix_len=len(history),
            sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
            return_prompt_logprobs=True,
        )
    )
    assert second.prompt_logprobs is not None and len(second.prompt_logprobs) == len(new_prompt)
    assert all(lp is not None for lp in second.prompt_logprobs)

    # Score the whole sequence from position 0, independently: the same positions get the same logprobs.
    async with httpx.AsyncClient(base_url=sglang_backend.base_url, timeout=120.0) as client:
        scored = (
            await client.post(
                "/generate",
                json={
                    "input_ids": full,
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                    "return_logprob": True,
                    "logprob_start_len": 0,
                },
            )
        ).json()
    reference = scored["meta_info"]["input_token_logprobs"]
    assert [entry[1] for entry in reference] == full
    assert second.prompt_logprobs == pytest.approx([e[0] for e in reference[len(history) :]], abs=0.05)
    assert first.prompt_logprobs[1:] == pytest.approx([e[0] for e in reference[1 : len(first_prompt)]], abs=0.05)
    # The output logprobs of the first call are the prompt logprobs of those tokens in the full sequence.
    assert first.output_logprobs == pytest.approx([e[0] for e in reference[len(first_prompt) : len(history)]], abs=0.05)


async def test_cancel_aborts_the_generation_on_the_server(sglang_backend: SGLangBackend, tokenizer: Any) -> None:
    ids = prompt_ids(tokenizer, "Write forever.")
    task = asyncio.create_task(sglang_backend.generate(request(ids, max_new_tokens=3000, ignore_eos=True)))
    deadline = time.monotonic() + 60
    while await running_requests(sglang_backend.base_url) == 0:
        assert time.monotonic() < deadline, "the long request never started"
        assert not task.done(), "the long request finished before it could be cancelled"
        await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    deadline = time.monotonic() + 30
    while (left := await running_requests(sglang_backend.base_url)) != 0:
        assert time.monotonic() < deadline, f"{left} request(s) still running 30 s after the abort"
        await asyncio.sleep(0.2)


async def test_regex_forces_a_hermes_tool_call(sglang_backend: SGLangBackend, tokenizer: Any) -> None:
    ids = prompt_ids(tokenizer, "Add 2 and 3.")
    result = await sglang_backend.generate(request(ids, max_new_tokens=64, extra={"regex": TOOL_CALL_RX}))
    text = tokenizer.decode(result.output_ids)
    assert re.fullmatch(TOOL_CALL_RX + "<\\|im_end\\|>", text), text
    assert result.output_ids[-2:] == [151658, IM_END]  # </tool_call> and <|im_end|> as single tokens
    assert result.finish_reason == "stop"


# -- a Strands agent through TitoModel --------------------------------------------------------------


def _tito_model(backend: SGLangBackend, tokenizer: Any, **kwargs: Any) -> Any:
    tito_core = pytest.importorskip("tito_core")
    if not hasattr(tito_core, "TitoModel"):
        pytest.skip("tito_core.TitoModel is not available")
    return tito_core.TitoModel(backend, tokenizer, **kwargs)


def check_requests_extend_the_trajectory(model: Any, transport: RecordingTransport) -> None:
    """Every request = the trajectory before it + its new prompt (in a session: the part the session does not
    hold yet, after the previous request); the engine ran on exactly that; every output = the server's answer."""
    trajectory = model.trajectory
    token_ids = trajectory.token_ids
    logprobs = trajectory.logprobs
    turns = trajectory.turns
    assert len(transport.exchanges) == len(turns)
    previous_end = 0
    previous_rid = None
    for turn, (sent, answer) in zip(turns, transport.exchanges, strict=True):
        assert turn.prompt_start == previous_end
        assert sent["rid"] == turn.rid
        parent = (sent.get("session_params") or {}).get("rid")
        held = turn.prompt_start if parent is not None else 0
        assert parent in (None, previous_rid)
        assert sent["input_ids"] == token_ids[held : turn.prompt_start + turn.prompt_len]
        assert answer["meta_info"]["prompt_tokens"] == turn.prompt_start + turn.prompt_len
        previous_rid = turn.rid
        out = slice(turn.output_start, turn.output_start + turn.output_len)
        assert token_ids[out] == answer["output_ids"]
        assert logprobs[out] == [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
        assert trajectory.loss_mask[out] == [1] * turn.output_len
        previous_end = turn.output_start + turn.output_len
    assert previous_end == len(token_ids)


async def test_agent_runs_real_tool_turns(recorded: tuple[SGLangBackend, RecordingTransport], tokenizer: Any) -> None:
    from strands import Agent, tool

    backend, transport = recorded
    tool_sampling = SamplingParams(max_new_tokens=64, temperature=0.0, extra={"regex": TOOL_CALL_RX})
    final_sampling = SamplingParams(max_new_tokens=32, temperature=0.0, extra={"regex": FINAL_RX})
    model = _tito_model(backend, tokenizer, sampling=tool_sampling)
    calls: list[tuple[int, int]] = []

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: First number.
            b: Second number.
        """
        calls.append((a, b))
        if len(calls) == 2:  # after two real tool turns, let the model answer
            model.update_config(sampling=final_sampling)
        return a + b

    agent = Agent(model=model, tools=[add], callback_handler=None)
    result = await agent.invoke_async("Add 2 and 3, then add the result to 4.")
    assert len(calls) == 2
    trajectory = model.trajectory
    assert [turn.stop_reason for turn in trajectory.turns] == ["tool_use", "tool_use", "end_turn"]
    assert trajectory.status == "completed"
    assert re.fullmatch(FINAL_RX, str(result).strip()), str(result)
    check_requests_extend_the_trajectory(model, transport)
    # Tool results reached the model as prompt tokens (loss 0) between the outputs.
    text = tokenizer.decode(trajectory.token_ids)
    assert text.count("<tool_response>") == 2
    assert sum(trajectory.loss_mask) == sum(turn.output_len for turn in trajectory.turns)


async def set_weight_version(url: str, version: str) -> None:
    """Relabel the server's weights (what a trainer does after pushing new ones); requests in flight are kept."""
    async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
        answer = await client.post("/update_weight_version", json={"new_version": version, "abort_all_requests": False})
        assert answer.status_code == 200 and answer.json()["success"], answer.text


async def test_a_rollout_records_weight_versions_over_every_output_token(
    recorded: tuple[SGLangBackend, RecordingTransport], sglang_url: str, tokenizer: Any
) -> None:
    """A 3-call agent rollout; the weights are relabelled "1" after the first call (by the tool)."""
    from strands import Agent, tool

    from tito_core.trajectory import Trajectory
    from tito_core.versions import VersionSpan

    backend, transport = recorded
    tool_sampling = SamplingParams(max_new_tokens=64, temperature=0.0, extra={"regex": TOOL_CALL_RX})
    model = _tito_model(backend, tokenizer, sampling=tool_sampling)
    calls: list[tuple[int, int]] = []

    @tool
    async def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: First number.
            b: Second number.
        """
        calls.append((a, b))
        if len(calls) == 1:
            await set_weight_version(sglang_url, "1")
        if len(calls) == 2:
            model.update_config(sampling=SamplingParams(max_new_tokens=32, temperature=0.0, extra={"regex": FINAL_RX}))
        return a + b

    try:
        await Agent(model=model, tools=[add], callback_handler=None).invoke_async("Add 2 and 3, then add 4.")
    finally:
        await set_weight_version(sglang_url, "default")
    trajectory = model.trajectory
    assert len(calls) == 2 and trajectory.status == "completed"
    check_requests_extend_the_trajectory(model, transport)
    turns = trajectory.turns
    versions = ["default", "1", "1"]  # the server's label until a trainer sets one, then the new label
    expected = [(VersionSpan(version=v, start=0, end=t.output_len),) for v, t in zip(versions, turns, strict=True)]
    assert [t.weight_versions for t in turns] == expected
    for turn, (_, answer) in zip(turns, transport.exchanges, strict=True):  # as the server reported them
        assert [[s.version, s.start, s.end] for s in turn.weight_versions] == [
            [s["version"], s["start"], s["end"]] for s in answer["meta_info"]["weight_versions"]
        ]
    spans = trajectory.weight_versions()
    covered = [i for span in spans for i in range(span.start, span.end)]
    assert covered == [i for i, m in enumerate(trajectory.loss_mask) if m]  # every output token exactly once
    assert trajectory.weight_version_range() == ("default", "1")
    assert Trajectory.from_json(trajectory.to_json()).turns == turns
    REPORT.append(
        "weight versions of a 3-call rollout on /generate (relabelled after call 1): "
        + "; ".join(f"call {t.index}: {[(s.version, s.start, s.end) for s in t.weight_versions]}" for t in turns)
    )


async def test_agent_greedy_twice_gives_the_same_trajectory(sglang_url: str, tokenizer: Any) -> None:
    from strands import Agent
    from strands.types.exceptions import MaxTokensReachedException

    trajectories = []
    for _ in range(2):
        backend = SGLangBackend(sglang_url, timeout=180.0)
        model = _tito_model(backend, tokenizer, sampling={"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True})
        agent = Agent(model=model, callback_handler=None)
        with pytest.raises(MaxTokensReachedException):  # the tiny model does not stop by itself
            await agent.invoke_async("Tell me a story.")
        trajectories.append(model.trajectory)
        await backend.aclose()
    first, second = trajectories
    assert first.token_ids == second.token_ids
    assert first.loss_mask == second.loss_mask
    assert first.logprobs == pytest.approx(second.logprobs, abs=1e-3)


async def test_length_truncated_turn_keeps_its_tokens(
    recorded: tuple[SGLangBackend, RecordingTransport], tokenizer: Any
) -> None:
    from strands import Agent
    from strands.types.exceptions import MaxTokensReachedException

    backend, transport = recorded
    model = _tito_model(backend, tokenizer, sampling={"max_new_tokens": 7, "temperature": 0.0, "ignore_eos": True})
    agent = Agent(model=model, callback_handler=None)
    with pytest.raises(MaxTokensReachedException):
        await agent.invoke_async("Tell me a story.")
    trajectory = model.trajectory
    assert trajectory.status == "truncated"
    (turn,) = trajectory.turns
    assert turn.finish_reason == "length" and turn.output_len == 7
    check_requests_extend_the_trajectory(model, transport)


async def test_agent_prompt_logprobs_cover_every_prompt_token(
    recorded: tuple[SGLangBackend, RecordingTransport], tokenizer: Any
) -> None:
    from strands import Agent, tool

    backend, transport = recorded
    tool_sampling = SamplingParams(max_new_tokens=64, temperature=0.0, extra={"regex": TOOL_CALL_RX})
    final_sampling = SamplingParams(max_new_tokens=32, temperature=0.0, extra={"regex": FINAL_RX})
    model = _tito_model(backend, tokenizer, sampling=tool_sampling, return_prompt_logprobs=True)

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: First number.
            b: Second number.
        """
        model.update_config(sampling=final_sampling)
        return a + b

    await Agent(model=model, tools=[add], callback_handler=None).invoke_async("Add 2 and 3.")
    trajectory = model.trajectory
    assert len(trajectory.turns) == 2
    logprobs = trajectory.logprobs
    assert logprobs[0] is None
    assert all(lp is not None for lp in logprobs[1:])
    # The second request asked for logprobs from one token before its new prompt (cache reuse).
    sent = transport.exchanges[1][0]
    assert sent["logprob_start_len"] == trajectory.turns[1].prompt_start - 1


async def test_server_side_abort_is_reported_as_abort(sglang_backend: SGLangBackend, tokenizer: Any) -> None:
    """A request aborted by someone else (``/abort_request``) ends with finish reason ``abort``."""
    ids = prompt_ids(tokenizer, "Write forever.")
    long_request = request(ids, max_new_tokens=3000, ignore_eos=True)
    task = asyncio.create_task(sglang_backend.generate(long_request))
    deadline = time.monotonic() + 60
    while await running_requests(sglang_backend.base_url) == 0:
        assert time.monotonic() < deadline and not task.done()
        await asyncio.sleep(0.2)
    await sglang_backend.abort(long_request.rid)
    async with asyncio.timeout(60):
        result = await task
    assert result.finish_reason == "abort"
    assert len(result.output_ids) < 3000
    assert result.output_logprobs is not None and len(result.output_logprobs) == len(result.output_ids)


async def test_prompt_longer_than_the_context_raises_context_length_error(
    sglang_backend: SGLangBackend,
) -> None:
    from tito_core.errors import ContextLengthError

    with pytest.raises(ContextLengthError) as info:
        await sglang_backend.generate(request([198] * 5000, max_new_tokens=4))
    assert info.value.status == 400 and info.value.backend == "sglang"


async def test_same_greedy_ids_as_vllm(sglang_backend: SGLangBackend, sglang_model_dir: Any, tokenizer: Any) -> None:
    """The same tiny model and greedy prompt give the same ids on SGLang and vLLM (when both ran here), but where
    the two tokens are a near-tie under a bf16 forward pass (which one a kernel picks depends on the CPU)."""
    from ..cross_engine import greedy_ids, record_and_compare

    prompt, output = await greedy_ids(sglang_backend, tokenizer)
    reason = record_and_compare("sglang", sglang_model_dir, prompt, output)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("parser", ["hermes", "qwen_xml"])
async def test_tool_choice_forces_a_call_with_the_parsers_grammar(
    sglang_backend: SGLangBackend, tokenizer: Any, parser: str
) -> None:
    largest, mean = await forced_first_call(sglang_backend, tokenizer, parser=parser, answer_extra={"regex": FINAL_RX})
    REPORT.append(f"forced {parser} call re-scored without its grammar: max {largest:.2f}, mean {mean:.2f} nats")


async def test_structured_output_is_forced(sglang_backend: SGLangBackend, tokenizer: Any) -> None:
    await forced_structured_output(sglang_backend, tokenizer)


async def test_a_weight_update_in_keep_mode_loses_no_rollout_in_flight(sglang_url: str, tokenizer: Any) -> None:
    """Eight 3-call agents; ``weight_update`` pauses SGLang in place mid-run, relabels, continues."""
    from ..weight_updates import check_versions, keep_mode_update

    backend = SGLangBackend(sglang_url, timeout=300.0)
    try:
        trajectories = await keep_mode_update(backend, tokenizer, lambda rx: {"regex": rx})
    finally:
        await backend.aclose()
    REPORT.append("weight update in keep mode, 8 rollouts in flight: " + check_versions(trajectories))


@pytest.mark.parametrize("mode", ["recompute", "keep"])
async def test_new_weights_mid_generation_each_token_logprob_is_its_spans_checkpoints(
    sglang_url: str, sglang_model_dir: Any, tokenizer: Any, mode: str
) -> None:
    """Eight 200-token generations in flight; ``weight_update`` loads another checkpoint (``/update_weights_from_disk``)
    labelled "1". Each recorded logprob is compared with the logprob of that token under each checkpoint, by a
    transformers forward pass of the checkpoint's files (independent of the engine) and by the engine's own
    re-scoring after loading it again (the whole sequence prefilled, no cached prefix).

    ``recompute`` (SGLang's ``retract``): every token matches the checkpoint its span names, within bf16 noise, and
    not the other one. ``keep`` (``in_place``): the tokens before the update match; those after it were computed
    over the KV cache of the old weights: nearer the new checkpoint than the old, not exact, and the difference is
    reported (the reason ``recompute`` exists)."""
    from tito_core import weight_update
    from tito_testing.tiny_model import build_tiny_qwen3

    from ..reference import Reference
    from ..weight_updates import BF16_MAX, BF16_MEAN, NAMES, OTHER_MEAN, Figures

    second = build_tiny_qwen3(seed=1)
    checkpoints = {"1": second, "default": sglang_model_dir}
    backend = SGLangBackend(sglang_url, timeout=300.0)

    async def load(path: Any, version: str, *, flush: bool) -> None:
        async with httpx.AsyncClient(base_url=sglang_url, timeout=120.0) as client:
            body = {"model_path": str(path), "weight_version": version, "abort_all_requests": False,
                    "flush_cache": flush}  # fmt: skip
            answer = await client.post("/update_weights_from_disk", json=body)
            assert answer.status_code == 200 and answer.json().get("success"), answer.text

    prompts = [prompt_ids(tokenizer, f"Tell me a story about the number {n}.") for n in range(8)]
    sampling = SamplingParams(max_new_tokens=200, temperature=1.0, ignore_eos=True)
    requests = [
        GenerateRequest(
            rid=uuid.uuid4().hex, input_ids=p, prefix_len=0, sampling=msgspec.structs.replace(sampling, seed=n)
        )
        for n, p in enumerate(prompts)
    ]
    tasks = [asyncio.ensure_future(backend.generate(r)) for r in requests]
    figures = Figures()
    try:
        await asyncio.sleep(2.5)  # the generations are under way (here: ~10 tokens/s each, so ~25 of 200 done)
        async with weight_update([backend], version="1", mode=mode):  # type: ignore[arg-type]
            await load(second, "1", flush=mode == "recompute")
        results = await asyncio.gather(*tasks)
        straddled = [r for r in results if r.weight_versions and len(r.weight_versions) == 2]
        assert len(straddled) >= 2, [r.weight_versions for r in results]

        async def rescore(ids: list[int]) -> list[float | None]:
            again = GenerateRequest(rid=uuid.uuid4().hex, input_ids=ids, prefix_len=1,
                                    sampling=SamplingParams(max_new_tokens=1), return_prompt_logprobs=True)  # fmt: skip
            scored = await backend.generate(again)
            assert scored.prompt_logprobs is not None and len(scored.prompt_logprobs) == len(ids) - 1
            return list(scored.prompt_logprobs)

        reference = Reference()
        for weights in ("1", "default"):
            await load(checkpoints[weights], weights, flush=True)
            for request, result in zip(requests, results, strict=True):
                ids = [*request.input_ids, *result.output_ids]
                scores = {"engine": await rescore(ids), "independent": reference.score(checkpoints[weights], ids)}
                first = len(request.input_ids) - 1  # the score of output token j is at first + j
                for scorer, scored in scores.items():
                    for span in result.weight_versions or ():
                        recorded = (result.output_logprobs or [])[span.start : span.end]
                        again = scored[first + span.start : first + span.end]
                        got = [abs(a - (b or 0.0)) for a, b in zip(recorded, again, strict=True)]
                        figures.add(weights, span.version, scorer, got)
    finally:
        for task in tasks:
            task.cancel()
        await load(sglang_model_dir, "default", flush=True)
        await backend.aclose()
    assert sum(figures.count(v) for v in ("default", "1")) == sum(len(r.output_ids) for r in results)
    for scorer in ("independent", "engine"):  # the tokens before the update: the first checkpoint's
        assert figures.mean("default", "default", scorer) < BF16_MEAN, figures.describe(NAMES)
        assert figures.max("default", "default", scorer) < BF16_MAX, figures.describe(NAMES)
    assert figures.mean("1", "default") > OTHER_MEAN, figures.describe(NAMES)
    if mode == "recompute":  # the new tokens: the second checkpoint's, by its own forward pass and the engine's
        for scorer in ("independent", "engine"):
            assert figures.mean("1", "1", scorer) < BF16_MEAN, figures.describe(NAMES)
            assert figures.max("1", "1", scorer) < BF16_MAX, figures.describe(NAMES)
        assert figures.mean("default", "1") > OTHER_MEAN, figures.describe(NAMES)
    else:  # the new weights over a cache of the old ones
        assert figures.mean("1", "1") < figures.mean("default", "1"), figures.describe(NAMES)
    REPORT.append(
        f"new weights mid-generation ({mode}): {len(straddled)} of 8 generations straddled the update, e.g. "
        f"{[(s.version, s.start, s.end) for s in straddled[0].weight_versions or ()]}; |recorded logprob - "
        f"re-scored|: {figures.describe(NAMES)}"
    )


async def test_new_weights_mid_rollout_in_abort_mode_continue_the_cut_calls_exactly(
    sglang_url: str, sglang_model_dir: Any, tokenizer: Any
) -> None:
    """Eight 2-call rollouts; ``weight_update(mode="abort")`` cuts the calls in flight, another checkpoint is loaded
    (``/update_weights_from_disk``, cache flushed) and each cut call goes on from its tokens: every token has the
    logprob of the checkpoint its span names, by a transformers forward pass of that checkpoint and by the engine's
    own re-scoring (see ``weight_updates.new_weights_mid_rollout``)."""
    from tito_testing.tiny_model import build_tiny_qwen3

    from ..weight_updates import new_weights_mid_rollout

    second = build_tiny_qwen3(seed=1)
    backend = SGLangBackend(sglang_url, timeout=300.0)

    async def load(version: str) -> None:
        path = second if version == "1" else sglang_model_dir
        async with httpx.AsyncClient(base_url=sglang_url, timeout=120.0) as client:
            body = {"model_path": str(path), "weight_version": version, "abort_all_requests": False,
                    "flush_cache": True}  # fmt: skip
            answer = await client.post("/update_weights_from_disk", json=body)
            assert answer.status_code == 200 and answer.json().get("success"), answer.text

    try:
        checkpoints = {"1": second, "default": sglang_model_dir}
        line, _ = await new_weights_mid_rollout(backend, tokenizer, load, checkpoints=checkpoints, mode="abort")
        REPORT.append(line)
    finally:
        await load("default")
        await backend.set_weight_version("default")
        await backend.aclose()


async def test_the_weight_probe_passes_the_pushed_checkpoint_and_catches_a_wrong_or_half_loaded_one(
    sglang_url: str, sglang_model_dir: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The trainer pushes checkpoint B with a probe it scored itself (a transformers forward pass of B's files).
    ``weight_update(..., probe=...)`` passes when SGLang loaded B; when the engine loaded A instead (a sync that
    did not happen) or B with layer 1 of A (half an update), it raises ``WeightUpdateError`` naming the engine
    and the difference, and leaves the engine paused: a generation sent then waits, and goes on once resumed."""
    from tito_core import weight_update
    from tito_core.errors import WeightUpdateError
    from tito_testing.tiny_model import build_tiny_qwen3

    from ..reference import Reference, mixed_checkpoint, trainer_probe
    from ..weight_updates import BF16_MEAN

    second = build_tiny_qwen3(seed=1)
    half = mixed_checkpoint(second, sglang_model_dir, "model.layers.1.", tmp_path_factory.mktemp("half") / "ckpt")
    probe = trainer_probe(Reference(), second, tokenizer)  # the trainer's own logprobs under B
    backend = SGLangBackend(sglang_url, timeout=300.0)

    async def load(path: Any) -> None:
        async with httpx.AsyncClient(base_url=sglang_url, timeout=120.0) as client:
            body = {"model_path": str(path), "abort_all_requests": False, "flush_cache": True}
            answer = await client.post("/update_weights_from_disk", json=body)
            assert answer.status_code == 200 and answer.json().get("success"), answer.text

    lines = []
    try:
        async with weight_update([backend], version="1", probe=probe) as update:
            await load(second)
        (score,) = update.probes
        assert score.passed and score.mean_diff < BF16_MEAN, score
        lines.append(f"B pushed, B loaded: passed, {score.describe()}")
        for name, wrong in (("A (the old checkpoint)", sglang_model_dir), ("B with layer 1 of A", half)):
            # the last request (the passing probe, or the held one) has answered, but a busy machine can leave it in
            # SGLang's running batch a moment longer, and the keep-mode pause below freezes it there: the load's
            # flush is then refused (seen in a fresh-clone run). Each update starts on an engine that settled.
            assert await asyncio.to_thread(left_busy, sglang_url, "sglang") is None
            with pytest.raises(WeightUpdateError) as caught:
                async with weight_update([backend], version="2", probe=probe):
                    await load(wrong)
            message = str(caught.value)
            assert sglang_url in message and "paused again (recompute)" in message, message
            assert caught.value.paused == [sglang_url] and not caught.value.probes[0].passed
            lines.append(f"B pushed, {name} loaded: {message}")
            # nothing of tito's probe is left in the paused engine: the next update's flush can run
            flushed = await asyncio.to_thread(httpx.post, sglang_url + "/flush_cache", timeout=60.0)
            assert flushed.status_code == 200, flushed.text
            held = asyncio.ensure_future(backend.generate(request(prompt_ids(tokenizer), max_new_tokens=4)))
            # SGLang holds a request sent while paused in its tokenizer manager, where no endpoint shows it: that
            # nothing is generated can only be seen over a time (a slow machine only makes this pass more surely)
            await asyncio.sleep(2.0)
            assert not held.done(), "the engine generated although its probe failed"
            await backend.resume_generation()
            assert len((await asyncio.wait_for(held, 60)).output_ids) == 4
            assert await asyncio.to_thread(left_busy, sglang_url, "sglang") is None  # the held request settled
    finally:
        await backend.resume_generation()
        await load(sglang_model_dir)
        await backend.set_weight_version("default")
        await backend.aclose()
    REPORT.append("weight probe on SGLang: " + " | ".join(lines))
