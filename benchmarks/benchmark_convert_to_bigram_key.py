"""EAGLE bigram-key conversion: native kernels vs the Python list comprehension, one process.

First proves, for every size, that the native results are byte-identical to the reference (same
pickle bytes, same item objects); then times every variant interleaved, round after round, and
reports medians and the spread of the per-round speedups.

Timing, in the mode a serving loop pays: each sample is a batch of calls whose results stay alive
until the batch is done (as SGLang keeps a key for the insert and match that follow) and are then
freed, inside the clock; the cyclic GC stays on. A second table gives the older figure with the
frees outside the clock, for the tuple-producing variants.

    python benchmarks/benchmark_convert_to_bigram_key.py --check [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import platform
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable

from _report import report

import radix_core
from radix_core import convert_to_bigram_key, pack_bigram_keys, python_convert_to_bigram_key, python_pack_bigram_keys
from radix_core._backend import verifying

DEFAULT_SIZES = [2**k for k in range(7, 18)]  # 128 .. 131072
VOCAB = 152_064  # Qwen2-sized vocabulary: realistic token ids, none of them small cached ints
ELEMENTS_PER_SAMPLE = 262_144

# Variants timed with RADIX_CORE_VERIFY's check of a share of native calls on (what a canary pays).
VERIFIED = {"native tuples, 1% verified": 0.01}

# name -> (size predicate, minimum median speedup over the list comprehension)
TARGETS = {
    "native tuples": [(lambda n: n == 1024, 2.5), (lambda n: n == 131072, 2.2)],
    "packed, buffer in, out=buffer": [(lambda n: n >= 8192, 50.0)],
}


def variants(tokens: list[int]) -> dict[str, Callable[[], object]]:
    buffer = array("q", tokens)
    out = array("q", bytes(8 * max(len(tokens) - 1, 0)))
    return {
        "list comprehension": lambda: python_convert_to_bigram_key(tokens),
        "list(zip(t, t[1:]))": lambda: list(zip(tokens, tokens[1:])),
        "native tuples": lambda: convert_to_bigram_key(tokens),
        "native tuples, 1% verified": lambda: convert_to_bigram_key(tokens),
        "packed, list in": lambda: pack_bigram_keys(tokens),
        "packed, int64 buffer in": lambda: pack_bigram_keys(buffer),
        "packed, buffer in, out=buffer": lambda: pack_bigram_keys(buffer, out=out),
    }


def prove_identical(sizes: list[int], rng: random.Random) -> list[str]:
    """Byte-exact agreement of every fast variant with its reference; returns the failures."""
    failures = []
    for n in sizes:
        tokens = [rng.randrange(VOCAB) for _ in range(n)]
        expected = python_convert_to_bigram_key(tokens)
        for name, make in variants(tokens).items():
            if name.startswith("packed"):
                if make() != python_pack_bigram_keys(tokens):
                    failures.append(f"n={n}: {name} differs from python_pack_bigram_keys")
                continue
            got = make()
            same_objects = all(a is b and c is d for (a, c), (b, d) in zip(got, expected))
            if type(got) is not list or pickle.dumps(got) != pickle.dumps(expected) or not same_objects:
                failures.append(f"n={n}: {name} is not byte-identical to the list comprehension")
    return failures


# Variants timed a second way, with the frees of their results outside the clock.
FREES_OUTSIDE = ("list comprehension", "native tuples")


def time_batch(call: Callable[[], object], batch: int, verify: float = 0.0, frees_timed: bool = True) -> float:
    with verifying(verify):
        start = time.perf_counter_ns()
        results = [call() for _ in range(batch)]
        if frees_timed:
            del results
        elapsed = time.perf_counter_ns() - start
    return elapsed / batch


def measure(n: int, rounds: int, rng: random.Random) -> dict:
    tokens = [rng.randrange(VOCAB) for _ in range(n)]
    calls = variants(tokens)
    batch = max(1, ELEMENTS_PER_SAMPLE // n)
    # (variant, frees timed) pairs, all interleaved round after round
    runs = [(name, True) for name in calls] + [(name, False) for name in FREES_OUTSIDE]
    samples: dict[tuple[str, bool], list[float]] = {run: [] for run in runs}
    for name, frees_timed in runs:  # warm-up
        time_batch(calls[name], batch, VERIFIED.get(name, 0.0), frees_timed)
    for r in range(rounds):
        for name, frees_timed in runs[r % len(runs) :] + runs[: r % len(runs)]:  # rotate who goes first
            elapsed = time_batch(calls[name], batch, VERIFIED.get(name, 0.0), frees_timed)
            samples[(name, frees_timed)].append(elapsed)
    row: dict = {"n": n, "batch": batch, "variants": {}, "frees_outside": {}}
    for (name, frees_timed), times in samples.items():
        baseline = samples[("list comprehension", frees_timed)]
        ratios = sorted(b / t for b, t in zip(baseline, times))
        row["variants" if frees_timed else "frees_outside"][name] = {
            "ns_per_element": statistics.median(times) / n,
            "speedup": statistics.median(ratios),
            "speedup_p10": ratios[len(ratios) // 10],
            "speedup_p90": ratios[-1 - len(ratios) // 10],
        }
    return row


def target_verdicts(rows: list[dict]) -> list[tuple[str, bool]]:
    verdicts = []
    for row in rows:
        for name, rules in TARGETS.items():
            for applies, minimum in rules:
                if applies(row["n"]):
                    got = row["variants"][name]["speedup"]
                    verdicts.append((f"{name} at n={row['n']}: {got:.2f}x (target >= {minimum}x)", got >= minimum))
    return verdicts


def print_table(rows: list[dict], part: str, title: str) -> None:
    names = list(rows[0][part])
    print(f"{title}: ns/element (median) and speedup vs the list comprehension [p10-p90 of per-round ratios]")
    header = ["n"] + names
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        cells = [str(row["n"])]
        for name in names:
            v = row[part][name]
            if name == "list comprehension":
                cells.append(f"{v['ns_per_element']:.1f} ns")
            else:
                cells.append(
                    f"{v['ns_per_element']:.2f} ns, {v['speedup']:.1f}x [{v['speedup_p10']:.1f}-{v['speedup_p90']:.1f}]"
                )
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit non-zero on any mismatch or missed target")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=DEFAULT_SIZES)
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args()

    status = radix_core.backend()
    print(f"radix-core {radix_core.__version__}, backend: {status.active} ({status.reason})")
    machine = f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs"
    print(f"{machine}, gc enabled: {gc.isenabled()}")
    if status.active != "native":
        print("the native backend is not in use: nothing to compare", file=sys.stderr)
        return 1

    rng = random.Random(args.seed)
    failures = prove_identical(args.sizes, rng)
    for failure in failures:
        print("MISMATCH", failure)
    print(f"byte-exact equality on random inputs for n in {args.sizes}: {'FAILED' if failures else 'ok'}")

    rows = [measure(n, args.rounds, rng) for n in args.sizes]
    print_table(rows, "variants", "Frees in the clock, gc on (what a serving loop pays)")
    print_table(rows, "frees_outside", "Frees outside the clock, gc on")
    payload = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "backend": status.reason,
        "rows": rows,
        "identical": not failures,
    }
    exit_status = report(target_verdicts(rows), payload, args.json, args.check)
    return 1 if args.check and failures else exit_status


if __name__ == "__main__":
    sys.exit(main())
