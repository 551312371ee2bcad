"""The cross-check: Strands' own OpenAIModel pointed at the gateway records what TitoModel records directly.

Same scripted engine replies (ids and logprobs are a function of the tokens and positions), same tools, same
prompt: the trajectories must agree token for token (ids, loss mask, logprobs), with no fork.
"""

from __future__ import annotations

from typing import Any

from strands.models.openai import OpenAIModel

from tests.gateway.conftest import GrammarBackend
from tests.helpers import add, agent_for, hermes_call
from tito_core import TitoModel
from tito_core.gateway import Gateway

SCRIPT = [hermes_call("add", {"a": 2, "b": 3}), "The sum is 5."]
SYSTEM = "You are a careful assistant."


async def test_openai_model_through_the_gateway_equals_tito_model(gateway: Gateway, qwen3_tokenizer: Any) -> None:
    direct_backend = GrammarBackend(qwen3_tokenizer, SCRIPT)
    direct = TitoModel(direct_backend, qwen3_tokenizer, sampling={"seed": 7})
    await agent_for(direct, [add], system_prompt=SYSTEM).invoke_async("What is 2 + 3?")
    expected = direct.trajectory

    gateway.backend.add(*SCRIPT)  # type: ignore[attr-defined]
    rollout = gateway.open()
    model = OpenAIModel(
        client_args={"base_url": rollout.base_url, "api_key": rollout.token, "max_retries": 0},
        model_id="tito",
        params={"seed": 7},
    )
    await agent_for(model, [add], system_prompt=SYSTEM).invoke_async("What is 2 + 3?")
    traj = await gateway.take(rollout.id)

    assert traj.branch == 0 and not traj.branches
    assert traj.token_ids == expected.token_ids
    assert traj.loss_mask == expected.loss_mask
    assert traj.logprobs == expected.logprobs
    assert len(traj.turns) == len(expected.turns) == 2
    assert traj.status == expected.status == "completed"
    sent = [r.sampling.seed for r in gateway.backend.requests]  # type: ignore[attr-defined]
    assert sent == [r.sampling.seed for r in direct_backend.requests] == [7, 8]  # call k samples with seed + k
