"""Training on the prefix-tree export gives the flat rows' loss and gradients (issue 48, item 5), on SmolLM2 in
float32: one forward per tree (each shared prefix once, the tree attention mask, depths as positions) against one
forward per row, for a GRPO group of 8 sharing one prompt, a rollout with a sub-agent, a rollout with a retried
call and an edited history (a fork), and a rollout with a retried summary call and a compaction going on from it.
Relative difference: the norm of the difference over the norm of the flat rows' value (loss; the gradient of every
parameter as one vector)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tito_core import Trajectory
from tito_core.export import pack_trees, to_areal, training_branches
from tito_testing.rollout_trees import record_compaction, record_group, record_sub_agent, record_tree
from tito_testing.tree_training import flat_logprobs, policy_loss, tree_logprobs

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def smollm2() -> Iterator[tuple[Any, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tito_testing.tokenizers import MissingTestAssetError
    from tito_transformers.models import build_smollm2

    try:
        model_dir = build_smollm2()
    except MissingTestAssetError as exc:
        pytest.skip(str(exc))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="sdpa")
    yield AutoTokenizer.from_pretrained(str(model_dir)), model


CASES: dict[str, Callable[[Any], list[Trajectory]]] = {
    "grpo-group-of-8": lambda tok: record_group(tok, 8),
    "sub-agent": lambda tok: [record_sub_agent(tok)],
    "retry-and-fork": lambda tok: [record_tree(tok)],
    "compaction-and-retry": lambda tok: [record_compaction(tok)],
}


def _loss_and_grad(model: Any, logprobs: Callable[[], list[Any]], rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    model.zero_grad(set_to_none=True)
    loss = policy_loss(logprobs(), rows)
    loss.backward()
    return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("case", list(CASES))
def test_training_on_the_tree_equals_training_on_the_flat_rows(smollm2: tuple[Any, Any], case: str) -> None:
    tok, model = smollm2
    rows = [to_areal(s) for traj in CASES[case](tok) for s in training_branches(traj)]
    for k, row in enumerate(rows):  # a different advantage per row: rows through a shared prefix weigh it apart
        row["advantage"] = 1.0 - 0.4 * k
    trees = pack_trees(rows, max_tokens=4096)
    assert len(trees) == 1 and trees[0].num_tokens < sum(len(r["input_ids"]) for r in rows)  # prefixes shared
    assert sum(sum(r["loss_mask"]) for r in rows) > 0
    tree_loss, tree_grad = _loss_and_grad(model, lambda: tree_logprobs(model, trees, rows), rows)
    flat_loss, flat_grad = _loss_and_grad(model, lambda: flat_logprobs(model, rows), rows)
    assert flat_grad.norm() > 0
    assert abs(tree_loss - flat_loss) <= TOLERANCE * abs(flat_loss)
    assert (tree_grad - flat_grad).norm() <= TOLERANCE * flat_grad.norm()
