"""The device path against what a GPU server runs today, on the Mooncake trace.

On a GPU server SGLang's KV indices are device tensors: radix-core's RadixCache then keeps Python
nodes (its default for device values), or, with ``RADIX_CORE_DEVICE_TREE=native``, radix-native's
tree with the indices in a device arena. There is no GPU here, so the indices are tensors on
torch's meta device (shapes, no data): each replay times what the scheduler's CPU pays per
request, the device copies themselves excluded (a GPU queues them, one launch each; on the meta
device a copy is a dispatch that moves nothing).

Per request, timed: match the prompt and take its indices as one tensor, insert prompt + output
with theirs, evict until at most the capacity is cached (gc on, torch on 1 thread, the two caches
in alternating order every round). Also each filled cache's gc-tracked objects and what they add
to a full collection. Cells: EAGLE off and on x capacity unbounded, 1M and 200k tokens; LRU.

    python benchmarks/benchmark_device_path.py [--requests N] [--rounds R] [--check] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from typing import Any

import torch
from _gc import gc_footprint
from _report import cpu_model, report
from benchmark_anchor import CAPACITIES, DEFAULT_TRACE, RadixCoreTree, timed_requests, trace_stream

import radix_core
from radix_testing.backends import device_path

PYTHON_NODES = "Python nodes (the default)"
DEVICE_PATH = "device path (RADIX_CORE_DEVICE_TREE=native)"
GC_OBJECTS_TARGET = 1_000  # a filled cache, whatever its size


def make_cache(name: str, eagle: bool, freed: list[int]) -> RadixCoreTree:
    def on_evict(indices: Any) -> None:
        freed[0] += indices.shape[0]

    if name == DEVICE_PATH:
        with device_path():
            return RadixCoreTree(radix_core.RadixCache(is_eagle=eagle, on_evict=on_evict))
    return RadixCoreTree(radix_core.RadixCache(is_eagle=eagle, on_evict=on_evict))


def replay(name: str, stream: list, eagle: bool, capacity: int | None) -> tuple[float, list[int], int, list[Any]]:
    """Seconds per request, each request's prefix length, the units evicted, the filled cache."""
    freed = [0]
    tree = make_cache(name, eagle, freed)
    seconds, matched = timed_requests(tree, stream, capacity)
    expected = "python" if name == PYTHON_NODES else "native"
    if tree.cache.tree_kind != expected:
        raise RuntimeError(f"{name} ran on the {tree.cache.tree_kind} tree")
    return sum(seconds) / len(seconds), matched, freed[0], [tree]


def measure(stream: list, rounds: int) -> list[dict]:
    names = [PYTHON_NODES, DEVICE_PATH]
    for name in names:  # untimed: a process's first touch of fresh memory
        replay(name, stream, False, None)
    cells = []
    for eagle in (False, True):
        for capacity_name, capacity in CAPACITIES.items():
            seconds: dict[str, list[float]] = {name: [] for name in names}
            matched_by, freed_by, footprint = {}, {}, {}
            for r in range(rounds):
                for name in names[r % 2 :] + names[: r % 2]:
                    gc.collect()
                    per_request, matched_by[name], freed_by[name], held = replay(name, stream, eagle, capacity)
                    seconds[name].append(per_request)
                    if r == rounds - 1:
                        footprint[name] = gc_footprint(held)
                    held.clear()
            ratios = [p / d for p, d in zip(seconds[PYTHON_NODES], seconds[DEVICE_PATH])]
            cell = {
                "eagle": eagle,
                "capacity": capacity_name,
                "same_answers": matched_by[PYTHON_NODES] == matched_by[DEVICE_PATH]
                and freed_by[PYTHON_NODES] == freed_by[DEVICE_PATH],
                "device_path_speedup": statistics.median(ratios),
                "implementations": {
                    name: {"us_per_request": statistics.median(seconds[name]) * 1e6, **footprint[name]}
                    for name in names
                },
            }
            cells.append(cell)
            print(f"\ntrace, {'EAGLE' if eagle else 'plain'}, {capacity_name}", flush=True)
            for name, v in cell["implementations"].items():
                print(
                    f"  {name:<44} {v['us_per_request']:>7.1f} us/request {v['gc_objects']:>9,} gc objects, "
                    f"{v['gc_full_ms']:+.1f} ms a full collection",
                    flush=True,
                )
            spread = f"[{min(ratios):.2f}-{max(ratios):.2f}]"
            print(f"  device path vs Python nodes: {cell['device_path_speedup']:.2f}x {spread}", flush=True)
    return cells


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="a Mooncake-format JSONL trace")
    parser.add_argument("--requests", type=int, default=2000, help="replay the first N requests of the trace")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit non-zero on a mismatch or a missed target")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    torch.set_num_threads(1)
    status = radix_core.backend()
    print(f"radix-core {radix_core.__version__} ({status.reason}), torch {torch.__version__}, {cpu_model()}")
    if status.active != "native":
        print("radix-native is not in use: there is no device path to measure", file=sys.stderr)
        return 1
    stream = [(prompt, full, kv.to("meta")) for prompt, full, kv in trace_stream(args.trace, args.requests)]
    gc.collect()
    gc.freeze()  # the stream and import-time objects: not what a cache adds
    cells = measure(stream, args.rounds)
    gc.unfreeze()
    print()
    verdicts = []
    for cell in cells:
        where = f"trace, {'EAGLE' if cell['eagle'] else 'plain'}, {cell['capacity']}"
        objects = cell["implementations"][DEVICE_PATH]["gc_objects"]
        verdicts.append((f"{where}: the same prefix lengths and evictions on both", cell["same_answers"]))
        verdicts.append(
            (
                f"{where}: device path {objects:,} gc objects (target <= {GC_OBJECTS_TARGET:,})",
                objects <= GC_OBJECTS_TARGET,
            )
        )
    return report(verdicts, {"cells": cells}, args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
