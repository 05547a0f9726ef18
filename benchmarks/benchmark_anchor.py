"""The anchor: radix-core's tree against SGLang 0.5.23's default serving cache, on real traffic.

Per request, on each tree directly (no scheduler around it), timed: match the prompt and obtain
the matched KV indices as one tensor (``path_device_indices`` for SGLang's caches), insert prompt +
output with their KV indices (1-D int64 CPU tensors), then evict until at most the capacity is
cached; each eviction frees through the same counting allocator. gc on, torch on 1 thread.

Caches, each fresh per replay, in rotating order every round:
- SGLang default: ``create_tree_cache()`` without flags: UnifiedRadixCache on its Rust TreeCore
- SGLang RadixCache: SGLang's Python radix tree
- radix-core native / pure: ``radix_core.RadixCache`` with and without radix-native (native: its
  default tree, radix-native's; pure: the Python tree)
- radix-core native, Python tree: ``radix_core.RadixCache(tree="python")`` on radix-native's kernels
- radix-core native, device path: radix-native's tree with the KV indices in a device arena, as
  ``RADIX_CORE_DEVICE_TREE=native`` keeps a GPU's (``radix_core.device_values``), here on CPU
  tensors: the arena's copies are memory copies on this CPU, which a GPU would queue instead

Workloads: the first ``--requests`` of the bundled Mooncake synthetic trace, and benchmark_radix_cache's
multi-turn-100k (4 chats growing by 0.8k-3.2k tokens a turn to 100k tokens). Cells: EAGLE off and on x capacity
unbounded, 1M and 200k tokens; LRU. Every cache must give every request the same prefix length
(else the run fails). Ratios are medians of per-round ratios against SGLang's default.

Each cell also times a memory floor: per request only the memory work any exact cache does
(compare the matched tokens, copy the matched KV indices out and the new ones in), to show how much
faster than SGLang's default a cache could be on this machine at all (``speedup_bound``). Each
cache's last replay and the floor also give their p99 over their p50 per request (gc on): where the
floor's own is high, the tail is the requests' spread of sizes, which no cache removes.

    python benchmarks/benchmark_anchor.py [--requests N] [--rounds R] [--check] [--json FILE] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.metadata
import os
import platform
import random
import statistics
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radix_testing import sglang_cpu_shim  # test-only shim: SGLang imports on CPU

REPO = Path(__file__).resolve().parents[1]

sglang_cpu_shim.install()

import torch  # noqa: E402
from _gc import gc_footprint  # noqa: E402
from _plot import speedup_bars  # noqa: E402
from _report import report  # noqa: E402
from benchmark_radix_cache import multi_turn_100k  # noqa: E402  (the project's workload, one definition)
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache as SGLangRadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey as SGLangRadixKey  # noqa: E402
from sglang.srt.mem_cache.registry import create_tree_cache  # noqa: E402

import radix_core  # noqa: E402
from radix_core.key import common_prefix_length  # noqa: E402
from radix_core.trace import TokenExpander, read_trace  # noqa: E402
from radix_testing import scheduler_harness as sh  # noqa: E402
from radix_testing.backends import device_path, python_reference_only  # noqa: E402

DEFAULT_TRACE = REPO / "benchmarks" / "data" / "mooncake_synthetic_trace.jsonl"
BASELINE = "SGLang default"
CAPACITIES = {"unbounded": None, "1M": 1_000_000, "200k": 200_000}
# implementation -> minimum speedup over SGLang's default cache, in every cell
TARGETS = {"radix-core native": 5.0, "radix-core pure": 1.5}

Request = tuple[array, array, torch.Tensor]  # prompt tokens, prompt + output tokens, their KV slots


class CountingAllocator(TokenToKVPoolAllocator):
    """SGLang's token-to-KV allocator as the caches see it; a free only counts the slots (all
    values are made up front), so every cache pays the same small price per free."""

    def clear(self) -> None:
        self.freed = 0

    def available_size(self) -> int:
        return self.size

    def free(self, free_index: torch.Tensor) -> None:
        self.freed += free_index.numel()


class SGLangTree:
    """One of SGLang's caches behind the three calls a request makes."""

    def __init__(self, cache: Any):
        self.cache = cache

    def match(self, prompt: array) -> int:
        cache = self.cache
        result = cache.match_prefix(MatchPrefixParams(key=SGLangRadixKey(prompt)))
        return len(cache.path_device_indices(result.last_device_node))

    def insert(self, full: array, kv: torch.Tensor) -> None:
        self.cache.insert(InsertParams(key=SGLangRadixKey(full), value=kv))

    def evict_to(self, capacity: int) -> None:
        excess = self.cache.evictable_size() + self.cache.protected_size() - capacity
        if excess > 0:
            self.cache.evict(EvictParams(num_tokens=excess))


class RadixCoreTree:
    def __init__(self, cache: radix_core.RadixCache):
        self.cache = cache

    def match(self, prompt: array) -> int:
        return len(self.cache.match_prefix(radix_core.RadixKey(prompt)).indices)

    def insert(self, full: array, kv: torch.Tensor) -> None:
        self.cache.insert(radix_core.RadixKey(full), kv)

    def evict_to(self, capacity: int) -> None:
        excess = self.cache.evictable_size() + self.cache.protected_size() - capacity
        if excess > 0:
            self.cache.evict(excess)


def sglang_default(server_args: Any, eagle: bool, allocator: CountingAllocator) -> SGLangTree:
    cache = create_tree_cache(sh.build_context(server_args, sh.cache_params(None, allocator, 1, eagle, "lru")))
    core = type(getattr(cache, "tree_core", None)).__name__
    assert core.startswith("Rust"), f"SGLang's default cache runs {core}, not its Rust TreeCore"
    return SGLangTree(cache)


def sglang_radix(server_args: Any, eagle: bool, allocator: CountingAllocator) -> SGLangTree:
    return SGLangTree(SGLangRadixCache(sh.cache_params(None, allocator, 1, eagle, "lru")))


def radix_core_tree(
    server_args: Any, eagle: bool, allocator: CountingAllocator, tree: str | None = None
) -> RadixCoreTree:
    cache = radix_core.RadixCache(is_eagle=eagle, eviction_policy="lru", on_evict=allocator.free, tree=tree)
    return RadixCoreTree(cache)


def radix_core_device_path(server_args: Any, eagle: bool, allocator: CountingAllocator) -> RadixCoreTree:
    with device_path():
        return radix_core_tree(server_args, eagle, allocator)


IMPLEMENTATIONS: dict[str, Callable[[Any, bool, CountingAllocator], Any]] = {
    BASELINE: sglang_default,
    "SGLang RadixCache": sglang_radix,
    "radix-core native": radix_core_tree,
    "radix-core native, Python tree": functools.partial(radix_core_tree, tree="python"),
    "radix-core native, device path": radix_core_device_path,
    "radix-core pure": radix_core_tree,
}


def replay(implementation: str, server_args: Any, stream: list[Request], eagle: bool, capacity: int | None):
    """Seconds per request, each request's prefix length, the slots freed by eviction, and the
    filled cache (alone in a list, so that the caller can drop it)."""
    allocator = CountingAllocator(1 << 40, torch.float16, "cpu", None, False)
    tree = IMPLEMENTATIONS[implementation](server_args, eagle, allocator)
    seconds, matched = timed_requests(tree, stream, capacity)
    return seconds, matched, allocator.freed, [tree]


def timed_requests(tree: Any, stream: list[Request], capacity: int | None) -> tuple[list[float], list[int]]:
    """Each request on ``tree``, timed: match, insert, evict to the capacity; seconds and prefix lengths."""
    clock = time.perf_counter
    seconds, matched = [], []
    for prompt, full, kv in stream:
        start = clock()
        found = tree.match(prompt)
        tree.insert(full, kv)
        if capacity is not None:
            tree.evict_to(capacity)
        seconds.append(clock() - start)
        matched.append(found)
    return seconds, matched


def memory_floor(stream: list[Request], matched: list[int], eagle: bool, capacity: int | None) -> list[float]:
    """Seconds per request of memory work that every exact cache does for it, and nothing else.
    The matched tokens are read twice: once in the prompt (by the match) and once in the inserted
    prompt + output (by an insert, which cannot know they repeat the prompt without reading them);
    here the two are compared with each other, so the tree's own copy of them is not read at all.
    The matched units' KV indices are copied out into one fresh tensor and the new units' copied
    in (kept, oldest dropped beyond the capacity). No tree, no key stored, no bookkeeping: every
    cache of int64 tokens and indices that SGLang could call takes longer than this."""
    kept: deque[torch.Tensor] = deque()
    cached = 0
    clock = time.perf_counter
    seconds = []
    for (prompt, full, kv), found in zip(stream, matched):
        units = max(len(full) - eagle, 0)
        start = clock()
        if found:
            raw = found + eagle  # an EAGLE unit is a pair of raw tokens
            if common_prefix_length(prompt, 0, full, 0, raw) != raw:
                raise RuntimeError("a prompt is not the start of its request's tokens")
            kv[:found].clone()
        kept.append(kv[found:units].clone())
        cached += units - found
        while capacity is not None and cached > capacity:
            cached -= kept.popleft().shape[0]
        seconds.append(clock() - start)
    return seconds


def run_one(implementation: str, *args: Any) -> tuple[list[float], list[int], int, list[Any]]:
    if implementation == "radix-core pure":
        with python_reference_only():
            return replay(implementation, *args)
    return replay(implementation, *args)


def measure(workload: str, server_args: Any, stream: list[Request], rounds: int) -> list[dict]:
    names = list(IMPLEMENTATIONS)
    # One untimed replay each first, in both modes: a process's first touch of fresh memory (page
    # faults, which cost several times the copies themselves here) would otherwise land on
    # whichever cache runs first, and a serving process pays it once at start.
    for name in names:
        gc.collect()
        for eagle in (False, True):
            run_one(name, server_args, stream, eagle, None)
    cells = []
    for eagle in (False, True):
        for capacity_name, capacity in CAPACITIES.items():
            per_round: dict[str, list[float]] = {name: [] for name in names}
            matched_by: dict[str, list[int]] = {}
            freed_by: dict[str, int] = {}
            footprint: dict[str, dict[str, float]] = {}  # after the last round's replay
            tails: dict[str, float] = {}  # p99 / p50 of the last round's requests
            floor: list[float] = []
            for r in range(rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    gc.collect()
                    seconds, matched, freed, held = run_one(name, server_args, stream, eagle, capacity)
                    per_round[name].append(sum(seconds) / len(seconds))
                    matched_by[name], freed_by[name] = matched, freed
                    if r == rounds - 1:
                        footprint[name] = gc_footprint(held)
                        tails[name] = tail_ratio(seconds)
                    held.clear()
                gc.collect()
                seconds = memory_floor(stream, matched_by[BASELINE], eagle, capacity)
                floor.append(sum(seconds) / len(seconds))
            tails["memory floor"] = tail_ratio(seconds)
            prompt_units = sum(max(len(prompt) - eagle, 0) for prompt, _, _ in stream)
            cell = {
                "workload": workload,
                "eagle": eagle,
                "capacity": capacity_name,
                "same_prefix_lengths": all(m == matched_by[BASELINE] for m in matched_by.values()),
                "freed": freed_by,
                "hit_rate": sum(matched_by[BASELINE]) / prompt_units,
                "implementations": {},
                "memory_floor": {
                    "us_per_request": statistics.median(floor) * 1e6,
                    "speedup_bound": statistics.median(b / f for b, f in zip(per_round[BASELINE], floor)),
                    "p99_over_p50": tails["memory floor"],
                },
            }
            for name, times in per_round.items():
                ratios = [b / t for b, t in zip(per_round[BASELINE], times)]
                cell["implementations"][name] = {
                    "us_per_request": statistics.median(times) * 1e6,
                    "speedup": statistics.median(ratios),
                    "speedup_min": min(ratios),
                    "speedup_max": max(ratios),
                    "p99_over_p50": tails[name],
                    **footprint[name],
                }
            cells.append(cell)
            print_cell(cell)
    return cells


def tail_ratio(seconds: list[float]) -> float:
    """A replay's p99 over its p50 per request: how far its slow requests are from its typical one.
    The floor's own says how much of that is the requests' spread of sizes, not the cache."""
    cuts = statistics.quantiles(seconds, n=100)
    return cuts[98] / cuts[49]


def cell_name(cell: dict) -> str:
    return f"{cell['workload']}, {'EAGLE' if cell['eagle'] else 'plain'}, {cell['capacity']}"


def print_cell(cell: dict) -> None:
    print(f"\n{cell_name(cell)}: hit rate {cell['hit_rate']:.1%}", flush=True)
    for name, v in cell["implementations"].items():
        spread = f"[{v['speedup_min']:.2f}-{v['speedup_max']:.2f}]"
        gc_cost = f"{v['gc_objects']:>9,} gc objects, {v['gc_full_ms']:+.1f} ms a full collection"
        tail = f"p99/p50 {v['p99_over_p50']:4.1f}"
        print(
            f"  {name:<30} {v['us_per_request']:>8.1f} us/request {v['speedup']:>6.2f}x {spread}  {tail}  {gc_cost}",
            flush=True,
        )
    floor = cell["memory_floor"]
    print(
        f"  {'memory floor':<30} {floor['us_per_request']:>8.1f} us/request {floor['speedup_bound']:>6.2f}x "
        f"{'':>13}  p99/p50 {floor['p99_over_p50']:4.1f}",
        flush=True,
    )


def verdicts(cells: list[dict]) -> list[tuple[str, bool]]:
    found = []
    for cell in cells:
        where = cell_name(cell)
        found.append((f"{where}: same prefix length for every request", cell["same_prefix_lengths"]))
        for name, minimum in TARGETS.items():
            got = cell["implementations"][name]["speedup"]
            found.append((f"{where}: {name} {got:.2f}x vs {BASELINE} (target >= {minimum}x)", got >= minimum))
    return found


def trace_stream(path: str, requests: int) -> list[Request]:
    expander = TokenExpander()
    stream, slot = [], 0
    for index, request in enumerate(read_trace(path, requests)):
        prompt = expander.prompt(request)
        full = prompt + expander.output(index, request)
        stream.append((prompt, full, torch.arange(slot, slot + len(full), dtype=torch.int64)))
        slot += len(full)
    return stream


def plot(cells: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(IMPLEMENTATIONS)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    labels = [cell_name(cell).replace("multi-turn-100k", "multi-turn").replace(", ", "\n", 1) for cell in cells]
    width = speedup_bars(ax, cells, names, labels, label_size=6, tick_size=7)
    left = [x - width / 2 for x in range(len(cells))]
    right = [x + len(names) * width for x in left]
    floors = [cell["memory_floor"]["us_per_request"] for cell in cells]
    ax.hlines(floors, left, right, colors="black", linestyles="dashed", label="memory floor")
    native_target = TARGETS["radix-core native"]
    goals = [cell["implementations"][BASELINE]["us_per_request"] / native_target for cell in cells]
    ax.hlines(goals, left, right, colors="red", linestyles="dotted", label=f"{BASELINE} / {native_target:g}")
    ax.set_ylabel("µs per request (match + indices + insert + evict)")
    ax.set_yscale("log")
    ax.set_title("Prefix tree per request vs SGLang 0.5.23's default cache (Rust TreeCore), CPU")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="a Mooncake-format JSONL trace")
    parser.add_argument("--requests", type=int, default=2000, help="replay the first N requests of the trace")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="seed of the multi-turn-100k stream")
    parser.add_argument("--workload", choices=("trace", "multi-turn-100k"), action="append")
    parser.add_argument("--check", action="store_true", help="exit non-zero on a mismatch or a missed target")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--plot", metavar="FILE.png")
    args = parser.parse_args()

    torch.set_num_threads(1)
    status = radix_core.backend()
    print(f"SGLang {importlib.metadata.version('sglang')}, radix-core {radix_core.__version__} ({status.reason})")
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    if status.active != "native":
        print("radix-native is not in use: the native column would be the pure one", file=sys.stderr)
        return 1
    workloads = {
        "trace": lambda: trace_stream(args.trace, args.requests),
        "multi-turn-100k": lambda: multi_turn_100k(random.Random(args.seed)),
    }
    cells = []
    with sh.published_server_args() as server_args:
        for workload in args.workload or list(workloads):
            stream = workloads[workload]()
            tokens = sum(len(full) for _, full, _ in stream)
            print(f"\n== {workload}: {len(stream)} requests, {tokens:,} tokens inserted", flush=True)
            # Import-time objects and the stream are frozen, so that a full collection (which any
            # cache may trigger) does not rescan them; the collector is otherwise on.
            gc.collect()
            gc.freeze()
            cells += measure(workload, server_args, stream, args.rounds)
            gc.unfreeze()
    print()
    exit_status = report(verdicts(cells), {"cells": cells}, args.json, args.check)
    if args.plot:
        plot(cells, args.plot)
    return exit_status


if __name__ == "__main__":
    sys.exit(main())
