"""Routing replay (R3) on the embedded backend and the tiny random Qwen3-MoE (4 MoE layers, 8 experts, top 2; float32).

The backend records the experts of every token it feeds (the routers' top 2, captured by forward hooks); a rollout's
rows line up with its trajectory across turns; a teacher-forced forward pass that replays them reproduces the recorded
logprobs; it really replays (with a perturbed router, free routing goes elsewhere while the replayed pass still uses
the recorded experts, and other rows give other logprobs); rows decoded in one batch go to their own requests.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tito_core import TitoModel
from tito_core.backend import GenerateRequest, SamplingParams
from tito_core.trajectory import Trajectory

pytest.importorskip("xgrammar")

torch = pytest.importorskip("torch")

LAYERS, TOP_K = 4, 2
NEAR_TIE = 1e-4  # router probabilities this close may rank either way between a decoding step and a whole-sequence pass
# A regex ends every turn with a stop (at most 4 words of 6 letters, then only a stop token is allowed), so a rollout
# has several turns whatever the random model samples; the logprobs are then post-constraint, so the replay is checked
# on an unconstrained rollout (`sampled`).
WORDS = {"temperature": 1.0, "seed": 3, "max_new_tokens": 48, "extra": {"regex": "[a-z]{1,6}( [a-z]{1,6}){0,3}"}}
FREE = {"temperature": 1.0, "seed": 5, "max_new_tokens": 24, "ignore_eos": True}


@pytest.fixture(scope="module")
def moe_backend(tiny_moe_dir: Path) -> Iterator[Any]:
    from tito_transformers import TransformersBackend

    backend = TransformersBackend(tiny_moe_dir, dtype="float32", num_threads=1)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def trainer(tiny_moe_dir: Path) -> Any:
    from tito_transformers.scoring import load_model

    return load_model(str(tiny_moe_dir))


@pytest.fixture(scope="module")
def sampled(moe_backend: Any, tokenizer: Any) -> Trajectory:
    """One unconstrained turn of 24 tokens with routing, through the core (cut at the token limit)."""
    from strands import Agent
    from strands.types.exceptions import MaxTokensReachedException

    model = TitoModel(moe_backend, tokenizer, sampling=FREE, return_routed_experts=True)
    with pytest.raises(MaxTokensReachedException):
        Agent(model=model, callback_handler=None)("Write on, whatever comes.")
    return model.trajectory


def _rows(traj: Trajectory) -> np.ndarray:
    routed = traj.routed_experts()
    assert routed is not None
    data, shape = routed
    return np.frombuffer(data, dtype="<i4").reshape(-1, *shape)


def _router_probs(model: Any, ids: list[int]) -> Any:
    """Each router's probabilities over the experts for ``ids[:-1]`` (a plain forward pass): ``(tokens, layers, 8)``."""
    with torch.no_grad():
        out = model(torch.tensor([ids[:-1]]), output_router_logits=True)
    return torch.stack([torch.softmax(logits.float(), dim=-1) for logits in out.router_logits], dim=1)


def _top(probs: Any) -> np.ndarray:
    return torch.topk(probs, TOP_K, dim=-1).indices.numpy()


def _moved(rows: np.ndarray, other: np.ndarray) -> int:
    """How many (token, layer) pairs are routed to another set of experts."""
    return int((np.sort(rows, axis=-1) != np.sort(other, axis=-1)).any(axis=-1).sum())


def _assert_routed_as(rows: np.ndarray, probs: Any) -> None:
    """Every row holds the router's top-k experts (in any order), except where the k-th and the next are a near-tie."""
    assert rows.shape == (*probs.shape[:2], TOP_K)
    ranked = probs.sort(dim=-1, descending=True).values
    for token, layer in np.argwhere((np.sort(rows, -1) != np.sort(_top(probs), -1)).any(-1)):
        gap = float(ranked[token, layer, TOP_K - 1] - ranked[token, layer, TOP_K])
        assert gap < NEAR_TIE, f"token {token}, layer {layer}: recorded {rows[token, layer]}, not the top {TOP_K}"


def _output_gap(traj: Trajectory, logprobs: list[float | None]) -> float:
    """The largest |logprobs - recorded| over the trajectory's output tokens."""
    positions = [i for i, trained in enumerate(traj.loss_mask) if trained]
    recorded = traj.logprobs
    return max(abs(float(logprobs[i]) - float(recorded[i])) for i in positions)  # type: ignore[arg-type]


def test_a_rollout_records_the_experts_of_every_token_it_fed(moe_backend: Any, trainer: Any, tokenizer: Any) -> None:
    from strands import Agent

    model = TitoModel(moe_backend, tokenizer, sampling=WORDS, return_routed_experts=True)
    agent = Agent(model=model, callback_handler=None)
    agent("Say a few words.")
    agent("And a few more.")
    traj = model.trajectory
    assert traj.status == "completed" and len(traj.turns) == 2
    for turn in traj.turns:  # each call's rows: from the token the previous call left unfed to its own last but one
        assert turn.routed_experts is not None and turn.routed_experts_missing is None
        assert turn.routed_experts_shape == (LAYERS, TOP_K)
        assert turn.routed_experts_start == max(turn.prompt_start - 1, 0)
        fed = turn.prompt_start + turn.prompt_len + turn.output_len - 1 - turn.routed_experts_start
        assert len(turn.routed_experts) == fed * LAYERS * TOP_K * 4
    rows = _rows(traj)
    ids = list(traj.token_ids)
    assert rows.shape == (len(ids) - 1, LAYERS, TOP_K)  # every token but the last, output tokens included
    _assert_routed_as(rows, _router_probs(trainer, ids))  # the experts the model routes each token to, no gap


def test_replaying_the_recorded_routing_reproduces_the_recorded_logprobs(sampled: Trajectory, trainer: Any) -> None:
    from tito_transformers.scoring import token_logprobs

    ids = list(sampled.token_ids)
    assert sum(sampled.loss_mask) == 24 and sampled.turns[0].routed_experts_missing is None
    replayed = token_logprobs(trainer, ids, routed_experts=_rows(sampled))
    assert _output_gap(sampled, replayed) < 1e-4  # float32: measured 2e-6


def test_the_replay_routes_to_the_recorded_experts_whatever_the_router_says(sampled: Trajectory, trainer: Any) -> None:
    from tito_transformers.routing import routers
    from tito_transformers.scoring import token_logprobs

    ids, rows = list(sampled.token_ids), _rows(sampled)
    perturbed = copy.deepcopy(trainer)
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for router in routers(perturbed):
            router.weight.add_(0.2 * torch.randn(router.weight.shape, generator=noise))

    # Left to itself, the perturbed router sends many tokens elsewhere, and the logprobs follow.
    free_rows = _top(_router_probs(perturbed, ids))
    assert _moved(rows, free_rows) > rows.shape[0] * LAYERS // 10
    assert _output_gap(sampled, token_logprobs(perturbed, ids)) > 0.05

    # Replayed, every expert block gets the recorded experts, weighted by the router's softmax over them alone.
    seen: list[tuple[Any, Any]] = []
    logits: list[Any] = []
    experts = [layer.mlp.experts for layer in perturbed.model.layers]
    hooks = [block.register_forward_pre_hook(lambda _, args: seen.append(args[1:3])) for block in experts]
    hooks += [router.register_forward_hook(lambda _, __, out: logits.append(out[0])) for router in routers(perturbed)]
    try:
        token_logprobs(perturbed, ids, routed_experts=rows)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(seen) == len(logits) == LAYERS
    for layer, ((chosen, weights), router_logits) in enumerate(zip(seen, logits, strict=True)):
        assert np.array_equal(chosen[:-1].numpy(), rows[:, layer])  # the last token's row routes nothing read
        expected = torch.softmax(router_logits.float().gather(1, chosen), dim=-1)
        assert torch.allclose(weights.float(), expected, atol=1e-6)

    # The rows drive the logprobs: the right ones reproduce the recording, the perturbed router's choice does not.
    assert _output_gap(sampled, token_logprobs(trainer, ids, routed_experts=rows)) < 1e-4
    assert _output_gap(sampled, token_logprobs(trainer, ids, routed_experts=free_rows)) > 0.05


async def test_requests_decoded_together_get_their_own_rows(
    moe_backend: Any,
    trainer: Any,
    tokenizer: Any,
    decode_together: Callable[[Any, int], Any],
    batch_sizes: list[int],
) -> None:
    prompts = [
        tokenizer.encode("Short."),
        tokenizer.encode("A longer prompt, so the short one is padded on the left of the batch."),
        tokenizer.encode("No routing asked for this one."),
    ]
    # the second continues a sequence (rows from prefix_len - 1); lengths differ, so rows leave the batch at each end
    requests = [
        GenerateRequest(
            rid=uuid.uuid4().hex,
            input_ids=prompt,
            prefix_len=prefix,
            sampling=SamplingParams(temperature=1.0, seed=i, max_new_tokens=n, ignore_eos=True),
            return_routed_experts=routing,
        )
        for i, (prompt, prefix, n, routing) in enumerate(
            zip(prompts, (0, 6, 0), (9, 17, 13), (True, True, False), strict=True)
        )
    ]
    with decode_together(moe_backend, 3):
        results = await asyncio.gather(*(moe_backend.generate(r) for r in requests))
    assert max(batch_sizes) == 3
    assert results[2].routed_experts is None
    for request, result in zip(requests[:2], results[:2], strict=True):
        ids = [*request.input_ids, *result.output_ids]
        start = max(request.prefix_len - 1, 0)
        assert result.routed_experts_start == start and result.routed_experts_shape == (LAYERS, TOP_K)
        assert result.routed_experts is not None
        rows = np.frombuffer(result.routed_experts, dtype="<i4").reshape(-1, LAYERS, TOP_K)
        assert rows.shape[0] == len(ids) - 1 - start
        _assert_routed_as(rows, _router_probs(trainer, ids)[start:])


def test_replay_refuses_rows_that_do_not_fit_and_a_model_without_experts(
    trainer: Any, tiny_model_dir: Path, tokenizer: Any
) -> None:
    from strands import Agent
    from strands.types.exceptions import MaxTokensReachedException

    from tito_transformers import TransformersBackend
    from tito_transformers.routing import replay_routing
    from tito_transformers.scoring import load_model, token_logprobs

    ids = tokenizer.encode("Ten or so tokens of a sequence to score here.")
    rows = np.zeros((len(ids) - 1, LAYERS, TOP_K), dtype=np.int32)
    rows[..., 1] = 1
    with pytest.raises(ValueError, match=f"{len(ids) - 1} rows for {len(ids)} tokens"):
        token_logprobs(trainer, ids, routed_experts=rows[1:])
    with pytest.raises(ValueError, match="do not fit the model's routers"):
        token_logprobs(trainer, ids, routed_experts=rows[:, :3])
    with pytest.raises(ValueError, match=r"in \[0, 8\)"):
        token_logprobs(trainer, ids, routed_experts=rows + 7)
    with pytest.raises(ValueError, match="feeds 3 tokens"), replay_routing(trainer, rows), torch.no_grad():
        trainer(torch.tensor([ids[:3]]))

    dense = load_model(str(tiny_model_dir))
    with pytest.raises(ValueError, match="no MoE routers"):
        token_logprobs(dense, ids, routed_experts=rows)
    # asked for routing, a dense model has none to give: the core records it as missing, with why
    backend = TransformersBackend(tiny_model_dir, dtype="float32", num_threads=1)
    try:
        model = TitoModel(backend, tokenizer, sampling={**FREE, "max_new_tokens": 3}, return_routed_experts=True)
        with pytest.raises(MaxTokensReachedException):
            Agent(model=model, callback_handler=None)("Hi.")
    finally:
        backend.close()
    (turn,) = model.trajectory.turns
    assert turn.routed_experts is None and turn.routed_experts_missing is not None
    assert "transformers backend's answer has none" in turn.routed_experts_missing
