"""The replay loop every benchmark shares, written once.

Variants replay the same requests in one process, round after round in rotating order, each on a
fresh cache with the cyclic GC on (a full collection before each, import-time objects and the
requests frozen); every variant must give the same answers; a table gives medians over rounds and
the spread of the per-round ratios against a baseline; the end is PASS/MISS lines, a JSON file and
the exit status. Scripts say only what a variant does per request and what its targets are.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import radix_core
from radix_core.trace import TokenExpander, read_trace

BENCHMARKS = Path(__file__).resolve().parent
DEFAULT_TRACE = BENCHMARKS / "data" / "mooncake_synthetic_trace.jsonl"
Verdicts = list[tuple[str, bool]]

# ----- the environment a run reports ------------------------------------------------------------

# What /proc/cpuinfo says besides the model name, under the names it is shown with.
CPU_DETAILS = (("family", "cpu family"), ("model", "model"), ("cache", "cache size"))


def cpu_model() -> str:
    """The CPU the numbers were measured on, as Linux names it: a VM may only say "AMD EPYC", so its
    family, model and cache size are added to tell one such machine from another."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    details = ", ".join(f"{label} {fields[key]}" for label, key in CPU_DETAILS if key in fields)
    return f"{name} ({details}), {os.cpu_count()} CPUs" if details else f"{name}, {os.cpu_count()} CPUs"


def native_in_use(torch_threads: bool = True) -> bool:
    """Prints what the numbers ran on (SGLang, radix-core's backend, Python, CPU, torch); pins torch
    to one thread, as a scheduler's CPU work runs; False (and says why) without radix-native, whose
    column would then be the pure one."""
    status = radix_core.backend()
    try:
        sglang = f"SGLang {importlib.metadata.version('sglang')}, "
    except importlib.metadata.PackageNotFoundError:
        sglang = ""
    print(f"{sglang}radix-core {radix_core.__version__} ({status.reason})")
    line = f"{cpu_model()}, Python {platform.python_version()}"
    if torch_threads:
        import torch

        torch.set_num_threads(1)
        line += f", torch {torch.__version__} on 1 thread"
    print(line, flush=True)
    if status.active != "native":
        print("radix-native is not in use: the native column would be the pure one", flush=True)
    return status.active == "native"


def arguments(doc: str | None, requests: int | None = 2000, rounds: int = 5, plot: bool = False):
    """The options every replay takes: the trace and how much of it, rounds, --check, --json, --plot."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if requests is not None:
        parser.add_argument("--trace", default=str(DEFAULT_TRACE), help="a Mooncake-format JSONL trace")
        parser.add_argument("--requests", type=int, default=requests, help="replay the first N requests")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--check", action="store_true", help="exit non-zero on a mismatch or a missed target")
    parser.add_argument("--json", metavar="FILE")
    if plot:
        parser.add_argument("--plot", metavar="FILE.png")
    return parser


# ----- the requests -----------------------------------------------------------------------------


def trace_requests(path: str | Path, requests: int | None) -> list[tuple[array, array]]:
    """The first ``requests`` of a Mooncake-format trace as (prompt, output) int64 token arrays."""
    expander = TokenExpander()
    return [(expander.prompt(r), expander.output(i, r)) for i, r in enumerate(read_trace(path, requests))]


def with_kv_slots(requests: list[tuple[Any, Any]]) -> list[tuple[Any, Any, Any]]:
    """(prompt, prompt + output, their KV slots as one int64 tensor), slots never reused."""
    import torch

    stream, slot = [], 0
    for prompt, output in requests:
        full = prompt + output
        stream.append((prompt, full, torch.arange(slot, slot + len(full), dtype=torch.int64)))
        slot += len(full)
    return stream


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Import-time objects and the requests frozen, so that a full collection (which any variant
    may trigger) does not rescan them; the collector is otherwise on."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# ----- the interleaved loop ---------------------------------------------------------------------


@dataclass
class Replay:
    """One variant's replay: per-request seconds on each clock (the first is the one ratios and
    targets use), what every variant must answer alike, and the filled cache (alone in a list, so
    that the loop can measure it and drop it)."""

    clocks: dict[str, float]
    answers: Any
    held: list = field(default_factory=list)
    detail: dict = field(default_factory=dict)  # kept from the last round only (tails, by method)


@dataclass
class Rounds:
    """A variant over the rounds: per clock the per-round seconds; the last round's answers,
    detail and the gc footprint of its filled cache."""

    clocks: dict[str, list[float]] = field(default_factory=dict)
    answers: Any = None
    detail: dict = field(default_factory=dict)
    footprint: dict = field(default_factory=dict)


def rotated(names: list, round_number: int) -> list:
    """This round's order: a different variant goes first every round."""
    shift = round_number % len(names)
    return names[shift:] + names[:shift]


def interleave(
    names: list[str],
    replay: Callable[[str], Replay],
    rounds: int,
    after_round: Callable[[dict[str, Rounds]], None] | None = None,
    footprint: bool = True,
) -> dict[str, Rounds]:
    """Every variant's ``replay(name)`` each round, rotating, a full collection before each; in the
    last round each filled cache's gc footprint (``gc_footprint``) before it is dropped."""
    runs = {name: Rounds() for name in names}
    for number in range(rounds):
        last = number == rounds - 1
        for name in rotated(names, number):
            gc.collect()
            result = replay(name)
            run = runs[name]
            for clock, seconds in result.clocks.items():
                run.clocks.setdefault(clock, []).append(seconds)
            run.answers = result.answers
            if last:
                run.detail = result.detail
                if footprint:
                    run.footprint = gc_footprint(result.held)
            result.held.clear()
            del result
        if after_round is not None:
            after_round(runs)
    return runs


def same_answers(runs: dict[str, Rounds], baseline: str) -> bool:
    return all(run.answers == runs[baseline].answers for run in runs.values())


def ratios(baseline: list[float], times: list[float]) -> dict[str, float]:
    """Median and range over rounds of baseline / variant, round by round (above 1: faster)."""
    each = [b / t for b, t in zip(baseline, times, strict=True)]
    return {"speedup": statistics.median(each), "speedup_min": min(each), "speedup_max": max(each)}


def timing(runs: dict[str, Rounds], name: str, baseline: str, clock: str = "seconds") -> dict[str, float]:
    """A variant's median µs per request on ``clock`` and its ratios to the baseline's."""
    times = runs[name].clocks[clock]
    return {"us_per_request": statistics.median(times) * 1e6, **ratios(runs[baseline].clocks[clock], times)}


def timing_text(v: dict[str, float]) -> str:
    """A table cell: 123.4 us/request   2.05x [1.98-2.10]."""
    return (
        f"{v['us_per_request']:>8.1f} us/request {v['speedup']:>6.2f}x [{v['speedup_min']:.2f}-{v['speedup_max']:.2f}]"
    )


def tail_ratio(seconds: list[float]) -> float:
    """A replay's p99 over its p50 per request: how far its slow requests are from its typical one."""
    cuts = statistics.quantiles(seconds, n=100)
    return cuts[98] / cuts[49]


def probe_seconds(make_probe: Callable[[Any], Any], calls: int = 200_000) -> float:
    """What a timing wrapper records for one call of a method that does nothing (median of 5 runs):
    left out of the clocks that wrap each call."""

    class Idle:
        def method(self) -> None:
            pass

    runs = []
    for _ in range(5):
        probe = make_probe(Idle())
        for _ in range(calls):
            probe.method()
        runs.append(probe.seconds / calls)
    return statistics.median(runs)


# ----- what a filled cache costs the collector --------------------------------------------------


def full_collection_seconds(repeats: int = 5) -> float:
    """Median wall time of a full ``gc.collect()`` in this process as it stands."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def gc_footprint(holder: list[Any]) -> dict[str, float]:
    """The gc-tracked objects and full-collection milliseconds that what ``holder`` holds adds, as
    SGLang's scheduler pays it on every full collection; ``holder`` is emptied on the way (the
    difference is taken with and without it, in the same process)."""
    gc.collect()
    objects, seconds = len(gc.get_objects()), full_collection_seconds()
    holder.clear()
    gc.collect()
    return {
        "gc_objects": objects - len(gc.get_objects()),
        "gc_full_ms": (seconds - full_collection_seconds()) * 1e3,
    }


# ----- the end of a run -------------------------------------------------------------------------


def report(verdicts: Verdicts, payload: dict, json_path: str | None, check: bool) -> int:
    """Prints each target as PASS or MISS, writes ``payload`` and the targets to ``json_path`` when
    given, and returns the exit status: 1 when ``check`` is set and a target was missed."""
    for text, ok in verdicts:
        print(("PASS " if ok else "MISS ") + text)
    if json_path:
        targets = [{"target": text, "met": ok} for text, ok in verdicts]
        Path(json_path).write_text(json.dumps({**payload, "targets": targets}, indent=2))
    return 1 if check and not all(ok for _, ok in verdicts) else 0


def speedup_bars(
    ax: Any,
    groups: list[dict],
    names: list[str],
    labels: list[str],
    scale: float = 1.0,
    label_size: int = 8,
    tick_size: int | None = None,
) -> float:
    """Draws ``groups[g]["implementations"][name]["us_per_request"] / scale`` as bars (one colour
    per name), labels each with its ``speedup`` and each group with ``labels[g]``; returns the
    bar width."""
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        results = [group["implementations"][name] for group in groups]
        values = [result["us_per_request"] / scale for result in results]
        bars = ax.bar([x + i * width for x in range(len(groups))], values, width, label=name)
        for bar, result in zip(bars, results):
            ax.annotate(
                f"{result['speedup']:.1f}x",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=label_size,
            )
    centers = [x + width * (len(names) - 1) / 2 for x in range(len(groups))]
    ax.set_xticks(centers, labels, **({} if tick_size is None else {"fontsize": tick_size}))
    return width


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
