"""TitoModel behaviour through a real Strands Agent, on the in-process scripted backend."""

from __future__ import annotations

import asyncio

import pytest
from strands import Agent
from strands.agent.conversation_manager import NullConversationManager, SlidingWindowConversationManager
from strands.hooks import AfterModelCallEvent
from strands.types.exceptions import ContextWindowOverflowException, MaxTokensReachedException

from tests.helpers import scripted_agent
from tito_core import TitoModel, Trajectory
from tito_core.errors import BackendThrottledError, ConfigError, TitoError, UnsupportedContentError
from tito_testing.scripted import ScriptedBackend, ScriptedReply

from .helpers import SYSTEM, add, echo, hermes_call

IM_END = 151645


def make_agent(tokenizer, replies, *, tools=(add,), manager=None, hooks=None, **model_kwargs):
    return scripted_agent(tokenizer, replies, tools, system_prompt=SYSTEM, manager=manager, hooks=hooks, **model_kwargs)


def assert_token_in(backend: ScriptedBackend, traj: Trajectory) -> None:
    """Every request = the trajectory so far + its new prompt, and the trajectory grew by exactly that."""
    ids = traj.token_ids
    for turn, request in zip(traj.turns, backend.requests, strict=False):
        sent = list(request.input_ids)
        assert request.prefix_len == turn.prompt_start
        assert sent == ids[: turn.output_start]
        assert ids[turn.output_start : turn.output_start + turn.output_len] == list(
            ids[turn.output_start : turn.output_start + turn.output_len]
        )


def test_multi_turn_rollout_records_exact_tokens(qwen25_tokenizer):
    tok = qwen25_tokenizer
    replies = [hermes_call("add", {"a": 1, "b": 2}), hermes_call("add", {"a": 3, "b": 4}), "Done: 3 and 7."]
    agent, model, backend = make_agent(tok, replies)
    result = agent("Add 1+2, then 3+4.")
    assert str(result).strip() == "Done: 3 and 7."
    traj = model.trajectory
    assert traj.status == "completed"
    assert traj.branch == 0 and not traj.branches
    assert len(traj.turns) == 3
    assert_token_in(backend, traj)
    # outputs are exactly the scripted tokens, stop token included, with their logprobs
    for turn, text in zip(traj.turns, replies, strict=True):
        out = traj.token_ids[turn.output_start : turn.output_start + turn.output_len]
        assert out == tok.encode(text, add_special_tokens=False) + [IM_END]
        assert all(lp is not None for lp in traj.logprobs[turn.output_start : turn.output_start + turn.output_len])
    # the boundary after <|im_end|> is the template's "\n", never generated
    boundaries = [s for s in traj.segments if s.kind == "boundary"]
    assert [traj.tokens(s) for s in boundaries] == [[198], [198]]
    mask = traj.loss_mask
    assert sum(mask) == sum(t.output_len for t in traj.turns)
    assert [t.stop_reason for t in traj.turns] == ["tool_use", "tool_use", "end_turn"]


def test_output_tokens_are_never_re_encoded(qwen25_tokenizer):
    """Pitfall 1: decode -> encode is not identity; the trajectory keeps the engine's ids."""
    tok = qwen25_tokenizer
    # " hello" split into unusual pieces: a valid but non-canonical tokenization of the same text.
    odd = tok.encode(" he", add_special_tokens=False) + tok.encode("llo", add_special_tokens=False)
    assert odd != tok.encode(" hello", add_special_tokens=False)
    backend = ScriptedBackend(tok)

    async def odd_generate(request):
        from tito_core.backend import GenerateResult

        backend.requests.append(request)
        return GenerateResult(output_ids=[*odd, IM_END], output_logprobs=[-0.5] * (len(odd) + 1))

    backend.generate = odd_generate  # type: ignore[method-assign]
    model = TitoModel(backend, tok)
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    agent("hi")
    traj = model.trajectory
    out = traj.turns[0]
    assert traj.token_ids[out.output_start : out.output_start + out.output_len] == [*odd, IM_END]


def test_parallel_tool_results_keep_call_order(qwen25_tokenizer):
    """Pitfall 5: results of parallel calls follow the order of the calls, whatever their ids."""
    tok = qwen25_tokenizer
    calls = "\n".join(hermes_call("echo", {"text": t}) for t in ["first", "second", "third"])
    agent, model, backend = make_agent(tok, [calls, "ok"], tools=[echo])
    agent("go")
    prompt = tok.decode(backend.requests[1].input_ids[backend.requests[1].prefix_len :])
    assert prompt.index("first") < prompt.index("second") < prompt.index("third")


def test_tool_results_are_reordered_to_call_order(qwen25_tokenizer):
    tok = qwen25_tokenizer
    model = TitoModel(ScriptedBackend(tok), tok)
    from tito_core.strands_front.messages import to_chat_messages

    results = {"role": "user", "content": [
        {"toolResult": {"toolUseId": "functions.search:10", "content": [{"text": "B"}]}},
        {"toolResult": {"toolUseId": "functions.calc:2", "content": [{"text": "A"}]}},
    ]}  # fmt: skip
    chat = to_chat_messages([results], call_order=["functions.calc:2", "functions.search:10"])
    assert [m["content"] for m in chat] == ["A", "B"]
    assert model is not None


def test_tool_call_whitespace_is_kept_as_generated(qwen25_tokenizer):
    """Pitfall 6: compact JSON stays compact; the trajectory is not re-serialized."""
    tok = qwen25_tokenizer
    compact = hermes_call("add", {"a": 1, "b": 2}, compact=True)
    agent, model, backend = make_agent(tok, [compact, "3"])
    agent("add")
    text = tok.decode(model.trajectory.token_ids)
    assert '{"name":"add","arguments":{"a":1,"b":2}}' in text


def test_malformed_call_is_not_run_and_model_sees_its_raw_call(qwen25_tokenizer):
    """Pitfall 11: the raw call and the parse error are the tool result; counts are kept."""
    tok = qwen25_tokenizer
    bad = '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    ran = []

    from strands import tool

    @tool
    def add(a: int = 0, b: int = 0) -> int:
        """Add (all optional, so a silent {} would run)."""
        ran.append((a, b))
        return a + b

    agent, model, backend = make_agent(tok, [bad, "sorry"], tools=[add])
    agent("add")
    assert ran == []
    follow_up = tok.decode(backend.requests[1].input_ids[backend.requests[1].prefix_len :])
    assert "could not be parsed" in follow_up
    assert '"arguments": "{\\"a\\": 1}"' in follow_up  # its own raw call, verbatim
    assert model.trajectory.tool_parse_errors == {"add": 1}
    assert model.trajectory.turns[0].tool_parse_errors == 1
    raw_tokens = tok.encode(bad, add_special_tokens=False)
    first = model.trajectory.turns[0]
    assert model.trajectory.token_ids[first.output_start : first.output_start + len(raw_tokens)] == raw_tokens


def test_calls_inside_reasoning_are_not_executed(qwen3_tokenizer):
    """Pitfall 12: a draft call before a lone </think> (pre-opened thinking) must not run."""
    tok = qwen3_tokenizer
    ran = []

    from strands import tool

    @tool
    def shell(cmd: str) -> str:
        """Run a command."""
        ran.append(cmd)
        return "ok"

    out = (
        "Maybe "
        + hermes_call("shell", {"cmd": "rm -rf /"})
        + " no wait.\n</think>\n\n"
        + hermes_call("shell", {"cmd": "ls"})
    )
    agent, model, _ = make_agent(tok, [out, "listed"], tools=[shell])
    agent("list files")
    assert ran == ["ls"]


def test_length_truncation_keeps_tokens(qwen25_tokenizer):
    """Pitfall 10: a turn cut by the token limit is recorded; status truncated; tokens kept."""
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, ["word " * 50], sampling={"max_new_tokens": 7})
    with pytest.raises(MaxTokensReachedException):
        agent("talk")
    traj = model.trajectory
    assert traj.status == "truncated"
    assert traj.turns[0].output_len == 7 and traj.turns[0].stop_reason == "max_tokens"
    assert sum(traj.loss_mask) == 7


def test_max_new_tokens_is_clamped_to_the_room_left(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(
        tok,
        [hermes_call("add", {"a": 1, "b": 2}), "x"],
        context_length=400,
        sampling={"max_new_tokens": 10_000},
    )
    agent("add")
    for request in backend.requests:
        assert request.sampling.max_new_tokens == 400 - len(request.input_ids)


def test_no_room_raises_context_overflow_before_any_request(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, ["never"], context_window_limit=50)
    with pytest.raises(ContextWindowOverflowException):
        agent("a long question " * 20)
    assert backend.requests == []
    assert model.trajectory.status == "truncated"
    assert "context window" in (model.trajectory.status_reason or "")


def test_sliding_window_trim_forks_instead_of_crashing(qwen25_tokenizer):
    """Strands' default conversation manager trims history; the rollout forks into a new branch."""
    tok = qwen25_tokenizer
    replies = [hermes_call("add", {"a": i, "b": i}) for i in range(3)] + ["done", "again"]
    manager = SlidingWindowConversationManager(window_size=4, should_truncate_results=False)
    agent, model, backend = make_agent(tok, replies, manager=manager)
    agent("add many")
    assert len(agent.messages) <= 4  # the manager trimmed after the invocation
    agent("and once more")
    traj = model.trajectory
    assert traj.status == "completed"
    assert traj.branch == 1 and len(traj.branches) == 1
    assert {b.rollout_id for b in traj.branches} == {traj.rollout_id}
    assert not any(b.closed for b in traj.branches)  # the old lineage stays open: it may go on later
    assert "rewritten" in (traj.fork_reason or "")
    old = traj.branches[0]
    assert len(old.turns) == 4 and old.status == "completed"  # it had finished; the fork keeps that
    # the new branch re-rendered the trimmed conversation and still obeys token-in
    last = backend.requests[-1]
    assert list(last.input_ids) == traj.token_ids[: traj.turns[-1].output_start]
    assert traj.loss_mask.count(1) == traj.turns[-1].output_len
    assert model.reset() is traj and all(b.closed for b in traj.all_branches) and old.status == "completed"


def test_after_model_call_retry_forks_and_drops_the_discarded_output(qwen25_tokenizer):
    tok = qwen25_tokenizer
    retried = []

    def retry_once(event: AfterModelCallEvent) -> None:
        if not retried and event.stop_response is not None:
            retried.append(True)
            event.retry = True

    agent, model, backend = make_agent(tok, ["first try", "second try"], hooks=[retry_once])
    agent.hooks.add_callback(AfterModelCallEvent, retry_once)
    result = agent("hello")
    assert str(result).strip() == "second try"
    traj = model.trajectory
    assert traj.branch == 1 and traj.branches[0].status == "aborted"
    assert "discarded" in (traj.fork_reason or "")
    text = tok.decode(traj.token_ids)
    assert "first try" not in text and "second try" in text
    assert "first try" in tok.decode(traj.branches[0].token_ids)
    # the retry re-sent exactly the same prompt
    assert list(backend.requests[0].input_ids) == list(backend.requests[1].input_ids)


def test_edited_history_forks(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, ["answer one", "answer two"])
    agent("question one")
    agent.messages[0]["content"][0]["text"] = "question one, edited"
    agent("question two")
    traj = model.trajectory
    assert traj.branch == 1
    assert "question one, edited" in tok.decode(traj.token_ids)
    assert "question one, edited" not in tok.decode(traj.branches[0].token_ids)


def test_history_rebuilt_with_the_same_content_does_not_fork(qwen25_tokenizer):
    """A conversation manager may rebuild messages (new dicts, other key order): same content, same rollout."""
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, ["answer one", "answer two"])
    agent("question one")
    agent.messages[:] = [
        {"content": [dict(reversed(list(block.items()))) for block in message["content"]], "role": message["role"]}
        for message in agent.messages
    ]
    agent("question two")
    traj = model.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2
    assert_token_in(backend, traj)


def test_consumed_messages_are_compared_by_content_whatever_it_holds():
    from tito_core.conversation import canonical
    from tito_core.rollout_core.sync import _common_prefix

    class Opaque:  # content msgspec cannot encode: the message itself is kept and compared
        def __eq__(self, other: object) -> bool:
            return isinstance(other, Opaque)

        __hash__ = None  # type: ignore[assignment]

    plain = {"role": "user", "content": "hi"}
    odd = {"role": "tool", "tool_call_id": "c1", "content": Opaque()}
    seen = [canonical(plain), canonical(odd)]
    assert isinstance(seen[0], bytes) and seen[1] is odd
    same = [{"content": "hi", "role": "user"}, {"role": "tool", "tool_call_id": "c1", "content": Opaque()}]
    assert _common_prefix(same, seen) == 2
    assert _common_prefix([{"role": "user", "content": "hi!"}, odd], seen) == 0
    assert _common_prefix([plain, {"role": "tool", "tool_call_id": "c1", "content": 1}], seen) == 1
    assert _common_prefix([{"role": "assistant", "content": "hi"}], seen) == 0


def test_second_invocation_continues_the_same_rollout(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, ["one", "two"])
    agent("first")
    agent("second")
    traj = model.trajectory
    assert traj.branch == 0 and len(traj.turns) == 2
    assert_token_in(backend, traj)


def test_reset_closes_and_starts_a_new_rollout(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, ["one", "two"])
    agent("first")
    closed = model.reset()
    assert closed.closed and closed.status == "completed"
    assert model.trajectory is not closed and len(model.trajectory) == 0
    assert model.trajectory.rollout_id != closed.rollout_id
    agent.messages.clear()
    agent("again")
    assert len(model.trajectory.turns) == 1


def test_backend_failure_marks_failed_and_keeps_tokens(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, [hermes_call("add", {"a": 1, "b": 1})])  # no reply for call 2
    with pytest.raises(Exception) as info:  # Strands wraps it in an EventLoopException
        agent("add")
    assert isinstance(info.value, TitoError) or isinstance(info.value.__cause__, TitoError)
    traj = model.trajectory
    assert traj.status == "failed" and "no reply left" in (traj.status_reason or "")
    assert len(traj.turns) == 1 and len(traj) > 0


def test_throttling_is_not_retried_again_by_strands():
    # tito's HTTP client already retried with backoff; Strands' ModelRetryStrategy must not multiply that.
    from strands.event_loop._retry import ModelRetryStrategy

    assert not ModelRetryStrategy().is_retryable(BackendThrottledError("busy", status=429))


def test_stop_reasons_and_usage(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, [hermes_call("add", {"a": 2, "b": 2}), "4"])
    result = agent("2+2")
    usage = result.metrics.accumulated_usage
    total_prompt = sum(t.usage.prompt_tokens for t in model.trajectory.turns)
    assert usage["inputTokens"] == total_prompt
    assert usage["outputTokens"] == sum(t.output_len for t in model.trajectory.turns)


def test_stop_without_end_of_turn_token_closes_the_turn_as_template(qwen25_tokenizer):
    """Pitfall 3/7: an output that stopped without <|im_end|> gets <|im_end|>\\n as boundary tokens."""
    tok = qwen25_tokenizer
    replies = [ScriptedReply(text=hermes_call("add", {"a": 1, "b": 2}), stop_token=None), "3"]
    agent, model, backend = make_agent(tok, replies)
    agent("add")
    traj = model.trajectory
    boundary = next(s for s in traj.segments if s.kind == "boundary")
    assert traj.tokens(boundary) == [IM_END, 198]


def test_content_blocks_are_handled(qwen25_tokenizer):
    tok = qwen25_tokenizer
    backend = ScriptedBackend(tok, ["fine"])
    model = TitoModel(backend, tok)
    messages = [
        {"role": "user", "content": [{"text": "part A"}, {"text": "part B"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "add", "input": {"a": 1}}}]},
        {"role": "user", "content": [
            {"toolResult": {"toolUseId": "t1", "status": "error", "content": []}},
        ]},
        {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "hmm"}}}, {"text": "x"},
        ]},
        {"role": "user", "content": [
            {"toolResult": {"toolUseId": "t2", "content": [{"json": {"k": [1, "é"]}}, {"text": "more"}]}},
            {"text": "and a question"},
        ]},
    ]  # fmt: skip

    async def run():
        return [e async for e in model.stream(messages, system_prompt="s")]

    asyncio.run(run())
    prompt = tok.decode(backend.requests[0].input_ids)
    assert "part A\npart B" in prompt
    assert '{"k": [1, "é"]}\nmore' in prompt and "and a question" in prompt


def test_images_are_rejected_with_a_clear_error(qwen25_tokenizer):
    tok = qwen25_tokenizer
    model = TitoModel(ScriptedBackend(tok, ["x"]), tok)
    messages = [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": b""}}}]}]

    async def run():
        return [e async for e in model.stream(messages)]

    with pytest.raises(UnsupportedContentError, match="image"):
        asyncio.run(run())


def test_many_agents_share_one_backend_on_one_loop(qwen25_tokenizer):
    tok = qwen25_tokenizer
    backend = ScriptedBackend(tok, delay=0.001)
    for i in range(8):
        backend.add(hermes_call("add", {"a": i, "b": 1}))
    backend.add(*["done"] * 8)
    models = [TitoModel(backend, tok) for _ in range(8)]
    agents = [
        Agent(model=m, tools=[add], callback_handler=None, conversation_manager=NullConversationManager())
        for m in models
    ]

    async def run():
        await asyncio.gather(*(a.invoke_async(f"task {i}") for i, a in enumerate(agents)))

    asyncio.run(run())
    assert all(m.trajectory.status == "completed" and len(m.trajectory.turns) == 2 for m in models)


def test_same_model_generating_twice_at_once_records_both_calls(qwen25_tokenizer):
    """Two calls from one point at once: the second branches off the branch the first holds (``parallel``)."""
    tok = qwen25_tokenizer
    model = TitoModel(ScriptedBackend(tok, ["a", "b"], delay=0.05), tok)
    messages = [{"role": "user", "content": [{"text": "hi"}]}]

    async def consume():
        return [e async for e in model.stream(messages)]

    async def run():
        return await asyncio.gather(consume(), consume())

    first, second = asyncio.run(run())
    assert first and second
    traj = model.trajectory
    root, twin = sorted(traj.all_branches, key=lambda b: b.branch)
    assert (len(root.turns), len(twin.turns), twin.fork_kind, twin.parent_branch) == (1, 1, "parallel", None)
    assert root.token_ids[: root.turns[0].output_start] == twin.token_ids[: twin.turns[0].output_start]


def test_bad_config_is_rejected(qwen25_tokenizer):
    tok = qwen25_tokenizer
    with pytest.raises(ConfigError):
        TitoModel(ScriptedBackend(tok), tok, sampling={"temperature": "hot"})
    model = TitoModel(ScriptedBackend(tok), tok)
    with pytest.raises(ConfigError, match="unknown"):
        model.update_config(temprature=1.0)
    model.update_config(sampling={"temperature": 0.5})
    assert model.sampling.temperature == 0.5


def test_prompt_logprobs_align_with_prompt_tokens(qwen25_tokenizer):
    tok = qwen25_tokenizer
    agent, model, backend = make_agent(tok, [hermes_call("add", {"a": 1, "b": 2}), "3"], return_prompt_logprobs=True)
    agent("add")
    traj = model.trajectory
    lps = traj.logprobs
    assert lps[0] is None  # the very first token has no logprob
    assert all(lp is not None for lp in lps[1:])


def test_output_not_taken_by_strands_is_not_kept_as_accepted(qwen25_tokenizer):
    """A consumer that stops reading early never appends the output; the next call forks it away."""
    tok = qwen25_tokenizer
    backend = ScriptedBackend(tok, ["abandoned", "kept"])
    model = TitoModel(backend, tok)
    messages = [{"role": "user", "content": [{"text": "hi"}]}]

    async def first_event_only():
        async for _ in model.stream(messages):
            break

    async def consume():
        return [e async for e in model.stream(messages)]

    asyncio.run(first_event_only())
    asyncio.run(consume())
    traj = model.trajectory
    assert traj.branch == 1 and "discarded" in (traj.fork_reason or "")
    assert "abandoned" not in tok.decode(traj.token_ids) and "kept" in tok.decode(traj.token_ids)
    assert list(backend.requests[0].input_ids) == list(backend.requests[1].input_ids)


def test_engine_abort_keeps_tokens_and_says_why(qwen25_tokenizer):
    from tito_core.backend import GenerateResult

    tok = qwen25_tokenizer
    backend = ScriptedBackend(tok)

    async def aborted(request):
        return GenerateResult(output_ids=[9707], output_logprobs=[-1.0], finish_reason="abort")

    backend.generate = aborted  # type: ignore[method-assign]
    model = TitoModel(backend, tok)
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    with pytest.raises(Exception) as info:
        agent("hi")
    assert "aborted" in str(info.value)
    traj = model.trajectory
    assert traj.status == "aborted" and traj.turns[0].finish_reason == "abort"
    assert traj.token_ids[-1] == 9707 and traj.loss_mask[-1] == 1


def test_backend_selected_by_string_in_config(tmp_path):
    from tito_core import load_config
    from tito_testing.tokenizers import qwen_tokenizer_dir

    tokenizer_dir = str(qwen_tokenizer_dir("qwen2.5"))
    config_file = tmp_path / "tito.toml"
    config_file.write_text(
        f'backend = "scripted"\ntokenizer = "{tokenizer_dir}"\ntool_parser = "hermes"\n'
        f'[backend_options]\ntokenizer = "{tokenizer_dir}"\nreplies = ["configured reply"]\n'
        "[sampling]\ntemperature = 0.0\nmax_new_tokens = 64\n"
    )
    model = load_config(config_file).create_model()
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    assert str(agent("hi")).strip() == "configured reply"
    assert model.backend.requests[0].sampling.max_new_tokens == 64
    assert model.trajectory.status == "completed"


def test_another_eos_is_not_shown_as_content(qwen25_tokenizer):
    """Pitfall 7: a turn that ends on another EOS (<|endoftext|>) keeps it as a token, not as text."""
    from tito_core.backend import GenerateResult

    tok = qwen25_tokenizer
    backend = ScriptedBackend(tok)
    text_ids = tok.encode("All done.", add_special_tokens=False)

    async def eos_stop(request):
        backend.requests.append(request)
        ids = [*text_ids, 151643]
        return GenerateResult(output_ids=ids, output_logprobs=[-0.1] * len(ids), matched_stop=151643)

    backend.generate = eos_stop  # type: ignore[method-assign]
    model = TitoModel(backend, tok)
    agent = Agent(model=model, callback_handler=None, conversation_manager=NullConversationManager())
    assert str(agent("hi")).strip() == "All done."
    agent("more")
    traj = model.trajectory
    assert traj.branch == 0
    assert traj.token_ids[traj.turns[0].output_start + len(text_ids)] == 151643
    boundary = next(s for s in traj.segments if s.kind == "boundary")
    assert traj.tokens(boundary) == [IM_END, 198]  # the turn is closed as the template would


def test_incremental_json_of_input_ids_is_byte_exact(qwen25_tokenizer):
    """An adapter's per-sequence JSON of the ids equals a fresh encoding on every call, across forks too."""
    import msgspec

    from tito_core.http.ids_json import IdsJson
    from tito_core.rollout_core.lineages import LIVE_SEQUENCES

    tok = qwen25_tokenizer

    class JsonBackend(ScriptedBackend):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.ids_json = IdsJson()
            self.extended = 0

        async def generate(self, request):
            kept = len(self.ids_json) and request.sequence in self.ids_json._texts
            self.extended += bool(kept)
            assert self.ids_json.encode(request) == msgspec.json.encode(list(request.input_ids))
            return await super().generate(request)

        def end_sequence(self, sequence):
            self.ids_json.end(sequence)

    replies = [hermes_call("add", {"a": i, "b": 1}) for i in range(3)] + ["done", "again", "more"]
    backend = JsonBackend(tok, replies)
    model = TitoModel(backend, tok)
    manager = SlidingWindowConversationManager(window_size=4, should_truncate_results=False)
    agent = Agent(model=model, tools=[add], callback_handler=None, conversation_manager=manager)
    agent("add")
    agent("and again")  # the window trimmed the history: this call forks
    agent("once more")
    assert model.trajectory.branch >= 1 and len(backend.requests) == 6
    assert backend.extended >= 3  # later calls of a branch extend the kept text
    # a branch left behind by a rewrite stays open with its text, up to the rollout's bound on live sequences
    branches = len(model.trajectory.all_branches)
    assert branches >= 2 and len(backend.ids_json) == min(branches, LIVE_SEQUENCES)
    model.reset()
    assert len(backend.ids_json) == 0  # closing the rollout ended every sequence
