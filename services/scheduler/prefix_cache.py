"""Which KV blocks of a paged worker hold which tokens: a radix tree of full blocks.

Each node is one full block: its `block_size` token ids, the node of the block before it
(the root for a first block) and the block id that holds the keys and values. A path from the
root spells a token prefix. Children are keyed by the tuple of their tokens, so a lookup
compares the tokens themselves (a dict compares keys for equality after hashing), never a hash
alone. Requests hold references to nodes; a node nobody holds stays cached until the pool needs
its block, and only leaves are evicted (least recently used first), so every cached node stays
reachable from the root. Blocks computed under a LoRA adapter hang from a root of their own (its
`salt`, the adapter's generation; 0 for the base model): the same tokens under two adapters never
share keys and values.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterator


@dataclasses.dataclass(eq=False, slots=True)
class Node:
    block_id: int
    tokens: tuple[int, ...]
    parent: Node | None
    children: dict[tuple[int, ...], Node] = dataclasses.field(default_factory=dict)
    num_refs: int = 0
    last_used: int = 0


class PrefixCache:
    """The tree; `BlockAllocator` asks it for hits, gives it full blocks and takes back evictions."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.roots: dict[int, Node] = {}  # salt -> the root of the blocks computed under it
        self.block_to_node: dict[int, Node] = {}
        self.num_unreferenced = 0
        self._clock = itertools.count(1)
        self._evictable: list[tuple[int, int]] = []  # (last_used, block_id), lazily invalidated

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.block_to_node

    def _blocks(self, tokens: list[int], count: int) -> Iterator[tuple[int, ...]]:
        size = self.block_size
        return (tuple(tokens[i * size:(i + 1) * size]) for i in range(count))

    def _root(self, salt: int) -> Node:
        root = self.roots.get(salt)
        if root is None:
            root = self.roots[salt] = Node(-1, (), None)
        return root

    def match(self, tokens: list[int], max_blocks: int, salt: int = 0) -> list[int]:
        """Block ids of the longest prefix of `tokens` cached under `salt`, in whole blocks, at most
        `max_blocks`."""
        node, block_ids = self._root(salt), []
        for key in self._blocks(tokens, min(max_blocks, len(tokens) // self.block_size)):
            child = node.children.get(key)
            if child is None:
                break
            node = child
            block_ids.append(node.block_id)
        return block_ids

    def acquire(self, block_ids: list[int]) -> None:
        """References cached blocks (a request now reads them)."""
        for block_id in block_ids:
            node = self.block_to_node[block_id]
            if node.num_refs == 0:
                self.num_unreferenced -= 1
            node.num_refs += 1

    def release(self, block_id: int) -> None:
        """Drops a reference; the last one makes the block evictable (once it is a leaf)."""
        node = self.block_to_node[block_id]
        node.num_refs -= 1
        if node.num_refs == 0:
            self.num_unreferenced += 1
            self._touch(node)

    def _touch(self, node: Node) -> None:
        node.last_used = next(self._clock)
        if not node.children:
            heapq.heappush(self._evictable, (node.last_used, node.block_id))

    def insert(self, tokens: list[int], block_ids: list[int], num_full: int, salt: int = 0) -> None:
        """Indexes the first `num_full` blocks of a request (`block_ids` hold `tokens`). A block
        whose content is already cached under another id stays the request's own; the chain goes
        on under the cached node. A newly indexed block is referenced by its writer."""
        node = self._root(salt)
        for index, key in enumerate(self._blocks(tokens, num_full)):
            child = node.children.get(key)
            if child is None:
                block_id = block_ids[index]
                if block_id in self.block_to_node:  # already indexed elsewhere: cannot be in two places
                    return
                child = Node(block_id, key, node, num_refs=1)
                node.children[key] = child
                self.block_to_node[block_id] = child
            node = child

    def evict(self) -> int | None:
        """The least recently used unreferenced leaf's block, removed from the tree; None if none."""
        while self._evictable:
            last_used, block_id = heapq.heappop(self._evictable)
            node = self.block_to_node.get(block_id)
            if node is None or node.num_refs or node.children or node.last_used != last_used:
                continue  # stale entry: referenced, re-touched, grown children or gone since
            parent = node.parent
            assert parent is not None, "only the root has no parent, and it holds no block"
            del parent.children[node.tokens]
            del self.block_to_node[block_id]
            self.num_unreferenced -= 1
            if parent.parent is not None and not parent.children and parent.num_refs == 0:
                heapq.heappush(self._evictable, (parent.last_used, parent.block_id))
            return block_id
        return None
