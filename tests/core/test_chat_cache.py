"""ChatCache: a call's unchanged messages are the previous call's objects; anything changed is the call's own."""

from __future__ import annotations

import asyncio

from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager

from tests.helpers import scripted_agent
from tito_core.conversation import ChatCache, Conversation
from tito_core.render.renderer import ChatRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.tool_parsers.hermes import HermesToolParser
from tito_testing.scripted import ScriptedBackend

from .helpers import SYSTEM, add


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text, "tool_calls": [{"id": "c1", "function": {"name": "f"}}]}


def test_unchanged_leading_messages_are_the_previous_calls_objects():
    cache = ChatCache()
    first = cache.reuse([user("q"), assistant("a")])
    second = cache.reuse([user("q"), assistant("a"), user("r")])
    assert second[0] is first[0] and second[1] is first[1]
    assert second == [user("q"), assistant("a"), user("r")]


def test_a_changed_message_and_everything_after_it_stay_the_calls_own():
    cache = ChatCache()
    first = cache.reuse([user("q"), assistant("a"), user("r")])
    edited = [user("q"), assistant("a, edited"), user("r")]
    second = cache.reuse(edited)
    assert second[0] is first[0]
    assert second[1] is edited[1] and second[1]["content"] == "a, edited"
    assert second[2] is edited[2]  # equal again, but after a change: not replaced


def test_a_message_equal_in_python_but_not_in_its_tokens_is_not_replaced():
    """``1 == 1.0 == True``, but a template writes them differently: such a change is the call's own message."""
    cache = ChatCache()
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    cache.reuse([user("q"), {"role": "assistant", "content": "", "tool_calls": [call]}])
    for value in (1.0, True):
        changed = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": value}}}
        edited = [user("q"), {"role": "assistant", "content": "", "tool_calls": [changed]}]
        assert cache.reuse(edited)[1]["tool_calls"][0]["function"]["arguments"]["a"] is value


def test_each_conversation_is_known_by_its_first_message_and_only_the_most_recent_are_kept():
    cache = ChatCache(size=2)
    parent = cache.reuse([user("parent"), assistant("p")])
    child = cache.reuse([user("child"), assistant("c")])
    assert cache.reuse([user("parent"), assistant("p")])[1] is parent[1]  # interleaved: each keeps its own
    assert cache.reuse([user("child"), assistant("c")])[1] is child[1]
    cache.reuse([user("third")])  # the parent is now the least recently used of three: dropped
    again = [user("parent"), assistant("p")]
    assert cache.reuse(again)[1] is again[1]
    cache.clear()
    fresh = [user("child"), assistant("c")]
    assert cache.reuse(fresh)[1] is fresh[1]


def test_the_model_reuses_unchanged_messages_and_records_edits_exactly(qwen25_tokenizer):
    """Through a real agent: the second call's earlier messages are the first call's; an edit still forks."""
    agent, model, backend = scripted_agent(
        qwen25_tokenizer,
        ['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>', "3"],
        [add],
        system_prompt=SYSTEM,
    )
    seen = []
    original = model._rollout.call

    async def spy(conversation, *args, **kwargs):
        seen.append(conversation.messages)
        return await original(conversation, *args, **kwargs)

    model._rollout.call = spy
    agent("add 1 and 2")
    assert len(seen) == 2
    assert seen[1][0] is seen[0][0]  # the user question: last call's object
    assert model.trajectory.branch == 0
    backend.add("edited")
    agent.messages[0]["content"][0]["text"] = "add 1 and 2, please"  # an edit of the first message: a new lineage
    agent("and again?")
    assert seen[2][0] is not seen[1][0] and seen[2][0]["content"] == "add 1 and 2, please"
    assert model.trajectory.branch == 1


def test_unchanged_tools_are_the_last_calls_object_and_a_changed_list_is_new(qwen25_tokenizer):
    """Through the rollout: the tools the second call renders are the first call's; a changed list is new."""
    spec = {"name": "f", "description": "d", "inputSchema": {"json": {"type": "object", "properties": {}}}}
    backend = ScriptedBackend(qwen25_tokenizer, ["a", "b", "c"])
    rollout = Rollout(backend, ChatRenderer(qwen25_tokenizer), HermesToolParser())
    seen = []
    choose = rollout._lineages.choose

    def spy(conversation, tools, label=None):
        seen.append(tools)
        return choose(conversation, tools, label)

    rollout._lineages.choose = spy
    question = [{"role": "user", "content": "q"}]
    for specs in ([spec], [dict(spec)], [{**spec, "description": "other"}]):
        asyncio.run(rollout.call(Conversation(messages=question, tool_specs=specs), CallOptions()))
    assert seen[1] is seen[0]
    assert seen[2] is not seen[0] and seen[2][0]["function"]["description"] == "other"


def test_every_agent_on_one_model_refuses_its_malformed_calls(qwen25_tokenizer):
    """A model guards each agent it serves (the first one and any other), once each."""
    ran = []

    @tool
    def act(a: int = 0) -> int:
        """Act (optional argument, so a silent {} would run)."""
        ran.append(a)
        return a

    bad = '<tool_call>\n{"name": "act", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    agent, model, backend = scripted_agent(qwen25_tokenizer, [bad, "no", bad, "no", bad, "no"], [act])
    other = Agent(model=model, tools=[act], callback_handler=None, conversation_manager=NullConversationManager())
    agent("first")
    other("second")
    agent("third")
    assert ran == []  # no agent ran a call it could not parse (a silent {} would have run)
    assert sum(turn.tool_parse_errors for branch in model.trajectory.all_branches for turn in branch.turns) == 3
