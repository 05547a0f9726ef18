"""SGLang's HiCache TreeCores against radix-core's, through the TreeCore interface.

With ``--enable-hierarchical-cache`` SGLang's cache is UnifiedRadixCache, a Python layer over a
TreeCore. This replays a Mooncake-format trace (first ``--requests``) through the calls
UnifiedRadixCache makes on its core, for each TreeCore, HiCache on, page 1:

    match_prefix, inc_lock_ref                       admission
    build_load_back_spec, commit_load_back,          a host hit loaded back to the device, under
      finish_load_back                                 a lock
    begin_insert (+ resume/end), each BackupKV       caching the request; write-through backups
      action committed (build_backup_spec, commit_backup)
    dec_lock_ref                                     release
    evict_device_* / evict_device_leaf (+ backup      device eviction down to --capacity tokens
      and demote under write_back), drive_host_eviction   host eviction down to twice that

The clock (gc on, torch on 1 thread) runs inside those calls only (each core behind
bench-sglang-backend's ``TimedCache``, less its probe's cost per call): not this driver's work
between them (making the requests' slot tensors), not UnifiedRadixCache's layer above the core,
not the cache controller's copies (there are none: host slots are numbers). So it says how the
cores compare, not what the whole cache costs. Cores, each fresh per replay, in
turn every round: SGLang's Python TreeCore, its Rust TreeCore (what SGLang's default uses),
RadixTreeCore on radix-core native and on its Python tree. Every core must give the same device
prefix to every request and load back the same host hits (else the run fails).

    python benchmarks/benchmark_tree_core.py [--requests N] [--rounds R] [--check] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import statistics
import sys
import types
from array import array
from collections import defaultdict
from pathlib import Path
from typing import Any

from radix_testing import sglang_cpu_shim  # test-only shim: SGLang imports on CPU

REPO = Path(__file__).resolve().parents[1]

sglang_cpu_shim.install()

import benchmark_sglang_backend as timing  # noqa: E402  (its TimedCache and timing probe)
import torch  # noqa: E402
from _report import cpu_model, report  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.rust_tree_core.adapter import RustUnifiedTreeCore  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore  # noqa: E402

import radix_core  # noqa: E402
from radix_core.trace import TokenExpander, read_trace  # noqa: E402
from radix_sglang_adapter.backend.tree_core import RadixTreeCore  # noqa: E402
from radix_testing.backends import python_reference_only  # noqa: E402

FULL = ComponentType.FULL
DEFAULT_TRACE = REPO / "benchmarks" / "data" / "mooncake_synthetic_trace.jsonl"
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
        self.core, self.capacity = timing.TimedCache(core), capacity
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


def replay(name: str, requests: list[tuple[array, array]], write_policy: str, capacity: int):
    """Microseconds per request in the core's calls, and each request's (device, host) hit."""
    run = Replay(build(name, write_policy), capacity)
    hits = [run.request(prompt, output) for prompt, output in requests]
    return run.core.cache_seconds() / len(requests) * 1e6, hits


def run_one(name: str, *args: Any):
    if name == "radix pure":
        with python_reference_only():
            return replay(name, *args)
    return replay(name, *args)


def measure(requests: list[tuple[array, array]], rounds: int) -> list[dict]:
    cells = []
    for write_policy, capacity in CELLS:
        times: dict[str, list[float]] = {name: [] for name in CORES}
        answers = {}
        for number in range(rounds + 1):  # round 0 warms up, untimed
            for name in CORES:
                gc.collect()
                spent, answers[name] = run_one(name, requests, write_policy, capacity)
                if number:
                    times[name].append(spent)
        agree = all(hits == answers[BASELINE] for hits in answers.values())
        host_hits = sum(host for _, host in answers[BASELINE])
        cell = {
            "write_policy": write_policy,
            "capacity": capacity,
            "agree": agree,
            "host_hit_tokens": host_hits,
            "us_per_request": {name: statistics.median(spent) for name, spent in times.items()},
            "vs_rust": {
                name: statistics.median(base / mine for base, mine in zip(times[BASELINE], spent))
                for name, spent in times.items()
            },
        }
        print_cell(cell)
        cells.append(cell)
    return cells


def print_cell(cell: dict) -> None:
    print(
        f"\n{cell['write_policy']}, device capacity {cell['capacity']:,} tokens (host twice that); "
        f"{cell['host_hit_tokens']:,} prompt tokens found on the host only (loaded back)"
    )
    for name, micros in cell["us_per_request"].items():
        print(f"  {name:<20} {micros:8.1f} us/request   {cell['vs_rust'][name]:5.2f}x the Rust core's speed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="a Mooncake-format JSONL trace")
    parser.add_argument("--requests", type=int, default=2000, help="replay the first N requests")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit non-zero when the cores disagree")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    torch.set_num_threads(1)
    timing.PROBE_SECONDS = timing.probe_seconds()
    status = radix_core.backend()
    print(f"SGLang {importlib.metadata.version('sglang')}, radix-core {radix_core.__version__} ({status.reason})")
    print(f"{cpu_model()}, torch {torch.__version__}")
    print(f"timing probe: {timing.PROBE_SECONDS * 1e9:.0f} ns per call, left out of the clock")
    if status.active != "native":
        print("radix-native is not in use: the native column would be the pure one", file=sys.stderr)
        return 1
    trace = read_trace(args.trace, args.requests)
    expander = TokenExpander()
    requests = [(array("q", expander.prompt(r)), array("q", expander.output(i, r))) for i, r in enumerate(trace)]
    print(f"{Path(args.trace).name}: first {len(requests)} requests, page 1, LRU, median of {args.rounds} rounds")
    gc.collect()
    gc.freeze()  # import-time objects and the requests: not rescanned by any core's collections
    cells = measure(requests, args.rounds)
    gc.unfreeze()
    print()
    verdicts = [
        (f"{cell['write_policy']} {cell['capacity']:,}: every core gives every request the same hits", cell["agree"])
        for cell in cells
    ]
    return report(verdicts, {"cells": cells}, args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
