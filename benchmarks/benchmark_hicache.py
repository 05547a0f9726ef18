"""HiCache: radix-core against SGLang's, with the host tier on (``--enable-hierarchical-cache``).

``--layer cache`` (the whole cache on SGLang 0.5.23's scheduler path, benchmark_sglang_backend.py's
replay with HiCache on: a host tier twice the device pool; write_through and write_back x 1M and
200k tokens): SGLang's default is UnifiedRadixCache with its cache controller on SGLang's Rust
TreeCore, ``--radix-cache-backend radix`` RadixCoreHiCache (radix-core's tiered tree driving the
same controller). The scheduler's HiCache calls are added: its poll of the host tier once per
request, a host hit's load-back at admission, the batch's start of the load. The host tier's KV
copies move nothing (on a GPU they are kernels on their own streams, off the scheduler's CPU);
their bookkeeping stays on the clock. The default's calls into its TreeCore are timed too, so each
cell also says what it would cost with a TreeCore costing nothing: the most any core under
UnifiedRadixCache can win. Target: radix native >= 2x SGLang's default, in the cache.

``--layer core`` (the TreeCores under UnifiedRadixCache, which serves radix-core's with HiCache and
speculative decoding or an L3 store): the trace replayed through the calls UnifiedRadixCache makes
on its core, HiCache on, page 1:

    match_prefix, inc_lock_ref                       admission
    build_load_back_spec, commit_load_back,          a host hit loaded back to the device, under
      finish_load_back                                 a lock
    begin_insert (+ resume/end), each BackupKV       caching the request; write-through backups
      action committed (build_backup_spec, commit_backup)
    dec_lock_ref                                     release
    evict_device_* / evict_device_leaf (+ backup      device eviction down to the capacity
      and demote under write_back), drive_host_eviction   host eviction down to twice that

The clock runs inside those calls only (each core behind the scheduler path's ``TimedCache``, less
its probe's cost per call): not this driver's work between them, not UnifiedRadixCache's layer
above the core, not the controller's copies (there are none: host slots are numbers). Cores: SGLang's
Python TreeCore, its Rust TreeCore (the default's), RadixTreeCore on radix-core native and on its
Python tree; one untimed round first.

Both layers: the first ``--requests`` of the Mooncake trace, LRU, gc on, torch on 1 thread, each
variant fresh per replay, rotating every round. Every variant must give every request the same
device prefix and load back the same host hits (else the run fails).

    python benchmarks/benchmark_hicache.py [--layer cache|core] [--requests N] [--rounds R] [--check] [--json FILE]
"""

from __future__ import annotations

import contextlib
import sys
import types
from array import array
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from radix_testing import sglang_server_shims  # test-only: SGLang imports on CPU, and HiCache's host tier runs there

sglang_server_shims.install()

import benchmark_sglang_backend as scheduler  # noqa: E402  (the scheduler path: its replay, TimedCache, probe)
import harness  # noqa: E402
import torch  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore  # noqa: E402

from radix_sglang_adapter.backend.tree_core import RadixTreeCore  # noqa: E402
from radix_testing.backends import python_reference_only  # noqa: E402

FULL = ComponentType.FULL
BASELINE = "SGLang Rust core"
CORES = {
    "SGLang Python core": lambda params, components: UnifiedTreeCore(params, components),
    BASELINE: lambda params, components: RustUnifiedTreeCore(params),
    "radix native": RadixTreeCore,
    "radix pure": RadixTreeCore,
}
CELLS = [(policy, capacity) for policy in ("write_through", "write_back") for capacity in (1_000_000, 200_000)]


def build(name: str, write_policy: str) -> Any:
    params = CacheInitParams(
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        page_size=1,
        disable=False,
        tree_components=(FULL,),
        eviction_policy="lru",
        is_eagle=False,
    )
    owner = types.SimpleNamespace(enable_session_radix_cache=False)
    core = CORES[name](params, {FULL: FullComponent(owner, params)})
    core.set_hicache_enabled()
    core.is_write_back = write_policy == "write_back"
    core.write_through_threshold = 1
    return core


class Replay:
    """One core through one cell: the clock over its calls, its answers, host slots in use."""

    def __init__(self, core: Any, capacity: int):
        self.core, self.capacity = scheduler.TimedCache(core), capacity
        self.next_slot = self.next_host_slot = 0
        self.host_in_use = 0

    def drain(self, result: Any, tracker: dict) -> None:
        """What UnifiedRadixCache does with an eviction step: its frees consumed, its count kept."""
        self.host_in_use -= sum(len(values) for values in result.host_frees.get(FULL, ()))
        for component, count in result.tracker.items():
            tracker[component] += count
        result.device_frees.clear()
        result.host_frees.clear()
        result.cache_actions.clear()

    def back_up(self, node_id: int) -> None:
        core = self.core
        if core.is_backuped(node_id):
            return
        device, _ = core.build_backup_spec(node_id)
        host = torch.arange(self.next_host_slot, self.next_host_slot + len(device), dtype=torch.int64)
        self.next_host_slot += len(device)
        self.host_in_use += len(device)
        core.commit_backup(node_id, host, {})

    def request(self, prompt: array, output: array) -> tuple[int, int]:
        core = self.core
        full = prompt + output
        values = torch.arange(self.next_slot, self.next_slot + len(full), dtype=torch.int64)
        self.next_slot += len(full)
        match = core.match_prefix(MatchPrefixParams(key=RadixKey(prompt, None)))
        if match.host_hit_length:
            self.load_back(match.best_match_node)
        receipt = core.inc_lock_ref(match.last_device_node)
        step = core.begin_insert(InsertParams(key=RadixKey(full, None), value=values))
        actions = list(step.actions)
        while step.result is None:
            step = core.resume_insert()
            actions += step.actions
        actions += core.end_insert()
        for action in actions:
            if type(action).__name__ == "BackupKV":
                for node_id in action.node_ids:
                    self.back_up(node_id)
        core.dec_lock_ref(receipt.node_id, receipt.to_dec_params())
        self.evict()
        return match.device_prefix_len, match.host_hit_length

    def load_back(self, node_id: int) -> None:
        core = self.core
        transfer, _ = core.build_load_back_spec(node_id)
        if not transfer.nodes_to_load:
            return
        lock = core.inc_lock_ref(node_id)
        slots = len(transfer.host_indices)
        device = torch.arange(self.next_slot, self.next_slot + slots, dtype=torch.int64)
        self.next_slot += slots
        core.commit_load_back(node_id, device, transfer, {})
        core.finish_load_back(node_id)
        core.dec_lock_ref(lock.node_id, lock.to_dec_params())

    def evict(self) -> None:
        core, tracker = self.core, defaultdict(int)
        excess = core.full_evictable_size() + core.full_protected_size() - self.capacity
        if excess > 0:
            core.evict_device_start(FULL, excess)
            while True:
                step = core.evict_device_next_node(FULL, tracker)
                self.drain(step, tracker)
                if step.node_id is None:
                    break
                leaf = core.evict_device_leaf(step.node_id, core.is_write_back)
                self.drain(leaf, tracker)
                if leaf.backup_kv is not None:
                    for node_id in leaf.backup_kv.node_ids:
                        self.back_up(node_id)
                    self.drain(core.demote(step.node_id), tracker)
            core.evict_device_end(FULL)
        if self.host_in_use > 2 * self.capacity:
            self.drain(core.drive_host_eviction(FULL, self.host_in_use - 2 * self.capacity), tracker)


def replay(name: str, requests: list[tuple[array, array]], write_policy: str, capacity: int) -> harness.Replay:
    """Seconds per request in the core's calls, and each request's (device, host) hit."""
    run = Replay(build(name, write_policy), capacity)
    if name == "radix pure":
        with python_reference_only():
            hits = [run.request(prompt, output) for prompt, output in requests]
    else:
        hits = [run.request(prompt, output) for prompt, output in requests]
    return harness.Replay({"seconds": run.core.cache_seconds() / len(requests)}, hits)


def measure_cores(requests: list[tuple[array, array]], rounds: int) -> list[dict]:
    cells = []
    for write_policy, capacity in CELLS:

        def one(name: str, write_policy: str = write_policy, capacity: int = capacity) -> harness.Replay:
            return replay(name, requests, write_policy, capacity)

        harness.interleave(list(CORES), one, 1, footprint=False)  # a round first, untimed
        runs = harness.interleave(list(CORES), one, rounds, footprint=False)
        cell = {
            "write_policy": write_policy,
            "capacity": capacity,
            "agree": harness.same_answers(runs, BASELINE),
            "host_hit_tokens": sum(host for _, host in runs[BASELINE].answers),
            "implementations": {name: harness.timing(runs, name, BASELINE) for name in CORES},
        }
        print(
            f"\n{cell['write_policy']}, device capacity {cell['capacity']:,} tokens (host twice that); "
            f"{cell['host_hit_tokens']:,} prompt tokens found on the host only (loaded back)"
        )
        for name, v in cell["implementations"].items():
            print(f"  {name:<20} {harness.timing_text(v)} (the Rust core's time / this one's)", flush=True)
        cells.append(cell)
    return cells


# ----- the whole cache on the scheduler path ----------------------------------------------------

HICACHE_IMPLEMENTATIONS = [scheduler.BASELINE, "radix native", "radix pure"]  # SGLang's RadixCache has no host tier
HICACHE_CELLS = [(policy, capacity) for policy in ("write_through", "write_back") for capacity in ("1M", "200k")]


def host_copies_move_nothing() -> None:
    """On a GPU server the host tier's KV copies are kernels on their own streams, off the
    scheduler's CPU; on this CPU they would be synchronous copies (or absent kernels), the same for
    every cache. The replays keep the caches' bookkeeping around them and move no KV."""
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    MHATokenToKVPoolHost.backup_from_device_all_layer = lambda self, *args, **kwargs: None
    MHATokenToKVPoolHost.load_to_device_per_layer = lambda self, *args, **kwargs: None


@contextlib.contextmanager
def hicache_server_args(write_policy: str) -> Iterator[Any]:
    """SGLang's process-wide config with HiCache on, as on a GPU server: copies by kernel (the io
    backend SGLang defaults to), layer_first host layout."""
    with scheduler.sh.published_server_args(
        enable_hierarchical_cache=True,
        hicache_ratio=scheduler.HOST_RATIO,
        hicache_write_policy=write_policy,
        hicache_io_backend="kernel",
        hicache_mem_layout="layer_first",
    ) as server_args:
        yield server_args


def measure_caches(requests: list[tuple[array, array]], rounds: int, chunk: int) -> list[dict]:
    host_copies_move_nothing()
    cells = []
    for number, (write_policy, capacity_name) in enumerate(HICACHE_CELLS):
        with hicache_server_args(write_policy) as server_args:
            if not number:
                scheduler.warm_up(server_args, requests, chunk, HICACHE_IMPLEMENTATIONS, hicache=True)
            cell = (False, capacity_name, write_policy)
            cells.append(scheduler.measure(server_args, requests, rounds, chunk, HICACHE_IMPLEMENTATIONS, *cell))
    return cells


def main() -> int:
    parser = scheduler.arguments(__doc__)
    parser.add_argument("--layer", choices=("cache", "core"), default="cache", help="whole caches or TreeCores")
    args = parser.parse_args()
    requests = scheduler.start(args)
    if requests is None:
        return 1
    with harness.frozen_heap():
        if args.layer == "cache":
            cells = measure_caches(requests, args.rounds, args.chunk)
        else:
            cells = measure_cores(requests, args.rounds)
    print()
    if args.layer == "cache":
        verdicts = scheduler.verdicts(cells)
    else:
        verdicts = [
            (
                f"{cell['write_policy']} {cell['capacity']:,}: every core gives every request the same hits",
                cell["agree"],
            )
            for cell in cells
        ]
    return harness.report(verdicts, {"layer": args.layer, "cells": cells}, args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
