"""Mistral row of the fidelity matrix: tito vs mistral-common's encoding of the whole conversation.

The reference is what vLLM / SGLang compute for Mistral models: ``MistralCommonBackend.apply_chat_template``
(mistral-common) on the conversation so far, built here from the Strands messages independently of tito.
Hypothesis writes multi-turn tool conversations (parallel calls, error results, unicode, empty tool
results, control-token text such as ``[INST]`` or ``</s>`` inside user and tool messages); each is replayed
through a real :class:`~tito_core.rollout_core.Rollout` whose engine answers every assistant turn with the ids
mistral-common gives it. Measured divergence: tokenizer v3 encodes the tools block and the system prompt
with the *last* user message (v7 and v11: the tools block), so a later user message moves them. v11
(``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``) and v13 (no call ids, tools block first, ``[THINK]``) are the
real Tekken vocabulary loaded as those versions; v13 moves nothing and matches token for token.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strands.types.content import Messages
from strands.types.tools import ToolSpec

from tito_core.errors import ConfigError, TemplateError
from tito_core.plugins import get_tool_parser
from tito_core.render.mistral import MistralCommonRenderer
from tito_core.rollout_core import CallOptions, Rollout
from tito_core.strands_front.messages import to_conversation
from tito_testing.families import load_family_tokenizer

from .replay import IdsBackend, replay

pytest.importorskip("mistral_common")

EXAMPLES = int(os.environ.get("TITO_FIDELITY_EXAMPLES", "30"))
COUNTS: Counter[str] = Counter()
FAMILIES = ("mistral", "mistral_v7", "mistral_v11", "mistral_v13")
MOVES_TOOLS = {"mistral", "mistral_v7", "mistral_v11"}  # v13 writes the tools block before the first user message
NO_CALL_IDS = {"mistral_v13"}  # v13 encodes calls and results without ids: tito's parser gives new ones
SYSTEM = "Be brief."
TOOLS: list[ToolSpec] = [
    {
        "name": name,
        "description": f"{name} tool",
        "inputSchema": {"json": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}},
    }
    for name in ("search", "calc")
]
CONTROL_TEXT = ["[INST]", "[/INST]", "</s>", "<s>", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[AVAILABLE_TOOLS]"]
PLAIN = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)
TEXT = st.lists(st.one_of(PLAIN, st.sampled_from(CONTROL_TEXT)), max_size=3).map("".join)
# The model's own text never spells markup: its decoded output would read as markup. Hypothesis also draws string
# constants from the project's source (such as "[/THINK]"), so plain text is filtered, not only built without them.
MODEL_TEXT = PLAIN.filter(lambda text: not any(mark in text for mark in [*CONTROL_TEXT, "[THINK]", "[/THINK]"]))


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print("\nhypothesis examples per Mistral check:", dict(sorted(COUNTS.items())))


@st.composite
def conversations(draw: st.DrawFn, thinking: bool = False) -> Messages:
    """Tool conversations in the shapes mistral-common accepts: an assistant turn is text or calls, not both.

    With ``thinking`` (v13), text turns may start with reasoning (``[THINK]...[/THINK]``).
    """
    messages: Messages = [{"role": "user", "content": [{"text": draw(TEXT) or "hi"}]}]
    for turn in range(draw(st.integers(1, 4))):
        n_calls = draw(st.integers(0, 2))
        ids = [f"call{turn:02d}{i:02d}x" for i in range(n_calls)]  # 9 letters/digits, as Mistral models write
        if ids:
            content: list[Any] = [
                {
                    "toolUse": {
                        "toolUseId": call_id,
                        "name": draw(st.sampled_from(["search", "calc"])),
                        "input": draw(
                            st.dictionaries(
                                st.sampled_from(["q", "n"]), st.one_of(PLAIN, st.integers(-5, 99)), max_size=2
                            )
                        ),
                    }
                }
                for call_id in ids
            ]
        else:  # the model's own text: no control-token text (its decoded output would read as markup)
            content = [{"text": draw(MODEL_TEXT).strip() or "ok"}]
            if thinking and draw(st.booleans()):
                content.insert(0, {"reasoningContent": {"reasoningText": {"text": draw(MODEL_TEXT).strip() or "hmm"}}})
        messages.append({"role": "assistant", "content": content})
        if ids:
            results = [
                {
                    "toolResult": {
                        "toolUseId": call_id,
                        "status": draw(st.sampled_from(["success", "error"])),
                        "content": [{"text": draw(TEXT)}],
                    }
                }
                for call_id in ids
            ]
            if not draw(st.integers(0, 2)):  # the user also writes, after the results: a later user turn
                results.append({"text": draw(TEXT) or "and?"})
            messages.append({"role": "user", "content": results})
        elif draw(st.integers(0, 2)):  # a later user turn (what moves the tools block) two times in three
            messages.append({"role": "user", "content": [{"text": draw(TEXT) or "more"}]})
        else:
            break
    return messages


def openai_messages(messages: Messages, system: str | None) -> list[dict[str, Any]]:
    """The conversation as an OpenAI chat request, as an engine's chat endpoint receives it."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        blocks = message["content"]
        reasoning = [b["reasoningContent"]["reasoningText"]["text"] for b in blocks if "reasoningContent" in b]
        if reasoning:  # v13: a text turn with its reasoning, as one message of thinking and text parts
            parts = [{"type": "thinking", "thinking": text} for text in reasoning]
            parts += [{"type": "text", "text": b["text"]} for b in message["content"] if "text" in b]
            out.append({"role": message["role"], "content": parts})
            continue
        for block in message["content"]:
            if "text" in block:
                out.append({"role": message["role"], "content": block["text"]})
            elif "toolUse" in block:
                use = block["toolUse"]
                call = {"id": use["toolUseId"], "type": "function"}
                call["function"] = {"name": use["name"], "arguments": json.dumps(use["input"], ensure_ascii=False)}
                if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                    out[-1]["tool_calls"].append(call)
                else:
                    out.append({"role": "assistant", "tool_calls": [call]})
            elif "toolResult" in block:
                result = block["toolResult"]
                text = "\n".join(item["text"] for item in result["content"])
                out.append({"role": "tool", "tool_call_id": result["toolUseId"], "content": text})
    return out


def openai_tools(tools: list[ToolSpec] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["inputSchema"]["json"]},
        }
        for t in tools
    ]


class Reference:
    """mistral-common's encoding of a conversation, and of each assistant turn as the model generates it."""

    def __init__(self, family: str, messages: Messages, tools: list[ToolSpec] | None, system: str | None) -> None:
        self.tok = load_family_tokenizer(family)
        self.messages, self.tools, self.system = messages, openai_tools(tools), system

    def prompt(self, upto: int) -> list[int]:
        """The ids an engine computes for a request holding ``messages[:upto]``."""
        chat = openai_messages(self.messages[:upto], self.system)
        return list(self.tok.apply_chat_template(chat, tools=self.tools, tokenize=True, return_dict=False))

    def output(self, i: int) -> list[int]:
        """The ids of assistant message ``i`` as generated: the encoding's growth when it is added, then ``</s>``."""
        before = self.prompt(i)
        chat = openai_messages(self.messages[: i + 1], self.system)
        with_turn = self.tok.apply_chat_template(
            chat, tools=self.tools, tokenize=True, return_dict=False, continue_final_message=True
        )
        assert with_turn[: len(before)] == before
        return [*with_turn[len(before) :], self.tok.eos_token_id]


def user_turns(messages: Messages, upto: int) -> int:
    return sum(1 for m in messages[:upto] if m["role"] == "user" and any("text" in b for b in m["content"]))


def without_moving_parts(tok: Any, ids: list[int]) -> str:
    """The decoded text without what v3/v7 move to the last user turn: the tools block and v3's system prompt."""
    begin, end = tok.convert_tokens_to_ids("[AVAILABLE_TOOLS]"), tok.convert_tokens_to_ids("[/AVAILABLE_TOOLS]")
    kept: list[int] = []
    inside = False
    for token in ids:  # by id: the same text inside a message is plain tokens, never these control ids
        if token in (begin, end):
            inside = token == begin
        elif not inside:
            kept.append(token)
    return tok.decode(kept, skip_special_tokens=False).replace(f"[INST]{SYSTEM}\n\n", "[INST]")


def without_ids(messages: Messages) -> list[Any]:
    """The conversation without its call ids (v13 encodes none)."""
    out: list[Any] = []
    for message in messages:
        blocks: list[Any] = []
        for block in message["content"]:
            if "toolUse" in block:
                block = {"toolUse": {k: v for k, v in block["toolUse"].items() if k != "toolUseId"}}
            elif "toolResult" in block:
                block = {"toolResult": {k: v for k, v in block["toolResult"].items() if k != "toolUseId"}}
            blocks.append(block)
        out.append({"role": message["role"], "content": blocks})
    return out


def test_v13_reasoning_is_read_back_and_encoded_as_mistral_common_does() -> None:
    """v13 (Magistral's layout) keeps earlier [THINK] blocks: incremental ids equal mistral-common's every call."""

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations(thinking=True))
    def body(messages: Messages) -> None:
        COUNTS["mistral_v13 incremental, [THINK] + tools + system"] += 1
        thinks = any("reasoningContent" in b for m in messages for b in m["content"])
        COUNTS["mistral_v13 [THINK] examples with reasoning"] += thinks
        ref = Reference("mistral_v13", messages, TOOLS, SYSTEM)
        sent, traj, history = replay(
            ref.tok, messages, ref.output, parser="mistral", tools=TOOLS, system=SYSTEM, render_mode="incremental"
        )
        assert traj.branch == 0, traj.fork_reason
        assert without_ids(history) == without_ids(messages)  # reasoning, text and calls read back
        for request, i in zip(sent, calls(messages), strict=True):
            assert request == ref.prompt(i), f"call before message {i}"

    body()


def calls(messages: Messages) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "assistant"]


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_equals_mistral_common_without_moving_parts(family: str) -> None:
    """No tools, no system prompt: tito's incremental ids are mistral-common's, token for token, every call."""

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations())
    def body(messages: Messages) -> None:
        COUNTS[f"{family} incremental, no tools"] += 1
        ref = Reference(family, messages, None, None)
        sent, traj, history = replay(
            ref.tok, messages, ref.output, parser="mistral", tools=None, system=None, render_mode="incremental"
        )
        assert traj.branch == 0, traj.fork_reason
        if family in NO_CALL_IDS:
            assert without_ids(history) == without_ids(messages)
        else:
            assert history == messages  # the parser reads back every turn as it was written
        for request, i in zip(sent, calls(messages), strict=True):
            assert request == ref.prompt(i), f"call before message {i}"

    body()


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_diverges_only_by_the_moving_tools_block(family: str) -> None:
    """With tools and a system prompt: equal until a second user turn, then different only by what moved."""

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations())
    def body(messages: Messages) -> None:
        COUNTS[f"{family} incremental, tools + system"] += 1
        ref = Reference(family, messages, TOOLS, SYSTEM)
        sent, traj, _ = replay(
            ref.tok, messages, ref.output, parser="mistral", tools=TOOLS, system=SYSTEM, render_mode="incremental"
        )
        assert traj.branch == 0, traj.fork_reason  # one consistent branch: the model's own tokens are kept
        for request, i in zip(sent, calls(messages), strict=True):
            expected = ref.prompt(i)
            if user_turns(messages, i) == 1 or family not in MOVES_TOOLS:
                assert request == expected, f"call before message {i}"
            else:
                COUNTS[f"{family} calls after a second user turn"] += 1
                assert request != expected
                assert without_moving_parts(ref.tok, request) == without_moving_parts(ref.tok, expected)

    body()


@pytest.mark.parametrize("mode", ["auto", "full"])
@pytest.mark.parametrize("family", FAMILIES)
def test_auto_and_full_send_mistral_commons_encoding(family: str, mode: str) -> None:
    """render_mode 'full' (and 'auto', which detects the move) send exactly what mistral-common encodes."""

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations())
    def body(messages: Messages) -> None:
        COUNTS[f"{family} {mode}"] += 1
        ref = Reference(family, messages, TOOLS, SYSTEM)
        sent, traj, _ = replay(
            ref.tok, messages, ref.output, parser="mistral", tools=TOOLS, system=SYSTEM, render_mode=mode
        )
        for request, i in zip(sent, calls(messages), strict=True):
            COUNTS[f"{family} {mode}: calls after a second user turn"] += user_turns(messages, i) > 1
            assert request == ref.prompt(i), f"call before message {i}"
        assert traj.status in ("running", "completed")

    body()


def test_control_token_text_in_a_tool_result_stays_text() -> None:
    tok = load_family_tokenizer("mistral")
    messages: Messages = [
        {"role": "user", "content": [{"text": "Look it up."}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "abcdefgh1", "name": "search", "input": {}}}]},
        {
            "role": "user",
            "content": [{"toolResult": {"toolUseId": "abcdefgh1", "content": [{"text": "[INST] </s> [TOOL_CALLS]"}]}}],
        },
        {"role": "assistant", "content": [{"text": "Done."}]},
    ]
    ref = Reference("mistral", messages, TOOLS, SYSTEM)
    sent, traj, _ = replay(tok, messages, ref.output, parser="mistral", tools=TOOLS, system=SYSTEM, render_mode="auto")
    assert sent[1] == ref.prompt(3)
    new = sent[1][len(sent[0]) + len(ref.output(1)) :]
    control = {tok.convert_tokens_to_ids(t) for t in ("[INST]", "</s>", "[TOOL_CALLS]")}
    opened, closed = tok.convert_tokens_to_ids("[TOOL_RESULTS]"), tok.convert_tokens_to_ids("[/TOOL_RESULTS]")
    assert new[0] == opened and new[-1] == closed and not control & set(new)
    # a Hugging Face encoder of the same text would have made them control tokens: tito does not
    assert "[INST] </s> [TOOL_CALLS]" in tok.decode(new)
    assert traj.branch == 0


def test_chat_template_with_a_mistral_common_tokenizer_is_a_config_error() -> None:
    from tito_core.strands_front.model import TitoModel

    tok = load_family_tokenizer("mistral")
    with pytest.raises(ConfigError, match="mistral-common"):
        TitoModel(IdsBackend([]), tok, chat_template="{{ messages }}")
    model = TitoModel(IdsBackend([]), tok, tool_parser="auto")
    assert type(model.renderer).__name__ == "MistralCommonRenderer"
    assert type(model.tool_parser).__name__ == "MistralToolParser"


def test_a_mistral_common_failure_fails_the_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash inside mistral-common on a later call leaves the rollout ``failed`` with the reason, not running."""
    tok = load_family_tokenizer("mistral")
    messages: Messages = [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "abcdefgh1", "name": "search", "input": {}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "abcdefgh1", "content": [{"text": "r"}]}}]},
    ]
    backend = IdsBackend([Reference("mistral", messages, TOOLS, SYSTEM).output(1)])
    rollout = Rollout(backend, MistralCommonRenderer(tok), get_tool_parser("mistral"))
    asyncio.run(rollout.call(to_conversation(messages[:1], TOOLS, SYSTEM), CallOptions()))
    assert rollout.trajectory.status == "running"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("mistral-common exploded")

    monkeypatch.setattr(tok, "apply_chat_template", broken)
    with pytest.raises(TemplateError, match="exploded"):
        asyncio.run(rollout.call(to_conversation(messages, TOOLS, SYSTEM), CallOptions()))
    assert rollout.trajectory.status == "failed"
    assert "exploded" in (rollout.trajectory.status_reason or "")


def test_an_output_cut_before_its_end_of_turn_is_closed_with_a_loss_free_eos() -> None:
    """A turn that stopped without ``</s>`` (a stop string, a length limit) is closed by a boundary ``</s>``."""
    tok = load_family_tokenizer("mistral")
    messages: Messages = [
        {"role": "user", "content": [{"text": "Look it up."}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "abcdefgh1", "name": "search", "input": {}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "abcdefgh1", "content": [{"text": "r"}]}}]},
        {"role": "assistant", "content": [{"text": "Done."}]},
    ]
    ref = Reference("mistral", messages, TOOLS, SYSTEM)
    sent, traj, _ = replay(
        tok, messages, lambda i: ref.output(i)[:-1], parser="mistral", tools=TOOLS, system=SYSTEM, render_mode="auto"
    )
    assert sent[1] == ref.prompt(3)
    boundary = [s for s in traj.segments if s.kind == "boundary" and s.end > s.start]
    assert [traj.token_ids[s.start : s.end] for s in boundary] == [[tok.eos_token_id]]
