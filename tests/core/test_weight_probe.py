"""The weight probe of ``weight_update(..., probe=WeightProbe(...))``: after the block, every engine scores the
trainer's token sequence; one whose logprobs are not the trainer's is paused again and named, with the mean and
max difference, in a ``WeightUpdateError``. Driven on an in-process fake engine that records every call and serves
"weights" a test chooses (a logprob per token)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest

from tito_core.backend import Backend, GenerateRequest, GenerateResult, PauseMode
from tito_core.errors import ConfigError, WeightUpdateError
from tito_core.weights import WeightProbe, wait_for_resume, weight_update

IDS = (151644, 872, 198, 9707, 151645, 198)
TRAINER = (-1.0, -2.0, -0.5, -3.0, -0.25)  # the trainer's logprobs of IDS[1:] under the new weights


class FakeEngine(Backend):
    """Pauses, resumes, labels and scores; ``weights`` is what ``score`` answers (a logprob per scored token)."""

    name: ClassVar[str] = "fake"
    supports_pause: ClassVar[bool] = True
    supports_score: ClassVar[bool] = True

    def __init__(self, url: str, weights: Sequence[float | None] = TRAINER, *, recompute: bool = True) -> None:
        self.base_url = url
        self.recompute = recompute  # False: an engine without a recompute pause (vLLM)
        self.weights: list[float | None] = list(weights)
        self.events: list[str] = []
        self.paused = False
        self.score_error: Exception | None = None
        self.pause_error: Exception | None = None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        raise AssertionError("the probe never generates")

    async def pause_generation(self, mode: PauseMode = "keep") -> None:
        if mode == "recompute" and not self.recompute:
            raise ConfigError("no recompute pause")
        self.events.append(f"pause:{mode}")
        if self.pause_error is not None and sum(e.startswith("pause:") for e in self.events) > 1:
            raise self.pause_error
        self.paused = True

    async def resume_generation(self) -> None:
        self.events.append("resume")
        self.paused = False

    async def set_weight_version(self, version: str) -> None:
        self.events.append(f"version:{version}")

    async def score(self, token_ids: Sequence[int]) -> list[float | None]:
        # an engine scores nothing while paused (SGLang's scheduler skips every batch, vLLM schedules nothing new)
        assert not self.paused, "scored while paused"
        assert tuple(token_ids) == IDS
        self.events.append("score")
        if self.score_error is not None:
            raise self.score_error
        return list(self.weights)


def probe(**kwargs: Any) -> WeightProbe:
    return WeightProbe(token_ids=IDS, logprobs=TRAINER, **kwargs)


async def test_the_right_weights_pass_and_every_engine_goes_on() -> None:
    engine = FakeEngine("http://a", [v + 1e-3 for v in TRAINER])  # bf16 noise
    async with weight_update([engine], version=3, probe=probe()) as update:
        assert engine.events == ["pause:keep"] and update.probes == []
    assert engine.events == ["pause:keep", "version:3", "resume", "score"]  # scored after the label, resumed
    (score,) = update.probes
    assert score.passed and score.engine == "http://a" and score.tokens == len(TRAINER)
    assert score.mean_diff == pytest.approx(1e-3) and score.max_diff == pytest.approx(1e-3)


async def test_a_wrong_checkpoint_is_caught_named_and_paused_again() -> None:
    wrong = [-1.2, -1.7, -0.5, -3.4, -0.25]  # another checkpoint: differences 0.2, 0.3, 0, 0.4, 0
    engine = FakeEngine("http://a", wrong)
    with pytest.raises(WeightUpdateError) as caught:
        async with weight_update([engine], version=4, probe=probe()):
            pass
    message = str(caught.value)
    assert "http://a" in message and "mean |logprob - the trainer's| 0.18 nats, max 0.4" in message
    assert "over 5 tokens (tolerance mean 0.05)" in message
    # paused again in recompute: nothing of the probe window (its KV, the probe's own request) stays in the engine
    assert "paused again (recompute)" in message and "generation was not resumed on weights that are not" in message
    assert engine.events == ["pause:keep", "version:4", "resume", "score", "pause:recompute"]  # left paused
    assert caught.value.paused == ["http://a"]
    (score,) = caught.value.probes
    assert not score.passed and score.mean_diff == pytest.approx(0.18) and score.max_diff == pytest.approx(0.4)


async def test_half_a_checkpoint_is_caught_by_the_max_tolerance() -> None:
    half = [*TRAINER[:4], TRAINER[4] - 0.2]  # one token off: mean 0.04 passes the mean, not the max
    engine = FakeEngine("http://a", half)
    with pytest.raises(WeightUpdateError, match=r"max 0.2, over 5 tokens \(tolerance mean 0.05, max 0.05\)"):
        async with weight_update([engine], probe=probe(max_tolerance=0.05)):
            pass
    assert engine.events[-1] == "pause:recompute"
    async with weight_update([engine], probe=probe()) as update:  # the mean alone lets it through
        pass
    assert update.probes[0].passed and engine.events[-2:] == ["resume", "score"]


async def test_an_engine_without_a_recompute_pause_is_paused_again_in_the_updates_mode() -> None:
    engine = FakeEngine("http://a", [v - 1.0 for v in TRAINER], recompute=False)  # vLLM: keep or abort only
    with pytest.raises(WeightUpdateError, match=r"paused again \(keep\)") as caught:
        async with weight_update([engine], version=7, probe=probe()):
            pass
    assert engine.events == ["pause:keep", "version:7", "resume", "score", "pause:keep"]
    assert caught.value.paused == ["http://a"]


async def test_only_the_engines_that_fail_are_paused_again() -> None:
    good, bad = FakeEngine("http://good"), FakeEngine("http://bad", [v - 1.0 for v in TRAINER])
    with pytest.raises(WeightUpdateError, match="http://bad: mean") as caught:
        async with weight_update([good, bad], version=5, mode="recompute", probe=probe()):
            pass
    assert "http://good" not in str(caught.value)
    assert good.events == ["pause:recompute", "version:5", "resume", "score"]
    assert bad.events == ["pause:recompute", "version:5", "resume", "score", "pause:recompute"]
    assert caught.value.paused == ["http://bad"] and [s.engine for s in caught.value.probes] == ["http://bad"]


async def test_in_abort_mode_the_cut_calls_go_on_only_after_the_probe() -> None:
    engine = FakeEngine("http://a")
    order: list[str] = []

    async def cut_call() -> None:  # what a call cut by the update does before sending its continuation
        await wait_for_resume(engine)
        order.append("continued" if "score" in engine.events else "continued before the probe")

    async with weight_update([engine], mode="abort", probe=probe()):
        waiting = asyncio.ensure_future(cut_call())
        await asyncio.sleep(0)
    await waiting
    assert order == ["continued"]


async def test_a_probe_that_cannot_be_scored_fails_clearly() -> None:
    class NoScore(FakeEngine):
        supports_score: ClassVar[bool] = False

    engine = NoScore("http://a")
    with pytest.raises(ConfigError, match=r"cannot check the weights of http://a with a probe.*supports_score"):
        async with weight_update([engine], probe=probe()):
            raise AssertionError("the block must not run")
    assert engine.events == []  # refused before anything was paused

    failing = FakeEngine("http://b")
    failing.score_error = RuntimeError("HTTP 400: token id out of range")
    with pytest.raises(WeightUpdateError, match=r"http://b could not score the weight probe \(RuntimeError: HTTP 400"):
        async with weight_update([failing], probe=probe()):
            pass
    assert failing.events[-1] == "pause:recompute"  # weights that could not be checked are not served


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (TRAINER[:-1], "scored 4 tokens of the weight probe, expected 5"),
        ([*TRAINER[:-1], None], "missing or non-finite logprob"),
        ([*TRAINER[:-1], math.nan], "missing or non-finite logprob"),
    ],
)
async def test_an_answer_that_is_not_a_score_of_the_probe_fails(answer: list[float | None], message: str) -> None:
    engine = FakeEngine("http://a", answer)
    with pytest.raises(WeightUpdateError, match=message) as caught:
        async with weight_update([engine], probe=probe()):
            pass
    assert caught.value.paused == ["http://a"] and caught.value.probes == []


async def test_an_engine_that_cannot_be_paused_again_is_said_to_generate_on_the_wrong_weights() -> None:
    engine = FakeEngine("http://a", [v - 1.0 for v in TRAINER])
    engine.pause_error = RuntimeError("connection refused")
    with pytest.raises(WeightUpdateError, match="http://a could not be paused again and are generating on them"):
        async with weight_update([engine], probe=probe()):
            pass


async def test_no_probe_when_the_block_fails() -> None:
    engine = FakeEngine("http://a", [v - 1.0 for v in TRAINER])
    with pytest.raises(RuntimeError, match="push failed"):
        async with weight_update([engine], version=6, probe=probe()):
            raise RuntimeError("push failed")
    assert engine.events == ["pause:keep", "resume"]  # resumed as before, nothing scored


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"token_ids": (1,), "logprobs": ()}, "at least 2 token ids"),
        ({"token_ids": (1, -2), "logprobs": (-1.0,)}, "at least 2 token ids"),
        ({"token_ids": (1, 2, 3), "logprobs": (-1.0,)}, "2 for 3 token ids, got 1"),
        ({"token_ids": (1, 2), "logprobs": (math.inf,)}, "finite logprobs"),
        ({"token_ids": (1, 2), "logprobs": (0.5,)}, "finite logprobs"),
        ({"token_ids": (1, 2), "logprobs": (-1.0,), "tolerance": 0}, "tolerance must be a positive"),
        ({"token_ids": (1, 2), "logprobs": (-1.0,), "max_tolerance": math.nan}, "max_tolerance must be a positive"),
    ],
)
def test_a_malformed_probe_is_a_config_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WeightProbe(**kwargs)


def test_a_probe_keeps_lists_as_tuples() -> None:
    made = WeightProbe(token_ids=list(IDS), logprobs=list(TRAINER))
    assert made.token_ids == IDS and made.logprobs == TRAINER and hash(made)


async def test_a_probe_that_is_not_a_weight_probe_is_refused() -> None:
    engine = FakeEngine("http://a")
    with pytest.raises(ConfigError, match="probe must be a WeightProbe"):
        async with weight_update([engine], probe=(IDS, TRAINER)):  # type: ignore[arg-type]
            pass
    assert engine.events == []
