"""``python -m radix_core replay TRACE.jsonl ...``: hit rate and CPU per request of a KV cache on a
request trace, swept over capacities and eviction policies. Exit status 2 on bad input."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

from .cache import EVICTION_POLICIES
from .replay import ReplayResult, replay_sweep, terminal_progress
from .trace import TraceError, read_trace

_SCALES = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}
_UNBOUNDED = ("unbounded", "none", "inf")


def capacity_list(text: str) -> list[int | None]:
    """``unbounded,1M,200k,4096`` -> [None, 1000000, 200000, 4096] (k, M, G are powers of 1000)."""
    capacities: list[int | None] = []
    for word in text.split(","):
        word = word.strip().lower()
        if word in _UNBOUNDED:
            capacities.append(None)
            continue
        found = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)", word)
        if found is None:
            raise argparse.ArgumentTypeError(f"{word!r} is not a capacity: use tokens like 200k, 1M, 4096 or unbounded")
        capacities.append(round(float(found.group(1)) * _SCALES[found.group(2)]))
    return capacities


def policy_list(text: str) -> list[str]:
    policies = [word.strip().lower() for word in text.split(",")]
    unknown = [policy for policy in policies if policy not in EVICTION_POLICIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown policy {unknown[0]!r}; use some of: {', '.join(EVICTION_POLICIES)}")
    return policies


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def print_table(results: list[ReplayResult]) -> None:
    print("| policy | capacity | hit rate | tokens saved | evicted | p50 us/request | p99 us/request (gc on) |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        capacity = "unbounded" if r.capacity is None else f"{r.capacity:,}"
        print(
            f"| {r.policy} | {capacity} | {r.hit_rate:.1%} | {r.hit_units:,} | {r.evicted_units:,} "
            f"| {r.p50_us:.1f} | {r.p99_us:.1f} |"
        )


def plot(results: list[ReplayResult], path: str, title: str) -> None:
    """Hit rate against capacity, a line per policy; the unbounded hit rate (the same for every
    policy: nothing is evicted) as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for policy in dict.fromkeys(r.policy for r in results):
        bounded = sorted((r.capacity, r.hit_rate) for r in results if r.policy == policy and r.capacity is not None)
        ax.plot([c for c, _ in bounded], [h * 100 for _, h in bounded], marker="o", label=policy)
    unbounded = [r.hit_rate for r in results if r.capacity is None]
    if unbounded:
        ax.axhline(unbounded[0] * 100, linestyle="--", color="gray", label="unbounded (no eviction)")
    ax.set_xscale("log")
    ax.set_xlabel("KV cache capacity (tokens)")
    ax.set_ylabel("hit rate (% of prompt tokens)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radix_core", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    command = commands.add_parser(
        "replay",
        help="replay a Mooncake-format trace through RadixCache",
        description="Replays a Mooncake-format JSONL trace (timestamp, input_length, output_length, "
        "hash_ids of 512-token blocks) in timestamp order: match the prompt, insert prompt + output, "
        "evict to the capacity. Prints hit rate, tokens saved, evictions and CPU per request for "
        "each capacity and policy.",
    )
    command.add_argument("trace", help="the trace file (JSON lines)")
    command.add_argument("--capacity", type=capacity_list, default=[None], help="e.g. unbounded,1M,200k (tokens)")
    command.add_argument("--policy", type=policy_list, default=["lru"], help=f"any of {', '.join(EVICTION_POLICIES)}")
    command.add_argument("--page-size", type=positive_int, default=1)
    command.add_argument("--eagle", action="store_true", help="bigram keys, as SGLang with EAGLE")
    command.add_argument("--requests", type=positive_int, help="only the first N requests of the file")
    command.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    command.add_argument("--plot", metavar="FILE.png", help="hit rate against capacity (needs radix-core[plot])")
    args = parser.parse_args(argv)

    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("radix-core: --plot needs matplotlib: pip install 'radix-core[plot]'", file=sys.stderr)
        return 2
    try:
        requests = read_trace(args.trace, args.requests)
    except TraceError as error:
        print(f"radix-core: {error}", file=sys.stderr)
        return 2
    results = replay_sweep(requests, args.capacity, args.policy, args.page_size, args.eagle, terminal_progress)
    prompt_tokens = sum(r.input_length for r in requests)
    mode = "EAGLE" if args.eagle else "plain"
    print(
        f"{Path(args.trace).name}: {len(requests)} requests, {prompt_tokens:,} prompt tokens, page {args.page_size}, "
        f"{mode}, radix-core {results[0].backend}"
    )
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps([r.summary() for r in results], indent=2))
    if args.plot:
        plot(results, args.plot, f"{Path(args.trace).name}: hit rate by KV capacity ({mode}, page {args.page_size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
