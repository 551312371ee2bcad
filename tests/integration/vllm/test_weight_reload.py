"""New weights loaded into a real vLLM 0.32 server (CPU) mid-rollout, checked against the checkpoints' files.

On some CPUs vLLM's CPU build does not reload a checkpoint with **tied** embeddings from disk: the output layer
keeps the old weights (docs/async.md, and
``test_vllm_server.py::test_a_reload_from_disk_of_a_tied_checkpoint_is_judged_by_the_weight_probe``). This module
starts its own server on the tiny model with its output layer written out (``tie_word_embeddings`` false,
``lm_head.weight`` a copy of the embeddings: the same function, other files), which vLLM reloads exactly, and
checks every token generated around an update against a transformers forward pass of the checkpoint its span
names.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tito_core import weight_update
from tito_core.errors import WeightUpdateError
from tito_vllm import VLLMBackend

from ..reference import Reference, mixed_checkpoint, trainer_probe, untied_checkpoint
from ..weight_updates import BF16_MAX, BF16_MEAN, OTHER_MEAN, new_weights_mid_rollout
from .conftest import REPORT, SERVER_PYTHON, serve

pytestmark = pytest.mark.integration


class Untied:
    """The server of this module and its checkpoints: A (the tiny model), B (seed 1), both untied."""

    def __init__(self, url: str, a: Path, b: Path) -> None:
        self.url, self.a, self.b = url, a, b

    async def load(self, path: Path | str) -> None:
        """``/collective_rpc`` ``reload_weights`` from ``path``, then ``/reset_prefix_cache`` (refused, and not
        needed, while requests are frozen: no KV of the other weights is reused after it)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=120.0) as client:
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
            (await client.post("/collective_rpc", json=body)).raise_for_status()
            reset = await client.post("/reset_prefix_cache")
            paused = (await client.get("/is_paused")).json().get("is_paused")
            assert paused or reset.json().get("success"), reset.text

    async def paused(self) -> bool:
        async with httpx.AsyncClient(base_url=self.url, timeout=30.0) as client:
            return bool((await client.get("/is_paused")).json().get("is_paused"))


@pytest.fixture(scope="module")
def untied(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Untied]:
    built = subprocess.run([SERVER_PYTHON, "-m", "tito_testing.tiny_model", "--seed", "1"],
                           capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    root = tmp_path_factory.mktemp("untied")
    a = untied_checkpoint(tiny_model_dir, root / "a")
    b = untied_checkpoint(built.stdout.strip().splitlines()[-1], root / "b")
    # two sequences at a time (the suite's server runs eight): the rollouts' calls queue at the engine, so an
    # update that comes once two rollouts made a call meets calls running and waiting there, however late a
    # busy machine lets it come (with eight, every call could end before it: the update then met none)
    for url in serve(a, "vLLM server (untied tiny model)", flags=["--max-num-seqs", "2"]):
        yield Untied(url, a, b)


@pytest.fixture(scope="module")
def qwen3_tokenizer() -> Any:
    from tito_testing.tokenizers import load_qwen_tokenizer

    return load_qwen_tokenizer("qwen3")


async def test_a_reload_from_disk_serves_the_checkpoint_it_names(untied: Untied, qwen3_tokenizer: Any) -> None:
    """After ``reload_weights`` with B's path, vLLM's prompt logprobs of a fixed sequence (one prefill,
    ``VLLMBackend.score``) match a transformers forward pass of B's files within bf16 noise, and A's again after
    reloading A; the other checkpoint is far."""
    ids = list(qwen3_tokenizer.encode("The engine reloads its weights from disk; a forward pass of the files says."))
    reference = Reference()
    expected = {"A": reference.score(untied.a, ids), "B": reference.score(untied.b, ids)}
    backend = VLLMBackend(untied.url, endpoint="generate", timeout=300.0)

    def diffs(got: list[float | None], name: str) -> tuple[float, float]:
        d = [abs((a or 0.0) - b) for a, b in zip(got, expected[name], strict=True)]
        return sum(d) / len(d), max(d)

    figures = []
    try:
        for name, other in (("B", "A"), ("A", "B")):
            await untied.load(untied.b if name == "B" else untied.a)
            got = await backend.score(ids)
            (mean, most), (far, _) = diffs(got, name), diffs(got, other)
            figures.append(f"after reloading {name}: vs {name} mean {mean:.1e} max {most:.1e}, vs {other} {far:.2f}")
            assert mean < BF16_MEAN and most < BF16_MAX and far > OTHER_MEAN, figures
    finally:
        await untied.load(untied.a)
        await backend.aclose()
    REPORT.append(f"reload from disk (untied), {len(ids)}-token sequence: " + "; ".join(figures))


@pytest.mark.parametrize("mode", ["keep", "abort"])
async def test_new_weights_mid_rollout_each_token_logprob_is_its_spans_checkpoints(
    untied: Untied, qwen3_tokenizer: Any, mode: str
) -> None:
    """Eight 2-call rollouts; ``weight_update`` pauses vLLM, checkpoint B is loaded from disk and each token's
    recorded logprob is compared with a transformers forward pass of the checkpoint its span names, and with the
    engine's own re-scoring (``weight_updates.new_weights_mid_rollout``): ``abort`` continues the cut calls under
    B, exactly; ``keep`` resumes them over the old KV cache."""
    backend = VLLMBackend(untied.url, endpoint="generate", timeout=300.0)

    async def load(version: str) -> None:
        await untied.load(untied.b if version == "1" else untied.a)

    try:
        checkpoints = {"1": untied.b, "default": untied.a}
        line, _ = await new_weights_mid_rollout(
            backend,
            qwen3_tokenizer,
            load,
            checkpoints=checkpoints,
            mode=mode,  # type: ignore[arg-type]
            hold_later_calls=True,  # this module's server runs two calls at a time: the first calls queue
        )
        REPORT.append(line)
    finally:
        await load("default")
        await backend.set_weight_version("default")
        await backend.aclose()


async def test_the_weight_probe_passes_the_pushed_checkpoint_and_catches_a_wrong_or_half_loaded_one(
    untied: Untied, qwen3_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The trainer pushes checkpoint B with a probe it scored itself (a transformers forward pass of B's files).
    ``weight_update(..., probe=...)`` passes when vLLM loaded B, and raises ``WeightUpdateError`` naming the engine
    and the difference when it loaded A (a sync that did not happen) or B with layer 1 of A (half an update),
    leaving the engine paused."""
    half = mixed_checkpoint(untied.b, untied.a, "model.layers.1.", tmp_path_factory.mktemp("half") / "ckpt")
    probe = trainer_probe(Reference(), untied.b, qwen3_tokenizer)  # the trainer's own logprobs under B
    backend = VLLMBackend(untied.url, endpoint="generate", timeout=300.0)
    lines = []
    try:
        async with weight_update([backend], version="1", probe=probe) as update:
            await untied.load(untied.b)
        (score,) = update.probes
        assert score.passed and score.mean_diff < BF16_MEAN, score
        assert not await untied.paused()
        lines.append(f"B pushed, B loaded: passed, {score.describe()}")
        for name, wrong in (("A (the old checkpoint)", untied.a), ("B with layer 1 of A", half)):
            with pytest.raises(WeightUpdateError) as caught:
                async with weight_update([backend], version="2", probe=probe):
                    await untied.load(wrong)
            message = str(caught.value)
            assert untied.url in message and "paused again (keep)" in message, message  # vLLM has no recompute pause
            assert caught.value.paused == [untied.url] and not caught.value.probes[0].passed
            assert await untied.paused()
            lines.append(f"B pushed, {name} loaded: {message}")
            await backend.resume_generation()
    finally:
        await backend.resume_generation()
        await untied.load(untied.a)
        await backend.set_weight_version("default")
        await backend.aclose()
    REPORT.append("weight probe on vLLM: " + " | ".join(lines))
