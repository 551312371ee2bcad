"""tito's prefix-tree export is AReaL's tree-training batch: the same trees from AReaL's own builder, and AReaL's
own objects (``TrieNode``) built from the export give AReaL's attention mask and each row's logprobs."""

from __future__ import annotations

from typing import Any

import pytest

from tito_core.export import PackedTree, pack_trees, to_areal, training_branches
from tito_testing.rollout_trees import record_group, record_tree

torch = pytest.importorskip("torch")

MAX_TOKENS = 128  # small enough that the batch needs several trees


def _rows(tok: Any) -> list[dict[str, Any]]:
    """A lineage rollout twice (the second merges whole into the first), a GRPO group of 8, and a row that ends
    inside the first (a node is cut where a row ends)."""
    trajectories = [record_tree(tok), record_tree(tok), *record_group(tok, 8)]
    rows = [to_areal(sample) for traj in trajectories for sample in training_branches(traj)]
    return [*rows, {key: values[:30] for key, values in rows[0].items()}]


def _batch(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows as AReaL's padded batch dict."""
    width = max(len(r["input_ids"]) for r in rows)
    batch: dict[str, Any] = {"attention_mask": torch.zeros(len(rows), width, dtype=torch.bool)}
    dtypes = {"input_ids": torch.long, "loss_mask": torch.int32, "logprobs": torch.float32, "versions": torch.int32}
    for key, dtype in dtypes.items():
        batch[key] = torch.zeros(len(rows), width, dtype=dtype)
        for i, row in enumerate(rows):
            batch[key][i, : len(row[key])] = torch.tensor(row[key], dtype=dtype)
    for i, row in enumerate(rows):
        batch["attention_mask"][i, : len(row["input_ids"])] = True
    batch["rewards"] = torch.arange(len(rows), dtype=torch.float32)
    return batch


def _padded(values: list[int], fill: int) -> Any:
    return torch.tensor(values + [fill] * (MAX_TOKENS - len(values)))


def _trie(areal: Any, tree: PackedTree, tree_id: int) -> Any:
    """AReaL's ``TrieNode`` of one exported tree, from the export alone."""
    TrieNode = areal.tree.TrieNode
    root = TrieNode(tree_id=tree_id)
    made: list[Any] = []
    for node in tree.nodes:  # pre-order: a parent comes before its children
        ancestors = [] if node.parent < 0 else [*made[node.parent].ancestors, made[node.parent]]
        tokens = tree.input_ids[node.start : node.end + 1]
        trie_node = TrieNode(
            tree_id=tree_id, start_idx=node.start, end_idx=node.end, tokens=tokens,
            sequence_ids=list(node.sequence_ids), ancestors=ancestors,
        )  # fmt: skip
        (root if node.parent < 0 else made[node.parent]).children[tokens[0]] = trie_node
        root.nodes.append(trie_node)
        made.append(trie_node)
    return root


def test_the_tree_export_is_areal_s_own_tree_batch(qwen25_tokenizer, areal_tree) -> None:
    rows = _rows(qwen25_tokenizer)
    trees = pack_trees(rows, max_tokens=MAX_TOKENS)
    batch = _batch(rows)
    theirs = areal_tree.tree.build_packed_tree_batch(batch, areal_tree.MicroBatchSpec(max_tokens_per_mb=MAX_TOKENS))
    assert len(trees) == len(theirs.mbs) > 1
    assert sum(t.num_tokens for t in trees) == sum(theirs.group_lens) < sum(len(r["input_ids"]) for r in rows)
    for tree_id, (ours, mb) in enumerate(zip(trees, theirs.mbs, strict=True)):
        trie = mb["trie_node"]
        assert torch.equal(_padded(ours.input_ids, 0), mb["input_ids"][0])
        assert torch.equal(_padded(ours.position_ids, 0), mb["position_ids"][0])
        parent = areal_tree.tree.trie_to_parent_array(trie, MAX_TOKENS)
        assert torch.equal(_padded(ours.parent, -1).to(torch.int32), parent[0])
        assert [(n.start_idx, n.end_idx, n.tokens, n.sequence_ids) for n in trie.nodes] == [
            (n.start, n.end, ours.input_ids[n.start : n.end + 1], n.sequence_ids) for n in ours.nodes
        ]
        assert ours.sequence_ids == trie.all_sequence_ids
        for key in ("loss_mask", "logprobs", "versions"):
            assert ours.packed[key] == pytest.approx(mb[key].tolist()), key
        for seq in ours.sequence_ids:  # each row is the tree's tokens at its positions
            assert [ours.input_ids[i] for i in ours.row_positions(seq)] == rows[seq]["input_ids"]
        # AReaL's objects built from the export: its mask, and each row's logprobs read from one set of logits
        built = _trie(areal_tree, ours, tree_id)
        mask = areal_tree.tree.build_attention_mask_from_trie(built, MAX_TOKENS, torch.device("cpu"))
        assert torch.equal(mask, areal_tree.tree.build_attention_mask_from_trie(trie, MAX_TOKENS, torch.device("cpu")))
        logits = torch.randn(MAX_TOKENS, 64, generator=torch.Generator().manual_seed(tree_id))
        ids = _padded([t % 64 for t in ours.input_ids], 0)
        logprobs, _ = areal_tree.functional.gather_packed_tree_logprobs_entropy(logits, built, ids)
        flat = []
        for seq in ours.sequence_ids:  # the flat row's logprobs: token t+1 from the logits at token t
            at = ours.row_positions(seq)
            row = torch.log_softmax(logits[at], dim=-1)
            flat.append(row[:-1].gather(1, ids[at[1:]].unsqueeze(1)).squeeze(1))
        lengths = [len(ours.row_positions(seq)) for seq in ours.sequence_ids]
        per_row = torch.split(logprobs, lengths)
        for got, want in zip(per_row, flat, strict=True):  # AReaL's last value per row is a dummy label
            assert torch.allclose(got[:-1], want, atol=1e-6)
