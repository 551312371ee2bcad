"""Training rows packed into prefix trees, each shared prefix stored once: AReaL's tree-training layout.

AReaL (areal 1.0.x, ``areal.models.tree_attn.tree.build_packed_tree_batch``) packs a batch of rows into token
tries and trains on the tries: a shared prefix is computed once, under a tree attention mask. :func:`pack_trees`
builds the same trees from rows (:func:`~tito_core.export.areal.to_areal`'s, or any with ``input_ids``), by the same
rules, so a tree here is AReaL's tree for the same batch:

- rows go in in order, each into the first tree where it adds at most ``max_tokens`` tokens in all, else a new tree
  (a row longer than ``max_tokens`` is an error); tokens merge by id alone, across rollouts and branches;
- a tree's tokens are laid out in the order they were first inserted (a parent's before its children's);
- a node is a run of tokens the same rows pass through, cut where rows diverge or a row ends; ``nodes`` lists them in
  pre-order, children by first token;
- ``position_ids`` is each token's depth, ``parent`` (AReaL's ``trie_to_parent_array``) its parent token's index
  (-1 at a root); AReaL pads all three to ``max_tokens`` (with 0, 0 and -1), which a tree here leaves out;
- per-token row fields (``loss_mask``, ``logprobs``, ``versions``) stay per row, concatenated in the order of
  ``sequence_ids`` (the rows' batch indices, sorted): the loss reads each row's tokens back from the tree (its
  ``row_positions``), so it equals the loss over the flat rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

__all__ = ["BLOCK_SIZE", "PACKED_KEYS", "PackedTree", "TreeNode", "pack_trees"]

BLOCK_SIZE = 128
"""AReaL's block size: ``max_tokens`` must be a multiple of it (its block masks)."""

PACKED_KEYS = ("loss_mask", "logprobs", "versions")
"""The per-token row fields a tree keeps per row (those a row has)."""


class TreeNode(msgspec.Struct, frozen=True, kw_only=True):
    """One node of a tree: its tokens ``start`` to ``end`` (inclusive), which the rows ``sequence_ids`` pass through.

    ``parent`` is the parent node's index in ``nodes`` (-1 for a node at the root).
    """

    start: int
    end: int
    parent: int
    sequence_ids: list[int]


class PackedTree(msgspec.Struct, frozen=True, kw_only=True):
    """One tree of a batch (AReaL's micro-batch): its tokens once, and its rows' fields.

    Attributes:
        input_ids: The tree's tokens (``num_tokens`` of them), each once.
        position_ids: Each token's depth (its position in every row through it).
        parent: Each token's parent token (-1 at a root).
        nodes: The nodes, in pre-order.
        sequence_ids: The batch indices of the tree's rows, sorted.
        max_tokens: The size AReaL pads the tree to.
        packed: Per-token row fields, each row's values concatenated in ``sequence_ids`` order.
        rows: Each row's other fields (reward, lineage, ...), in ``sequence_ids`` order.
    """

    input_ids: list[int]
    position_ids: list[int]
    parent: list[int]
    nodes: list[TreeNode]
    sequence_ids: list[int]
    max_tokens: int
    packed: dict[str, list[Any]]
    rows: list[dict[str, Any]]

    @property
    def num_tokens(self) -> int:
        """Tokens in the tree (each shared prefix once)."""
        return len(self.input_ids)

    def row_positions(self, seq_id: int) -> list[int]:
        """The tree indices of row ``seq_id``'s tokens, in order: ``input_ids`` at these is the row."""
        return [i for n in self.nodes if seq_id in n.sequence_ids for i in range(n.start, n.end + 1)]


class _Node:
    """One token of a tree being built (AReaL's trie before compression)."""

    __slots__ = ("children", "ends", "index", "rows", "token")

    def __init__(self, token: int, index: int) -> None:
        self.token = token
        self.index = index
        self.children: dict[int, _Node] = {}
        self.rows: list[int] = []
        self.ends = False


class _Trie:
    __slots__ = ("root", "size")

    def __init__(self) -> None:
        self.root = _Node(-1, -1)
        self.size = 0

    def added(self, ids: Sequence[int]) -> int:
        """How many tokens inserting ``ids`` would add."""
        node = self.root
        for depth, token in enumerate(ids):
            child = node.children.get(token)
            if child is None:
                return len(ids) - depth
            node = child
        return 0

    def insert(self, ids: Sequence[int], row: int) -> None:
        node = self.root
        for token in ids:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(token, self.size)
                self.size += 1
            child.rows.append(row)
            node = child
        node.ends = True


def pack_trees(rows: Iterable[Mapping[str, Any]], *, max_tokens: int) -> list[PackedTree]:
    """The rows packed into trees of at most ``max_tokens`` tokens, as AReaL's tree training packs one batch.

    Each row has ``input_ids``; ``loss_mask``, ``logprobs`` and ``versions`` are packed per row, the rest kept.

    Raises:
        ValueError: ``max_tokens`` not a positive multiple of :data:`BLOCK_SIZE`; an empty row, a row longer than
            ``max_tokens``, or a per-token field whose length is not the row's.
    """
    if max_tokens <= 0 or max_tokens % BLOCK_SIZE:
        raise ValueError(f"max_tokens must be a positive multiple of {BLOCK_SIZE} (AReaL's blocks), not {max_tokens}")
    batch = list(rows)
    tries: list[_Trie] = []
    for index, row in enumerate(batch):
        ids = row["input_ids"]
        _check_row(index, row, max_tokens)
        trie = next((t for t in tries if t.size + t.added(ids) <= max_tokens), None)
        if trie is None:
            trie = _Trie()
            tries.append(trie)
        trie.insert(ids, index)
    return [_packed(trie, batch, max_tokens) for trie in tries]


def _check_row(index: int, row: Mapping[str, Any], max_tokens: int) -> None:
    ids = row["input_ids"]
    if not ids:
        raise ValueError(f"row {index} has no tokens: a tree has nothing to hold for it")
    if len(ids) > max_tokens:
        raise ValueError(f"row {index} has {len(ids)} tokens, more than max_tokens={max_tokens}")
    for key in PACKED_KEYS:
        if key in row and len(row[key]) != len(ids):
            raise ValueError(f"row {index}: {key} has {len(row[key])} values for {len(ids)} tokens")


def _packed(trie: _Trie, batch: list[Mapping[str, Any]], max_tokens: int) -> PackedTree:
    ids = [0] * trie.size
    position = [0] * trie.size
    parent = [-1] * trie.size
    nodes: list[TreeNode] = []

    stack = [(trie.root.children[t], -1, 0) for t in sorted(trie.root.children, reverse=True)]
    while stack:  # pre-order, children by first token
        first, parent_node, depth = stack.pop()
        node, run = first, [first]
        while len(node.children) == 1 and not node.ends:  # a run the same rows pass through
            node = next(iter(node.children.values()))
            run.append(node)
        end_of_parent = nodes[parent_node].end if parent_node >= 0 else -1
        for k, tok in enumerate(run):
            ids[tok.index] = tok.token
            position[tok.index] = depth + k
            parent[tok.index] = end_of_parent if k == 0 else tok.index - 1
        nodes.append(TreeNode(start=first.index, end=node.index, parent=parent_node, sequence_ids=list(node.rows)))
        here = len(nodes) - 1
        stack += [(node.children[t], here, depth + len(run)) for t in sorted(node.children, reverse=True)]
    sequence_ids = sorted({r for n in nodes for r in n.sequence_ids})
    keys = [key for key in PACKED_KEYS if all(key in batch[r] for r in sequence_ids)]  # a field every row has
    packed = {key: [v for r in sequence_ids for v in batch[r][key]] for key in keys}
    rows = [{k: v for k, v in batch[r].items() if k != "input_ids" and k not in PACKED_KEYS} for r in sequence_ids]
    return PackedTree(
        input_ids=ids,
        position_ids=position,
        parent=parent,
        nodes=nodes,
        sequence_ids=sequence_ids,
        max_tokens=max_tokens,
        packed=packed,
        rows=rows,
    )
