"""The bundled Mooncake trace replayed through RadixCache, radix-core pure and native side by side.

What ``python -m radix_core replay`` does (match each prompt, insert prompt + output, evict to the
capacity; LRU), over a capacity sweep, once with the Python reference and once with radix-native,
alternating which goes first. ``--check``: both must give every request the same prefix length,
hence the same hit rate, and evict as much, else the exit status is 1; the CPU columns (median and
p99 of the time per request: match + insert + evict, token ids as values, gc on) are only reported.
The last line says whether they agreed.

    python benchmarks/benchmark_replay.py [--check] [--requests N] [--capacity unbounded,1M,200k]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from harness import DEFAULT_TRACE, cpu_model

import radix_core
from radix_core.__main__ import capacity_list
from radix_core.replay import ReplayResult, replay
from radix_core.trace import TokenExpander, read_trace
from radix_testing.backends import python_reference_only


def replay_on(backend: str, *args: object) -> ReplayResult:
    if backend == "python":
        with python_reference_only():
            return replay(*args)  # type: ignore[arg-type]
    return replay(*args)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 unless both backends agree on every request")
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--requests", type=int, help="only the first N requests")
    parser.add_argument("--capacity", type=capacity_list, default=capacity_list("unbounded,4M,1M,200k"))
    args = parser.parse_args()

    status = radix_core.backend()
    print(f"radix-core {radix_core.__version__}, backend: {status.active} ({status.reason})")
    print(f"{cpu_model()}, Python {platform.python_version()}")
    if status.active != "native":
        print("the native backend is not in use: nothing to compare", file=sys.stderr)
        return 1
    requests = read_trace(args.trace, args.requests)
    expander = TokenExpander()
    for request in requests:  # expand every block once, outside any clock
        expander.prompt(request)
    prompt_tokens = sum(r.input_length for r in requests)
    name = Path(args.trace).name
    print(f"{name}: {len(requests)} requests, {prompt_tokens:,} prompt tokens, LRU, page 1, plain, gc on")
    print("| capacity | hit rate | tokens saved | evicted | pure p50 / p99 us | native p50 / p99 us | native vs pure |")
    print("|---|---|---|---|---|---|---|")
    disagreements = []
    started = time.perf_counter()
    for turn, capacity in enumerate(args.capacity):
        order = ("python", "native") if turn % 2 == 0 else ("native", "python")
        results = {backend: replay_on(backend, requests, capacity, "lru", 1, False, expander) for backend in order}
        pure, native = results["python"], results["native"]
        outcome = (pure.prefix_lengths, pure.hit_units, pure.evicted_units)
        same = outcome == (native.prefix_lengths, native.hit_units, native.evicted_units)
        label = "unbounded" if capacity is None else f"{capacity:,}"
        if not same:
            disagreements.append(label)
        print(
            f"| {label} | {native.hit_rate:.1%}{'' if same else ' (DIFFERS)'} | {native.hit_units:,} "
            f"| {native.evicted_units:,} | {pure.p50_us:.1f} / {pure.p99_us:.1f} "
            f"| {native.p50_us:.1f} / {native.p99_us:.1f} | {pure.p50_us / native.p50_us:.2f}x |"
        )
    seconds = time.perf_counter() - started
    if disagreements:
        print(f"RESULTS WRONG: pure and native differ at capacity {', '.join(disagreements)} ({seconds:.0f} s)")
    else:
        agreed = "every request's prefix length, the hit rates and the evictions"
        print(f"RESULTS CORRECT: pure and native agree on {agreed} at every capacity ({seconds:.0f} s)")
    return 1 if args.check and disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
