"""SGLang sessions on the real server: the same greedy agent run with ``session="on"`` and ``"off"``.

What this proves on SGLang 0.5.23 (CPU, tiny random Qwen3):
* both runs record the same ids, loss mask and logprobs (within the suite's 1e-3);
* with sessions, every call after the first sends only its new prompt (boundary included), continuing
  from the previous request, and the engine counts the whole trajectory as its prompt;
* a session that names a parent the engine does not know is refused (HTTP 400) before anything is
  generated; the adapter sends that call once more, whole and without a session, and the next call opens
  a new session.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tito_core.backend import SamplingParams
from tito_sglang import SGLangBackend
from tito_sglang._sessions import Session

from .conftest import REPORT
from .test_sglang_server import (
    FINAL_RX,
    TOOL_CALL_RX,
    RecordingTransport,
    _tito_model,
    check_requests_extend_the_trajectory,
    prompt_ids,
    request,
)

pytestmark = pytest.mark.integration

TOOL_TURNS = 4


async def agent_run(url: str, tokenizer: Any, session: str) -> tuple[Any, RecordingTransport]:
    """A greedy agent with ``TOOL_TURNS`` real tool turns (calls forced with a regex), then a final answer."""
    from strands import Agent, tool

    transport = RecordingTransport()
    backend = SGLangBackend(url, timeout=180.0, transport=transport, session=session)  # type: ignore[arg-type]
    tool_sampling = SamplingParams(max_new_tokens=64, temperature=0.0, extra={"regex": TOOL_CALL_RX})
    final_sampling = SamplingParams(max_new_tokens=32, temperature=0.0, extra={"regex": FINAL_RX})
    model = _tito_model(backend, tokenizer, sampling=tool_sampling)
    calls: list[int] = []

    @tool
    def add(a: int, b: int) -> str:
        """Add two integers.

        Args:
            a: First number.
            b: Second number.
        """
        calls.append(a + b)
        if len(calls) == TOOL_TURNS:
            model.update_config(sampling=final_sampling)
        return f"The sum of {a} and {b} is {a + b}. " + "Some more text from the tool. " * 8

    try:
        await Agent(model=model, tools=[add], callback_handler=None).invoke_async("Add 2 and 3, then keep adding.")
        assert model.trajectory.status == "completed"
        assert len(model.trajectory.turns) == TOOL_TURNS + 1
        check_requests_extend_the_trajectory(model, transport)
        if session == "on":
            assert backend.sessions.supported is True and backend.sessions.open_count == 1
    finally:
        await backend.aclose()
    assert backend.sessions.open_count == 0
    return model.trajectory, transport


async def test_session_on_and_off_record_the_same_trajectory(sglang_url: str, qwen3_tokenizer: Any) -> None:
    on, sent_on = await agent_run(sglang_url, qwen3_tokenizer, "on")
    off, sent_off = await agent_run(sglang_url, qwen3_tokenizer, "off")
    assert on.token_ids == off.token_ids
    assert on.loss_mask == off.loss_mask
    assert on.logprobs == pytest.approx(off.logprobs, abs=1e-3)

    rows = []
    exchanges = zip(on.turns, sent_on.exchanges, sent_off.exchanges, strict=True)
    for turn, (body_on, answer_on), (body_off, answer_off) in exchanges:
        ids_on, ids_off = len(body_on["input_ids"]), len(body_off["input_ids"])
        meta = answer_on["meta_info"]
        rows.append(
            f"call {turn.index}: ids sent on/off {ids_on}/{ids_off}, prompt_tokens {meta['prompt_tokens']}, "
            f"cached_tokens on/off {meta.get('cached_tokens')}/{answer_off['meta_info'].get('cached_tokens')}, "
            "body bytes on/off "
            f"{len(sent_on.raw[turn.index])}/{len(sent_off.raw[turn.index])}"
        )
        assert ids_off == turn.prompt_start + turn.prompt_len
        if turn.index == 0:
            assert ids_on == ids_off and "rid" not in body_on["session_params"]
        else:  # O(new tokens): the new prompt and its boundary, whatever the trajectory's length
            assert ids_on == turn.prompt_len
            assert body_on["session_params"]["rid"] == on.turns[turn.index - 1].rid
            assert len(sent_on.raw[turn.index]) < len(sent_off.raw[turn.index])
    last = on.turns[-1]
    assert len(sent_on.raw[last.index]) * 2 < len(sent_off.raw[last.index])
    diff = max((abs(a - b) for a, b in zip(on.logprobs, off.logprobs, strict=True) if a is not None and b is not None))
    REPORT.append(
        f"sessions on vs off ({len(on)} tokens, {len(on.turns)} calls; ids and loss mask identical, max logprob "
        f"difference {diff:.2g}; off ran second, on a warm cache):"
    )
    REPORT.extend(f"  {row}" for row in rows)


async def test_unknown_parent_is_refused_and_the_call_is_sent_whole_once(
    sglang_url: str, qwen3_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = qwen3_tokenizer
    backend = SGLangBackend(sglang_url, timeout=180.0, session="on")
    try:
        ids = prompt_ids(tokenizer)
        first = await backend.generate(_in_sequence(request(ids), "seq"))
        held = backend.sessions._open["seq"]
        assert held.length == len(ids) + len(first.output_ids)
        backend.sessions._open["seq"] = Session(held.id, "no-such-request", held.length)  # a parent lost
        longer = [*ids, *first.output_ids, *prompt_ids(tokenizer, "Go on.")]
        with caplog.at_level(logging.WARNING, logger="tito_sglang"):
            again = await backend.generate(_in_sequence(request(longer, held.length), "seq"))
        (refused,) = [r.getMessage() for r in caplog.records if "no longer knows session" in r.getMessage()]
        assert "Invalid request session id" in refused
        REPORT.append(f"session with an unknown parent: {refused}")
        assert again.prompt_tokens == len(longer)  # sent again whole, without a session, and answered
        assert "seq" not in backend.sessions._open
        third = [*longer, *again.output_ids, *prompt_ids(tokenizer, "More.")]
        last = await backend.generate(_in_sequence(request(third, len(longer) + len(again.output_ids)), "seq"))
        assert last.prompt_tokens == len(third)
        assert backend.sessions._open["seq"].id != held.id  # a new session
    finally:
        await backend.aclose()


def _in_sequence(req: Any, sequence: str) -> Any:
    import msgspec

    return msgspec.structs.replace(req, sequence=sequence)
