"""A torch reference for training on prefix trees (:func:`tito_core.export.pack_trees`) against the flat rows.

One forward per tree computes every shared prefix once, under the tree's attention mask (each token sees itself
and its ancestors) and its depths as positions; each row's logprobs are then read back at the row's own tree
positions (:meth:`~tito_core.export.PackedTree.row_positions`), so the loss function is the flat rows' own. The
flat reference runs one forward per row. Both read the language-model head only where a row trains a token (the
rest of the logits are never needed), which keeps long prompts in memory on a CPU.

Used by ``tests/transformers/test_tree_training.py`` (tree == flat on SmolLM2) and ``benchmarks/tree.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tito_core.export import PackedTree

__all__ = ["flat_logprobs", "policy_loss", "tree_logprobs", "tree_mask"]


def tree_mask(tree: PackedTree, dtype: Any) -> Any:
    """The additive attention mask ``[1, 1, T, T]`` of ``tree``: 0 where a token may see another, else -inf."""
    import torch

    size = tree.num_tokens
    allow = torch.zeros(size, size, dtype=torch.bool)
    seen: list[list[tuple[int, int]]] = []  # each node's ancestors' token ranges, its own last
    for node in tree.nodes:
        ranges = [*(seen[node.parent] if node.parent >= 0 else []), (node.start, node.end)]
        seen.append(ranges)
        rows = slice(node.start, node.end + 1)
        for start, end in ranges[:-1]:
            allow[rows, start : end + 1] = True
        allow[rows, rows] = torch.ones(node.end - node.start + 1, node.end - node.start + 1).tril().bool()
    mask = torch.zeros(size, size, dtype=dtype).masked_fill_(~allow, torch.finfo(dtype).min)
    return mask[None, None]


def _trained(hidden: Any, model: Any, ids: Any, at: Any, loss_mask: Sequence[int]) -> Any:
    """The logprob of each token the row trains, from the hidden states at the positions before it."""
    import torch

    trained = torch.tensor(loss_mask[1:], dtype=torch.bool)
    logits = model.lm_head(hidden[at[:-1][trained]]).float()
    return torch.log_softmax(logits, dim=-1).gather(1, ids[at[1:][trained]][:, None])[:, 0]


def tree_logprobs(model: Any, trees: Sequence[PackedTree], rows: Sequence[dict[str, Any]]) -> list[Any]:
    """Per row of ``rows`` (the rows the trees were packed from), the logprobs of the tokens it trains.

    One forward per tree.
    """
    import torch

    out: list[Any] = [None] * len(rows)
    dtype = next(model.parameters()).dtype
    for tree in trees:
        ids = torch.tensor(tree.input_ids)
        hidden = model.model(
            input_ids=ids[None],
            position_ids=torch.tensor(tree.position_ids)[None],
            attention_mask=tree_mask(tree, dtype),
        ).last_hidden_state[0]
        for seq in tree.sequence_ids:
            at = torch.tensor(tree.row_positions(seq))
            out[seq] = _trained(hidden, model, ids, at, rows[seq]["loss_mask"])
    return out


def flat_logprobs(model: Any, rows: Sequence[dict[str, Any]]) -> list[Any]:
    """Per row, the logprobs of the tokens it trains: one causal forward per row."""
    import torch

    out = []
    for row in rows:
        ids = torch.tensor(row["input_ids"])
        hidden = model.model(input_ids=ids[None]).last_hidden_state[0]
        out.append(_trained(hidden, model, ids, torch.arange(len(ids)), row["loss_mask"]))
    return out


def policy_loss(logprobs: Sequence[Any], rows: Sequence[dict[str, Any]]) -> Any:
    """The policy-gradient loss over the rows: ``-sum(advantage * logprob)`` over every trained token.

    Divided by the number of trained tokens (AReaL's token-mean); a row's ``advantage`` weighs all its tokens.
    """
    total = sum(int(sum(row["loss_mask"][1:])) for row in rows)
    return -sum(row["advantage"] * lp.sum() for lp, row in zip(logprobs, rows, strict=True)) / max(total, 1)
