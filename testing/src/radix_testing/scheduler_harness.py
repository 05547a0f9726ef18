"""A CPU stand-in for SGLang 0.5.22+'s scheduler around its tree cache, built from SGLang's own parts.

Requests are SGLang's ``Req``; rows live in SGLang's ``ReqToTokenPool``; KV slots come from SGLang's
token-to-KV allocator (paged or not) on the CPU device, through SGLang's allocation functions,
which evict from the tree when the pool runs short. The tree cache is driven through the same
functions the scheduler uses: ``Req.init_next_round_input`` (match), ``BasePrefixCache.lock``,
``checkpoint_kv_cache`` (chunked prefill), ``release_kv_cache`` (finish and abort); with a host
tier (HiCache), also the scheduler's ``init_load_back`` at admission, ``ready_to_load_host_cache``
before the batch, ``check_hicache_events`` before each step and ``flush_pending_backups`` after it,
over a real KV pool whose rows say which token they hold; for a model with sliding-window attention
(every layer, or beside full-attention ones), SGLang's SWA pools and the scheduler's window eviction
before each decode step (and, for a hybrid, the early release of a prefill's window lock). Only the
batching is left out: requests move one at a time, a step at a time, as a test chooses.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
from sglang.srt.mem_cache.allocation import (
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_token_slots,
)
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.runtime_context import get_context
from sglang.srt.sampling.sampling_params import SamplingParams


@contextmanager
def published_server_args(**fields: Any) -> Iterator[Any]:
    """SGLang's process-wide config (what the scheduler publishes at start), for a test's duration."""
    override = get_context().override_server_args(**fields)
    server_args = override.install()
    try:
        yield server_args
    finally:
        override.restore()


def cache_params(
    pool: Any, allocator: Any, page_size: int, is_eagle: bool, policy: str, **more: Any
) -> CacheInitParams:
    """SGLang's CacheInitParams of an enabled cache; ``more`` sets any other field."""
    fields: dict[str, Any] = {"disable": False, **more}
    return CacheInitParams(
        req_to_token_pool=pool,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        is_eagle=is_eagle,
        eviction_policy=policy,
        **fields,
    )


def event_params(event_format: str) -> dict[str, Any]:
    """SGLang's cache params under ``--kv-events-config`` in ``event_format`` ("default" or "dynamo"),
    with a LoRA name for the "lora-a" namespace, so that the default format scopes its hashes too."""
    from sglang.srt.mem_cache.events import KvEventLoraNames

    names = KvEventLoraNames()
    names.register(SimpleNamespace(lora_id="a" * 32, extra_key="lora-a"), "adapter-a")
    return {
        "enable_kv_cache_events": True,
        "dynamo_kv_event_format": event_format == "dynamo",
        "kv_event_lora_names": names,
    }


def build_context(server_args: Any, params: CacheInitParams, **overrides: Any) -> Any:
    """SGLang's TreeCacheBuildContext for a plain single-GPU server, as kv_cache_builder makes it."""
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext

    fields = dict(
        server_args=server_args,
        params=params,
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=params.disable,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
    )
    fields.update(overrides)
    return TreeCacheBuildContext(**fields)


def small_pools(page_size: int = 1, kv_slots: int = 1024, kv_pool: bool = False) -> tuple[ReqToTokenPool, Any]:
    """A request-to-token pool and a KV allocator (paged or not) on the CPU; with ``kv_pool``, over
    a KV pool (two layers, one head of 8 values a token: what a host tier copies)."""
    pool = ReqToTokenPool(16, 2048, "cpu", False)
    kv = None
    if kv_pool:
        shape = {"head_num": 1, "head_dim": 8, "layer_num": 2}
        kv = MHATokenToKVPool(kv_slots, page_size, torch.float32, **shape, device="cpu", enable_memory_saver=False)
    if page_size == 1:
        return pool, TokenToKVPoolAllocator(kv_slots, torch.float32, "cpu", kv, False)
    return pool, PagedTokenToKVPoolAllocator(kv_slots, page_size, torch.float32, "cpu", kv, False)


def pure_swa_pools(kv_slots: int) -> tuple[ReqToTokenPool, Any]:
    """The pools of a model whose every layer is sliding-window attention, as SGLang builds them:
    an SWAKVPool with no full-attention layer under a PureSWATokenToKVPoolAllocator (page 1 only)."""
    from sglang.srt.mem_cache.allocator.swa import PureSWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pool = ReqToTokenPool(16, 2048, "cpu", False)
    layers = {"swa_attention_layer_ids": [0, 1], "full_attention_layer_ids": []}
    kv = SWAKVPool(0, kv_slots, 1, torch.float32, head_num=1, head_dim=8, device="cpu", **layers)
    return pool, PureSWATokenToKVPoolAllocator(kv_slots, 1, torch.float32, "cpu", kv, False)


def hybrid_swa_pools(page_size: int, kv_slots: int, swa_slots: int) -> tuple[ReqToTokenPool, Any]:
    """The pools of a hybrid model, one full-attention and one sliding-window layer, as SGLang
    builds them: an SWAKVPool under an SWATokenToKVPoolAllocator (its SWA pool ``swa_slots``)."""
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    pool = ReqToTokenPool(16, 2048, "cpu", False)
    layers = {"swa_attention_layer_ids": [1], "full_attention_layer_ids": [0]}
    kv = SWAKVPool(kv_slots, swa_slots, page_size, torch.float32, head_num=1, head_dim=8, device="cpu", **layers)
    return pool, SWATokenToKVPoolAllocator(kv_slots, swa_slots, page_size, torch.float32, "cpu", kv, False)


class NoForwardWorker:
    """The scheduler's tp_worker as HiCache's set-up sees it: the forward would wait on the
    load-back counter; there is no forward here."""

    def register_hicache_layer_transfer_counter(self, counter: Any) -> None:
        pass


class Server:
    """One scheduler's KV state around a tree cache built by ``make_cache(params)``."""

    def __init__(
        self,
        make_cache: Any,
        *,
        page_size: int = 1,
        is_eagle: bool = False,
        policy: str = "lru",
        kv_slots: int = 4096,
        host_tier: bool = False,
        sliding_window: int | None = None,
        prefill_aware_swa: bool = False,
        swa_slots: int | None = None,
        release_prefill_window: bool = False,
        **params: Any,
    ):
        """``params``: any other CacheInitParams field (KV events, ...). ``host_tier``: the cache
        has HiCache on (the published server args say how): the scheduler's HiCache calls are made.
        ``sliding_window``: every layer is sliding-window attention with that window (page 1), or,
        given ``swa_slots`` (the SWA pool's size), one layer beside a full-attention one;
        ``prefill_aware_swa``: the model keeps each prefill's KV (``swa_evict_floor``), as the
        scheduler marks it for such models; ``release_prefill_window``: a hybrid's decoding request
        gives back its prefill's window lock once past the window (SGLANG_OPT_RELEASE_PREFILL_SWA)."""
        self.page_size = page_size
        self.host_tier = host_tier
        self.sliding_window = sliding_window
        self.prefill_aware_swa = prefill_aware_swa
        self.hybrid = swa_slots is not None
        self.release_prefill_window = release_prefill_window
        if sliding_window is None:
            self.pool, self.allocator = small_pools(page_size, kv_slots, kv_pool=host_tier)
        elif self.hybrid:
            assert not host_tier, "a hybrid model's cache runs without a host tier here"
            self.pool, self.allocator = hybrid_swa_pools(page_size, kv_slots, swa_slots)  # type: ignore[arg-type]
            params["sliding_window_size"] = sliding_window
        else:
            assert page_size == 1 and not host_tier, "SGLang's pure-SWA allocator is page 1, without a host tier"
            self.pool, self.allocator = pure_swa_pools(kv_slots)
            params["sliding_window_size"] = sliding_window
        self.cache = make_cache(cache_params(self.pool, self.allocator, page_size, is_eagle, policy, **params))
        self.live: dict[str, Req] = {}
        self._rids = itertools.count()

    # ----- requests -------------------------------------------------------------------------------

    def arrive(
        self, prompt: list[int], chunk: int, extra_key: Any = None, salt: Any = None, priority: int | None = None
    ) -> Req:
        """A new request: match against the tree, lock the match, allocate and fill its first chunk
        (of ``chunk`` tokens: chunked prefill)."""
        req = Req(
            f"r{next(self._rids)}",
            "",
            array("q", prompt),
            SamplingParams(max_new_tokens=64),
            extra_key=extra_key,
            cache_salt=salt,
            priority=priority,
        )
        req.chunk = chunk
        self.tick()
        req.init_next_round_input(self.cache)
        req.loaded_back = 0
        if self.host_tier and req.host_hit_length:  # admission loads the host hit back, or none of it
            req.loaded_back, req.last_node = self.cache.init_load_back(
                InitLoadBackParams(best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req)
            )
            req.prefix_len += req.loaded_back
            req.kv.cache_protected_len = req.prefix_len
        req.lock = self.cache.lock(req.last_node)
        self.live[req.rid] = req
        if self.host_tier:
            self.cache.ready_to_load_host_cache()
        self._extend(req)
        self.done()
        return req

    def tick(self) -> None:
        """Before a scheduler step: the host tier's finished copies are settled."""
        if self.host_tier:
            self.cache.check_hicache_events()

    def done(self) -> None:
        """After a step's results: the backups it queued are submitted."""
        if self.host_tier:
            self.cache.flush_pending_backups()

    def prefilling(self, req: Req) -> bool:
        return req.extend_end < len(req.full_untruncated_fill_ids)

    def step(self, req: Req, next_token: int) -> None:
        """One scheduler step of ``req``: its next prefill chunk (after checkpointing the last one,
        as chunked prefill does), or one decoded token."""
        self.tick()
        if self.prefilling(req):
            checkpoint_kv_cache(req, self.cache)
            req.init_next_round_input()  # a chunked request continues in its own row
            self._extend(req)
        else:
            self._decode(req, next_token)
        self.done()

    def finish(self, req: Req) -> None:
        req.finished_reason = FINISH_LENGTH(len(req.output_ids))
        self._release(req, checkpoint=True)

    def abort(self, req: Req) -> None:
        req.finished_reason = FINISH_ABORT("aborted by the test")
        self._release(req, checkpoint=False)

    def flush(self) -> None:
        """SGLang's /flush_cache on an idle server: the tree, the rows and the KV pool start over."""
        assert not self.live, "SGLang flushes only an idle server"
        self.cache.reset()
        self.pool.clear()
        self.allocator.clear()

    def evict(self, num_tokens: int) -> int:
        return self.cache.evict(EvictParams(num_tokens=num_tokens)).num_tokens_evicted

    def row(self, req: Req) -> list[int]:
        """The KV slots of ``req``'s tokens, as its row holds them."""
        return self.pool.req_to_token[req.kv.req_pool_idx, : req.kv.kv_allocated_len].tolist()

    def kv_tokens(self, req: Req) -> list[int]:
        """The token each of ``req``'s KV slots holds the KV of (with a host tier: what the
        forward would read, device KV written at prefill or loaded back from the host)."""
        k_buffer = self.allocator.get_kvcache().k_buffer
        slots = self.pool.req_to_token[req.kv.req_pool_idx, : req.kv.kv_allocated_len].to(torch.int64)
        held = [k_buffer[layer][slots, 0, 0].to(torch.int64).tolist() for layer in range(len(k_buffer))]
        assert all(layer == held[0] for layer in held), "the layers of one token's KV disagree"
        return held[0]

    def _compute_kv(self, slots: torch.Tensor, tokens: Any) -> None:
        """The forward's KV writes: each slot's K and V, in every layer, say which token it is."""
        if not self.host_tier:
            return
        kv_pool = self.allocator.get_kvcache()
        values = torch.tensor(list(tokens), dtype=torch.float32).view(-1, 1, 1)
        slots = slots.to(torch.int64)
        for buffers in (kv_pool.k_buffer, kv_pool.v_buffer):
            for layer in buffers:
                layer[slots] = values

    # ----- allocation, as SGLang's alloc_for_extend / alloc_for_decode do it for a batch of one --

    def _extend(self, req: Req) -> None:
        prefix_len = req.prefix_len
        req.extend_end = min(prefix_len + req.chunk, len(req.full_untruncated_fill_ids))
        if req.kv.holds_kv:
            prefix = self.pool.req_to_token[req.kv.req_pool_idx, :prefix_len].to(torch.int64)
        else:
            prefix = self.cache.prefix_device_indices(req) if prefix_len else torch.empty(0, dtype=torch.int64)
            self.pool.alloc([req])
        extend = req.extend_end - prefix_len
        if self.page_size == 1:
            slots = alloc_token_slots(self.cache, extend)
        else:
            last_loc = prefix[-1:] if len(prefix) else torch.full((1,), -1, dtype=torch.int64)
            prefix_lens = torch.tensor([prefix_len], dtype=torch.int64)
            seq_lens = torch.tensor([req.extend_end], dtype=torch.int64)
            slots = alloc_paged_token_slots_extend(
                self.cache, prefix_lens, prefix_lens, seq_lens, seq_lens, last_loc, extend
            )
        row = req.kv.req_pool_idx
        self.pool.write((row, slice(0, prefix_len)), prefix)
        self.pool.write((row, slice(prefix_len, req.extend_end)), slots)
        self._compute_kv(slots, req.full_untruncated_fill_ids[prefix_len : req.extend_end])
        req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end
        if self.prefill_aware_swa:
            req.kv.swa_evict_floor = req.extend_end

    def _decode(self, req: Req, token: int) -> None:
        if self.sliding_window is not None:  # ScheduleBatch.maybe_evict_swa, every step
            self.cache.evict_sliding_windows(req, req.seqlen - 1)
            if self.release_prefill_window and req.decode_batch_idx >= self.cache.swa_retain_window:
                self.cache.release_swa_prefix_lock(req)
        req.decode_batch_idx += 1
        seq_len = req.kv.kv_allocated_len
        row = req.kv.req_pool_idx
        if self.page_size == 1:
            slot = alloc_token_slots(self.cache, 1)
        else:
            last_loc = self.pool.req_to_token[[row], seq_len - 1].to(torch.int64)
            seq_lens = torch.tensor([seq_len + 1], dtype=torch.int64)
            slot = alloc_paged_token_slots_decode(self.cache, seq_lens, seq_lens, last_loc)
        self.pool.write((row, seq_len), slot.to(torch.int32))
        self._compute_kv(slot, [token])
        req.output_ids.append(token)
        req.kv.kv_allocated_len += 1
        req.kv.kv_committed_len += 1

    def _release(self, req: Req, checkpoint: bool) -> None:
        self.tick()
        release_kv_cache(req, self.cache, checkpoint=checkpoint)
        del self.live[req.rid]
        self.done()
