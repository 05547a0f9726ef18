"""RadixCoreHiCache: ``RadixCoreCache`` with SGLang's host tier (HiCache) under it, driven here.

With ``--enable-hierarchical-cache`` SGLang keeps a host-memory copy of the KV pool's pages and
moves KV between the tiers with its cache controller (``HybridCacheController``: host slots, copy
queues, acknowledgements). Its own cache drives that controller from UnifiedRadixCache's Python
layer; here radix-core's tiered tree (``radix_core.TieredRadixCache``) decides what moves, and this
class asks the controller to move it, as UnifiedRadixCache does for a FULL-attention KV pool:

- backups: ``write_through`` (and ``write_through_selective``) copy a node and its ancestors
  without a host copy once its hits reach the policy's threshold; the node stays device-locked
  until the copy is acknowledged. ``write_back`` copies a node when eviction takes it, and waits;
- load-back: a request whose match continues on the host gets device slots for that run, the
  copy is queued (the forward waits for it layer by layer), and the run stays locked on both tiers
  until the copy is acknowledged;
- host eviction: host-only leaves by the eviction policy, when a backup finds the host pool full;
- acknowledgements are reaped in ``check_hicache_events``, every scheduler step.

It serves one scheduler rank with SGLang's plain (MHA) KV pool and no L3 storage, and no
speculative decoding (SGLang requires its UnifiedRadixCache for HiCache's draft pools): the
backend's factory sends other HiCache configurations to UnifiedRadixCache on radix-core's TreeCore
(``backend.tree_core``); ``refusals.tree_core_route`` says why. This module imports SGLang.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_kv_only_stack

from radix_core.tiers import TieredNode, TieredRadixCache

from .cache import RadixCoreCache
from .translation import backup_chains, duplicate_ranges

if TYPE_CHECKING:
    from radix_core import InsertResult

logger = logging.getLogger("radix_sglang_adapter")

LOAD_BACK_THRESHOLD = 10  # UnifiedRadixCache's: host runs shorter than this are recomputed


class RadixCoreHiCache(RadixCoreCache):
    """``RadixCoreCache`` on a ``radix_core.TieredRadixCache``, driving SGLang's cache controller.

    Answers are those of SGLang's UnifiedRadixCache with HiCache (FULL KV, one rank), checked
    against it step by step in the scheduler-level tests: prefix lengths on both tiers, load-backs,
    rows, the device allocator's and the host pool's free slots, sizes.
    """

    tree: TieredRadixCache

    def __init__(self, params: CacheInitParams, tp_worker: Any):
        from sglang.srt.runtime_context import get_memory

        self.write_policy = get_memory().hicache_write_policy
        self.cache_controller: Any = None  # reset() (called by RadixCache's init) clears it once built
        super().__init__(params)
        kv_pool = params.token_to_kv_pool_allocator.get_kvcache()
        self.load_cache_event = threading.Event()
        self.host_pool_group, self.cache_controller = build_kv_only_stack(
            params=params,
            kv_pool=kv_pool,
            full_layer_mapping={layer: layer for layer in range(kv_pool.layer_num)},
            load_cache_event=self.load_cache_event,
            storage_backend=None,
            use_mla=False,
        )
        self.full_kv_pool_host = self.host_pool_group.get_pool(PoolName.KV)  # the scheduler's metrics read it
        # The forward waits on this counter for loaded layers; the controller may have replaced
        # the one the KV pool registered.
        counter = self.cache_controller.layer_done_counter
        kv_pool.register_layer_transfer_counter(counter)
        tp_worker.register_hicache_layer_transfer_counter(counter)

    # ----- the tree -----------------------------------------------------------------------------

    def _new_tree(self) -> TieredRadixCache:
        return TieredRadixCache(
            self.page_size,
            self.is_eagle,
            self.eviction_policy,
            self.write_policy,
            on_evict=self._free_evicted_value,
            on_host_evict=self._free_host_value,
            back_up=self._back_up_for_eviction,
        )

    def reset(self) -> None:
        super().reset()
        # Copies in flight, by the node id the controller acknowledges them with.
        self.ongoing_write_through: dict[int, TieredNode] = {}
        self.ongoing_load_back: dict[int, tuple[TieredNode, int | None]] = {}
        self.enable_storage = False
        if self.cache_controller is not None:  # a flush: what was queued or held on the host goes too
            self.cache_controller.reset()
            self.cache_controller.mem_pool_host.clear()

    def _free_host_value(self, value: torch.Tensor) -> None:
        self.cache_controller.mem_pool_host.free(value)

    # ----- match and insert ---------------------------------------------------------------------

    def _duplicate_ranges(self, inserted: InsertResult, protected: int) -> list[tuple[int, int]]:
        """Past the request's own prefix, what the tree held already, except what host-only nodes
        took from the row (their device copy now): a range per node, as UnifiedRadixCache frees
        them (SGLang's paged allocator files each freed batch apart: the order shows)."""
        return duplicate_ranges(inserted, self.root_node, protected)

    def _inserted(self, inserted: InsertResult) -> None:
        """Back up what reached the write policy's threshold, each node with its ancestors that
        have no host copy, root first; stop at the first that finds no host room."""
        tree = self.tree
        for chain in backup_chains(tree, inserted.to_back_up):
            for part in chain:
                host_value = self._write(part)
                if host_value is None:
                    return
                tree.commit_backup(part, host_value)
                tree.mark_backup_pending(part)
                tree.inc_lock_ref(part)  # its device KV is being read until the copy lands
                self.ongoing_write_through[part.id] = part

    def _write(self, node: TieredNode) -> torch.Tensor | None:
        """Queue a copy of ``node``'s device KV to host slots (evicting host leaves for room);
        the host slots, or None where there is no room."""
        units = len(node.value)
        short = units - self.cache_controller.mem_pool_host.available_size()
        if short > 0 and self.tree.evict_host(short) < short:
            return None
        return self.cache_controller.write(node.value, node_id=node.id, flush=False)

    def _back_up_for_eviction(self, node: TieredNode) -> torch.Tensor | None:
        """write_back: eviction takes ``node``, so its KV goes to the host first, and the copy must
        land before its device slots are handed out again."""
        host_value = self._write(node)
        if host_value is not None:
            self._drain_writes()
        return host_value

    # ----- the scheduler's HiCache calls ---------------------------------------------------------

    def check_hicache_events(self) -> None:
        """Every scheduler step: submit queued backups, then settle every copy that has landed."""
        controller = self.cache_controller
        controller.start_writing()
        tree = self.tree
        for ack in self._landed(controller.ack_write_queue):
            for node_id in ack.node_ids:
                self._finish_backup(self.ongoing_write_through.pop(node_id))
            self._count_copy(ack, load_back=False)
        for ack in self._landed(controller.ack_load_queue):
            for node_id in ack.node_ids:
                node, host_lock = self.ongoing_load_back.pop(node_id)
                tree.dec_lock_ref(node)
                tree.dec_host_lock_ref(node, host_lock)
                tree.finish_load_back(node)
            self._count_copy(ack, load_back=True)

    def _count_copy(self, ack: Any, load_back: bool) -> None:
        """SGLang's metrics of a landed copy (``--enable-metrics``), as UnifiedRadixCache records them."""
        metrics = self.metrics_collector
        if metrics is None:
            return
        kind = "load_back" if load_back else "backup"  # increment_backup_num_tokens and the like
        for pool, tokens in (ack.num_tokens_by_pool or {}).items():
            if tokens > 0:
                getattr(metrics, f"increment_{kind}_num_tokens")(num_tokens=tokens, pool=pool)
        if ack.num_bytes > 0:
            getattr(metrics, f"increment_{kind}_num_bytes")(ack.num_bytes)
        if ack.timing_enabled:
            getattr(metrics, f"observe_{kind}_duration")(ack.start_event.elapsed_time(ack.finish_event) / 1000.0)

    @staticmethod
    def _landed(queue: list) -> list:
        """The acknowledgements at the head of ``queue`` whose copies have finished, taken off it."""
        ready = 0
        while ready < len(queue) and queue[ready].finish_event.query():
            ready += 1
        landed = queue[:ready]
        del queue[:ready]
        for ack in landed:
            ack.finish_event.synchronize()
        return landed

    def _finish_backup(self, node: TieredNode) -> None:
        """A write-through copy of ``node`` landed: it and the upper parts splits cut from it while
        the copy was in flight (pending, no copy of their own in flight) are settled."""
        tree = self.tree
        tree.finish_backup(node)
        tree.dec_lock_ref(node)
        part = node.parent
        while isinstance(part, TieredNode) and part.backup_pending and part.id not in self.ongoing_write_through:
            tree.finish_backup(part)
            part = part.parent

    def _drain_writes(self) -> None:
        """Submit every queued backup and wait for all copies in flight (write_back's eviction)."""
        controller = self.cache_controller
        controller.start_writing()
        for ack in controller.ack_write_queue:
            ack.finish_event.synchronize()
        queue = list(controller.ack_write_queue)
        controller.ack_write_queue.clear()
        for ack in queue:
            for node_id in ack.node_ids:
                if node_id in self.ongoing_write_through:
                    self._finish_backup(self.ongoing_write_through.pop(node_id))
            self._count_copy(ack, load_back=False)

    def flush_pending_backups(self) -> None:
        self.cache_controller.start_writing()

    def ready_to_load_host_cache(self) -> int:
        """Start the load-backs queued for the batch; the index its forward waits on, -1 if none."""
        return self.cache_controller.start_loading()

    def init_load_back(self, params: InitLoadBackParams) -> tuple[int, Any]:
        """Queue the copy of the host-only run down to ``best_match_node``: all of it, with the
        node to lock, or nothing (0 and the request's device node) where it is short, over the
        memory quota, or the device pool has no room even after eviction."""
        req = params.req
        assert req is not None
        fallback = (0, req.last_node)
        best = params.best_match_node
        if params.host_hit_length <= 0 or best is self.root_node:
            return fallback
        tree = self.tree
        try:
            run = tree.load_back_nodes(best)
        except ValueError:  # host eviction took the run since the match (a backup of write_back's)
            return fallback
        host_indices = tree.host_indices(run)
        units = len(host_indices)
        if units < LOAD_BACK_THRESHOLD:
            return fallback
        host_lock = tree.inc_host_lock_ref(best)
        locked = tree.inc_lock_ref(best)  # device eviction below must not take the path
        device_indices = None
        if params.mem_quota is None or units + locked <= params.mem_quota:
            allocator = self.token_to_kv_pool_allocator
            short = units - allocator.available_size()
            if short > 0:
                self.evict(EvictParams(num_tokens=short))
            if allocator.available_size() >= units:
                device_indices = self.cache_controller.load(host_indices=host_indices, node_id=best.id)
        tree.dec_lock_ref(best)
        if device_indices is None:
            tree.dec_host_lock_ref(best, host_lock)
            return fallback
        tree.commit_load_back(run, device_indices, anchor=best)
        tree.inc_lock_ref(best)  # until the copy lands
        self.ongoing_load_back[best.id] = (best, host_lock)
        return units, best

    def evict_host(self, num_tokens: int) -> int:
        return self.tree.evict_host(num_tokens)

    def clear_storage_backend(self) -> bool:
        logger.info("clear_storage_backend: this cache has no L3 storage backend; nothing to clear")
        return False

    def release_host_resources(self) -> None:
        self.host_pool_group.destroy()
