"""Faults through the gateway: engine errors reach an OpenAI client as OpenAI error JSON, and nothing is forged.

The gateway sits on each shipping adapter (SGLang, vLLM's generate endpoint) and its real transport, in front of
the fault server; an OpenAI SDK client drives the add-tool loop. Whatever the fault, the rollout's trajectory
passes the suite's invariants (every recorded output is exactly the server's answer for its request id).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tito_core.config import TitoConfig
from tito_core.gateway import Gateway
from tito_testing.tokenizers import qwen_tokenizer_dir

from .conftest import SYSTEM, Harness, check_trajectory
from .server import Fault

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}


async def drive(h: Harness, fault: Fault | None, when: int) -> tuple[BaseException | None, Any]:
    """Run the add loop through a gateway on the adapter under test; the error the client saw and the trajectory."""
    if fault is not None:
        h.server.inject(fault, when=when)
    cfg = TitoConfig(backend=h.adapter, tokenizer=str(qwen_tokenizer_dir("qwen3")), sampling={"max_new_tokens": 64})
    gateway = Gateway(cfg, tokenizer=h.tokenizer, backend=h.backend())
    await gateway.start()
    error: BaseException | None = None
    try:
        rollout = gateway.open()
        api = openai.AsyncOpenAI(base_url=rollout.base_url, api_key=rollout.token, max_retries=0)
        messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Count with add."}]
        try:
            for _ in range(8):
                answer = await api.chat.completions.create(model="m", messages=messages, tools=[ADD])
                message = answer.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    args = json.loads(call.function.arguments)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
        except openai.APIStatusError as exc:
            error = exc
        traj = await gateway.take(rollout.id)
    finally:
        await gateway.close()
    return error, traj


async def test_clean_loop_through_the_gateway(h: Harness) -> None:
    error, traj = await drive(h, None, 0)
    assert error is None and traj.status == "completed" and traj.branch == 0
    check_trajectory(h.server, traj)


@pytest.mark.parametrize(
    ("fault", "status", "code"),
    [
        (Fault.http_status(500), 502, "engine_error"),
        (Fault.context_length(), 400, "context_length_exceeded"),
        (Fault.bad("logprob_nan"), 502, "engine_error"),
        (Fault.bad("id_vocab"), 502, "engine_error"),
    ],
    ids=["http500", "context", "nan-logprob", "id-vocab"],
)
async def test_engine_fault_is_openai_error_json_and_nothing_is_forged(
    h: Harness, fault: Fault, status: int, code: str
) -> None:
    error, traj = await drive(h, fault, 1)
    assert isinstance(error, openai.APIStatusError), error
    assert error.status_code == status
    body = error.body if isinstance(error.body, dict) else {}
    assert body.get("code") == code and body.get("message"), body
    assert len(traj.turns) == 1  # the faulty answer was not recorded
    assert traj.status in ("failed", "truncated", "aborted") and traj.status_reason
    check_trajectory(h.server, traj)
