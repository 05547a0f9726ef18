"""A KV-aware router's view of one worker, built from its KV cache events alone; and what it should be.

A router (Dynamo's KV indexer, SGLang's gateway, llm-d) never sees the tree: it keeps the blocks
the events announced, each under its published hash with its parent's hash and its tokens, and
drops them when removed. ``cached_blocks`` computes the same map from a cache's tree directly,
hashing every path from the root with SGLang's own functions (Dynamo format: every namespace
scoped), so a router that applied every event must hold exactly it.
"""

from __future__ import annotations

from array import array
from typing import Any

from sglang.srt.disaggregation.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    kv_event_namespace_seed,
    namespaced_block_hash,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_hash_str, hash_str_to_int64

from radix_sglang_adapter.backend.kv_events import chain_seed
from radix_sglang_adapter.backend.translation import split_namespace

Block = tuple[int | None, tuple]  # the parent's hash, the page's token ids (pairs under EAGLE)


class Router:
    """The blocks one worker's events say it holds, by published hash."""

    def __init__(self) -> None:
        self.blocks: dict[int, Block] = {}

    def apply(self, event: Any) -> None:
        if isinstance(event, AllBlocksCleared):
            self.blocks.clear()
        elif isinstance(event, BlockRemoved):
            for block in event.block_hashes:
                assert block in self.blocks, "only a stored block is removed"
                del self.blocks[block]
        else:
            assert isinstance(event, BlockStored)
            parent = event.parent_block_hash
            assert parent is None or parent in self.blocks, "a store chains on from a stored block"
            size = event.block_size
            assert len(event.token_ids) == size * len(event.block_hashes)
            for page, block in enumerate(event.block_hashes):
                assert block not in self.blocks, "a block is stored once"
                self.blocks[block] = (parent, tuple(event.token_ids[page * size : (page + 1) * size]))
                parent = block


def cached_blocks(tree: Any, page_size: int) -> dict[int, Block]:
    """Every page of ``tree`` (a radix_core.RadixCache of the backend) as a Dynamo-format router
    should know it, hashed from its whole path with SGLang's functions."""
    blocks: dict[int, Block] = {}
    stack = [(child, array("q")) for child in tree.root_node.children.values()]
    while stack:
        node, path = stack.pop()
        key = node.key
        tokens = key.token_ids
        path = path + (tokens[1:] if key.is_bigram and path else tokens)
        extra_key, cache_salt = split_namespace(key.extra_key)
        seed = chain_seed(cache_salt)
        hashes = get_hash_str(RadixKey(path, is_bigram=key.is_bigram), seed.hex() if seed else None, page_size)
        namespace = kv_event_namespace_seed(extra_key=extra_key, cache_salt=cache_salt)
        published = [namespaced_block_hash(hash_str_to_int64(h), namespace_seed=namespace) for h in hashes]
        units = list(RadixKey(path, is_bigram=key.is_bigram))
        first = len(published) - len(key) // page_size
        for page in range(first, len(published)):
            parent = published[page - 1] if page else None
            blocks[published[page]] = (parent, tuple(units[page * page_size : (page + 1) * page_size]))
        stack.extend((child, path) for child in node.children.values())
    return blocks
