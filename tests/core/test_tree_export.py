"""Rows packed into prefix trees (AReaL's tree-training layout, :mod:`tito_core.export.tree`): each shared prefix
stored once, every row readable back from the tree, and bad input refused by name. That the layout is AReaL's own
is ``tests/areal``'s (AReaL's builder on the same rows)."""

from __future__ import annotations

import pytest

from tito_core.export import pack_trees, to_areal, training_branches
from tito_testing.rollout_trees import record_group, record_tree


def test_rows_sharing_prefixes_store_them_once_in_first_appearance_order() -> None:
    rows = [{"input_ids": [1, 2, 3, 4, 5]}, {"input_ids": [1, 2, 3, 6, 7, 8]}, {"input_ids": [1, 2, 9]}]
    (tree,) = pack_trees(rows, max_tokens=128)
    assert tree.input_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9] and tree.num_tokens == 9  # 14 tokens in the rows
    assert tree.position_ids == [0, 1, 2, 3, 4, 3, 4, 5, 2]
    assert tree.parent == [-1, 0, 1, 2, 3, 2, 5, 6, 1]
    assert [(n.start, n.end, n.parent, n.sequence_ids) for n in tree.nodes] == [
        (0, 1, -1, [0, 1, 2]), (2, 2, 0, [0, 1]), (3, 4, 1, [0]), (5, 7, 1, [1]), (8, 8, 0, [2]),
    ]  # fmt: skip
    (later,) = pack_trees([{"input_ids": [1, 2, 3]}, {"input_ids": [1, 4]}, {"input_ids": [1, 2, 5]}], max_tokens=128)
    assert later.input_ids == [1, 2, 3, 4, 5]  # laid out as inserted: 5 after 4, though its node comes first
    assert [(n.start, n.end) for n in later.nodes] == [(0, 0), (1, 1), (2, 2), (4, 4), (3, 3)]


def test_a_row_ending_inside_another_cuts_the_node_and_a_full_tree_starts_another() -> None:
    rows = [{"input_ids": [1, 2, 3, 4]}, {"input_ids": [1, 2]}, {"input_ids": list(range(10, 135))}]
    first, second = pack_trees(rows, max_tokens=128)  # the third row fits only in a tree of its own
    assert [(n.start, n.end, n.sequence_ids) for n in first.nodes] == [(0, 1, [0, 1]), (2, 3, [0])]
    assert second.sequence_ids == [2] and second.num_tokens == 125


def test_lineage_rows_and_a_group_read_back_from_the_tree_with_their_fields(qwen25_tokenizer) -> None:
    tok = qwen25_tokenizer
    rows = [to_areal(s) for t in [record_tree(tok), *record_group(tok, 8)] for s in training_branches(t)]
    for k, row in enumerate(rows):
        row["reward"] = float(k)
    (tree,) = pack_trees(rows, max_tokens=4096)
    assert tree.sequence_ids == list(range(12))
    assert tree.num_tokens < sum(len(r["input_ids"]) for r in rows)
    cursor = 0
    for seq in tree.sequence_ids:
        ids = rows[seq]["input_ids"]
        at = tree.row_positions(seq)
        assert [tree.input_ids[i] for i in at] == ids and [tree.position_ids[i] for i in at] == list(range(len(ids)))
        assert all(tree.parent[i] == j for i, j in zip(at[1:], at, strict=False))  # each token's parent: the one before
        for key in ("loss_mask", "logprobs", "versions"):
            assert tree.packed[key][cursor : cursor + len(ids)] == rows[seq][key]
        cursor += len(ids)
    assert [r["reward"] for r in tree.rows] == [float(k) for k in range(12)]
    shared = tree.nodes[0]  # the group's system prompt and question, and the lineage rollout's system prompt
    assert shared.parent == -1 and len(shared.sequence_ids) > 1


@pytest.mark.parametrize(
    ("rows", "max_tokens", "message"),
    [
        ([{"input_ids": [1]}], 100, "max_tokens must be a positive multiple of 128"),
        ([{"input_ids": [1]}, {"input_ids": []}], 128, "row 1 has no tokens"),
        ([{"input_ids": list(range(129))}], 128, "row 0 has 129 tokens, more than max_tokens=128"),
        ([{"input_ids": [1, 2], "loss_mask": [0]}], 128, "row 0: loss_mask has 1 values for 2 tokens"),
    ],
)
def test_bad_rows_are_refused_by_name(rows: list[dict[str, list[int]]], max_tokens: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pack_trees(rows, max_tokens=max_tokens)
