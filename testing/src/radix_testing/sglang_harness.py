"""Builds SGLang's own RadixCache on CPU, for 0.5.10 (list keys) and 0.5.23 (array keys) alike."""

from __future__ import annotations

import importlib.metadata
from array import array
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.mem_cache import radix_cache
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams

SGLANG_VERSION = importlib.metadata.version("sglang")
# Releases whose radix cache still calls convert_to_bigram_key (keys are lists of ints there).
CALLS_CONVERT = hasattr(importlib.import_module("sglang.srt.mem_cache.utils"), "convert_to_bigram_key")
# Releases with the scheduler-facing cache interface the radix-cache backend implements (0.5.22+).
HAS_CHECKPOINT = hasattr(radix_cache.RadixCache, "checkpoint")


class RecordingAllocator:
    """The KV-pool allocator surface RadixCache uses: records what it frees."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.freed: list[torch.Tensor] = []

    def free(self, indices: torch.Tensor) -> None:
        self.freed.append(indices.clone())

    def free_segment(self, indices: torch.Tensor, start_pos: int = 0) -> None:
        self.free(indices)


class ReqToTokenPool:
    """Rows of KV indices per request, as SGLang's ReqToTokenPool keeps them."""

    def __init__(self, rows: int, width: int) -> None:
        self.req_to_token = torch.zeros((rows, width), dtype=torch.int64)

    def write(self, index: Any, values: torch.Tensor) -> None:
        self.req_to_token[index] = values


def make_cache_params(
    page_size: int = 1, is_eagle: bool = True, eviction_policy: str = "lru", pool: Any = None
) -> CacheInitParams:
    """What SGLang builds a tree cache from, with an allocator that records what it frees."""
    return CacheInitParams(
        disable=False,
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=RecordingAllocator(),
        page_size=page_size,
        is_eagle=is_eagle,
        eviction_policy=eviction_policy,
    )


def make_cache(page_size: int = 1, is_eagle: bool = True, eviction_policy: str = "lru", pool: Any = None) -> Any:
    return radix_cache.RadixCache(make_cache_params(page_size, is_eagle, eviction_policy, pool))


def key(tokens: list[int], extra_key: Any = None) -> Any:
    """A RadixKey of this SGLang release (lists before the bigram view, array('q') after)."""
    return radix_cache.RadixKey(list(tokens) if CALLS_CONVERT else array("q", tokens), extra_key)


def insert(cache: Any, tokens: list[int], value: torch.Tensor, extra_key: Any = None, priority: int = 0) -> int:
    return cache.insert(InsertParams(key=key(tokens, extra_key), value=value, priority=priority)).prefix_len


def match(cache: Any, tokens: list[int], extra_key: Any = None) -> tuple[int, Any, torch.Tensor]:
    """(matched units, last node, their KV indices) in either release's result shape."""
    result = cache.match_prefix(MatchPrefixParams(key=key(tokens, extra_key)))
    node = result.last_device_node
    if hasattr(result, "device_prefix_len"):
        return result.device_prefix_len, node, cache.path_device_indices(node)
    return len(result.device_indices), node, result.device_indices


def evict(cache: Any, num_tokens: int) -> int:
    return cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted


def make_request(pool: ReqToTokenPool, row: int, prompt: list[int], output: list[int], root: Any) -> Any:
    """A stand-in for SGLang 0.5.10's Req with what cache_(un)finished_req reads, its KV row filled."""
    tokens = prompt + output
    pool.req_to_token[row, : len(tokens)] = torch.arange(1000 * row, 1000 * row + len(tokens))
    return SimpleNamespace(
        origin_input_ids=list(prompt),
        output_ids=list(output),
        fill_ids=list(tokens),
        req_pool_idx=row,
        extra_key=None,
        last_node=root,
        cache_protected_len=0,
        priority=0,
        prefix_indices=torch.empty(0, dtype=torch.int64),
        pop_committed_kv_cache=lambda: len(tokens),
    )


# What serve() plays: requests on one system prompt, diverging after it or ending inside it, one
# sharing nothing, and the first one's next turn (its prompt and answer, then more).
SYSTEM_PROMPT = [(7 * i) % 97 + 3 for i in range(120)]
REQUESTS = [
    (SYSTEM_PROMPT + [11, 12, 13], [40, 41, 42, 43]),
    (SYSTEM_PROMPT + [11, 12, 99], [44, 45]),
    (SYSTEM_PROMPT[:50], [46]),
    ([5, 6, 7, 8], [9, 10]),
    (SYSTEM_PROMPT + [11, 12, 13, 40, 41, 42, 43, 77], [78, 79, 80]),
]


def serve(page_size: int = 1) -> list:
    """A scheduler's life of each request on an EAGLE RadixCache; returns everything observable."""
    pool = ReqToTokenPool(rows=len(REQUESTS), width=512)
    cache = make_cache(page_size=page_size, is_eagle=True, pool=pool)
    seen: list = []
    for row, (prompt, output) in enumerate(REQUESTS):
        matched, node, indices = match(cache, prompt)
        seen.append(("match", matched, indices.tolist()))
        request = make_request(pool, row, prompt, output, cache.root_node)
        if CALLS_CONVERT:
            cache.inc_lock_ref(node)
            request.last_node = node
            cache.cache_unfinished_req(request)
            seen.append(("unfinished", request.prefix_indices.tolist(), request.cache_protected_len))
            cache.cache_finished_req(request)
        else:
            insert(cache, prompt + output, pool.req_to_token[row, : len(prompt + output)].clone())
        seen.append(("sizes", cache.evictable_size(), cache.protected_size(), cache.total_size()))
    seen.append(("freed", [v.tolist() for v in cache.token_to_kv_pool_allocator.freed]))
    seen.append(("evicted", evict(cache, 60), cache.evictable_size()))
    return seen
