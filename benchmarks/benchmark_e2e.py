"""End to end: SGLang 0.5.23's real HTTP server on this CPU, on its default cache and on radix-core.

Starts the real server (``python -m sglang.launch_server`` with the test-only CPU shims of
``packages/radix-sglang-adapter/tests``: a dummy-weight tiny Llama, torch on 1 thread, one server
at a time) for each cache, EAGLE off and on:

    SGLang default   what SGLang builds without the flag (UnifiedRadixCache, Rust TreeCore)
    radix native     --radix-cache-backend radix, radix-core native
    radix pure       --radix-cache-backend radix, radix-core's Python tree

and replays prompts of the bundled Mooncake trace (each 512-token hash block scaled to
``--block-tokens`` tokens, at most ``--max-blocks`` blocks, so the trace's prefix sharing survives
at a size a CPU forward serves quickly) from ``--concurrency`` streaming clients, ``--new-tokens``
greedy tokens each: the first ``--warm`` requests untimed (they fill the tree, as a server's
history does, and warm the process), then the next ``--requests`` timed. The KV pool holds
every prompt (no eviction).

Per request, measured inside the scheduler process (benchmarks/e2e_probe: thread CPU time of the
scheduler's one thread, gc on):
- scheduler CPU outside the forward: everything the scheduler's thread does but the model's
  forward and sampling and the test-only stand-ins for SGLang's CPU kernels (EAGLE's tree ops,
  device kernels on a GPU server): the loop, batching, request bookkeeping, the cache;
- in the cache: inside the tree cache's public methods, less the probe's own time per call
  (measured in the scheduler at start, a function that does nothing);
and from the clients: TTFT p50/p99, requests/s, and the cached-token share (cached / prompt
tokens). Ratios are SGLang default over each radix cache, per round; rounds rotate the order.
The model is tiny, so its forward is cheap but not free: the scheduler's own work is what the
cache can change, and is reported apart from it.

``--kv-events``: SGLang default and radix native also run with KV cache events published
(``--kv-events-config``, ZMQ bound with no subscriber: the events are built, taken and sent all the
same), in the same rotation; their ratios are against SGLang default with events, and each is also
given against its own events-off run of the round.

    python benchmarks/benchmark_e2e.py [--requests N] [--rounds R] [--kv-events] [--json FILE] [--plot FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness

from radix_testing.prompts import trace_prompts
from radix_testing.sglang_server import SITE, VOCAB, Server, ServerConfig, write_models

PROBE = Path(__file__).resolve().parent / "e2e_probe"
TRACE = Path(__file__).resolve().parent / "data" / "mooncake_synthetic_trace.jsonl"

CACHES = {"SGLang default": "default", "radix native": "radix-native", "radix pure": "radix-python"}
BASELINE = "SGLang default"
WITH_EVENTS = " + events"  # a cache's name with it: the same cache, KV cache events published
EVENT_RUNS = [BASELINE + WITH_EVENTS, "radix native" + WITH_EVENTS]
# Published to a bound socket nobody reads: SGLang builds, takes and sends every event all the same.
EVENTS_CONFIG = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "topic": "kv", "bind": True})
MODES = {"plain": None, "EAGLE": "EAGLE"}
METRICS = ("outside_forward_ms", "cache_ms", "ttft_p50_ms", "ttft_p99_ms", "requests_per_s", "cached_share")
SHOWN_APART = ("forward_ms", "stand_in_kernels_ms")  # the scheduler's thread time left out of "outside"


def stream_request(server: Server, prompt: list[int], new_tokens: int) -> dict:
    """One streaming /generate: time to the first chunk, to the last, and the final meta_info."""
    start = time.perf_counter()
    first = last = None
    with server.stream(prompt, new_tokens) as response:
        for line in response:
            if line.startswith(b"data: {"):
                first = first or time.perf_counter()
                last = json.loads(line[len(b"data: ") :])
    if last is None:
        raise RuntimeError(f"no chunk from {server.config.name}")
    return {"ttft_s": first - start, "cached": last["meta_info"]["cached_tokens"], "prompt": len(prompt)}


def replay(server: Server, prompts: list[list[int]], concurrency: int, new_tokens: int) -> tuple[list[dict], float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda prompt: stream_request(server, prompt, new_tokens), prompts))
    return answers, time.perf_counter() - start


def scheduler_counts(server: Server, probe_dir: Path) -> dict:
    """The scheduler's counters, written when it went idle after this call began (the server
    info request wakes it, so it goes idle again even if it already was)."""
    asked = time.time()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        urllib.request.urlopen(server.url("/server_info"), timeout=60).read()
        files = glob.glob(str(probe_dir / "scheduler-*.json"))
        if len(files) == 1:
            counts = json.loads(Path(files[0]).read_text())
            if counts["written_at"] > asked:
                return counts
        time.sleep(0.2)
    raise RuntimeError(f"the scheduler wrote no counters in {probe_dir}")


def run_one(config: ServerConfig, models, warm: list[list[int]], prompts: list[list[int]], args, work: Path) -> dict:
    probe_dir = Path(tempfile.mkdtemp(dir=work))
    env = {"PYTHONPATH": os.pathsep.join([str(PROBE), str(SITE)]), "RADIX_E2E_PROBE_DIR": str(probe_dir)}
    config = dataclasses.replace(config, env=tuple(env.items()))
    with Server(config, models, work / f"{config.name}.log") as server:
        replay(server, warm, args.concurrency, args.new_tokens)
        before = scheduler_counts(server, probe_dir)
        answers, seconds = replay(server, prompts, args.concurrency, args.new_tokens)
        after = scheduler_counts(server, probe_dir)
    requests = len(prompts)
    delta = {key: after[key] - before[key] for key in ("thread_s", "forward_s", "stand_in_kernels_s")}
    outside = delta["thread_s"] - delta["forward_s"] - delta["stand_in_kernels_s"]
    ttfts = sorted(answer["ttft_s"] for answer in answers)
    bias = after["probe_s_per_call"]  # what the probe records for a call that does nothing
    methods = {
        name: (
            spent - before["cache_methods"].get(name, [0.0, 0])[0] - bias * calls_made,
            calls_made,
        )
        for name, (spent, calls) in after["cache_methods"].items()
        if (calls_made := calls - before["cache_methods"].get(name, [0, 0])[1])
    }
    cache_s = sum(spent for spent, _ in methods.values())
    return {
        "outside_forward_ms": 1e3 * outside / requests,
        "forward_ms": 1e3 * delta["forward_s"] / requests,
        "stand_in_kernels_ms": 1e3 * delta["stand_in_kernels_s"] / requests,
        "cache_ms": 1e3 * cache_s / requests,
        "probe_us_per_call": 1e6 * bias,
        "ttft_p50_ms": 1e3 * statistics.median(ttfts),
        "ttft_p99_ms": 1e3 * ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
        "requests_per_s": requests / seconds,
        "cached_share": sum(answer["cached"] for answer in answers) / sum(answer["prompt"] for answer in answers),
        "cache_us_by_method": {
            name: {"us_per_request": 1e6 * spent / requests, "calls_per_request": calls / requests}
            for name, (spent, calls) in sorted(methods.items(), key=lambda item: -item[1][0])
        },
    }


def summarize(runs: dict[str, dict[str, list[dict]]]) -> list[dict]:
    """Per mode and cache: the median of each metric over rounds, and per radix cache the median
    (and range) over rounds of SGLang default's time / its time."""
    rows = []
    for mode, by_cache in runs.items():
        row = {"mode": mode, "caches": {}}
        for name, rounds in by_cache.items():
            medians = {metric: statistics.median(run[metric] for run in rounds) for metric in [*METRICS, *SHOWN_APART]}
            methods = {method for run in rounds for method in run["cache_us_by_method"]}
            medians["cache_us_by_method"] = {
                method: statistics.median(
                    run["cache_us_by_method"].get(method, {"us_per_request": 0.0})["us_per_request"] for run in rounds
                )
                for method in methods
            }
            row["caches"][name] = medians
        for name in by_cache:
            events = name.endswith(WITH_EVENTS)
            baseline = BASELINE + WITH_EVENTS if events else BASELINE
            for metric in ("outside_forward_ms", "cache_ms"):
                if name != baseline:
                    spread = harness.ratios(
                        [run[metric] for run in by_cache[baseline]], [run[metric] for run in by_cache[name]]
                    )
                    row["caches"][name][f"{metric}_ratio"] = spread["speedup"]
                    row["caches"][name][f"{metric}_ratio_range"] = [spread["speedup_min"], spread["speedup_max"]]
                if events:  # per round: events on over events off
                    off = by_cache[name.removesuffix(WITH_EVENTS)]
                    costs = [on[metric] / plain[metric] for on, plain in zip(by_cache[name], off, strict=True)]
                    row["caches"][name][f"{metric}_events_cost"] = statistics.median(costs)
        rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    header = (
        f"{'mode':6} {'cache':23} {'outside fwd ms':>15} {'x default':>10} {'cache ms':>9} {'x default':>10} "
        f"{'fwd ms':>7} {'stand-in':>8} {'TTFT p50':>9} {'p99':>7} {'req/s':>6} {'cached':>7}"
    )
    print(header)
    for row in rows:
        for name, cell in row["caches"].items():
            ratios = [
                f"{cell[f'{metric}_ratio']:.2f}x" if f"{metric}_ratio" in cell else ""
                for metric in ("outside_forward_ms", "cache_ms")
            ]
            print(
                f"{row['mode']:6} {name:23} {cell['outside_forward_ms']:15.3f} {ratios[0]:>10} "
                f"{cell['cache_ms']:9.3f} {ratios[1]:>10} {cell['forward_ms']:7.2f} {cell['stand_in_kernels_ms']:8.2f} "
                f"{cell['ttft_p50_ms']:9.1f} "
                f"{cell['ttft_p99_ms']:7.1f} {cell['requests_per_s']:6.1f} {cell['cached_share']:7.1%}"
            )
            if "cache_ms_events_cost" in cell:
                print(
                    f"{'':6} {'':23} events on: outside the forward {cell['outside_forward_ms_events_cost']:.2f}x,"
                    f" in the cache {cell['cache_ms_events_cost']:.2f}x its time without"
                )


def print_methods(rows: list[dict], shown: int = 6) -> None:
    print(f"in the cache, by method: us per request (median over rounds), the {shown} largest")
    for row in rows:
        for name, cell in row["caches"].items():
            largest = sorted(cell["cache_us_by_method"].items(), key=lambda item: -item[1])[:shown]
            print(f"{row['mode']:6} {name:23} " + ", ".join(f"{method} {us:.1f}" for method, us in largest))


def plot(rows: list[dict], path: str) -> None:
    plt = harness.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    parts = (("outside_forward_ms", "scheduler CPU outside the forward"), ("cache_ms", "in the tree cache"))
    for ax, (metric, title) in zip(axes, parts):
        groups = [
            {
                "implementations": {
                    name: {"us_per_request": cell[metric], "speedup": cell.get(f"{metric}_ratio", 1.0)}
                    for name, cell in row["caches"].items()
                }
            }
            for row in rows
        ]
        harness.speedup_bars(ax, groups, list(CACHES), [row["mode"] for row in rows])
        ax.set_ylabel("ms of CPU per request")
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle("SGLang 0.5.23's server on the Mooncake trace (labels: SGLang default's time / each cache's)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--max-blocks", type=int, default=64)
    parser.add_argument("--kv-events", action="store_true", help="also run the default and radix native with events")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--plot", metavar="FILE")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    models = write_models(work / "models")
    count = args.warm + args.requests
    trace = trace_prompts(TRACE, count, VOCAB, block_tokens=args.block_tokens, max_blocks=args.max_blocks)
    warm, prompts = trace[: args.warm], trace[args.warm :]
    tokens = sum(map(len, trace))
    print(f"{harness.cpu_model()}, Python {platform.python_version()}, logs in {work}")
    print(f"{len(warm)} + {len(prompts)} timed trace prompts, {tokens} prompt tokens, concurrency {args.concurrency}")
    pool = 2 * args.concurrency * (args.block_tokens * args.max_blocks + args.new_tokens) + tokens
    names = list(CACHES) + (EVENT_RUNS if args.kv_events else [])
    runs: dict[str, dict[str, list[dict]]] = {mode: {name: [] for name in names} for mode in MODES}
    for round_index in range(args.rounds):
        for mode, speculative in MODES.items():
            for name in harness.rotated(names, round_index):
                events = ("--kv-events-config", EVENTS_CONFIG) if name.endswith(WITH_EVENTS) else ()
                config = ServerConfig(
                    CACHES[name.removesuffix(WITH_EVENTS)],
                    max_total_tokens=pool,
                    max_running_requests=args.concurrency,
                    speculative=speculative,
                    flags=events,
                )
                result = run_one(config, models, warm, prompts, args, work)
                runs[mode][name].append(result)
                print(
                    f"round {round_index + 1} {mode:5} {name:23} "
                    + json.dumps({k: round(v, 4) for k, v in result.items() if isinstance(v, float)})
                )
    rows = summarize(runs)
    print_table(rows)
    print_methods(rows)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "runs": runs}, indent=1))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
