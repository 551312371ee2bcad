"""The embedded backend's own behaviour on the tiny random Qwen3: sampling, logprobs, batching, cancellation.

Exact comparisons run in float32 (bfloat16 rounding differs between a row alone and a row in a batch).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.errors import BackendError, ContextLengthError
from tito_core.versions import VersionSpan
from tito_transformers import TransformersBackend

IM_END = 151645


@pytest.fixture(scope="module")
def fp32(tiny_model_dir: Path) -> Iterator[TransformersBackend]:
    backend = TransformersBackend(tiny_model_dir, dtype="float32", max_context_length=256)
    yield backend
    backend.close()


def request(ids: list[int], prefix_len: int = 0, prompt_logprobs: bool = False, **sampling: Any) -> GenerateRequest:
    return GenerateRequest(
        rid=uuid.uuid4().hex,
        input_ids=ids,
        prefix_len=prefix_len,
        sampling=SamplingParams(**sampling),
        return_prompt_logprobs=prompt_logprobs,
    )


def prompts(tokenizer: Any) -> list[list[int]]:
    texts = ["Hello there, how are you?", "One", "Count from one to ten, please, slowly and clearly.", "Why is the sky"]
    return [tokenizer.encode(text) for text in texts]


def close(a: list[float] | None, b: list[float] | None, tol: float = 1e-4) -> bool:
    assert a is not None and b is not None and len(a) == len(b)
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


def reference_processed(model: Any, prompt: list[int], output: list[int], temperature: float, top_p: float) -> list:
    """Independent re-computation of processed logprobs: full forward, scale, nucleus filter, renormalise."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([[*prompt, *output]])).logits[0, len(prompt) - 1 : -1].float() / temperature
    values = []
    for row, token in zip(logits, output, strict=True):
        probs = torch.softmax(row, -1)
        ordered = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(ordered.values, -1) - ordered.values
        kept = ordered.indices[mass_before <= top_p]
        assert token in kept.tolist()
        values.append(float(row[token] - torch.logsumexp(row[kept], -1)))
    return values


def test_registered_by_name(tiny_model_dir: Path) -> None:
    from tito_core.plugins import get_backend

    backend = get_backend("transformers", model_path=str(tiny_model_dir), max_batch_size=2)
    assert isinstance(backend, TransformersBackend) and backend.max_batch_size == 2
    backend.close()


async def test_batched_greedy_equals_single_request_greedy(fp32, tokenizer, batch_sizes, decode_together) -> None:
    ids = prompts(tokenizer)
    alone = [await fp32.generate(request(p, max_new_tokens=12, temperature=0, ignore_eos=True)) for p in ids]
    assert max(batch_sizes) == 1
    with decode_together(fp32, len(ids)):
        together = await asyncio.gather(
            *(fp32.generate(request(p, max_new_tokens=12, temperature=0, ignore_eos=True)) for p in ids)
        )
    assert max(batch_sizes) == len(ids), "requests sent together were not decoded together"
    for single, batched in zip(alone, together, strict=True):
        assert batched.output_ids == single.output_ids
        assert close(batched.output_logprobs, single.output_logprobs)


async def test_requests_joining_a_running_batch_get_the_same_tokens(fp32, tokenizer, batch_sizes, step_gate) -> None:
    """A request that arrives mid-generation joins the batch (left-padded cache) without changing anyone's output."""
    ids = prompts(tokenizer)
    seeded = {"temperature": 1.0, "seed": 7, "max_new_tokens": 40, "ignore_eos": True}
    alone = [await fp32.generate(request(p, **seeded)) for p in ids]
    batch_sizes.clear()
    step_gate.close()  # the first request is prefilled, then held before its first decoding step
    first = asyncio.create_task(fp32.generate(request(ids[0], **seeded)))
    assert await asyncio.to_thread(step_gate.held.wait, 120)
    rest = [asyncio.create_task(fp32.generate(request(p, **seeded))) for p in ids[1:]]
    while len(fp32._queue) < len(rest):  # queued behind the running row (the worker is held)
        await asyncio.sleep(0.001)
    step_gate.open.set()
    staggered = [await first, *await asyncio.gather(*rest)]
    assert batch_sizes[0] == 1 and max(batch_sizes) == len(ids)
    for single, batched in zip(alone, staggered, strict=True):
        assert batched.output_ids == single.output_ids, "seeded sampling changed by batching"
        assert close(batched.output_logprobs, single.output_logprobs)


async def test_seed_makes_sampling_reproducible(fp32, tokenizer) -> None:
    ids = prompts(tokenizer)[0]
    sample = {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}
    first = await fp32.generate(request(ids, seed=1, **sample))
    again = await fp32.generate(request(ids, seed=1, **sample))
    other = await fp32.generate(request(ids, seed=2, **sample))
    assert first.output_ids == again.output_ids
    assert first.output_ids != other.output_ids


async def test_eos_from_generation_config_stops_unless_ignored(fp32, tokenizer) -> None:
    # the tiny random model's greedy choice repeats the last prompt token: ending on <|im_end|> makes it emit EOS
    ids = [*tokenizer.encode("Hi"), IM_END]
    stopped = await fp32.generate(request(ids, temperature=0, max_new_tokens=5))
    assert stopped.output_ids == [IM_END] and stopped.finish_reason == "stop" and stopped.matched_stop == IM_END
    ignored = await fp32.generate(request(ids, temperature=0, max_new_tokens=5, ignore_eos=True))
    assert ignored.output_ids == [IM_END] * 5 and ignored.finish_reason == "length"
    assert fp32.eos_token_ids == {151643, IM_END}


async def test_stop_string_ends_generation_and_keeps_its_tokens(fp32, tokenizer) -> None:
    ids = prompts(tokenizer)[0]
    free = await fp32.generate(request(ids, temperature=0, max_new_tokens=6, ignore_eos=True))
    text = tokenizer.decode(free.output_ids[:2])
    stopped = await fp32.generate(request(ids, temperature=0, max_new_tokens=6, ignore_eos=True, stop=(text,)))
    assert stopped.output_ids == free.output_ids[:2]
    assert stopped.finish_reason == "stop" and stopped.matched_stop == text


async def test_prompt_logprobs_rescore_output_logprobs(fp32, tokenizer) -> None:
    """Raw output logprobs are the model's distribution: scoring the same ids as a prompt gives the same numbers."""
    ids = prompts(tokenizer)[2]
    out = await fp32.generate(request(ids, temperature=1.0, seed=3, max_new_tokens=10, ignore_eos=True))
    scored = await fp32.generate(
        request([*ids, *out.output_ids], prefix_len=len(ids), prompt_logprobs=True, max_new_tokens=0)
    )
    assert scored.output_ids == [] and scored.finish_reason == "length"
    assert close(scored.prompt_logprobs, out.output_logprobs)
    whole = await fp32.generate(request(ids, prompt_logprobs=True, max_new_tokens=0))
    assert whole.prompt_logprobs is not None and len(whole.prompt_logprobs) == len(ids)
    assert whole.prompt_logprobs[0] is None and all(v is not None and v < 0 for v in whole.prompt_logprobs[1:])


async def test_processed_logprobs_are_the_sampling_distribution(tiny_model_dir, tokenizer) -> None:
    processed = TransformersBackend(tiny_model_dir, dtype="float32", logprobs_mode="processed")
    raw = TransformersBackend(tiny_model_dir, dtype="float32")
    try:
        ids = prompts(tokenizer)[0]
        sample = {"seed": 5, "max_new_tokens": 6, "ignore_eos": True}
        # top_k=1 leaves one candidate: the sampler was certain
        certain = await processed.generate(request(ids, temperature=0.7, top_k=1, **sample))
        assert certain.output_logprobs == [0.0] * 6
        # temperature 1, no filter: the sampling distribution is the model's
        a = await processed.generate(request(ids, temperature=1.0, **sample))
        b = await raw.generate(request(ids, temperature=1.0, **sample))
        assert a.output_ids == b.output_ids and close(a.output_logprobs, b.output_logprobs)
        # temperature and top-p: the logprob under the renormalised, filtered, scaled distribution
        cold = await processed.generate(request(ids, temperature=0.5, top_p=0.5, **sample))
        assert close(cold.output_logprobs, reference_processed(raw.model, ids, cold.output_ids, 0.5, 0.5))
    finally:
        processed.close()
        raw.close()


async def test_top_k_and_top_p_restrict_the_candidates(fp32, tokenizer) -> None:
    ids = prompts(tokenizer)[1]
    greedy = await fp32.generate(request(ids, temperature=0, max_new_tokens=1))
    for seed in range(5):
        narrowed = await fp32.generate(request(ids, temperature=5.0, top_k=1, seed=seed, max_new_tokens=1))
        assert narrowed.output_ids == greedy.output_ids
        nucleus = await fp32.generate(request(ids, temperature=1.0, top_p=1e-6, seed=seed, max_new_tokens=1))
        assert nucleus.output_ids == greedy.output_ids


async def test_max_batch_size_bounds_the_batch(tiny_model_dir, tokenizer, batch_sizes) -> None:
    backend = TransformersBackend(tiny_model_dir, max_batch_size=2, batch_wait_ms=120_000)  # waits for a full batch
    try:
        ids = prompts(tokenizer)
        results = await asyncio.gather(
            *(backend.generate(request(p, temperature=0, max_new_tokens=5, ignore_eos=True)) for p in ids * 2)
        )
        assert all(len(r.output_ids) == 5 for r in results)
        assert max(batch_sizes) == 2
    finally:
        backend.close()


async def test_cancel_frees_the_slot_at_the_next_step(tiny_model_dir, tokenizer, batch_sizes, step_gate) -> None:
    backend = TransformersBackend(tiny_model_dir, max_batch_size=1)
    try:
        ids = prompts(tokenizer)[0]
        step_gate.close()  # held before its first decoding step: it cannot end before the cancel
        long = asyncio.create_task(backend.generate(request(ids, temperature=0, max_new_tokens=2000)))
        assert await asyncio.to_thread(step_gate.held.wait, 120)
        long.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long
        steps = len(batch_sizes)
        step_gate.open.set()
        # the only slot is free again: the next request runs, long before the cancelled one could have ended
        async with asyncio.timeout(30):
            result = await backend.generate(request(ids, temperature=0, max_new_tokens=3, ignore_eos=True))
        assert len(result.output_ids) == 3
        assert len(batch_sizes) - steps <= 10
    finally:
        backend.close()


async def test_context_window(fp32, tokenizer) -> None:
    assert await fp32.max_context_length() == 256
    ids = prompts(tokenizer)[0]
    with pytest.raises(ContextLengthError):
        await fp32.generate(request(ids * 100, max_new_tokens=1))
    near = (ids * 300)[:250]
    result = await fp32.generate(request(near, temperature=0, ignore_eos=True))
    assert result.finish_reason == "length" and len(result.output_ids) == 6


async def test_config_context_window_and_invalid_requests(tiny_backend, tokenizer) -> None:
    assert await tiny_backend.max_context_length() == 4096  # max_position_embeddings of the tiny model
    ids = prompts(tokenizer)[0]
    with pytest.raises(ValueError, match="extra"):  # `regex` is the one extra it reads (test_grammar.py)
        await tiny_backend.generate(request(ids, extra={"min_p": 0.1}))
    with pytest.raises(ValueError, match="vocabulary"):
        await tiny_backend.generate(request([10**7]))
    with pytest.raises(ValueError, match="prefix_len"):
        await tiny_backend.generate(request(ids, prefix_len=len(ids) + 1))


async def test_closed_backend_refuses_requests(tiny_model_dir, tokenizer, batch_sizes) -> None:
    backend = TransformersBackend(tiny_model_dir)
    ids = prompts(tokenizer)[0]
    running = asyncio.create_task(backend.generate(request(ids, max_new_tokens=2000, ignore_eos=True)))
    async with asyncio.timeout(120):  # a hang guard: until it decodes (closed mid-generation, not in the queue)
        while not batch_sizes:
            await asyncio.sleep(0.01)
    await backend.aclose()
    with pytest.raises(BackendError, match="closed"):
        await running
    with pytest.raises(BackendError, match="closed"):
        await backend.generate(request(ids))


async def test_models_whose_cache_cannot_be_stacked_run_one_request_at_a_time(
    tiny_model_dir, tokenizer, batch_sizes
) -> None:
    backend = TransformersBackend(tiny_model_dir, dtype="float32")
    backend._mergeable = False  # as for sliding-window or hybrid caches
    try:
        ids = prompts(tokenizer)
        results = await asyncio.gather(
            *(backend.generate(request(p, temperature=0, max_new_tokens=4, ignore_eos=True)) for p in ids)
        )
        assert all(len(r.output_ids) == 4 for r in results)
        assert set(batch_sizes) == {1}
    finally:
        backend.close()


def test_exit_with_requests_in_flight_stops_the_worker_cleanly(tiny_model_dir: Path, tmp_path: Path) -> None:
    """An exception ending asyncio.run while the worker is mid-generation must not abort the process."""
    import subprocess
    import sys

    script = tmp_path / "exit_in_flight.py"
    script.write_text(
        f"""
import asyncio
from tito_core.backend import GenerateRequest, SamplingParams
from tito_transformers import TransformersBackend

backend = TransformersBackend({str(tiny_model_dir)!r})

async def generate(i):
    sampling = SamplingParams(max_new_tokens=4000, ignore_eos=True)
    return await backend.generate(GenerateRequest(rid=str(i), input_ids=[1, 2, 3], prefix_len=0, sampling=sampling))

async def fail():
    await asyncio.sleep(2)
    raise RuntimeError("boom")

async def main():
    await asyncio.gather(generate(1), generate(2), fail())

asyncio.run(main())
"""
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr[-2000:]  # the script's own exception, not SIGABRT (-6)
    assert "RuntimeError: boom" in done.stderr
    assert "terminate called" not in done.stderr


async def test_weight_version_labels_every_sampled_token_when_the_caller_sets_it(fp32, tokenizer) -> None:
    ids = prompts(tokenizer)[1]
    greedy = {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}
    assert fp32.weight_version is None
    assert (await fp32.generate(request(ids, **greedy))).weight_versions is None  # unlabelled: no guess
    try:
        fp32.weight_version = 3  # a trainer's step, recorded as text
        result = await fp32.generate(request(ids, **greedy))
        assert result.weight_versions == (VersionSpan(version="3", start=0, end=5),)
        fp32.weight_version = "ckpt-a"
        assert (await fp32.generate(request(ids, **greedy))).weight_versions == (
            VersionSpan(version="ckpt-a", start=0, end=5),
        )
    finally:
        fp32.weight_version = None
    for bad in (True, "", 1.5):
        with pytest.raises(ValueError, match="weight_version"):
            fp32.weight_version = bad


class Updating(TransformersBackend):
    """The version read for token k is ``versions[k]`` (a weight update between two decoding steps)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.versions: list[str | None] = []
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def weight_version(self) -> str | None:
        return self.versions.pop(0) if self.versions else None

    @weight_version.setter
    def weight_version(self, value: Any) -> None:
        pass


async def test_an_update_between_steps_splits_the_output_into_spans(tiny_model_dir, tokenizer) -> None:
    backend = Updating(tiny_model_dir, dtype="float32")
    try:
        ids = prompts(tokenizer)[1]
        greedy = {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True}
        backend.versions = ["1", "1", "2", "2", "2"]
        result = await backend.generate(request(ids, **greedy))
        assert result.weight_versions == (
            VersionSpan(version="1", start=0, end=2),
            VersionSpan(version="2", start=2, end=5),
        )
        backend.versions = ["1", None, "2", "2", "2"]  # a token sampled without a label: none reported
        assert (await backend.generate(request(ids, **greedy))).weight_versions is None
    finally:
        backend.close()


async def test_generation_passes_the_cache_under_its_current_name(
    fp32: TransformersBackend, tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` and warns on the old name (the demo printed it
    twice: a FutureWarning and a log line)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught, caplog.at_level("WARNING"):
        warnings.simplefilter("always")
        results = await asyncio.gather(*(fp32.generate(request(ids, max_new_tokens=3)) for ids in prompts(tokenizer)))
    assert all(len(r.output_ids) == 3 for r in results)  # prefill and decode steps both ran
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "past_key_values" in m or "cache_params" in m], said
