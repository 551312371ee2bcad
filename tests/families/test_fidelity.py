"""Fidelity matrix: per family, tito's incremental render vs the family's reference (the full HF render).

Hypothesis writes multi-turn tool conversations (parallel calls, error results, reasoning where the
family has it, unicode, empty content). For each, :func:`check_prefix_preservation` renders it the way
tito does (first prompt, each assistant turn as the template writes it when last, boundary + only the
new messages after a dummy prefix) and as the template renders the whole conversation. Families marked
``equal`` must match text for text and token for token (pieces tokenized separately, as tito does, vs
the whole text tokenized at once). Other families must diverge only in the documented way; under
``render_mode="full"`` every family, divergent ones included, must send the reference encoding on every call.
Example counts per family are printed at the end of the session (``-s`` or the summary). The Mistral rows
(mistral-common, no template) are in ``test_mistral.py``.
"""

from __future__ import annotations

import os
import re
import tarfile
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strands.types.content import Messages
from strands.types.tools import ToolSpec

from tito_core.analysis.prefix_check import PrefixReport, check_prefix_preservation
from tito_core.conversation import tool_specs_to_chat
from tito_core.errors import TemplateError
from tito_core.plugins import get_tool_parser
from tito_core.render import shared_renderer
from tito_core.render.renderer import ChatRenderer, first_difference
from tito_core.strands_front.messages import to_chat_messages
from tito_testing.families import FAMILIES, llama_cpp_sdist, load_family_tokenizer
from tito_testing.tokenizers import chat_template

from .replay import replay

EXAMPLES = int(os.environ.get("TITO_FIDELITY_EXAMPLES", "30"))
COUNTS: Counter[str] = Counter()
TOOLS: list[ToolSpec] = [
    {
        "name": name,
        "description": f"{name} tool",
        "inputSchema": {"json": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}},
    }
    for name in ("search", "calc")
]

# How each family's template treats incremental rendering, as measured (docs/models.md has the table).
EQUAL = {"qwen2.5", "llama3", "deepseek_v3", "kimi_k2"}
DROPS_REASONING = {"qwen3", "qwen3_5", "glm"}  # earlier reasoning (or Qwen3's empty think block) is dropped
NOT_INCREMENTAL = {"gemma4", "gpt_oss"}  # tool results cannot be rendered after tito's dummy prefix
# llama.cpp's copy of Kimi-K2-Thinking's template appends to a list, which transformers' sandbox refuses: any
# conversation with a tool call fails to render (in vLLM / SGLang too); earlier reasoning is emptied as in GLM
REFUSES_TOOL_CALLS = {"kimi_k2_thinking"}
SPLIT_THINK_NEWLINES = {"qwen3_5"}  # equal text; the ids differ at an empty think block (see check)
MAX_CALLS = {"llama3": 1, "gpt_oss": 1, "kimi_k2_thinking": 0}  # parallel calls refused; no calls (see below)
HF_FAMILIES = sorted(EQUAL | DROPS_REASONING | NOT_INCREMENTAL | REFUSES_TOOL_CALLS)
SYSTEM = "Be brief."

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print("\nhypothesis examples per family:", dict(sorted(COUNTS.items())))


@st.composite
def conversations(draw: st.DrawFn, thinking: bool, max_calls: int = 2) -> Messages:
    messages: Messages = [{"role": "user", "content": [{"text": draw(TEXT) or "hi"}]}]
    for turn in range(draw(st.integers(1, 3))):
        content: list[Any] = []
        if thinking and draw(st.booleans()):
            content.append({"reasoningContent": {"reasoningText": {"text": draw(TEXT) or "hmm"}}})
        text = draw(TEXT)
        if text.strip():
            content.append({"text": text.strip()})
        n_calls = draw(st.integers(0, max_calls))
        ids = [f"call_{turn}_{i}" for i in range(n_calls)]
        for call_id in ids:
            args = draw(st.dictionaries(st.sampled_from(["q", "n"]), st.one_of(TEXT, st.integers(-5, 99)), max_size=2))
            content.append(
                {"toolUse": {"toolUseId": call_id, "name": draw(st.sampled_from(["search", "calc"])), "input": args}}
            )
        if not content:
            content.append({"text": "ok"})
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
            messages.append({"role": "user", "content": results})
        elif draw(st.booleans()):
            messages.append({"role": "user", "content": [{"text": draw(TEXT) or "more"}]})
        else:
            break
    return messages


def check(family: str, messages: Messages, **kwargs: Any) -> PrefixReport:
    tokenizer = load_family_tokenizer(family)
    report = check_prefix_preservation(tokenizer, messages, tools=TOOLS, system_prompt=SYSTEM, **kwargs)
    if report.ok:
        renderer = ChatRenderer(tokenizer, chat_template=kwargs.get("chat_template"))
        pieces = [token for piece in report.incremental_pieces for token in renderer.encode(piece)]
        whole = renderer.encode(report.canonical_text)
        at = next((i for i, pair in enumerate(zip(pieces, whole, strict=False)) if pair[0] != pair[1]), None)
        if family in SPLIT_THINK_NEWLINES and at is not None:
            # Qwen3.5's generation prompt ends "<think>\n"; an empty reasoning block goes on "\n</think>", so the
            # model's ids hold "\n" "\n" where the whole text tokenizes to one "\n\n": the first difference.
            nl, nlnl = renderer.encode("\n"), renderer.encode("\n\n")
            assert pieces[at - 1 : at + 2] == [*renderer.encode("<think>"), *nl, *nl], (family, at, report)
            assert whole[at - 1 : at + 1] == [*renderer.encode("<think>"), *nlnl], (family, at, report)
            COUNTS[f"{family}: <think> newlines split"] += 1
        else:
            assert pieces == whole, f"{family}: text matches but tokens differ at token {at}"
    return report


def has_tool_results(messages: Messages) -> bool:
    return any("toolResult" in block for m in messages for block in m["content"])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_separator_after_end_of_turn(family: str) -> None:
    spec = FAMILIES[family]
    assert shared_renderer(load_family_tokenizer(family)).turn_tail == (spec.end_of_turn, spec.separator)


def test_gguf_vocabularies_reproduce_llama_cpp_reference_ids() -> None:
    """The Qwen3.5 tokenizer built from its GGUF encodes llama.cpp's own test strings (``.inp``) to its ids (``.out``).

    (Llama 3's conversion differs from llama.cpp on one of its 50-odd strings, so it is not checked here.)
    """
    gguf = {"qwen35": "qwen3_5"}
    cases: dict[str, dict[str, str]] = {name: {} for name in gguf.values()}
    with tarfile.open(llama_cpp_sdist()) as archive:
        for member in archive.getmembers():
            stem, _, ext = member.name.rpartition("/ggml-vocab-")[2].rpartition(".gguf.")
            source = archive.extractfile(member) if stem in gguf and ext in ("inp", "out") else None
            if source is not None:
                cases[gguf[stem]][ext] = source.read().decode("utf-8")
    for name, files in cases.items():
        tok = load_family_tokenizer(name)
        texts = files["inp"].split("\n__ggml_vocab_test__\n")
        ids = [[int(i) for i in line.split()] for line in files["out"].split("\n")[: len(texts)]]
        assert [tok.encode(t, add_special_tokens=False) for t in texts] == ids, name


REASONED: Messages = [
    {"role": "user", "content": [{"text": "hi"}]},
    {"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"text": "plan"}}}, {"text": "a"}]},
    {"role": "user", "content": [{"text": "more"}]},
    {"role": "assistant", "content": [{"text": "b"}]},
]
TOOL_LOOP: Messages = [
    {"role": "user", "content": [{"text": "hi"}]},
    {"role": "assistant", "content": [{"toolUse": {"toolUseId": "c1", "name": "search", "input": {"q": "x"}}}]},
    {"role": "user", "content": [{"toolResult": {"toolUseId": "c1", "status": "success", "content": [{"text": "r"}]}}]},
    {"role": "assistant", "content": [{"text": "b"}]},
]


@pytest.mark.parametrize(
    ("family", "messages", "kind"),
    [
        ("qwen3", REASONED, "earlier <think> dropped"),
        ("qwen3_5", REASONED, "earlier <think> dropped"),
        ("glm", REASONED, "earlier reasoning emptied"),
        ("gpt_oss", REASONED, "earlier analysis dropped"),
        ("gpt_oss", TOOL_LOOP, "refused: tool results after tito's dummy prefix"),
        ("gemma4", TOOL_LOOP, "tool response inside the model turn"),
    ],
)
def test_each_documented_divergence_on_a_fixed_conversation(family: str, messages: Messages, kind: str) -> None:
    """Each kind of divergence explain() accepts, on a fixed conversation (hypothesis may not draw every kind)."""
    report = check(family, messages)
    assert not report.ok and explain(family, messages, report) == kind, report


def test_kimi_k2_thinking_template_refuses_tool_calls() -> None:
    """Its list.append is refused by transformers' sandbox: the matrix runs it on plain (reasoning) chat only."""
    call: Messages = [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "c1", "name": "search", "input": {"q": "x"}}}]},
    ]
    report = check("kimi_k2_thinking", call)
    assert explain("kimi_k2_thinking", call, report) == "refused: the template appends to a list (tool calls)"


def test_deepseek_v3_2_dsml_is_read_back_and_its_divergences_explained() -> None:
    """DeepSeek V3.2's DSML as llama.cpp's template renders it (thinking mode), through the ``deepseek_v3`` parser.

    Every assistant turn as the template writes it when last parses back to its reasoning, text and calls. The
    template is not incremental: tool results rendered after tito's dummy prefix lose their
    ``<function_results>`` wrapper (it looks back for the calling turn), and turns before the last user
    message lose their reasoning. Without thinking its generation prompt ``<think></think>`` is not even a
    prefix of the turn it renders (``</think>`` alone), so no output can be placed after it.
    """
    family, kwargs = "deepseek_v3_2", {"thinking": True}
    tok = load_family_tokenizer(family)
    renderer = ChatRenderer(tok, template_kwargs=kwargs)
    parser = get_tool_parser(FAMILIES[family].parser)
    tools = tool_specs_to_chat(TOOLS)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations(thinking=True))
    def body(messages: Messages) -> None:
        COUNTS[f"{family} (thinking)"] += 1
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            chat = to_chat_messages(messages[:i], system_prompt=SYSTEM)
            before = renderer.render(chat, tools=tools, add_generation_prompt=True)
            after = renderer.render(
                to_chat_messages(messages[: i + 1], system_prompt=SYSTEM), tools=tools, add_generation_prompt=False
            )
            assert after.startswith(before), (i, before[-80:], after[-80:])
            parsed = parser.parse(after[len(before) :].removesuffix(FAMILIES[family].end_of_turn), TOOLS)
            want = [(b["toolUse"]["name"], b["toolUse"]["input"]) for b in message["content"] if "toolUse" in b]
            assert [(c.name, c.input) for c in parsed.calls] == want and not any(c.error for c in parsed.calls)
            text = [b["text"] for b in message["content"] if "text" in b]
            assert (parsed.content or "").strip() == "".join(text).strip(), parsed
            thought = [
                b["reasoningContent"]["reasoningText"]["text"] for b in message["content"] if "reasoningContent" in b
            ]
            assert (parsed.reasoning or "") == "".join(thought), parsed
        report = check_prefix_preservation(
            tok, messages, tools=TOOLS, system_prompt=SYSTEM, chat_template_kwargs=kwargs
        )
        if report.ok:
            return
        at, mine, reference = report.position, report.incremental_text, report.canonical_text
        assert at is not None, report
        at = mine.rfind("<", 0, at + 1) if "<" in mine[at - 1 : at + 1] else at  # "<think>" vs "</think>"
        if "<function_results>" in reference[at : at + 20] and "<function_results>" not in mine[at : at + 20]:
            assert has_tool_results(messages), report
            COUNTS[f"{family}: tool results lose <function_results>"] += 1
        else:  # reasoning of a turn before the last user message: "</think>" alone
            assert mine.startswith("<think>", at) and reference.startswith("</think>", at), report
            COUNTS[f"{family}: earlier <think> dropped"] += 1

    body()
    plain = check_prefix_preservation(tok, [{"role": "user", "content": [{"text": "hi"}]},
                                            {"role": "assistant", "content": [{"text": "ok"}]}])  # fmt: skip
    assert not plain.ok and "generation prompt is not a prefix" in plain.reason, plain
    assert plain.incremental_excerpt.endswith("<think></think>"), plain
    assert plain.canonical_excerpt.endswith("</think>ok<｜end▁of▁sentence｜>"), plain


def run(family: str) -> Any:
    thinking = bool(FAMILIES[family].thinking)

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations(thinking, MAX_CALLS.get(family, 2)))
    def body(messages: Messages) -> None:
        COUNTS[family] += 1
        report = check(family, messages)
        if family in EQUAL:
            assert report.ok, f"{family}: {report}"
        elif not report.ok:
            COUNTS[f"{family}: {explain(family, messages, report)}"] += 1

    return body


def explain(family: str, messages: Messages, report: PrefixReport) -> str:
    """Assert that ``report``'s divergence is the family's documented one, at the place it names; say which."""
    mine, reference = report.incremental_text, report.canonical_text
    at = report.position
    if at is not None:  # back to the start of the tag the first difference is in ("<|return|>" vs "<|end|>")
        tag = mine.rfind("<", 0, at + 1)
        at = tag if tag != -1 and ">" not in mine[tag:at] else at
    if family in DROPS_REASONING and family != "glm":  # an earlier turn's <think>...</think> (even empty) is dropped
        assert at is not None and mine.startswith("<think>", at) and not reference.startswith("<think>", at), report
        assert reference[:at].endswith("<|im_start|>assistant\n") and "drops the reasoning" in report.reason, report
        return "earlier <think> dropped"
    if family in REFUSES_TOOL_CALLS and any("toolUse" in block for m in messages for block in m["content"]):
        assert at is None and "access to attribute 'append' of 'list' object is unsafe" in report.reason, report
        return "refused: the template appends to a list (tool calls)"
    if family in ("glm", *REFUSES_TOOL_CALLS):  # an earlier turn's reasoning is rendered as an empty <think></think>
        assert at is not None and mine[:at].endswith("<think>") and reference.startswith("</think>", at), report
        assert "empties the reasoning" in report.reason, report
        return "earlier reasoning emptied"
    if family == "gemma4":  # tool responses are rendered inside the model turn that called: only with tool results
        assert has_tool_results(messages), report
        assert at is not None, report
        if mine.startswith("<|channel>thought", at):  # a thought of a turn after tool responses, not rendered
            assert reference[:at].endswith("<|turn>model\n") and reference.startswith("<|tool_call>", at), report
            return "thought after tool responses dropped"
        assert reference.startswith("<|tool_response>response:", at) or (
            reference[:at].endswith("<|tool_response>") and reference.startswith("response:", at)
        ), report
        return "tool response inside the model turn"
    assert family == "gpt_oss", family
    if at is None:  # the template refuses to render
        if "Cannot pass both content and thinking" in report.reason:  # reasoning + text + calls in one turn
            return "refused: content and thinking with tool calls"
        assert "Message has tool role, but there was no previous assistant message" in report.reason, report
        assert has_tool_results(messages), report
        return "refused: tool results after tito's dummy prefix"
    if mine.startswith("<|return|>", at):  # a final turn ends <|return|> when last, <|end|> once anything follows
        assert reference.startswith("<|end|>", at), report
        return "<|return|> rewritten <|end|>"
    # the analysis channel of an earlier turn is dropped once a final answer follows it
    assert mine.startswith("analysis<|message|>", at) and reference.startswith("final<|message|>", at), report
    assert reference[:at].endswith("<|start|>assistant<|channel|>"), report
    return "earlier analysis dropped"


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_incremental_matches_reference(family: str) -> None:
    run(family)()


def test_qwen3_divergence_is_covered_by_the_training_template() -> None:
    """Qwen3 drops earlier <think>; trl's qwen3_training.jinja keeps it, and then tito matches exactly."""
    training = chat_template("qwen3_training")

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations(thinking=True))
    def body(messages: Messages) -> None:
        COUNTS["qwen3 (qwen3_training.jinja)"] += 1
        report = check("qwen3", messages, chat_template=training)
        assert report.ok, report

    body()


# ------------------------------------------------------------------------------------- render_mode="full"
class HFReference:
    """The family's template on the whole conversation, tokenized at once (what an engine's chat endpoint computes)."""

    def __init__(self, family: str, messages: Messages) -> None:
        self.tok = load_family_tokenizer(family)
        self.renderer = ChatRenderer(self.tok)
        self.messages = messages
        self.tools = tool_specs_to_chat(TOOLS)

    def chat(self, upto: int) -> list[dict[str, Any]]:
        return to_chat_messages(self.messages[:upto], system_prompt=SYSTEM)

    def prompt(self, upto: int) -> list[int]:
        ids = self.tok.apply_chat_template(
            self.chat(upto), tools=self.tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)

    def output(self, i: int) -> list[int]:
        """Assistant message ``i`` as the model writes it: what the template adds for it when it is last."""
        before = self.renderer.render(self.chat(i), tools=self.tools, add_generation_prompt=True)
        after = self.renderer.render(self.chat(i + 1), tools=self.tools, add_generation_prompt=False)
        if not after.startswith(before):  # an earlier turn is rewritten (gpt-oss drops analysis before a final)
            lone = to_chat_messages([self.messages[0], self.messages[i]], system_prompt=SYSTEM)
            before = self.renderer.render(lone[:-1], tools=self.tools, add_generation_prompt=True)
            after = self.renderer.render(lone, tools=self.tools, add_generation_prompt=False)
        text = after[first_difference(before, after) :] if not after.startswith(before) else after[len(before) :]
        boundary = self.renderer.turn_tail[1]
        if boundary and text.endswith(boundary):
            text = text[: -len(boundary)]
        return self.renderer.encode(text)


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_full_render_sends_the_reference_encoding(family: str) -> None:
    """render_mode='full': every request is the template's render of the conversation so far, tokenized at once.

    This covers the divergent families (Qwen3, GLM, Gemma 4, gpt-oss): the rollout forks where the re-render
    differs from what the model saw, and the engine gets the reference encoding.
    """
    thinking = bool(FAMILIES[family].thinking)
    parser = FAMILIES[family].parser

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(conversations(thinking, MAX_CALLS.get(family, 2)))
    def body(messages: Messages) -> None:
        ref = HFReference(family, messages)
        try:
            outputs = {i: ref.output(i) for i, m in enumerate(messages) if m["role"] == "assistant"}
        except TemplateError:  # a turn the template refuses to render (gpt-oss: reasoning + text + calls)
            COUNTS[f"{family} (render_mode='full') refused by the template"] += 1
            return
        COUNTS[f"{family} (render_mode='full')"] += 1
        sent, traj, history = replay(
            ref.tok, messages, outputs.__getitem__, parser=parser, tools=TOOLS, system=SYSTEM, render_mode="full"
        )
        held = HFReference(family, history)  # the conversation as the agent held it (parsed turns)
        for request, i in zip(sent, outputs, strict=True):
            assert request == held.prompt(i), f"{family}: call before message {i}"
        COUNTS[f"{family} (render_mode='full') forks"] += traj.branch
        if traj.branch:  # the warning names the first differing token: its id and text, recorded and rendered
            found = re.search(r"recorded (\d+) \((.*)\), rendered (\d+) \((.*)\)$", traj.fork_reason or "")
            assert found, traj.fork_reason
            assert found[2] == repr(ref.tok.decode([int(found[1])])) and found[1] != found[3], traj.fork_reason

    body()
