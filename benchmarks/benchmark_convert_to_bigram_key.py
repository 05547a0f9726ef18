"""EAGLE bigram-key conversion: native kernels vs pure Python (SGLang's list comprehension, radix-core's
pure path and the zip of a slice), one process.

First proves, for every size, that every variant's result is byte-identical to the reference (same
pickle bytes, same item objects); then times every variant interleaved, round after round, and
reports medians and the spread of the per-round ratios.

Beside radix-native runs the seed-style kernel (benchmarks/seed_kernel, built for the benchmark
only): the approach radix started from, a pybind11 function making each pair with PyTuple_New +
PyTuple_SET_ITEM and nothing else. Its ratio to radix-native holds on any CPU; the targets against
the list comprehension were set on the reference machine and are reported beside it.

Timing, in the mode a serving loop pays: each sample is a batch of calls whose results stay alive
until the batch is done (as SGLang keeps a key for the insert and match that follow) and are then
freed, inside the clock; the cyclic GC stays on. A second table gives the older figure with the
frees outside the clock, for the tuple-producing kernels.

Exit status: 0, or with --check 1 if any result differs; with --check-speed also 3 if a speed
target is missed (results right). The last line says which, and on what CPU.

    python benchmarks/benchmark_convert_to_bigram_key.py --check [--check-speed] [--json FILE]
"""

from __future__ import annotations

import argparse
import gc
import math
import pickle
import platform
import random
import statistics
import sys
import time
from array import array
from collections.abc import Callable

import seed_style_kernel
from harness import cpu_model, report

import radix_core
from radix_core import convert_to_bigram_key, pack_bigram_keys, python_convert_to_bigram_key, python_pack_bigram_keys
from radix_testing.backends import verifying

DEFAULT_SIZES = [2**k for k in range(7, 18)]  # 128 .. 131072
VOCAB = 152_064  # Qwen2-sized vocabulary: realistic token ids, none of them small cached ints
SAMPLE_ELEMENTS = 262_144  # tokens converted per timed sample, in batches of one size

LIST_COMPREHENSION = "list comprehension"
SEED_STYLE = "seed-style kernel"
PURE_PATH = "pure path, list(zip(t, it))"  # radix-core's python_convert_to_bigram_key
ZIP_OF_SLICE = "list(zip(t, t[1:]))"
PURE_PEERS = (PURE_PATH, ZIP_OF_SLICE)  # what a user without radix-native could write
# Every variant's ratio is measured against each, round by round.
BASELINES = (LIST_COMPREHENSION, SEED_STYLE, *PURE_PEERS)

# Variants timed with RADIX_CORE_VERIFY's check of a share of native calls on (what a canary pays).
VERIFIED = {"native tuples, 1% verified": 0.01}

# (variant, compared with, sizes, minimum median ratio, what kind of target)
SIDE_BY_SIDE = "side by side, for any CPU"
ABSOLUTE = "absolute, set on the reference machine"
TARGETS: list[tuple[str, str, Callable[[int], bool], float, str]] = [
    ("native tuples", SEED_STYLE, lambda n: True, 1.0, SIDE_BY_SIDE),
    (PURE_PATH, LIST_COMPREHENSION, lambda n: n in (1024, 131072), 1.25, SIDE_BY_SIDE),
    ("native tuples", LIST_COMPREHENSION, lambda n: n == 1024, 2.5, ABSOLUTE),
    ("native tuples", LIST_COMPREHENSION, lambda n: n == 131072, 2.2, ABSOLUTE),
    ("packed, buffer in, out=buffer", LIST_COMPREHENSION, lambda n: n >= 8192, 50.0, ABSOLUTE),
]

EXIT_WRONG_RESULT = 1
EXIT_SPEED_MISSED = 3


def list_comprehension(tokens: list[int]) -> list[tuple[int, int]]:
    """SGLang's conversion, the reference every variant must equal byte for byte."""
    return [(tokens[i], tokens[i + 1]) for i in range(len(tokens) - 1)]


def variants(tokens: list[int]) -> dict[str, Callable[[], object]]:
    buffer = array("q", tokens)
    out = array("q", bytes(8 * max(len(tokens) - 1, 0)))
    return {
        LIST_COMPREHENSION: lambda: list_comprehension(tokens),
        PURE_PATH: lambda: python_convert_to_bigram_key(tokens),
        ZIP_OF_SLICE: lambda: list(zip(tokens, tokens[1:])),
        SEED_STYLE: lambda: seed_style_kernel.convert_to_bigram_key(tokens),
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
        expected = list_comprehension(tokens)
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
FREES_OUTSIDE = (LIST_COMPREHENSION, SEED_STYLE, "native tuples")


def time_batch(call: Callable[[], object], batch: int, verify: float = 0.0, frees_timed: bool = True) -> float:
    with verifying(verify):
        start = time.perf_counter_ns()
        results = [call() for _ in range(batch)]
        if frees_timed:
            del results
        elapsed = time.perf_counter_ns() - start
    return elapsed / batch


def ratio_spread(baseline: list[float], times: list[float]) -> dict:
    """Median and p10-p90 of the per-round ratios baseline / variant (above 1: the variant is faster)."""
    ratios = sorted(b / t for b, t in zip(baseline, times))
    return {
        "median": statistics.median(ratios),
        "p10": ratios[len(ratios) // 10],
        "p90": ratios[-1 - len(ratios) // 10],
    }


def measure(n: int, rounds: int, rng: random.Random, sample_elements: int = SAMPLE_ELEMENTS) -> dict:
    tokens = [rng.randrange(VOCAB) for _ in range(n)]
    calls = variants(tokens)
    batch = max(1, sample_elements // n)
    # (variant, frees timed) pairs, all interleaved round after round
    runs = [(name, True) for name in calls] + [(name, False) for name in FREES_OUTSIDE]
    samples: dict[tuple[str, bool], list[float]] = {run: [] for run in runs}
    for name, frees_timed in runs:  # warm-up
        time_batch(calls[name], batch, VERIFIED.get(name, 0.0), frees_timed)
    for r in range(rounds):
        for name, frees_timed in runs[r % len(runs) :] + runs[: r % len(runs)]:  # rotate who goes first
            elapsed = time_batch(calls[name], batch, VERIFIED.get(name, 0.0), frees_timed)
            samples[(name, frees_timed)].append(elapsed)
    row: dict = {"n": n, "batch": batch, "frees_in": {}, "frees_outside": {}}
    for (name, frees_timed), times in samples.items():
        row["frees_in" if frees_timed else "frees_outside"][name] = {
            "ns_per_element": statistics.median(times) / n,
            "vs": {
                baseline: ratio_spread(samples[(baseline, frees_timed)], times)
                for baseline in BASELINES
                if (baseline, frees_timed) in samples  # the pure peers are timed with frees in only
            },
        }
    return row


def target_verdicts(rows: list[dict]) -> list[tuple[str, bool]]:
    """Each speed target at each size it applies to, frees in the clock, as (text, met)."""
    verdicts = []
    for variant, baseline, applies, minimum, kind in TARGETS:
        for row in rows:
            if applies(row["n"]):
                got = row["frees_in"][variant]["vs"][baseline]
                shown = math.floor(got["median"] * 100) / 100  # rounded down: a miss never prints as the target
                text = (
                    f"{variant} vs {baseline} at n={row['n']}: {shown:.2f}x "
                    f"[{got['p10']:.2f}-{got['p90']:.2f}] (target >= {minimum}x, {kind})"
                )
                verdicts.append((text, got["median"] >= minimum))
    return verdicts


def native_lead_lines(rows: list[dict]) -> list[str]:
    """Per size, native tuples against the fastest pure peer there (frees in the clock)."""
    lines = []
    for row in rows:
        timed = row["frees_in"]
        fastest = min(PURE_PEERS, key=lambda name: timed[name]["ns_per_element"])
        lead = spread_text(timed["native tuples"]["vs"][fastest])
        lines.append(f"native tuples vs the fastest pure peer at n={row['n']}: {lead} ({fastest})")
    return lines


def spread_text(spread: dict) -> str:
    """A table cell's ratio: 2.41x [1.71-3.19], or whole numbers from 10x up: 216x [197-236]."""
    digits = 2 if spread["median"] < 10 else 0
    return f"{spread['median']:.{digits}f}x [{spread['p10']:.{digits}f}-{spread['p90']:.{digits}f}]"


def print_table(rows: list[dict], part: str, title: str) -> None:
    names = list(rows[0][part])
    print(f"{title}: ns/element (median) and speedup vs the {LIST_COMPREHENSION} [p10-p90 of per-round ratios]")
    header = ["n", *names, f"native tuples vs {SEED_STYLE}"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        cells = [str(row["n"])]
        for name in names:
            v = row[part][name]
            if name == LIST_COMPREHENSION:
                cells.append(f"{v['ns_per_element']:.1f} ns")
            else:
                cells.append(f"{v['ns_per_element']:.2f} ns, {spread_text(v['vs'][LIST_COMPREHENSION])}")
        cells.append(spread_text(row[part]["native tuples"]["vs"][SEED_STYLE]))
        print("| " + " | ".join(cells) + " |")


def verdict_line(
    failures: list[str], verdicts: list[tuple[str, bool]], check_speed: bool, status: int, cpu: str
) -> str:
    """The run in one line: are the results right, how many speed targets were met where, and the exit status."""
    met = sum(ok for _, ok in verdicts)
    enforced = "enforced by --check-speed" if check_speed else "reported only (--check-speed enforces them)"
    speed = f"speed targets met: {met} of {len(verdicts)} on {cpu}, {enforced}"
    if failures:
        return f"RESULTS WRONG: {len(failures)} differ from the reference (MISMATCH above); {speed}; exit {status}"
    return f"RESULTS CORRECT: every variant byte-exact at every n; {speed}; exit {status}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if any result is not byte-identical")
    parser.add_argument("--check-speed", action="store_true", help="--check, and exit 3 if a speed target is missed")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=DEFAULT_SIZES)
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds per size")
    parser.add_argument("--sample-elements", type=int, default=SAMPLE_ELEMENTS, help="tokens per timed sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    args = parser.parse_args(argv)

    status = radix_core.backend()
    cpu = cpu_model()
    print(f"radix-core {radix_core.__version__}, backend: {status.active} ({status.reason})")
    print(f"{cpu}, Python {platform.python_version()}, gc enabled: {gc.isenabled()}")
    if status.active != "native":
        print("the native backend is not in use: nothing to compare", file=sys.stderr)
        return 1

    rng = random.Random(args.seed)
    failures = prove_identical(args.sizes, rng)
    for failure in failures:
        print("MISMATCH", failure)
    print(f"byte-exact equality on random inputs for n in {args.sizes}: {'FAILED' if failures else 'ok'}")

    rows = [measure(n, args.rounds, rng, args.sample_elements) for n in args.sizes]
    print_table(rows, "frees_in", "Frees in the clock, gc on (what a serving loop pays)")
    print_table(rows, "frees_outside", "Frees outside the clock, gc on")
    for line in native_lead_lines(rows):
        print(line)
    payload = {
        "python": platform.python_version(),
        "cpu": cpu,
        "backend": status.reason,
        "rows": rows,
        "identical": not failures,
    }
    verdicts = target_verdicts(rows)
    exit_status = EXIT_SPEED_MISSED if report(verdicts, payload, args.json, args.check_speed) else 0
    if failures and (args.check or args.check_speed):
        exit_status = EXIT_WRONG_RESULT
    print(verdict_line(failures, verdicts, args.check_speed, exit_status, cpu))
    return exit_status


if __name__ == "__main__":
    sys.exit(main())
