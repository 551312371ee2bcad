"""The rollout state machine: every way out of a model call sets a status, and bad engine output is never recorded."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import msgspec
import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.types.exceptions import ContextWindowOverflowException

from tests.helpers import scripted_agent
from tito_core import TitoModel
from tito_core.backend import GenerateRequest, GenerateResult
from tito_core.errors import (
    BackendError,
    BackendResponseError,
    GenerationAbortedError,
    TemplateError,
    TitoError,
    UnsupportedContentError,
)
from tito_core.status import status_of
from tito_core.trajectory import Trajectory
from tito_core.versions import VersionSpan
from tito_testing.scripted import ScriptedBackend

from .helpers import SYSTEM, add, hermes_call

Tamper = Callable[[GenerateResult, GenerateRequest], GenerateResult]


class TamperingBackend(ScriptedBackend):
    """A scripted backend whose answer to call ``n`` (1-based) is rewritten by ``tamper[n]``."""

    def __init__(self, tokenizer, replies, tamper: dict[int, Tamper], **kwargs) -> None:
        super().__init__(tokenizer, replies, **kwargs)
        self.tamper = tamper
        self.answers: dict[str, GenerateResult] = {}

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        result = await super().generate(request)
        change = self.tamper.get(len(self.requests))
        if change is not None:
            result = change(result, request)
        self.answers[request.rid] = result
        return result


def replace(**fields) -> Tamper:
    return lambda result, request: msgspec.structs.replace(result, **fields)


def snapshot(traj: Trajectory) -> tuple:
    turns = tuple(msgspec.structs.replace(t, rid="") for t in traj.turns)  # request ids are random
    return traj.token_ids, traj.logprobs, traj.segments, turns, dict(traj.tool_parse_errors)


def run_agent(tok, replies, tamper=None, *, tools=(add,), prompt="Add 1 and 2.", **model_kwargs):
    backend = TamperingBackend(tok, replies, tamper or {}, context_length=model_kwargs.pop("context_length", None))
    agent, model, _ = scripted_agent(tok, replies, tools, system_prompt=SYSTEM, backend=backend, **model_kwargs)
    error: BaseException | None = None
    try:
        agent(prompt)
    except Exception as exc:
        error = exc
    return model, backend, error


def unwrap(error: BaseException | None) -> BaseException | None:
    """Strands may wrap the model's exception; return tito's own."""
    while error is not None and not isinstance(error, TitoError) and error.__cause__ is not None:
        error = error.__cause__
    return error


CALL = hermes_call("add", {"a": 1, "b": 2})

# A bad answer on the SECOND call: the first turn is recorded, the second must leave no trace.
BAD_SECOND_ANSWERS = {
    "positive logprob": (replace(output_logprobs=None), "output_logprobs"),  # replaced below per tokens
    "NaN logprob": (None, "output_logprobs"),
    "non-numeric logprob": (None, "output_logprobs"),
    "too few logprobs": (None, "output_logprobs"),
    "id outside the vocabulary": (None, "output_ids"),
    "negative id": (None, "output_ids"),
    "id >= 2**31": (None, "output_ids"),
    "non-integer id": (None, "output_ids"),
    "unknown finish reason": (replace(finish_reason="eos"), "finish_reason"),
    "prompt echo mismatch": (None, "prompt_ids"),
    "prompt echo with an id >= 2**31": (None, "prompt_ids"),
    "negative prompt token count": (replace(prompt_tokens=-1), "prompt_tokens"),
    "no logprobs although requested": (replace(output_logprobs=None), "output_logprobs"),
    "weight versions short of the output": (None, "weight_versions"),
    "weight versions overlapping": (None, "weight_versions"),
}


def _with_logprob(value):
    def change(result: GenerateResult, request: GenerateRequest) -> GenerateResult:
        lps = list(result.output_logprobs or [])
        lps[0] = value
        return msgspec.structs.replace(result, output_logprobs=lps)

    return change


def _with_id(value):
    def change(result: GenerateResult, request: GenerateRequest) -> GenerateResult:
        ids = list(result.output_ids)
        ids[0] = value
        return msgspec.structs.replace(result, output_ids=ids)

    return change


def _with_spans(bounds: Callable[[int], list[tuple[int, int]]]) -> Tamper:
    def change(result: GenerateResult, request: GenerateRequest) -> GenerateResult:
        spans = tuple(VersionSpan(version="7", start=a, end=b) for a, b in bounds(len(result.output_ids)))
        return msgspec.structs.replace(result, weight_versions=spans)

    return change


def _tampers(vocab: int) -> dict[str, tuple[Tamper, str]]:
    table = dict(BAD_SECOND_ANSWERS)
    table["positive logprob"] = (_with_logprob(0.5), "output_logprobs")
    table["NaN logprob"] = (_with_logprob(math.nan), "output_logprobs")
    table["non-numeric logprob"] = (_with_logprob("-0.1"), "output_logprobs")
    table["too few logprobs"] = (
        lambda r, q: msgspec.structs.replace(r, output_logprobs=(r.output_logprobs or [])[:-1]),
        "output_logprobs",
    )
    table["weight versions short of the output"] = (_with_spans(lambda n: [(0, n - 1)]), "weight_versions")
    table["weight versions overlapping"] = (_with_spans(lambda n: [(0, 2), (1, n)]), "weight_versions")
    table["id outside the vocabulary"] = (_with_id(vocab), "output_ids")
    table["negative id"] = (_with_id(-3), "output_ids")
    table["id >= 2**31"] = (_with_id(2**31), "output_ids")
    table["non-integer id"] = (_with_id(12.0), "output_ids")
    table["prompt echo mismatch"] = (
        lambda r, q: msgspec.structs.replace(r, prompt_ids=[*list(q.input_ids)[:-1], 0]),
        "prompt_ids",
    )
    table["prompt echo with an id >= 2**31"] = (
        lambda r, q: msgspec.structs.replace(r, prompt_ids=[*list(q.input_ids)[:-1], 2**40]),
        "prompt_ids",
    )
    return table


@pytest.mark.parametrize("case", sorted(BAD_SECOND_ANSWERS))
def test_invalid_engine_output_is_not_recorded_and_the_rollout_fails(qwen3_tokenizer, case):
    tok = qwen3_tokenizer
    tamper, field = _tampers(len(tok))[case]
    # first run: the clean trajectory after one turn, to compare with
    clean, _, _ = run_agent(tok, [CALL, "3"], {2: lambda r, q: (_ for _ in ()).throw(BackendError("stop here"))})
    after_first = snapshot(clean.trajectory)
    model, backend, error = run_agent(tok, [CALL, "3"], {2: tamper})
    cause = unwrap(error)
    assert isinstance(cause, BackendResponseError), error
    assert cause.field == field and field in str(cause)
    traj = model.trajectory
    assert traj.status == "failed"
    assert traj.status_reason is not None and traj.status_reason.startswith("BackendResponseError")
    assert snapshot(traj) == after_first  # the bad answer left no trace
    assert len(traj.turns) == 1 and traj.turns[0].rid == backend.requests[0].rid


def test_a_failed_call_is_atomic_when_recording_itself_fails():
    """Even a failure inside the append (here: the trajectory refuses a value) rolls the whole call back."""
    traj = Trajectory()
    traj.append("prompt", [1, 2], turn=0)
    before = snapshot(traj)
    with pytest.raises(TitoError), traj.atomic():
        traj.append("boundary", [3], turn=1)
        traj.append("prompt", [4, 5], turn=1)
        traj.append("output", [6, 7], [-0.1, 1e300], turn=1)  # widens the logprob array to float64
        traj.append("output", [8], ["x"], turn=1)  # type: ignore[list-item]
    assert snapshot(traj) == before
    traj.append("output", [9], [-0.25], turn=1)
    assert traj.token_ids == [1, 2, 9] and traj.logprobs == [None, None, -0.25]


def test_engine_abort_keeps_the_tokens_and_marks_the_rollout_aborted(qwen3_tokenizer):
    tok = qwen3_tokenizer
    model, backend, error = run_agent(tok, [CALL], {1: replace(finish_reason="abort")})
    assert isinstance(unwrap(error), GenerationAbortedError)
    traj = model.trajectory
    assert traj.status == "aborted" and "aborted" in (traj.status_reason or "")
    (turn,) = traj.turns
    assert turn.finish_reason == "abort"
    out = traj.token_ids[turn.output_start : turn.output_start + turn.output_len]
    assert out == backend.answers[turn.rid].output_ids  # what the engine produced before it aborted


def test_unsupported_content_block_fails_the_rollout(qwen3_tokenizer):
    tok = qwen3_tokenizer
    model = TitoModel(ScriptedBackend(tok, ["hi"]), tok)
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    with pytest.raises(Exception) as info:
        agent([{"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}}])
    assert isinstance(unwrap(info.value), UnsupportedContentError)
    traj = model.trajectory
    assert traj.status == "failed" and "image" in (traj.status_reason or "") and len(traj) == 0


def test_template_error_fails_the_rollout(qwen3_tokenizer):
    tok = qwen3_tokenizer
    template = "{{ raise_exception('this template refuses') }}"
    model = TitoModel(ScriptedBackend(tok, ["hi"]), tok, chat_template=template)
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    with pytest.raises(Exception) as info:
        agent("hello")
    assert isinstance(unwrap(info.value), TemplateError)
    assert model.trajectory.status == "failed" and "refuses" in (model.trajectory.status_reason or "")


@tool
def read_raw() -> str:
    """Return bytes decoded the lenient way (a lone surrogate for the byte 0xff)."""
    return b"ok \xff".decode("utf-8", "surrogateescape")


def test_lone_surrogate_in_a_tool_result_fails_the_rollout_with_a_clear_error(qwen3_tokenizer):
    tok = qwen3_tokenizer
    model, _, error = run_agent(tok, [hermes_call("read_raw", {}), "done"], tools=(read_raw,), prompt="Read.")
    cause = unwrap(error)
    assert isinstance(cause, UnsupportedContentError) and "surrogate" in str(cause)
    traj = model.trajectory
    assert traj.status == "failed" and len(traj.turns) == 1  # the first turn is kept whole


def test_backend_raising_a_foreign_exception_fails_the_rollout(qwen3_tokenizer):
    tok = qwen3_tokenizer

    def boom(result, request):
        raise RuntimeError("socket exploded")

    model, _, error = run_agent(tok, [CALL, "3"], {2: boom})
    assert error is not None
    traj = model.trajectory
    assert traj.status == "failed" and traj.status_reason == "RuntimeError: socket exploded"
    assert len(traj.turns) == 1


async def test_cancellation_marks_the_rollout_aborted(qwen3_tokenizer):
    tok = qwen3_tokenizer
    backend = ScriptedBackend(tok, ["slow"], delay=5.0)
    model = TitoModel(backend, tok)
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    task = asyncio.ensure_future(agent.invoke_async("hello"))
    while not backend.requests:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert model.trajectory.status == "aborted" and "cancelled" in (model.trajectory.status_reason or "")
    assert len(model.trajectory) == 0


def test_context_window_full_truncates(qwen3_tokenizer):
    tok = qwen3_tokenizer
    model, _, error = run_agent(tok, [CALL, "3"], context_window_limit=40)
    assert isinstance(error, ContextWindowOverflowException) or isinstance(
        unwrap(error), ContextWindowOverflowException
    )
    assert model.trajectory.status == "truncated" and "context window" in (model.trajectory.status_reason or "")


def test_a_failed_context_length_lookup_is_asked_again(qwen3_tokenizer):
    tok = qwen3_tokenizer

    class Flaky(ScriptedBackend):
        asked = 0

        async def max_context_length(self) -> int | None:
            self.asked += 1
            if self.asked == 1:
                raise BackendError("server_info is down", backend=self.name)
            return 4096

    backend = Flaky(tok, [CALL, "3"])
    model = TitoModel(backend, tok)
    Agent(model=model, tools=[add], callback_handler=None, conversation_manager=NullConversationManager())("go")
    assert backend.asked == 2  # failed once, asked again on the next call, then remembered
    first, second = backend.requests
    assert first.sampling.max_new_tokens is None
    assert second.sampling.max_new_tokens == 4096 - len(second.input_ids)


def test_a_failure_then_a_successful_retry_leaves_a_clean_status(qwen3_tokenizer):
    tok = qwen3_tokenizer
    backend = TamperingBackend(tok, [CALL, "3", "3"], {2: replace(finish_reason="eos")})
    model = TitoModel(backend, tok)
    agent = Agent(
        model=model,
        tools=[add],
        system_prompt=SYSTEM,
        callback_handler=None,
        conversation_manager=NullConversationManager(),
    )
    with pytest.raises(Exception):  # noqa: B017 - the type is checked in other tests
        agent("Add.")
    assert model.trajectory.status == "failed"
    # the caller retries the same conversation: the failed call left nothing, so no fork is needed
    asyncio.run(_stream_all(model, agent.messages, agent.tool_registry.get_all_tool_specs()))
    traj = model.trajectory
    assert traj.status == "completed" and traj.branch == 0 and len(traj.turns) == 2


async def _stream_all(model: TitoModel, messages, tool_specs) -> None:
    async for _ in model.stream(messages, tool_specs, SYSTEM):
        pass


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (ContextWindowOverflowException("full"), "truncated"),
        (asyncio.CancelledError(), "aborted"),
        (GenerationAbortedError("engine abort"), "aborted"),
        (BackendResponseError("bad", field="x"), "failed"),
        (ValueError("odd"), "failed"),
        (KeyboardInterrupt(), "aborted"),
    ],
)
def test_status_of_each_exception(exc, status):
    got, reason = status_of(exc)
    assert got == status and reason


def test_tool_parser_auto_is_inferred_from_the_template(qwen3_tokenizer):
    from tito_core.tool_parsers.hermes import HermesToolParser

    tok = qwen3_tokenizer
    model = TitoModel(ScriptedBackend(tok), tok, tool_parser="auto")
    assert isinstance(model.tool_parser, HermesToolParser)
    # a chat_template override is what the model renders with, so it is what the parser is inferred from
    mistral_like = "{% for m in messages %}{{ m['content'] }}{% endfor %}[TOOL_CALLS]"
    model = TitoModel(ScriptedBackend(tok), tok, tool_parser="auto", chat_template=mistral_like)
    assert type(model.tool_parser).__name__ == "MistralToolParser"


# A template that puts the tools block just before the LAST user message (as Mistral's do): adding a user
# turn moves it, which an incremental render cannot see.
MOVING_TOOLS_TEMPLATE = (
    "{%- set last = namespace(i=-1) -%}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set last.i = loop.index0 %}{% endif %}{% endfor -%}"
    "{%- for m in messages -%}"
    "{%- if loop.index0 == last.i and tools %}[TOOLS]{{ tools | map(attribute='function.name') | join(',') }}"
    "[/TOOLS]{% endif -%}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


def _two_user_turns(tok, *, render_mode, template=MOVING_TOOLS_TEMPLATE, replies=("first", "second")):
    backend = ScriptedBackend(tok, list(replies))
    model = TitoModel(backend, tok, chat_template=template, render_mode=render_mode)
    agent = Agent(
        model=model,
        tools=[add],
        system_prompt=SYSTEM,
        callback_handler=None,
        conversation_manager=NullConversationManager(),
    )
    agent("one")
    agent("two")
    return model, backend


def test_auto_render_detects_a_moving_tools_block_and_renders_the_whole_conversation(qwen3_tokenizer, caplog):
    tok = qwen3_tokenizer
    model, backend = _two_user_turns(tok, render_mode="auto")
    traj = model.trajectory
    assert "moves the tools block" in caplog.text
    assert traj.branch == 1 and "full render differs" in (traj.fork_reason or "")
    # what was sent on the second call is exactly the template's full render of the conversation
    second = backend.requests[1]
    full = tok.apply_chat_template(
        [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "first"},
            {"role": "user", "content": "two"},
        ],
        tools=[{"type": "function", "function": {"name": "add"}}],
        chat_template=MOVING_TOOLS_TEMPLATE,
        add_generation_prompt=True,
        tokenize=False,
    )
    assert list(second.input_ids) == tok.encode(full, add_special_tokens=False)
    assert traj.token_ids[: len(second.input_ids)] == list(second.input_ids)
    assert traj.status == "completed"


def test_incremental_render_keeps_tokens_whatever_the_template_would_move(qwen3_tokenizer):
    model, backend = _two_user_turns(qwen3_tokenizer, render_mode="incremental")
    traj = model.trajectory
    assert traj.branch == 0  # exact, but the tools block stays where the first render put it
    assert list(backend.requests[1].input_ids) == traj.token_ids[: len(backend.requests[1].input_ids)]


def test_full_render_forks_where_the_template_rewrites_earlier_turns(qwen3_tokenizer, caplog):
    """Qwen3's template drops the <think> block of turns before the last user message."""
    tok = qwen3_tokenizer
    replies = ("<think>\nplan it\n</think>\n\nfirst", "second")
    model, backend = _two_user_turns(tok, render_mode="full", template=None, replies=replies)
    traj = model.trajectory
    assert traj.branch == 1 and "full render differs" in (traj.fork_reason or "")
    # the warning (and the fork reason) name the first differing token: the model's <think>, where the re-render
    # of the first turn (now before the last user message) goes straight to its answer
    think = tok.convert_tokens_to_ids("<think>")
    first = tok.encode("first", add_special_tokens=False)[0]
    named = f"recorded {think} ('<think>'), rendered {first} ({tok.decode([first])!r})"
    assert named in (traj.fork_reason or "") and named in caplog.text
    (old,) = traj.branches
    assert old.closed and len(old.turns) == 1
    assert len(traj.turns) == 1 and traj.status == "completed"
    # the new branch's tokens are exactly what the engine consumed for the second call, plus its output
    second = backend.requests[1]
    assert traj.token_ids[: len(second.input_ids)] == list(second.input_ids)
    # with the default (incremental) mode the rollout stays one branch and keeps the think block's tokens
    model, _ = _two_user_turns(tok, render_mode="auto", template=None, replies=replies)
    assert model.trajectory.branch == 0


def test_render_mode_is_checked(qwen3_tokenizer):
    from tito_core.errors import ConfigError

    with pytest.raises(ConfigError, match="render_mode"):
        TitoModel(ScriptedBackend(qwen3_tokenizer), qwen3_tokenizer, render_mode="partial")


def test_model_sampling_goes_through_the_one_schema(qwen3_tokenizer):
    from tito_core.errors import ConfigError

    tok = qwen3_tokenizer
    with pytest.raises(ConfigError, match="did you mean `temperature`"):
        TitoModel(ScriptedBackend(tok), tok, sampling={"temprature": 0.7})
    with pytest.raises(ConfigError, match="max_new_tokens"):
        TitoModel(ScriptedBackend(tok), tok, sampling={"max_new_tokens": -5})
    model = TitoModel(ScriptedBackend(tok), tok, sampling={"temperature": 0.7})
    with pytest.raises(ConfigError, match="top_p"):
        model.update_config(sampling={"top_p": 1.5})
    assert model.sampling.temperature == 0.7


def test_models_on_one_tokenizer_path_share_one_load(qwen3_tokenizer, tmp_path):
    from tito_core.tokenizers import clear_tokenizer_cache

    tok = qwen3_tokenizer
    tok.save_pretrained(tmp_path / "tok")
    clear_tokenizer_cache()
    models = [TitoModel(ScriptedBackend(tok), str(tmp_path / "tok")) for _ in range(3)]
    assert models[0].tokenizer is models[1].tokenizer is models[2].tokenizer
    assert models[0].renderer is models[2].renderer


async def test_create_loads_the_tokenizer_off_the_event_loop(qwen3_tokenizer, tmp_path):
    from tito_core.tokenizers import clear_tokenizer_cache, is_tokenizer_cached

    qwen3_tokenizer.save_pretrained(tmp_path / "tok")
    clear_tokenizer_cache()
    path = str(tmp_path / "tok")
    ticks = 0

    async def heartbeat():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    beat = asyncio.ensure_future(heartbeat())
    model = await TitoModel.create(ScriptedBackend(qwen3_tokenizer), path)
    beat.cancel()
    assert ticks > 3  # the loop kept running while the tokenizer loaded
    assert is_tokenizer_cached(path) and len(model.tokenizer) == len(qwen3_tokenizer)


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 0.5, True, None, "-0.1"], ids=repr)
def test_logprob_check_refuses_what_the_fast_path_cannot_vouch_for(bad):
    """The C-level fast path of the logprob check lets nothing through that the per-value check refuses."""
    from tito_core.errors import BackendResponseError
    from tito_core.rollout_core.checks import _check_logprobs

    _check_logprobs([-0.5, 0, -1e-7, -30.25] * 100, "b", "output_logprobs", allow_none=False)  # plainly valid
    with pytest.raises(BackendResponseError, match="position 201"):
        _check_logprobs([-0.5] * 201 + [bad] + [-0.1] * 50, "b", "output_logprobs", allow_none=False)
