"""radix-core's tree against SGLang's caches, each called directly (no scheduler around it).

Per request, on each cache, timed: match the prompt and obtain the matched KV indices as one tensor
(``path_device_indices`` for SGLang's caches, ``.indices`` for radix-core's, joined on first use),
insert prompt + output with their KV indices (1-D int64 tensors), then, under a capacity, evict
until at most the capacity is cached, each eviction freeing through the same counting allocator
(inside the clock). gc on, torch on 1 thread; one untimed replay each first (a process's first
touch of fresh memory lands on nobody's clock); then rounds in rotating order, each cache fresh.
Every cache must give every request the same prefix length (else the run fails). Ratios are
medians of per-round ratios against the set's baseline. Each filled cache's gc-tracked objects and
what they add to a full collection are measured after the last round.

``--set`` picks the caches and the workloads:

anchor (the default): SGLang 0.5.23's default serving cache (``create_tree_cache()`` without flags:
  UnifiedRadixCache on its Rust TreeCore, the baseline), SGLang's RadixCache, ``radix_core.RadixCache``
  native (radix-native's tree) and pure, native on its Python tree (``tree="python"``), and the
  device path (radix-native's tree with the indices in a device arena, as
  ``RADIX_CORE_DEVICE_TREE=native`` keeps a GPU's, here on CPU tensors). Workloads: the Mooncake
  trace (first ``--requests``) and multi-turn-100k; cells EAGLE off and on x capacity unbounded,
  1M, 200k; LRU. Each cell also times a memory floor: per request only the memory work any exact
  cache does (compare the matched tokens, copy the matched KV indices out and the new ones in), the
  most any cache could beat SGLang's default by on this machine (``speedup_bound``); each cache's
  and the floor's p99 over p50 per request.
eagle: EAGLE keys, no eviction: SGLang's RadixCache (the baseline), the same with the adapter's
  native ``RadixKey.match_at`` (RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH=1), radix-core pure and
  native; workloads shared-system-prompt (4 system prompts of 2k tokens), multi-turn-100k (4 chats
  growing by 0.8k-3.2k tokens a turn to 100k), no-reuse (random 1k-4k prompts).
device-path: what a GPU server's scheduler CPU pays: the indices are tensors on torch's meta device
  (shapes, no data: a copy is a dispatch that moves nothing, as a GPU copy is a launch); radix-core
  with Python nodes (its default for device values, the baseline) against the device path, on the
  trace, the anchor's cells; the same evictions required too; target: the device path's filled
  cache holds at most 1,000 gc-tracked objects.

    python benchmarks/benchmark_direct.py [--set anchor|eagle|device-path] [--requests N] [--rounds R]
                                          [--check] [--json FILE] [--plot FILE.png]
"""

from __future__ import annotations

import functools
import random
import statistics
import sys
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from radix_testing import sglang_cpu_shim  # test-only shim: SGLang imports on CPU

sglang_cpu_shim.install()

import harness  # noqa: E402
import torch  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache as SGLangRadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey as SGLangRadixKey  # noqa: E402
from sglang.srt.mem_cache.registry import create_tree_cache  # noqa: E402

import radix_core  # noqa: E402
import radix_sglang_adapter  # noqa: E402
from radix_core.key import common_prefix_length  # noqa: E402
from radix_testing import scheduler_harness as sh  # noqa: E402
from radix_testing.backends import device_path, python_reference_only  # noqa: E402

CAPACITIES = {"unbounded": None, "1M": 1_000_000, "200k": 200_000}
VOCAB = 152_064
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
    def __init__(self, cache: radix_core.RadixCache, expect: str | None = None):
        self.cache, self.expect = cache, expect

    def check(self) -> None:
        """After a replay (values decide a cache's tree): the tree this cache was meant to run."""
        if self.expect is not None and self.cache.tree_kind != self.expect:
            raise RuntimeError(f"expected radix-core's {self.expect} tree, got its {self.cache.tree_kind} tree")

    def match(self, prompt: array) -> int:
        return len(self.cache.match_prefix(radix_core.RadixKey(prompt)).indices)

    def insert(self, full: array, kv: torch.Tensor) -> None:
        self.cache.insert(radix_core.RadixKey(full), kv)

    def evict_to(self, capacity: int) -> None:
        excess = self.cache.evictable_size() + self.cache.protected_size() - capacity
        if excess > 0:
            self.cache.evict(excess)


def sglang_default(eagle: bool, allocator: CountingAllocator) -> SGLangTree:
    cache = create_tree_cache(sh.build_context(SERVER_ARGS, sh.cache_params(None, allocator, 1, eagle, "lru")))
    core = type(getattr(cache, "tree_core", None)).__name__
    assert core.startswith("Rust"), f"SGLang's default cache runs {core}, not its Rust TreeCore"
    return SGLangTree(cache)


def sglang_radix(eagle: bool, allocator: CountingAllocator) -> SGLangTree:
    return SGLangTree(SGLangRadixCache(sh.cache_params(None, allocator, 1, eagle, "lru")))


def radix_core_tree(
    eagle: bool, allocator: CountingAllocator, tree: str | None = None, expect: str | None = None
) -> RadixCoreTree:
    cache = radix_core.RadixCache(is_eagle=eagle, eviction_policy="lru", on_evict=allocator.free, tree=tree)
    return RadixCoreTree(cache, expect)


def radix_core_device_path(eagle: bool, allocator: CountingAllocator) -> RadixCoreTree:
    with device_path():
        return radix_core_tree(eagle, allocator, expect="native")


@contextmanager
def adapter_match_at() -> Iterator[None]:
    radix_sglang_adapter.activate(accelerate_match=True)
    try:
        yield
    finally:
        radix_sglang_adapter.deactivate()


# A cache: how to build it on a counting allocator, and what the whole replay runs under.
Cache = tuple[Callable[[bool, CountingAllocator], Any], Callable[[], Any]]
PURE: Cache = (radix_core_tree, python_reference_only)
NATIVE: Cache = (radix_core_tree, nullcontext)
PYTHON_NODES = "Python nodes (the default)"
DEVICE_PATH = "device path (RADIX_CORE_DEVICE_TREE=native)"


# ----- the workloads ----------------------------------------------------------------------------


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def arrays(requests: list[tuple[list[int], list[int]]]) -> list[Request]:
    return [(array("q", p), array("q", f), kv) for p, f, kv in harness.with_kv_slots(requests)]


def shared_system_prompt(rng: random.Random) -> list[Request]:
    systems = [tokens(rng, 2048) for _ in range(4)]
    return arrays(
        [
            (rng.choice(systems) + tokens(rng, rng.randrange(200, 800)), tokens(rng, rng.randrange(100, 300)))
            for _ in range(300)
        ]
    )


def multi_turn_100k(rng: random.Random) -> list[Request]:
    histories: list[list[int]] = [tokens(rng, 1024) for _ in range(4)]
    requests = []
    while any(len(h) < 100_000 for h in histories):
        for chat, history in enumerate(histories):
            if len(history) >= 100_000:
                continue
            prompt = history + tokens(rng, rng.randrange(500, 2000))
            answer = tokens(rng, rng.randrange(300, 1200))
            requests.append((prompt, answer))
            histories[chat] = prompt + answer
    return arrays(requests)


def no_reuse(rng: random.Random) -> list[Request]:
    return arrays([(tokens(rng, rng.randrange(1000, 4000)), tokens(rng, rng.randrange(50, 300))) for _ in range(300)])


def trace(args: Any) -> list[Request]:
    return [(array("q", p), array("q", f), kv) for p, f, kv in harness.with_kv_slots(trace_requests(args))]


def trace_requests(args: Any) -> list[tuple[list[int], list[int]]]:
    return harness.trace_requests(args.trace, args.requests)


def trace_on_meta(args: Any) -> list[Request]:
    return [(prompt, full, kv.to("meta")) for prompt, full, kv in trace(args)]


def seeded(make: Callable[[random.Random], list[Request]]) -> Callable[[Any], list[Request]]:
    return lambda args: make(random.Random(args.seed))


@dataclass
class Set:
    """What one question's run replays: the caches (the first is the baseline), the workloads, the
    cells (EAGLE, capacity), whether the memory floor is timed, and the targets."""

    caches: dict[str, Cache]
    workloads: dict[str, Callable[[Any], list[Request]]]
    cells: list[tuple[bool, str]]
    floor: bool
    # workload (or None: every one) -> cache -> minimum speedup over the baseline, in every cell
    targets: dict[str | None, dict[str, float]]
    title: str
    same_evictions: bool = False
    gc_objects_target: tuple[str, int] | None = None

    @property
    def baseline(self) -> str:
        return next(iter(self.caches))


EVERY_CELL = [(eagle, capacity) for eagle in (False, True) for capacity in CAPACITIES]
SETS = {
    "anchor": Set(
        caches={
            "SGLang default": (sglang_default, nullcontext),
            "SGLang RadixCache": (sglang_radix, nullcontext),
            "radix-core native": NATIVE,
            "radix-core native, Python tree": (functools.partial(radix_core_tree, tree="python"), nullcontext),
            "radix-core native, device path": (radix_core_device_path, nullcontext),
            "radix-core pure": PURE,
        },
        workloads={"trace": trace, "multi-turn-100k": seeded(multi_turn_100k)},
        cells=EVERY_CELL,
        floor=True,
        targets={None: {"radix-core native": 5.0, "radix-core pure": 1.5}},
        title="Prefix tree per request vs SGLang 0.5.23's default cache (Rust TreeCore), CPU",
    ),
    "eagle": Set(
        caches={
            "SGLang RadixCache": (sglang_radix, nullcontext),
            "SGLang + adapter match_at": (sglang_radix, adapter_match_at),
            "radix-core pure": PURE,
            "radix-core native": NATIVE,
        },
        workloads={
            "shared-system-prompt": seeded(shared_system_prompt),
            "multi-turn-100k": seeded(multi_turn_100k),
            "no-reuse": seeded(no_reuse),
        },
        cells=[(True, "unbounded")],
        floor=False,
        targets={
            "shared-system-prompt": {"radix-core pure": 1.0},
            "multi-turn-100k": {"radix-core pure": 1.0, "radix-core native": 5.0},
            "no-reuse": {"radix-core pure": 1.0},
        },
        title="EAGLE prefix cache per request: radix-core vs SGLang 0.5.23 RadixCache (CPU)",
    ),
    "device-path": Set(
        caches={
            PYTHON_NODES: (functools.partial(radix_core_tree, expect="python"), nullcontext),
            DEVICE_PATH: (radix_core_device_path, nullcontext),
        },
        workloads={"trace": trace_on_meta},
        cells=EVERY_CELL,
        floor=False,
        targets={},
        title="radix-core's device path vs Python nodes, indices on torch's meta device",
        same_evictions=True,
        gc_objects_target=(DEVICE_PATH, 1_000),
    ),
}
SERVER_ARGS: Any = None  # SGLang's process-wide config, published by main()


# ----- one replay -------------------------------------------------------------------------------


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


def replay(cache: Cache, stream: list[Request], eagle: bool, capacity: int | None) -> harness.Replay:
    """One fresh cache through the stream: seconds per request, prefix lengths and slots freed."""
    build, around = cache
    with around():
        allocator = CountingAllocator(1 << 40, torch.float16, "cpu", None, False)
        tree = build(eagle, allocator)
        seconds, matched = timed_requests(tree, stream, capacity)
    if isinstance(tree, RadixCoreTree):
        tree.check()
    return harness.Replay(
        {"seconds": sum(seconds) / len(seconds)},
        matched,
        [tree],
        {"freed": allocator.freed, "p99_over_p50": harness.tail_ratio(seconds)},
    )


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


# ----- a cell -----------------------------------------------------------------------------------


def measure(chosen: Set, workload: str, stream: list[Request], rounds: int) -> list[dict]:
    for name in chosen.caches:  # untimed: a process's first touch of fresh memory, in each mode
        for eagle in sorted({eagle for eagle, _ in chosen.cells}):
            replay(chosen.caches[name], stream, eagle, None).held.clear()
    cells = []
    for eagle, capacity_name in chosen.cells:
        cells.append(measure_cell(chosen, workload, stream, rounds, eagle, capacity_name))
        print_cell(cells[-1])
    return cells


def measure_cell(chosen: Set, workload: str, stream: list[Request], rounds: int, eagle: bool, capacity_name: str):
    """One cell: every cache in turn, rotating, each round (then the memory floor, if timed)."""
    names, baseline, capacity = list(chosen.caches), chosen.baseline, CAPACITIES[capacity_name]
    floor: list[list[float]] = []

    def time_floor(runs: dict[str, harness.Rounds]) -> None:
        floor.append(memory_floor(stream, runs[baseline].answers, eagle, capacity))

    runs = harness.interleave(
        names,
        lambda name: replay(chosen.caches[name], stream, eagle, capacity),
        rounds,
        after_round=time_floor if chosen.floor else None,
    )
    matched = runs[baseline].answers
    freed = {name: run.detail["freed"] for name, run in runs.items()}
    cell = {
        "workload": workload,
        "eagle": eagle,
        "capacity": capacity_name,
        "requests": len(stream),
        "tokens": sum(len(full) for _, full, _ in stream),
        "same_prefix_lengths": harness.same_answers(runs, baseline),
        "same_evictions": len(set(freed.values())) == 1,
        "freed": freed,
        "hit_rate": sum(matched) / max(sum(max(len(prompt) - eagle, 0) for prompt, _, _ in stream), 1),
        "implementations": {
            name: {**harness.timing(runs, name, baseline), "p99_over_p50": run.detail["p99_over_p50"], **run.footprint}
            for name, run in runs.items()
        },
    }
    if floor:
        per_round = [sum(seconds) / len(seconds) for seconds in floor]
        cell["memory_floor"] = {
            "us_per_request": statistics.median(per_round) * 1e6,
            "speedup_bound": harness.ratios(runs[baseline].clocks["seconds"], per_round)["speedup"],
            "p99_over_p50": harness.tail_ratio(floor[-1]),
        }
    return cell


def cell_name(cell: dict) -> str:
    return f"{cell['workload']}, {'EAGLE' if cell['eagle'] else 'plain'}, {cell['capacity']}"


def print_cell(cell: dict) -> None:
    print(f"\n{cell_name(cell)}: hit rate {cell['hit_rate']:.1%}", flush=True)
    for name, v in cell["implementations"].items():
        gc_cost = f"{v['gc_objects']:>9,} gc objects, {v['gc_full_ms']:+.1f} ms a full collection"
        print(f"  {name:<44} {harness.timing_text(v)}  p99/p50 {v['p99_over_p50']:4.1f}  {gc_cost}", flush=True)
    if "memory_floor" in cell:
        floor = cell["memory_floor"]
        print(
            f"  {'memory floor':<44} {floor['us_per_request']:>8.1f} us/request {floor['speedup_bound']:>6.2f}x "
            f"{'':>11}  p99/p50 {floor['p99_over_p50']:4.1f}",
            flush=True,
        )


def verdicts(chosen: Set, cells: list[dict]) -> harness.Verdicts:
    found = []
    for cell in cells:
        where = cell_name(cell)
        found.append((f"{where}: same prefix length for every request", cell["same_prefix_lengths"]))
        if chosen.same_evictions:
            found.append((f"{where}: the same evictions from every cache", cell["same_evictions"]))
        targets = chosen.targets.get(None, {}) | chosen.targets.get(cell["workload"], {})
        for name, minimum in targets.items():
            got = cell["implementations"][name]["speedup"]
            text = f"{where}: {name} {got:.2f}x vs {chosen.baseline} (target >= {minimum}x)"
            found.append((text, got >= minimum))
        if chosen.gc_objects_target is not None:
            name, most = chosen.gc_objects_target
            objects = cell["implementations"][name]["gc_objects"]
            found.append((f"{where}: {name} {objects:,} gc objects (target <= {most:,})", objects <= most))
    return found


def plot(chosen: Set, cells: list[dict], path: str) -> None:
    plt = harness.pyplot()
    names = list(chosen.caches)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    labels = [cell_name(cell).replace("multi-turn-100k", "multi-turn").replace(", ", "\n", 1) for cell in cells]
    width = harness.speedup_bars(ax, cells, names, labels, label_size=6, tick_size=7)
    left = [x - width / 2 for x in range(len(cells))]
    right = [x + len(names) * width for x in left]
    if all("memory_floor" in cell for cell in cells):
        floors = [cell["memory_floor"]["us_per_request"] for cell in cells]
        ax.hlines(floors, left, right, colors="black", linestyles="dashed", label="memory floor")
    native_target = chosen.targets.get(None, {}).get("radix-core native")
    if native_target:
        goals = [cell["implementations"][chosen.baseline]["us_per_request"] / native_target for cell in cells]
        label = f"{chosen.baseline} / {native_target:g}"
        ax.hlines(goals, left, right, colors="red", linestyles="dotted", label=label)
    ax.set_ylabel("µs per request (match + indices + insert + evict)")
    ax.set_yscale("log")
    ax.set_title(chosen.title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = harness.arguments(__doc__, plot=True)
    parser.add_argument("--set", choices=list(SETS), default="anchor", help="which caches and workloads")
    parser.add_argument("--workload", action="append", help="only this workload of the set (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated workloads")
    args = parser.parse_args()
    chosen = SETS[args.set]
    if not harness.native_in_use():
        return 1
    global SERVER_ARGS
    cells = []
    with sh.published_server_args() as SERVER_ARGS:
        for workload in args.workload or list(chosen.workloads):
            stream = chosen.workloads[workload](args)
            tokens_in = sum(len(full) for _, full, _ in stream)
            print(f"\n== {args.set}, {workload}: {len(stream)} requests, {tokens_in:,} tokens inserted", flush=True)
            with harness.frozen_heap():
                cells += measure(chosen, workload, stream, args.rounds)
    print()
    exit_status = harness.report(verdicts(chosen, cells), {"set": args.set, "cells": cells}, args.json, args.check)
    if args.plot:
        plot(chosen, cells, args.plot)
    return exit_status


if __name__ == "__main__":
    sys.exit(main())
