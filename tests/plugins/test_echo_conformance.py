"""The conformance kit run against the example third-party adapter, found by name like any plugin."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tito_core.backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import ContextLengthError
from tito_core.plugins import get_backend
from tito_testing.conformance import BackendConformanceTests, ModelConformanceTests

EOS = 151645  # <|im_end|>, the Qwen3 tokenizer's EOS


class TestEchoBackendConformance(BackendConformanceTests):
    echoes_prompt_ids = True
    supports_prompt_logprobs = True
    cancel_max_new_tokens = 4096
    cancel_after_s = 0.01

    @pytest.fixture
    def tokenizer(self, qwen3_tokenizer: Any) -> Any:
        return qwen3_tokenizer

    @pytest.fixture
    def backend(self, tokenizer: Any) -> Backend:
        return get_backend("echo", eos_token_id=tokenizer.eos_token_id, delay_s=0.001)


def request(ids: list[int], prefix_len: int = 0, **sampling: Any) -> GenerateRequest:
    return GenerateRequest(rid="r", input_ids=ids, prefix_len=prefix_len, sampling=SamplingParams(**sampling))


@pytest.fixture
def echo() -> Backend:
    return get_backend("echo", eos_token_id=EOS, window=3, context_length=64)


async def test_echo_stops_with_eos(echo: Backend) -> None:
    result = await echo.generate(request([1, 2, 3, 4, 5], max_new_tokens=10))
    assert result.output_ids == [3, 4, 5, EOS]
    assert (result.finish_reason, result.matched_stop) == ("stop", EOS)
    assert result.output_logprobs == [0.0] * 4


async def test_echo_length_and_ignore_eos(echo: Backend) -> None:
    short = await echo.generate(request([1, 2, 3, 4, 5], max_new_tokens=2))
    assert (short.output_ids, short.finish_reason) == ([3, 4], "length")
    cycled = await echo.generate(request([1, 2, 3, 4, 5], max_new_tokens=7, ignore_eos=True))
    assert (cycled.output_ids, cycled.finish_reason) == ([3, 4, 5, 3, 4, 5, 3], "length")


async def test_echo_stop_token_ids_and_prompt_logprobs(echo: Backend) -> None:
    ids = [9, 8, 7, 6]
    result = await echo.generate(
        GenerateRequest(
            rid="r",
            input_ids=ids,
            prefix_len=2,
            sampling=SamplingParams(max_new_tokens=8, stop_token_ids=(7,)),
            return_prompt_logprobs=True,
        )
    )
    assert result.output_ids == [8, 7]
    assert (result.finish_reason, result.matched_stop) == ("stop", 7)
    assert result.prompt_logprobs == [0.0, 0.0]
    assert result.prompt_ids == ids and result.prompt_tokens == 4


async def test_echo_rejects_what_it_cannot_do(echo: Backend) -> None:
    with pytest.raises(ValueError, match="stop strings"):
        await echo.generate(request([1, 2], stop=("x",)))
    with pytest.raises(ValueError, match="must not be empty"):
        await echo.generate(request([]))
    with pytest.raises(ContextLengthError):
        await echo.generate(request(list(range(64))))
    room = await echo.generate(request(list(range(60)), ignore_eos=True))
    assert (len(room.output_ids), room.finish_reason) == (4, "length")


# --- the kit's guard against silently replaced standard tests ----------------------------------------


class _NullBackend(Backend):
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        await asyncio.sleep(0)
        return GenerateResult(output_ids=[])


def test_kit_rejects_a_silently_overridden_test() -> None:
    class Quiet(BackendConformanceTests):
        async def test_greedy_is_deterministic(self, backend: Backend, tokenizer: Any) -> None:
            pass

    with pytest.raises(pytest.fail.Exception, match="test_greedy_is_deterministic is overridden"):
        Quiet().test_no_overrides()


def test_kit_rejects_a_removed_test() -> None:
    class Gone(BackendConformanceTests):
        test_cancel_in_flight = None

    with pytest.raises(pytest.fail.Exception, match="test_cancel_in_flight was removed"):
        Gone().test_no_overrides()


def test_kit_accepts_an_override_marked_with_a_reason() -> None:
    class Honest(BackendConformanceTests):
        @pytest.mark.xfail(reason="engine is not batch-invariant")
        async def test_greedy_is_deterministic(self, backend: Backend, tokenizer: Any) -> None:
            raise AssertionError

    Honest().test_no_overrides()


class TestEchoModelConformance(ModelConformanceTests):
    """A Strands agent on the third-party echo backend: token-in/token-out holds through TitoModel."""

    @pytest.fixture
    def tokenizer(self, qwen3_tokenizer: Any) -> Any:
        return qwen3_tokenizer

    @pytest.fixture
    def backend(self, tokenizer: Any) -> Backend:
        return get_backend("echo", eos_token_id=tokenizer.eos_token_id)
