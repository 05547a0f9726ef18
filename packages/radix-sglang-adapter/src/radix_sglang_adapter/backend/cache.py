"""RadixCoreCache: SGLang's own RadixCache, with every tree operation on radix_core.RadixCache.

Subclassing SGLang's RadixCache keeps what the scheduler drives around the tree SGLang's:
``free_kv_row``, ``unlock``, ``prefix_device_indices``, ``dfs_weight_order``, its key and result
types, page and EAGLE handling of request keys. What runs on radix-core is the tree: match,
insert, evict, lock counting, sizes, and ``checkpoint``, the per-chunk hot path, rewritten to leave
exactly what SGLang's leaves without redoing work (the differential tests compare the two after
every scheduler step). This module imports SGLang; only the backend's factory imports it, when
SGLang builds its tree cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
    MatchResult,
    TreeLock,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.utils.common import ceil_align

import radix_core

from .kv_events import HashedTreeNode, TreeEvents
from .refusals import Setup, refuse_unserved
from .translation import match_result, namespace, on_tree

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

logger = logging.getLogger("radix_sglang_adapter")

_INT64_MAX = torch.iinfo(torch.int64).max
_NO_RECEIPT = DecLockRefParams()


class RadixCoreCache(RadixCache):
    """SGLang's ``RadixCache`` whose tree is a ``radix_core.RadixCache`` (``self.tree``).

    Answers are SGLang's, checked against its RadixCache request by request. Where SGLang's
    tolerates misuse by corrupting its own sizes (``dec_lock_ref`` without ``inc_lock_ref``, a lock
    on an evicted node, ``evict`` of a negative count), this one logs an error and changes nothing.
    Single writer, as SGLang's scheduler: not thread-safe.
    """

    tree: radix_core.RadixCache | radix_core.TieredRadixCache
    components: tuple[str, ...] = ("FULL",)  # the attention the KV pool holds

    def __init__(self, params: CacheInitParams):
        refuse_unserved(Setup(params, components=self.components))
        super().__init__(params)  # calls reset(), which builds the tree

    # ----- the tree -----------------------------------------------------------------------------

    def reset(self) -> None:
        self.tree = self._new_tree()
        self.root_node = self.tree.root_node
        self._empty_device_indices = torch.empty((0,), dtype=torch.int64, device=self.device)
        root = self.root_node
        self._empty_match_result = MatchResult(
            device_prefix_len=0, last_device_node=root, last_host_node=root, best_match_node=root
        )
        self.kv_events.record_all_cleared()

    def _new_tree(self) -> radix_core.RadixCache | radix_core.TieredRadixCache:
        """An empty tree, its callbacks set: the KV pool's, and the KV event stream's if enabled."""
        events = TreeEvents(self.kv_events, self.page_size) if self.kv_events.enabled else None
        return radix_core.RadixCache(
            self.page_size,
            self.is_eagle,
            self.eviction_policy,
            on_evict=self._free_evicted_value,
            on_store=events.stored if events else None,
            on_remove=events.removed if events else None,
            node_class=HashedTreeNode,
        )

    def _free_evicted_value(self, value: torch.Tensor) -> None:
        # Tree values are page-aligned copies of a KV row, as in SGLang's evict().
        self.token_to_kv_pool_allocator.free_segment(value, start_pos=0)

    def _tree_key(self, key: RadixKey) -> radix_core.RadixKey:
        """The same tokens (a window, no copy of an array('q')) in the same namespace."""
        return radix_core.RadixKey(key.token_ids, namespace(key.extra_key, key.cache_salt), key.is_bigram, key.limit)

    def _request_key(self, req: Req, raw_tokens: int) -> radix_core.RadixKey:
        """The first ``raw_tokens`` of the request's fill ids, page-aligned, as SGLang keys it."""
        tokens = req.full_untruncated_fill_ids
        tree_namespace = namespace(req.extra_key, req.cache_salt)
        return radix_core.RadixKey(tokens, tree_namespace, self.is_eagle, raw_tokens).page_aligned(self.page_size)

    def _cached_units(self, raw_tokens: int) -> int:
        """The units a key of ``raw_tokens`` fill ids caches: one per token, one per pair of
        tokens in EAGLE mode, cut to whole pages (``len(self._request_key(req, raw_tokens))``)."""
        units = max(raw_tokens - 1, 0) if self.is_eagle else raw_tokens
        return units - units % self.page_size

    # ----- BasePrefixCache ----------------------------------------------------------------------

    def checkpoint(self, req: Req, *, up_to: int, **kwargs: Any) -> None:
        """SGLang's RadixCache.checkpoint: the same tree, row, allocator and request afterwards,
        without the work that is there only to be thrown away.

        SGLang's: insert the first ``up_to`` fill ids (page-aligned) with the KV indices of the
        request's row; insert again up to the prompt's end at priority + 1 (a split there, so
        eviction drops the output first); free the row's slots that duplicate KV the tree held
        already; match the key again; rewrite the row from the tree; move the request's lock.
        Here nothing is done twice: the key is a window over the fill ids (SGLang copies them;
        the tree keeps a window of that array where a node covers at least half of it and copies
        shorter parts, and SGLang only ever appends to it); both inserts are one call of the tree
        (``prefix_priority``) and follow the path the request already holds (its locked
        ``last_node``, then the node just reached) instead of comparing those tokens again, the
        prompt boundary is made with the new nodes, and the
        values start at ``cache_protected_len`` (SGLang converts and compares the whole row at
        every chunk: quadratic in the prompt); the second match is left out: it would only give
        the path the inserts just marked used a newer access time, and no other node's time falls
        in between, so every eviction order stays the same; the row is rewritten only over the
        duplicates (past them the tree holds copies of the row); the lock moves in one walk.
        """
        kv = req.kv
        key = self._request_key(req, up_to)
        if kv.swa_evict_floor > 0:  # what a pure-SWA window already evicted is never cached
            key = key[: ceil_align(kv.swa_evict_floor, self.page_size)]  # type: ignore[assignment]
        key_len = len(key)
        protected = min(kv.cache_protected_len, key_len)
        row = self.req_to_token_pool.req_to_token[kv.req_pool_idx]
        values = row[protected:key_len]  # a view of the request's row
        converted = self.tree.tree_kind == "python"
        if converted:  # the Python tree keeps a slice of this fresh conversion, no second copy
            values = values.to(dtype=torch.int64, copy=True)
        priority = req.priority or 0
        prompt_len = self._cached_units(min(len(req.origin_input_ids), up_to))
        split_prompt = 0 < prompt_len < key_len
        inserted = self.tree.insert(
            key,
            values,
            priority,
            inserted_len=kv.cache_inserted_len,
            value_offset=protected,
            known_path=req.last_node,
            copy=not converted,  # the native tree copies what it keeps (int32 widened as it goes)
            split_at=prompt_len if split_prompt else None,
            prefix_priority=min(priority + 1, _INT64_MAX) if split_prompt else None,
        )
        matched, node = inserted.prefix_len, inserted.last_node
        kv.cache_inserted_len = max(kv.cache_inserted_len, key_len)
        for start, stop in self._duplicate_ranges(inserted, protected):
            if start < stop:  # an empty free does nothing, after a few microseconds of calls
                self.token_to_kv_pool_allocator.free_segment(row[start:stop], start_pos=start)
        if matched > protected:
            tree_indices = self.tree.path_indices(node, protected, matched)
            self.req_to_token_pool.write((kv.req_pool_idx, slice(protected, matched)), tree_indices)
        kv.cache_protected_len = key_len
        req.lock = self._move_lock(req.lock, node)
        req.last_node = node
        self._inserted(inserted)

    def _duplicate_ranges(self, inserted: Any, protected: int) -> list[tuple[int, int]]:
        """The row's ranges that an insert found cached already: the request's copies, to free."""
        return [(protected, inserted.prefix_len)]

    def _inserted(self, inserted: Any) -> None:
        """After a checkpoint's insert, its request and row settled (the host tier backs up here)."""

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        key, _ = params.key.maybe_to_bigram_view(self.is_eagle)  # in place, as SGLang does
        if len(key) == 0:
            return self._empty_match_result
        found = self.tree.match_prefix(self._tree_key(key), indices=False)
        return match_result(found, self.root_node, self._empty_match_result)

    def touch_prefix(self, key: RadixKey) -> None:
        key, _ = key.maybe_to_bigram_view(self.is_eagle)
        if len(key):
            self.tree.match_prefix(self._tree_key(key), indices=False)

    def insert(self, params: InsertParams) -> InsertResult:
        """SGLang's insert: the key page-aligned, ``value`` cut to it (EAGLE: a raw key of n tokens
        takes n - 1 of its n values), the token ids as int64 values when ``value`` is None."""
        key, value = params.key.maybe_to_bigram_view(self.is_eagle, params.value)
        tree_key = self._tree_key(key).page_aligned(self.page_size)
        units = len(tree_key)
        if value is None:
            value = torch.tensor(tree_key.token_ids[:units], dtype=torch.int64)
        elif len(value) < units:
            raise ValueError(f"insert got {len(value)} values for a key of {units} cached units")
        else:
            value = value[:units]
        found = self.tree.insert(tree_key, value, params.priority, inserted_len=params.inserted_len)
        return InsertResult(prefix_len=found.prefix_len, last_device_node=found.last_node)

    def evict(self, params: EvictParams) -> EvictResult:
        if params.num_tokens < 0:
            logger.error("evict(num_tokens=%d): a negative count; nothing evicted", params.num_tokens)
            return EvictResult()
        start_time = time.perf_counter()
        evicted = self.tree.evict(params.num_tokens)
        self.update_eviction_metrics(evicted, start_time)
        return EvictResult(num_tokens_evicted=evicted)

    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        return IncLockRefResult(delta=self._lock_delta(self.tree.inc_lock_ref, node))

    def dec_lock_ref(self, node: Any, params: DecLockRefParams | None = None) -> DecLockRefResult:
        return DecLockRefResult(delta=self._lock_delta(self.tree.dec_lock_ref, node))

    def _lock_delta(self, change: Callable[[Any], int], node: Any) -> int:
        try:
            return change(node)
        except ValueError as exc:  # not (or no longer) in this tree, or unlocked: radix-core changed nothing
            logger.error("%s(%r) ignored: %s; the tree is unchanged", change.__name__, node, exc)
            return 0

    def lock(self, node: Any) -> TreeLock:
        """SGLang's lock, with one shared receipt: this tree's dec_lock_ref needs none replayed."""
        self.inc_lock_ref(node)
        return TreeLock(node, _NO_RECEIPT)

    def _move_lock(self, lock: TreeLock | None, node: Any) -> TreeLock:
        """``unlock(lock)`` then ``lock(node)``, walking only where the two paths differ."""
        if lock is not None:
            try:
                self.tree.move_lock(lock.node, node)
            except ValueError:  # radix-core changed nothing: the two calls say what is wrong
                pass
            else:
                return TreeLock(node, _NO_RECEIPT)
        self.unlock(lock)
        return self.lock(node)

    def path_device_indices(self, node: Any) -> torch.Tensor:
        """KV indices from the root down to ``node``; ValueError for a node no longer in the tree
        (its indices may have been handed out again: there is no right answer to give)."""
        if node is self.root_node:
            return self._empty_device_indices
        return self.tree.path_indices(node)

    evictable_size = on_tree("evictable_size")
    protected_size = on_tree("protected_size")
    total_size = on_tree("total_size")
    pretty_print = on_tree("pretty_print")


def window_freed_from(kv: Any, page_size: int) -> int:
    """The first row position whose KV a request's sliding window has freed, or int64's max."""
    dead_lo = kv.swa_dead_lo(page_size)  # the window frees from here up to the evicted length
    return dead_lo if kv.get_evicted_seqlen(ComponentType.SWA) > dead_lo else _INT64_MAX


class RadixCorePureSWACache(RadixCoreCache):
    """SGLang's ``PureSWARadixCache`` on radix-core: the cache of a model whose every layer is
    sliding-window attention. Its KV pool has one tier (SWA), its tree is a plain prefix tree.

    What makes it SWA is SGLang's, around the tree: the scheduler frees a running request's KV
    behind its window (``evict_sliding_windows``), ``checkpoint`` caches a prefill-aware model's
    request only below its ``swa_evict_floor``, and the allocator asks for room in SWA tokens
    (``swa_num_tokens``).
    """

    components = ("SWA",)

    def __init__(self, params: CacheInitParams):
        if params.sliding_window_size is None or params.sliding_window_size <= 0:
            raise ValueError(f"a sliding-window cache needs a window, got {params.sliding_window_size!r}")
        super().__init__(params)
        self.sliding_window_size = params.sliding_window_size
        self.draft_swa_window = params.draft_swa_window

    def supports_swa(self) -> bool:
        return True

    def checkpoint(self, req: Req, *, up_to: int, **kwargs: Any) -> None:
        """RadixCoreCache's, never keying KV the window freed: a request of a model without a
        prefill floor that decoded past its window is cached up to where the window began freeing.
        (SGLang 0.5.23's PureSWARadixCache keys those freed slots too, and frees them twice.)"""
        super().checkpoint(req, up_to=min(up_to, window_freed_from(req.kv, self.page_size)), **kwargs)

    swa_evictable_size = on_tree("evictable_size")
    swa_protected_size = on_tree("protected_size")

    def full_evictable_size(self) -> int:
        return 0

    def full_protected_size(self) -> int:
        return 0

    def sanity_check(self) -> None:
        """Nothing to cross-check: there is no full tier beside the SWA one."""

    def evict(self, params: EvictParams) -> EvictResult:
        """The allocator asks in SWA tokens (``swa_num_tokens``), other callers in ``num_tokens``."""
        return super().evict(EvictParams(num_tokens=max(params.num_tokens, params.swa_num_tokens)))

    def available_and_evictable_str(self) -> str:
        swa_available = self.token_to_kv_pool_allocator.swa_available_size()
        swa_evictable = self.swa_evictable_size()
        return f"SWA available tokens: {swa_available + swa_evictable} ({swa_available=} + {swa_evictable=})\n"
