"""EAGLE prefix-cache workloads: radix-core (pure, native) against SGLang's own RadixCache, one run.

Per request the scheduler's cache work is timed: match the prompt (and collect the matched KV
indices), then insert prompt + output with their KV indices (torch int64 tensors for everyone).
Implementations replay the same request stream round after round in rotating order, each on a
fresh cache; the table gives the median time per request and the speedup over SGLang.

Workloads:
- shared-system-prompt: 4 system prompts of 2k tokens, unique questions and answers.
- multi-turn-100k: 4 chats growing by ~2.5k tokens a turn until 100k tokens of history.
- no-reuse: random 1k-4k token prompts, nothing shared.

"SGLang + adapter match_at" is SGLang's own cache with radix-sglang-adapter's optional native
``RadixKey.match_at`` (RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH=1).

Needs SGLang (0.5.12+, e.g. 0.5.23) importable; on a CPU-only machine the adapter's test shim is used.

    python benchmarks/benchmark_radix_cache.py [--check] [--json FILE] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import platform
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable

from radix_testing import sglang_cpu_shim  # test-only shim: SGLang imports on CPU

sglang_cpu_shim.install()

import torch  # noqa: E402
from _plot import speedup_bars  # noqa: E402
from _report import report  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache as SGLangRadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey as SGLangRadixKey  # noqa: E402

import radix_core  # noqa: E402
import radix_sglang_adapter  # noqa: E402
from radix_testing.backends import python_reference_only  # noqa: E402

VOCAB = 152_064
Request = tuple[array, array, torch.Tensor]  # prompt tokens, prompt + output tokens, KV indices

# workload -> implementation -> minimum speedup over SGLang
TARGETS = {
    "shared-system-prompt": {"radix-core pure": 1.0},
    "multi-turn-100k": {"radix-core pure": 1.0, "radix-core native": 5.0},
    "no-reuse": {"radix-core pure": 1.0},
}


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def request(prompt: list[int], output: list[int], next_slot: list[int]) -> Request:
    full = prompt + output
    kv = torch.arange(next_slot[0], next_slot[0] + len(full), dtype=torch.int64)
    next_slot[0] += len(full)
    return array("q", prompt), array("q", full), kv


def shared_system_prompt(rng: random.Random) -> list[Request]:
    systems = [tokens(rng, 2048) for _ in range(4)]
    slot = [0]
    return [
        request(rng.choice(systems) + tokens(rng, rng.randrange(200, 800)), tokens(rng, rng.randrange(100, 300)), slot)
        for _ in range(300)
    ]


def multi_turn_100k(rng: random.Random) -> list[Request]:
    histories: list[list[int]] = [tokens(rng, 1024) for _ in range(4)]
    slot, stream = [0], []
    while any(len(h) < 100_000 for h in histories):
        for chat, history in enumerate(histories):
            if len(history) >= 100_000:
                continue
            prompt = history + tokens(rng, rng.randrange(500, 2000))
            answer = tokens(rng, rng.randrange(300, 1200))
            stream.append(request(prompt, answer, slot))
            histories[chat] = prompt + answer
    return stream


def no_reuse(rng: random.Random) -> list[Request]:
    slot = [0]
    return [
        request(tokens(rng, rng.randrange(1000, 4000)), tokens(rng, rng.randrange(50, 300)), slot) for _ in range(300)
    ]


WORKLOADS: dict[str, Callable[[random.Random], list[Request]]] = {
    "shared-system-prompt": shared_system_prompt,
    "multi-turn-100k": multi_turn_100k,
    "no-reuse": no_reuse,
}


class _CPUAllocator:
    device = torch.device("cpu")


def replay_sglang(stream: list[Request]) -> tuple[float, list[int]]:
    params = CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=_CPUAllocator(), page_size=1, is_eagle=True
    )
    cache = SGLangRadixCache(params)
    elapsed, matched = 0.0, []
    for prompt, full, kv in stream:
        start = time.perf_counter()
        result = cache.match_prefix(MatchPrefixParams(key=SGLangRadixKey(prompt)))
        indices = cache.path_device_indices(result.last_device_node)
        cache.insert(InsertParams(key=SGLangRadixKey(full), value=kv))
        elapsed += time.perf_counter() - start
        matched.append(len(indices))
    return elapsed, matched


def replay_radix_core(stream: list[Request]) -> tuple[float, list[int]]:
    cache = radix_core.RadixCache(is_eagle=True)
    elapsed, matched = 0.0, []
    for prompt, full, kv in stream:
        start = time.perf_counter()
        indices = cache.match_prefix(radix_core.RadixKey(prompt)).indices  # joined on first use: timed
        cache.insert(radix_core.RadixKey(full), kv)
        elapsed += time.perf_counter() - start
        matched.append(len(indices))
    return elapsed, matched


def replay_pure(stream: list[Request]) -> tuple[float, list[int]]:
    with python_reference_only():
        return replay_radix_core(stream)


def replay_sglang_accelerated(stream: list[Request]) -> tuple[float, list[int]]:
    radix_sglang_adapter.activate(accelerate_match=True)
    try:
        return replay_sglang(stream)
    finally:
        radix_sglang_adapter.deactivate()


IMPLEMENTATIONS = {
    "SGLang RadixCache": replay_sglang,
    "SGLang + adapter match_at": replay_sglang_accelerated,
    "radix-core pure": replay_pure,
    "radix-core native": replay_radix_core,
}


def measure(name: str, stream: list[Request], rounds: int) -> dict:
    names = list(IMPLEMENTATIONS)
    times: dict[str, list[float]] = {impl: [] for impl in names}
    matched_by: dict[str, list[int]] = {}
    for r in range(rounds):
        for impl in names[r % len(names) :] + names[: r % len(names)]:
            gc.collect()
            elapsed, matched = IMPLEMENTATIONS[impl](stream)
            times[impl].append(elapsed / len(stream))
            matched_by[impl] = matched
    baseline = times["SGLang RadixCache"]
    row = {"workload": name, "requests": len(stream), "tokens": sum(len(full) for _, full, _ in stream)}
    row["same_matches"] = all(m == matched_by["SGLang RadixCache"] for m in matched_by.values())
    row["implementations"] = {
        impl: {
            "us_per_request": statistics.median(t) * 1e6,
            "speedup": statistics.median(b / x for b, x in zip(baseline, t)),
            "speedup_min": min(b / x for b, x in zip(baseline, t)),
            "speedup_max": max(b / x for b, x in zip(baseline, t)),
        }
        for impl, t in times.items()
    }
    return row


def verdicts(rows: list[dict]) -> list[tuple[str, bool]]:
    found = []
    for row in rows:
        found.append((f"{row['workload']}: same prefix lengths as SGLang for every request", row["same_matches"]))
        for impl, minimum in TARGETS[row["workload"]].items():
            got = row["implementations"][impl]["speedup"]
            found.append((f"{row['workload']}: {impl} {got:.2f}x vs SGLang (target >= {minimum}x)", got >= minimum))
    return found


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    speedup_bars(ax, rows, list(IMPLEMENTATIONS), [row["workload"] for row in rows], scale=1000)
    ax.set_ylabel("ms per request (match + indices + insert), lower is better")
    ax.set_yscale("log")
    ax.set_title("EAGLE prefix cache per request: radix-core vs SGLang 0.5.23 RadixCache (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit non-zero on a mismatch or a missed target")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--plot", metavar="FILE.png")
    args = parser.parse_args()

    status = radix_core.backend()
    print(f"SGLang {importlib.metadata.version('sglang')}, radix-core {radix_core.__version__} ({status.reason})")
    print(
        f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}"
    )
    if status.active != "native":
        print("radix-native is not in use: the native column would be the pure one", file=sys.stderr)
        return 1
    rows = []
    for name, build in WORKLOADS.items():
        stream = build(random.Random(args.seed))
        # Import-time objects and the request stream are frozen, so that a full collection (which
        # any implementation may happen to trigger) does not rescan half a million of them.
        gc.collect()
        gc.freeze()
        rows.append(measure(name, stream, args.rounds))
        gc.unfreeze()
        row = rows[-1]
        print(f"\n{name}: {row['requests']} requests, {row['tokens']:,} tokens inserted")
        for impl, v in row["implementations"].items():
            spread = f"[{v['speedup_min']:.2f}-{v['speedup_max']:.2f}]"
            print(f"  {impl:<26} {v['us_per_request']:>10.1f} us/request  {v['speedup']:>6.2f}x {spread}")
    print()
    exit_status = report(verdicts(rows), {"rows": rows}, args.json, args.check)
    if args.plot:
        plot(rows, args.plot)
    return exit_status


if __name__ == "__main__":
    sys.exit(main())
