"""The conformance kit every backend adapter runs, first- or third-party.

Subclass :class:`BackendConformanceTests` in a test module, supply two fixtures and set the capability
flags your engine has; every standard test then runs against your backend::

    import pytest
    from tito_testing.conformance import BackendConformanceTests
    from tito_testing.tokenizers import load_qwen_tokenizer

    from tito_mybackend import MyBackend


    class TestMyBackend(BackendConformanceTests):
        echoes_prompt_ids = True
        supports_prompt_logprobs = True

        @pytest.fixture
        def tokenizer(self):
            return load_qwen_tokenizer("qwen3")  # the tokenizer of the model the engine serves

        @pytest.fixture
        def backend(self, tokenizer):
            return MyBackend(base_url="http://localhost:8000")

The fixtures may have any scope: for a module- or session-scoped ``backend`` (one server connection for
the whole run), define it as a plain function fixture, e.g. in ``conftest.py``, since pytest deprecates
wider-scoped fixtures written as methods. A backend must be usable from any event loop, which the kit
checks. Tests
are ``async`` and need ``pytest-asyncio`` (``asyncio_mode = "auto"`` or its ``asyncio`` mark, which the
tests carry). A standard test that does not apply may be overridden only with
``@pytest.mark.xfail(reason=...)`` or ``@pytest.mark.skip(reason=...)``; ``test_no_overrides`` fails
otherwise, so a kit upgrade can never be silently bypassed. Pin the tito-testing version you test against:
new standard tests can appear in new versions.

Everything here is engine-neutral: requests carry token ids built with the ``tokenizer`` fixture,
and outputs are checked for shape and consistency, never for specific text.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

import msgspec
import pytest

from tito_core.backend import Backend, GenerateRequest, GenerateResult, SamplingParams
from tito_core.errors import BackendError

__all__ = ["BackendConformanceTests", "ModelConformanceTests"]


class _StandardTests:
    """Base of the kit's classes: guards the standard tests against silent removal or replacement."""

    _standard_kit: ClassVar[bool] = False

    def test_no_overrides(self) -> None:
        """Standard tests may be marked xfail/skip with a reason, never deleted or silently replaced."""
        problems: list[str] = []
        for kit in type(self).__mro__:
            if not kit.__dict__.get("_standard_kit", False):
                continue
            for name, member in vars(kit).items():
                if not name.startswith("test_"):
                    continue
                current = getattr(type(self), name, None)
                if current is None:
                    problems.append(f"{name} was removed")
                elif current is not member and not _has_reasoned_mark(current):
                    problems.append(f"{name} is overridden without @pytest.mark.xfail/skip(reason=...)")
        if problems:
            pytest.fail(f"{type(self).__name__} changes standard tests: " + "; ".join(problems))


def _has_reasoned_mark(function: object) -> bool:
    marks = getattr(function, "pytestmark", [])
    return any(mark.name in ("xfail", "skip", "skipif") and mark.kwargs.get("reason") for mark in marks)


class BackendConformanceTests(_StandardTests):
    """Standard tests for a :class:`~tito_core.backend.Backend`.

    Fixtures the subclass provides:
        backend: The :class:`~tito_core.backend.Backend` under test.
        tokenizer: The Hugging Face tokenizer of the model the backend serves (for prompts).

    Capability flags (class attributes) say what the engine can do; tests of a missing capability are
    skipped, and tests of a claimed one fail when the backend does not deliver it.
    """

    _standard_kit = True

    returns_logprobs: ClassVar[bool] = True
    """The backend returns one logprob per output token when asked."""
    supports_prompt_logprobs: ClassVar[bool] = False
    """The backend returns logprobs of the new prompt tokens when asked."""
    echoes_prompt_ids: ClassVar[bool] = False
    """The backend always reports the prompt ids the engine consumed."""
    deterministic_greedy: ClassVar[bool] = True
    """The same greedy request twice gives the same tokens."""
    supports_stop_token_ids: ClassVar[bool] = True
    """``SamplingParams.stop_token_ids`` end generation, the stop token included in the output."""

    max_new_tokens: ClassVar[int] = 8
    """Token limit of the short greedy requests."""
    cancel_max_new_tokens: ClassVar[int] = 1024
    """Token limit of the request cancelled in flight: long enough to still be running when cancelled."""
    cancel_after_s: ClassVar[float] = 0.05
    """How long the in-flight request runs before it is cancelled."""
    request_timeout_s: ClassVar[float] = 120.0
    """A request taking longer fails the test instead of hanging it."""
    logprob_tolerance: ClassVar[float] = 1e-4
    """How far above 0 a logprob may be (floating-point rounding of a certain token)."""
    prompt_messages: ClassVar[list[dict[str, str]]] = [
        {"role": "user", "content": "Count from one to twenty, separated by commas."}
    ]
    """The conversation rendered into the test prompt."""

    # --- helpers (overridable) ----------------------------------------------------------------------

    def prompt_ids(self, tokenizer: Any) -> list[int]:
        """Token ids of the test prompt: ``prompt_messages`` through the chat template when there is one."""
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(self.prompt_messages, tokenize=False, add_generation_prompt=True)
        else:
            text = " ".join(message["content"] for message in self.prompt_messages)
        ids = tokenizer.encode(text, add_special_tokens=False)
        return [int(i) for i in ids]

    def make_request(
        self,
        input_ids: Sequence[int],
        *,
        prefix_len: int = 0,
        return_logprobs: bool = True,
        return_prompt_logprobs: bool = False,
        **sampling: Any,
    ) -> GenerateRequest:
        """Build a request with a fresh id; ``sampling`` are :class:`SamplingParams` fields."""
        return GenerateRequest(
            rid=f"conformance-{uuid.uuid4().hex}",
            input_ids=list(input_ids),
            prefix_len=prefix_len,
            sampling=SamplingParams(**sampling),
            return_logprobs=return_logprobs,
            return_prompt_logprobs=return_prompt_logprobs,
        )

    def greedy_request(self, input_ids: Sequence[int], **overrides: Any) -> GenerateRequest:
        """Build a greedy request for ``max_new_tokens`` tokens that ignores EOS."""
        options: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        }
        options.update(overrides)
        return self.make_request(input_ids, **options)

    async def generate(self, backend: Backend, request: GenerateRequest) -> GenerateResult:
        """Run one request with the test timeout; check the result has the right type."""
        async with asyncio.timeout(self.request_timeout_s):
            result = await backend.generate(request)
        assert isinstance(result, GenerateResult), f"generate() returned {type(result).__name__}"
        return result

    def check_result(self, request: GenerateRequest, result: GenerateResult) -> None:
        """Invariants every result must satisfy, whatever was asked."""
        limit = request.sampling.max_new_tokens
        assert result.finish_reason in ("stop", "length", "abort"), result.finish_reason
        assert all(isinstance(i, int) and i >= 0 for i in result.output_ids), "output ids must be ints >= 0"
        if limit is not None:
            assert len(result.output_ids) <= limit, f"{len(result.output_ids)} tokens for a limit of {limit}"
            if result.finish_reason == "length":
                assert len(result.output_ids) == limit, "finish 'length' before the token limit was reached"
        if result.output_logprobs is not None:
            assert len(result.output_logprobs) == len(result.output_ids), "one logprob per output token"
            for value in result.output_logprobs:
                self.check_logprob(value)
        if result.prompt_ids is not None:
            assert list(result.prompt_ids) == list(request.input_ids), "echoed prompt ids differ from input"
        if result.prompt_tokens is not None:
            assert result.prompt_tokens == len(request.input_ids), "prompt_tokens differs from the prompt"
        if result.cached_tokens is not None:
            assert 0 <= result.cached_tokens <= len(request.input_ids), "cached_tokens out of range"

    def check_logprob(self, value: object) -> None:
        """Check a logprob is a finite float, at most 0 (within ``logprob_tolerance``)."""
        assert isinstance(value, float | int) and not isinstance(value, bool), f"logprob {value!r}"
        assert math.isfinite(value), f"logprob {value} is not finite"
        assert value <= self.logprob_tolerance, f"logprob {value} > 0"

    # --- standard tests -----------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_greedy_respects_max_new_tokens(self, backend: Backend, tokenizer: Any) -> None:
        """An ignore-EOS greedy request stops at the limit with finish 'length' (or earlier with 'stop')."""
        request = self.greedy_request(self.prompt_ids(tokenizer))
        result = await self.generate(backend, request)
        self.check_result(request, result)
        assert result.finish_reason in ("length", "stop"), f"finish {result.finish_reason!r}"
        if result.finish_reason == "length":
            assert len(result.output_ids) == self.max_new_tokens
        else:
            assert 1 <= len(result.output_ids) <= self.max_new_tokens

    @pytest.mark.asyncio
    async def test_one_logprob_per_output_token(self, backend: Backend, tokenizer: Any) -> None:
        """Asked for logprobs, the backend returns one finite, non-positive logprob per output id."""
        if not self.returns_logprobs:
            pytest.skip("returns_logprobs = False")
        request = self.greedy_request(self.prompt_ids(tokenizer))
        result = await self.generate(backend, request)
        assert result.output_logprobs is not None, "logprobs were asked for but not returned"
        self.check_result(request, result)

    @pytest.mark.asyncio
    async def test_sampling_masks_fit_the_output(self, backend: Backend, tokenizer: Any) -> None:
        """A backend with ``supports_sampling_mask`` gives a truncating request one kept set per output token.

        Each holds its token, and every id is in the vocabulary's range (docs/exactness.md). Its size is not checked
        against ``top_k``: a sampler may keep the ids tied at the boundary (the embedded backend does).
        """
        if not backend.capabilities().supports_sampling_mask:
            pytest.skip("the backend returns no sampling masks (supports_sampling_mask is False)")
        sampled = self.make_request(
            self.prompt_ids(tokenizer), max_new_tokens=self.max_new_tokens, temperature=1.0, top_k=20, top_p=0.9,
            seed=1, ignore_eos=True,
        )  # fmt: skip
        request = msgspec.structs.replace(sampled, return_sampling_mask=True)
        result = await self.generate(backend, request)
        self.check_result(request, result)
        mask = result.sampling_mask
        assert mask is not None, "sampling masks were asked for but not returned"
        problem = mask.problem(result.output_ids, vocab_size=2**31 - 1)
        assert problem is None, problem

    @pytest.mark.asyncio
    async def test_prompt_ids_echo_input(self, backend: Backend, tokenizer: Any) -> None:
        """Echoed prompt ids equal the ids sent (required when ``echoes_prompt_ids``)."""
        request = self.greedy_request(self.prompt_ids(tokenizer))
        result = await self.generate(backend, request)
        if result.prompt_ids is None:
            assert not self.echoes_prompt_ids, "echoes_prompt_ids = True but prompt_ids is None"
            pytest.skip("the backend does not echo prompt ids")
        assert list(result.prompt_ids) == list(request.input_ids)

    @pytest.mark.asyncio
    async def test_greedy_is_deterministic(self, backend: Backend, tokenizer: Any) -> None:
        """The same greedy request twice gives the same tokens and finish reason."""
        if not self.deterministic_greedy:
            pytest.skip("deterministic_greedy = False")
        ids = self.prompt_ids(tokenizer)
        first = await self.generate(backend, self.greedy_request(ids))
        second = await self.generate(backend, self.greedy_request(ids))
        assert first.output_ids == second.output_ids
        assert first.finish_reason == second.finish_reason

    @pytest.mark.asyncio
    async def test_stop_token_id_ends_generation(self, backend: Backend, tokenizer: Any) -> None:
        """A stop token id ends generation right after it, the stop token kept in the output."""
        if not self.supports_stop_token_ids or not self.deterministic_greedy:
            pytest.skip("needs supports_stop_token_ids and deterministic_greedy")
        ids = self.prompt_ids(tokenizer)
        reference = await self.generate(backend, self.greedy_request(ids))
        if len(reference.output_ids) < 3:
            pytest.skip("the greedy output is too short to pick a stop token from")
        stop_id = reference.output_ids[2]
        end = reference.output_ids.index(stop_id) + 1
        request = self.greedy_request(ids, stop_token_ids=(stop_id,))
        result = await self.generate(backend, request)
        self.check_result(request, result)
        assert result.output_ids == reference.output_ids[:end], "stop token trimmed or generation not stopped"
        assert result.finish_reason == "stop"
        assert result.matched_stop in (None, stop_id)

    @pytest.mark.asyncio
    async def test_prompt_logprobs_cover_new_prompt(self, backend: Backend, tokenizer: Any) -> None:
        """Prompt logprobs cover exactly ``input_ids[prefix_len:]``, for a first and a later call."""
        if not self.supports_prompt_logprobs:
            pytest.skip("supports_prompt_logprobs = False")
        ids = self.prompt_ids(tokenizer)
        for prefix_len in (0, len(ids) // 2):
            request = self.greedy_request(ids, prefix_len=prefix_len, return_prompt_logprobs=True)
            result = await self.generate(backend, request)
            self.check_result(request, result)
            assert result.prompt_logprobs is not None, "prompt logprobs were asked for but not returned"
            assert len(result.prompt_logprobs) == len(ids) - prefix_len, f"prefix_len={prefix_len}"
            values = [value for value in result.prompt_logprobs if value is not None]
            assert len(values) >= len(ids) - prefix_len - 1, "prompt logprobs missing beyond the first token"
            for value in values:
                self.check_logprob(value)

    @pytest.mark.asyncio
    async def test_max_context_length(self, backend: Backend) -> None:
        """``max_context_length()`` is a positive int or None."""
        async with asyncio.timeout(self.request_timeout_s):
            length = await backend.max_context_length()
        assert length is None or (isinstance(length, int) and length > 0), f"max_context_length() = {length!r}"

    @pytest.mark.asyncio
    async def test_concurrent_requests(self, backend: Backend, tokenizer: Any) -> None:
        """Concurrent requests on one backend all complete with valid results."""
        ids = self.prompt_ids(tokenizer)
        requests = [self.greedy_request(ids) for _ in range(4)]
        results = await asyncio.gather(*(self.generate(backend, request) for request in requests))
        for request, result in zip(requests, results, strict=True):
            self.check_result(request, result)

    @pytest.mark.asyncio
    async def test_usable_from_several_event_loops(self, backend: Backend, tokenizer: Any) -> None:
        """One backend serves requests from two other event loops (``asyncio.run`` twice) and this one."""
        ids = self.prompt_ids(tokenizer)

        def in_fresh_loops() -> list[GenerateResult]:
            return [asyncio.run(self.generate(backend, self.greedy_request(ids))) for _ in range(2)]

        results = await asyncio.to_thread(in_fresh_loops)
        results.append(await self.generate(backend, self.greedy_request(ids)))
        for result in results:
            self.check_result(self.greedy_request(ids), result)
        if self.deterministic_greedy:
            assert all(result.output_ids == results[0].output_ids for result in results)

    @pytest.mark.asyncio
    async def test_cancel_in_flight(self, backend: Backend, tokenizer: Any) -> None:
        """Cancelling a running generate raises CancelledError, and the backend serves the next request."""
        ids = self.prompt_ids(tokenizer)
        long_request = self.greedy_request(ids, max_new_tokens=self.cancel_max_new_tokens)
        task = asyncio.create_task(backend.generate(long_request))
        await asyncio.sleep(self.cancel_after_s)
        if task.done():
            pytest.fail(
                "generate() finished before it could be cancelled: raise cancel_max_new_tokens or lower "
                "cancel_after_s (or make generate() await while it runs)"
            )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        request = self.greedy_request(ids)
        self.check_result(request, await self.generate(backend, request))

    @pytest.mark.asyncio
    async def test_cancel_before_start(self, backend: Backend, tokenizer: Any) -> None:
        """A generate cancelled before it ran raises CancelledError and leaves the backend usable."""
        ids = self.prompt_ids(tokenizer)
        task = asyncio.create_task(backend.generate(self.greedy_request(ids)))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        request = self.greedy_request(ids)
        self.check_result(request, await self.generate(backend, request))

    @pytest.mark.asyncio
    async def test_invalid_request_raises_typed_error(self, backend: Backend, tokenizer: Any) -> None:
        """An empty prompt raises a tito ``BackendError`` or a ``ValueError``, and the backend recovers."""
        with pytest.raises((BackendError, ValueError)):
            await self.generate(backend, self.greedy_request([]))
        request = self.greedy_request(self.prompt_ids(tokenizer))
        self.check_result(request, await self.generate(backend, request))


class ModelConformanceTests(_StandardTests):
    """Standard tests for a :class:`~tito_core.strands_front.model.TitoModel` running a Strands agent on a backend.

    Fixtures the subclass provides: ``backend`` and ``tokenizer``, as for
    :class:`BackendConformanceTests`. Engines that can constrain decoding with a regex (which makes even a
    random tiny model produce real tool calls) override :meth:`constrain`.
    """

    _standard_kit = True

    max_new_tokens: ClassVar[int] = 6
    """Token limit of the truncated single-turn rollout."""
    deterministic_greedy: ClassVar[bool] = True
    """The same greedy rollout twice gives the same tokens."""
    tool_call_regex: ClassVar[str] = (
        r'<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9], "b": [1-9]\}\}\n</tool_call>'
    )
    final_answer_regex: ClassVar[str] = r"The answer is [0-9]{1,2}\."

    def constrain(self, regex: str) -> dict[str, Any] | None:
        """Engine-specific ``SamplingParams.extra`` that restricts output to ``regex`` (None: unsupported)."""
        return None

    def _model(self, backend: Backend, tokenizer: Any, **sampling: Any) -> Any:
        from tito_core.strands_front.model import TitoModel
        from tito_testing.recording import RecordingBackend

        options = {"temperature": 0.0, **sampling}
        return TitoModel(RecordingBackend(backend), tokenizer, sampling=options)

    @staticmethod
    def _agent(model: Any, tools: Sequence[Any] = ()) -> Any:
        from strands import Agent
        from strands.agent.conversation_manager import NullConversationManager

        return Agent(
            model=model, tools=list(tools), callback_handler=None, conversation_manager=NullConversationManager()
        )

    async def _truncated_rollout(self, backend: Backend, tokenizer: Any) -> Any:
        from strands.types.exceptions import MaxTokensReachedException

        model = self._model(backend, tokenizer, max_new_tokens=self.max_new_tokens, ignore_eos=True)
        with pytest.raises(MaxTokensReachedException):
            await self._agent(model).invoke_async("Count from one to twenty.")
        return model

    @staticmethod
    def check_token_in_out(model: Any) -> None:
        """Every request was the trajectory so far + its new prompt; outputs/logprobs are the engine's, verbatim."""
        traj = model.trajectory
        ids, lps, mask = traj.token_ids, traj.logprobs, traj.loss_mask
        calls = model.backend.calls
        assert len(calls) == len(traj.turns), "one recorded turn per engine call"
        for (request, result), turn in zip(calls, traj.turns, strict=True):
            assert list(request.input_ids) == ids[: turn.output_start], "request != trajectory so far + new prompt"
            assert request.prefix_len == turn.prompt_start
            out = slice(turn.output_start, turn.output_start + turn.output_len)
            assert ids[out] == list(result.output_ids), "output ids not recorded verbatim"
            if result.output_logprobs is not None:
                assert lps[out] == list(result.output_logprobs), "logprobs not recorded verbatim"
            assert mask[out] == [1] * turn.output_len
        assert sum(mask) == sum(turn.output_len for turn in traj.turns), "loss mask is 1 exactly on outputs"

    async def test_truncated_turn_keeps_tokens(self, backend: Backend, tokenizer: Any) -> None:
        """A turn cut at the token limit is recorded exactly and the rollout is ``truncated``."""
        model = await self._truncated_rollout(backend, tokenizer)
        traj = model.trajectory
        assert traj.status == "truncated"
        assert [turn.output_len for turn in traj.turns] == [self.max_new_tokens]
        assert traj.turns[0].stop_reason == "max_tokens"
        self.check_token_in_out(model)

    async def test_greedy_rollout_reproduces(self, backend: Backend, tokenizer: Any) -> None:
        """The same greedy rollout twice gives the same trajectory tokens."""
        if not self.deterministic_greedy:
            pytest.skip("the backend does not claim deterministic greedy decoding")
        first = await self._truncated_rollout(backend, tokenizer)
        second = await self._truncated_rollout(backend, tokenizer)
        assert first.trajectory.token_ids == second.trajectory.token_ids

    async def test_agent_runs_real_tool_turns(self, backend: Backend, tokenizer: Any) -> None:
        """Constrained decoding makes the model call a real tool twice, then answer; every turn is exact."""
        tool_extra = self.constrain(self.tool_call_regex)
        final_extra = self.constrain(self.final_answer_regex)
        if tool_extra is None or final_extra is None:
            pytest.skip("the backend offers no regex-constrained decoding (override constrain())")
        from strands import tool
        from strands.hooks import BeforeModelCallEvent

        seen: list[tuple[int, int]] = []

        @tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            seen.append((a, b))
            return a + b

        model = self._model(backend, tokenizer, max_new_tokens=64)
        agent = self._agent(model, [add])

        def steer(event: BeforeModelCallEvent) -> None:
            extra = tool_extra if len(model.trajectory.turns) < 2 else final_extra
            model.update_config(sampling={"temperature": 0.0, "max_new_tokens": 64, "extra": extra})

        agent.hooks.add_callback(BeforeModelCallEvent, steer)
        await agent.invoke_async("Add some numbers with the add tool.")
        traj = model.trajectory
        assert [turn.stop_reason for turn in traj.turns] == ["tool_use", "tool_use", "end_turn"]
        assert len(seen) == 2, "the tool ran once per tool turn"
        assert traj.status == "completed" and traj.branch == 0
        assert [s.kind for s in traj.segments].count("boundary") == 2
        self.check_token_in_out(model)
