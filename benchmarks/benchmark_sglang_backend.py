"""SGLang's tree caches on real traffic: its default, its RadixCache, and ``--radix-cache-backend radix``.

Replays a Mooncake-format trace (default: the bundled synthetic trace, first ``--requests``) one
request at a time through the calls SGLang 0.5.23's scheduler makes on its tree cache, with
SGLang's own ``Req``, ``ReqToTokenPool`` and cache functions on the CPU:

    admission   Req.init_next_round_input (match) + lock + prefix_device_indices
    prefill     chunks of --chunk tokens; checkpoint_kv_cache between chunks
    allocation  evict_from_tree_cache before every allocation (eviction to the KV capacity)
    finish      release_kv_cache(checkpoint=True)

Two clocks (gc on, torch on 1 thread), neither counting slot allocation and row writes:
- in the cache: the time inside the cache's methods called by those steps (match_prefix, lock,
  checkpoint, evict_for_alloc, free_kv_row, unlock, ...), nested calls counted once, less what
  the timing probe records for a method that does nothing (measured at start, printed);
- scheduler path: the whole steps, SGLang's request bookkeeping around the calls included (copying
  fill ids, reading its config): the same for every cache, so it narrows every ratio.
Under each backend, its in-the-cache time by method, SGLang's inherited methods marked ``*`` (one
of SGLang's around one of ours, e.g. ``evict_for_alloc`` around ``evict``, counts as SGLang's).
KV slots come from a CPU stand-in for SGLang's allocator that frees in O(1): on a GPU server a
free is a device-side tensor op, while on this CPU SGLang's torch.cat of a million-slot free list
would be most of the clock, identically for every cache.

Caches, each on a fresh pool per replay, in rotating order every round:
- SGLang default: what create_tree_cache() builds without the flag (UnifiedRadixCache, Rust TreeCore)
- SGLang RadixCache: SGLang's Python radix tree
- radix native / radix pure: what ``--radix-cache-backend radix`` builds, radix-core native (its
  RadixCache on radix-native's tree, the default) / Python
- radix native, Python tree: the same on radix-native's kernels with ``RADIX_CORE_TREE=python``

Cells: EAGLE on and off x KV capacities (unbounded, 1M, 200k tokens), LRU. Every cache must give
the same prefix length to every request (else the run fails). Targets are checked on the
in-the-cache clock; the scheduler-path ratios are printed beside them.

``--hybrid-window N``: instead, a hybrid model's caches (one full-attention and one sliding-window
layer, window N, its SWA pool 80% of the full one): SGLang's default (UnifiedRadixCache with FULL
and SWA on its Rust TreeCore) and the backend (the same UnifiedRadixCache on radix's TreeCore,
radix-core native and pure), each decoding request's window freeing the SWA KV behind it once its
output is in (``evict_sliding_windows``, in the clock). Cells: EAGLE on and off x 1M and 200k tokens.

``--kv-events``: SGLang's default cache and radix native also run with KV cache events on
(``--kv-events-config``), interleaved with their events-off runs, the events taken after every
request as the scheduler's publisher takes them after every batch (inside the clock; the
publisher's serialization runs on its own thread, outside the scheduler's).

The same path with HiCache on is benchmark_hicache.py's question (``--layer cache``), which
replays it with this module's ``replay``.

    python benchmarks/benchmark_sglang_backend.py [--requests N] [--rounds R] [--kv-events]
                                                  [--check] [--json FILE]
"""

from __future__ import annotations

import atexit
import collections
import gc
import statistics
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from radix_testing import sglang_server_shims  # test-only: SGLang imports on CPU, and HiCache's host tier runs there

REPO = Path(__file__).resolve().parents[1]

sglang_server_shims.install()

import harness  # noqa: E402
import torch  # noqa: E402
from benchmark_direct import arrays, memory_floor  # noqa: E402  (one definition of the floor)
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req  # noqa: E402
from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache, evict_from_tree_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.mem_cache.registry import create_tree_cache, get_radix_cache_factory  # noqa: E402
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

import radix_sglang_adapter  # noqa: E402
from radix_testing import scheduler_harness as sh  # noqa: E402
from radix_testing.backends import python_reference_only, tree_by_default  # noqa: E402

BASELINE = "SGLang default"
CAPACITIES = {"unbounded": None, "1M": 1_000_000, "200k": 200_000}
# implementation -> minimum speedup over SGLang's default cache, in every cell
TARGETS = {"radix native": 3.0, "radix pure": None}
NOT_SLOWER_THAN = "SGLang RadixCache"  # the backend, native, must never be slower than this either
WITH_EVENTS = " + events"  # an implementation's name with it: the same cache, KV cache events on
EVENT_RUNS = [BASELINE + WITH_EVENTS, "radix native" + WITH_EVENTS]

Request = tuple[array, array]  # prompt tokens, output tokens


class FreeListAllocator(TokenToKVPoolAllocator):
    """SGLang's token-to-KV allocator with its free list kept as a queue of index tensors, so a free
    costs O(1) on the CPU (see the module docstring). Same slots handed out, same counts."""

    def clear(self) -> None:
        self._chunks: collections.deque[torch.Tensor] = collections.deque([torch.arange(1, self.size + 1)])
        self._available = self.size
        self.free_group = None
        self.release_pages = torch.empty((0,), dtype=torch.int64)

    def available_size(self) -> int:
        return self._available

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > self._available:
            return None
        parts = []
        while need_size:
            chunk = self._chunks[0]
            take = min(need_size, len(chunk))
            parts.append(chunk[:take])
            if take == len(chunk):
                self._chunks.popleft()
            else:
                self._chunks[0] = chunk[take:]
            need_size -= take
        self._available -= sum(len(part) for part in parts)
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def free(self, free_index: torch.Tensor) -> None:
        if free_index.numel():
            self._chunks.append(free_index.to(torch.int64, copy=True))  # rows get rewritten: copy
            self._available += free_index.numel()


class TimedCache:
    """What the scheduler's functions get instead of the cache: the same object, its methods
    timed, in all and by name. The cache's calls to its own methods go around this, so nothing is
    counted twice. ``cache_seconds()`` leaves out what the probe itself records for a call that
    does nothing."""

    def __init__(self, cache: Any):
        self._cache = cache
        self.seconds = 0.0
        self.calls = 0
        self.by_method: collections.Counter[str] = collections.Counter()

    def cache_seconds(self) -> float:
        return self.seconds - self.calls * PROBE_SECONDS

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._cache, name)
        if not callable(found):
            return found

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return found(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                self.seconds += spent
                self.calls += 1
                self.by_method[name] += spent - PROBE_SECONDS

        setattr(self, name, timed)  # made once per method: later look-ups skip __getattr__
        return timed


def probe_seconds() -> float:
    """What TimedCache records for one call of a method that does nothing."""
    return harness.probe_seconds(TimedCache)


PROBE_SECONDS = 0.0  # set by main() before any replay


def default_cache(context: Any) -> Any:
    cache = create_tree_cache(context)
    core = type(getattr(cache, "tree_core", None)).__name__
    assert core.startswith("Rust"), f"SGLang's default cache runs {core}, not its Rust TreeCore"
    return cache


def backend_cache(context: Any) -> Any:
    return get_radix_cache_factory(radix_sglang_adapter.BACKEND_NAME)(context)


IMPLEMENTATIONS: dict[str, Callable[[Any], Any]] = {
    BASELINE: default_cache,
    "SGLang RadixCache": lambda context: RadixCache(context.params),
    "radix native": backend_cache,
    "radix native, Python tree": backend_cache,
    "radix pure": backend_cache,
}
HICACHE_TARGET = 2.0  # radix native over SGLang's default, both with HiCache, in the cache
HYBRID_TARGET = 2.0  # the same, both caching a hybrid sliding-window model
HYBRID_IMPLEMENTATIONS = [BASELINE, "radix native", "radix pure"]
HYBRID_CAPACITIES = ["1M", "200k"]
SWA_SHARE = 0.8  # the SWA pool's size, a share of the full pool's
HOST_RATIO = 2.0  # the host tier holds twice the device pool (--hicache-ratio)
# The device KV pool the host tier is sized and laid out from (its copies move nothing here, see
# host_copies_move_nothing): one layer, one head of 8 fp16 values per token.
KV_SHAPE = {"head_num": 1, "head_dim": 8, "layer_num": 1}


def hybrid_pools(capacity: int) -> tuple[Any, Any]:
    """A hybrid model's KV pools (one full-attention, one sliding-window layer) and SGLang's SWA
    allocator over them, its two free lists the O(1) stand-in's."""
    swa_capacity = int(capacity * SWA_SHARE)
    layers = {"swa_attention_layer_ids": [1], "full_attention_layer_ids": [0]}
    shape = {"head_num": KV_SHAPE["head_num"], "head_dim": KV_SHAPE["head_dim"]}
    kv_pool = SWAKVPool(capacity, swa_capacity, 1, torch.float16, **shape, device="cpu", **layers)
    allocator = SWATokenToKVPoolAllocator(capacity, swa_capacity, 1, torch.float16, "cpu", kv_pool, False)
    allocator.full_attn_allocator = FreeListAllocator(capacity, torch.float16, "cpu", kv_pool.full_kv_pool, False)
    allocator.swa_attn_allocator = FreeListAllocator(swa_capacity, torch.float16, "cpu", kv_pool.swa_kv_pool, False)
    return kv_pool, allocator


class NoForwardWorker:
    """The scheduler's tp_worker as HiCache's set-up sees it: the model's layers would wait on the
    load-back counter; with no forward here, nothing does."""

    def register_hicache_layer_transfer_counter(self, counter: Any) -> None:
        pass


def sglang_wrote(cache_type: type, method: str) -> bool:
    """Whether ``method`` of ``cache_type`` is SGLang's own code (a backend inherits it from
    SGLang's RadixCache): the class that defines it comes from the sglang package (a callable no
    class defines is not counted)."""
    owner = next((klass for klass in cache_type.__mro__ if method in vars(klass)), None)
    return owner is not None and owner.__module__.startswith("sglang.")


def replay(
    implementation: str,
    server_args: Any,
    requests: list[Request],
    eagle: bool,
    capacity: int,
    chunk: int,
    hicache: bool = False,
    window: int | None = None,
):
    """Seconds per request on the scheduler path, inside the cache and inside its TreeCore (none
    for a cache without one), each request's matched prefix (on the device, loaded back from the
    host tier), the seconds per request in each of the cache's methods the scheduler called (and
    which of them SGLang wrote), and the filled cache (alone in a list, so that the caller can
    drop it). ``window``: a hybrid model's, whose sliding-window layer has that window."""
    longest = max(len(prompt) + len(output) for prompt, output in requests)
    pool = ReqToTokenPool(1, longest + 1, "cpu", False)
    kv_pool = None
    hybrid: dict[str, Any] = {}
    if window is not None:
        kv_pool, allocator = hybrid_pools(capacity)
        hybrid = {"is_hybrid_swa": True, "full_tokens_per_layer": capacity}
    else:
        if hicache:
            kv_pool = MHATokenToKVPool(capacity, 1, torch.float16, **KV_SHAPE, device="cpu", enable_memory_saver=False)
        allocator = FreeListAllocator(capacity, torch.float16, "cpu", kv_pool, False)
    cache_name = implementation.removesuffix(WITH_EVENTS)
    events = cache_name != implementation
    options = {"enable_kv_cache_events": events, "sliding_window_size": window}
    params = sh.cache_params(pool, allocator, 1, eagle, "lru", **options)
    worker = NoForwardWorker() if hicache else None
    context = sh.build_context(server_args, params, enable_hierarchical_cache=hicache, tp_worker=worker, **hybrid)
    built = IMPLEMENTATIONS[cache_name](context)
    # With HiCache, a UnifiedRadixCache's calls into its TreeCore are timed too: the share of the
    # cache's time a faster core could win back (the rest is UnifiedRadixCache and its controller).
    tree_core = getattr(built, "tree_core", None) if hicache or window is not None else None
    core = TimedCache(tree_core)
    if tree_core is not None:
        built.tree_core = core
    cache = TimedCache(built)
    clock = time.perf_counter
    seconds, inside, in_core, matched = [], [], [], []
    for number, (prompt, output) in enumerate(requests):
        req = Req(f"r{number}", "", prompt, SamplingParams(max_new_tokens=len(output) + 1))
        cache.seconds, cache.calls = core.seconds, core.calls = 0.0, 0
        start = clock()
        if hicache:  # the scheduler polls the host tier's copies once per step
            cache.check_hicache_events()
        req.init_next_round_input(cache)
        on_device, loaded = req.prefix_len, 0
        if hicache and req.host_hit_length:  # admission loads a host hit back, then the batch starts it
            loaded, req.last_node = cache.init_load_back(
                InitLoadBackParams(best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req)
            )
            req.prefix_len += loaded
            req.kv.cache_protected_len = req.prefix_len
        req.lock = cache.lock(req.last_node)
        if hicache:
            cache.ready_to_load_host_cache()
        prefix = cache.prefix_device_indices(req)
        spent = clock() - start
        matched.append((on_device, loaded))
        pool.alloc([req])
        row = req.kv.req_pool_idx
        pool.write((row, slice(0, req.prefix_len)), prefix)
        while True:  # chunked prefill
            begin, end = req.prefix_len, min(req.prefix_len + chunk, len(prompt))
            req.extend_end = end
            start = clock()
            evict_from_tree_cache(cache, end - begin)
            spent += clock() - start
            pool.write((row, slice(begin, end)), allocator.alloc(end - begin))
            req.kv.kv_allocated_len = req.kv.kv_committed_len = end
            if end == len(prompt):
                break
            start = clock()
            checkpoint_kv_cache(req, cache)
            spent += clock() - start
        start = clock()  # decoding: the output's slots, in one go
        evict_from_tree_cache(cache, len(output))
        spent += clock() - start
        pool.write((row, slice(len(prompt), len(prompt) + len(output))), allocator.alloc(len(output)))
        req.output_ids.extend(output)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = len(prompt) + len(output)
        req.finished_reason = FINISH_LENGTH(len(output))
        start = clock()
        if window is not None:  # the window has moved on: the SWA KV behind it goes (every step, on a server)
            cache.evict_sliding_windows(req, len(prompt) + len(output) - 1)
        release_kv_cache(req, cache, checkpoint=True)
        if events:
            cache.take_events()
        seconds.append(spent + clock() - start)
        inside.append(cache.cache_seconds() - core.calls * PROBE_SECONDS)  # the inner probes too
        if tree_core is not None:
            in_core.append(core.cache_seconds())
    if hasattr(built, "shutdown"):  # what UnifiedRadixCache registers to run at exit would keep it alive till then
        built.shutdown()
        atexit.unregister(built.shutdown)
    methods = {name: spent / len(requests) for name, spent in cache.by_method.most_common()}
    sglang_methods = [name for name in methods if sglang_wrote(type(built), name)]
    del cache, core
    return seconds, inside, in_core, matched, (methods, sglang_methods), [built]


def run_one(
    implementation: str, *args: Any
) -> tuple[list[float], list[float], list[float], list[tuple[int, int]], tuple[dict[str, float], list[str]], list]:
    if implementation.startswith("radix pure"):
        with python_reference_only():
            return replay(implementation, *args)
    if implementation.startswith("radix native, Python tree"):
        with tree_by_default("python"):
            return replay(implementation, *args)
    return replay(implementation, *args)


def warm_up(
    server_args: Any, requests: list[Request], chunk: int, names: list[str], hicache: bool, window: int | None = None
) -> None:
    """Each cache once per mode its cells use, untimed: the process's first touch of fresh memory
    lands on nobody's clock (unbounded, EAGLE off and on, without HiCache; the largest HiCache
    capacity, EAGLE off as in its cells, with it; the largest hybrid one, EAGLE off and on)."""
    capacity = sum(len(prompt) + len(output) for prompt, output in requests) + 1
    if hicache or window is not None:
        capacity = CAPACITIES["1M"]
    for name in names:
        gc.collect()
        for eagle in (False,) if hicache else (False, True):
            run_one(name, server_args, requests, eagle, capacity, chunk, hicache, window)[-1].clear()


def measure(
    server_args: Any,
    requests: list[Request],
    rounds: int,
    chunk: int,
    names: list[str],
    eagle: bool,
    capacity_name: str,
    write_policy: str | None = None,
    floor_stream: list | None = None,
    window: int | None = None,
) -> dict:
    """One cell: every cache in turn, in rotating order each round; ``write_policy`` turns HiCache on,
    ``window`` makes the model a hybrid one. With ``floor_stream`` (each request's prompt, its tokens,
    its KV slots) the memory floor is timed after each round, as bench-anchor times it."""
    hicache = write_policy is not None
    slots = CAPACITIES[capacity_name] or sum(len(prompt) + len(output) for prompt, output in requests) + 1
    floor: list[float] = []

    def one(name: str) -> harness.Replay:
        seconds, inside, in_core, matched, methods, held = run_one(
            name, server_args, requests, eagle, slots, chunk, hicache, window
        )
        clocks = {"seconds": sum(inside) / len(inside), "path": sum(seconds) / len(seconds)}
        if in_core:
            clocks["core"] = sum(in_core) / len(in_core)
        return harness.Replay(clocks, matched, held, {"methods": methods})

    def time_floor(runs: dict[str, harness.Rounds]) -> None:
        gc.collect()
        found = [device + loaded for device, loaded in runs[BASELINE].answers]
        seconds = memory_floor(floor_stream, found, eagle, CAPACITIES[capacity_name])
        floor.append(sum(seconds) / len(seconds))

    runs = harness.interleave(names, one, rounds, after_round=None if floor_stream is None else time_floor)
    per_round = {name: run.clocks["seconds"] for name, run in runs.items()}  # in the cache
    matched_by = {name: run.answers for name, run in runs.items()}
    prompt_tokens = sum(len(prompt) for prompt, _ in requests)
    cell = {
        "eagle": eagle,
        "capacity": capacity_name,
        "hicache": write_policy,
        "hybrid_window": window,
        "same_prefix_lengths": harness.same_answers(runs, BASELINE),
        "hit_rate": sum(device + loaded for device, loaded in matched_by[BASELINE]) / prompt_tokens,
        "host_hit_rate": sum(loaded for _, loaded in matched_by[BASELINE]) / prompt_tokens,
        "implementations": {},
    }
    if floor:
        cell["memory_floor"] = {
            "us_per_request": statistics.median(floor) * 1e6,
            "speedup_bound": harness.ratios(per_round[BASELINE], floor)["speedup"],
        }
    for name, times in per_round.items():
        events_off = per_round.get(name.removesuffix(WITH_EVENTS)) if name.endswith(WITH_EVENTS) else None
        path = harness.timing(runs, name, BASELINE, "path")
        cell["implementations"][name] = {
            **harness.timing(runs, name, BASELINE),
            "path_us_per_request": path["us_per_request"],
            "path_speedup": path["speedup"],
            **runs[name].footprint,
            "methods_us": {method: spent * 1e6 for method, spent in runs[name].detail["methods"][0].items()},
            "sglang_methods": runs[name].detail["methods"][1],
        }
        core_times = runs[name].clocks.get("core")
        if core_times:  # in its TreeCore; and what the cache would cost with a core costing nothing
            cell["implementations"][name]["core_us_per_request"] = statistics.median(core_times) * 1e6
            ceilings = [b / (t - c) for b, t, c in zip(per_round[BASELINE], times, core_times)]
            cell["implementations"][name]["free_core_speedup"] = statistics.median(ceilings)
        if events_off:  # in the cache, per round: events on over events off
            costs = [on / off for on, off in zip(times, events_off)]
            cell["implementations"][name]["events_cost"] = statistics.median(costs)
    print_cell(cell)
    return cell


def cell_name(cell: dict) -> str:
    mode = "EAGLE" if cell["eagle"] else "plain"
    if cell.get("hybrid_window"):
        mode = f"hybrid (window {cell['hybrid_window']}), {mode}"
    return f"{mode}, {cell['capacity']}" + (f", HiCache {cell['hicache']}" if cell["hicache"] else "")


def print_cell(cell: dict) -> None:
    host = f" ({cell['host_hit_rate']:.1%} loaded back from the host tier)" if cell["hicache"] else ""
    print(f"\n{cell_name(cell)}: hit rate {cell['hit_rate']:.1%}{host}", flush=True)
    print(f"  {'':<27} {'in the cache':>29}  {'scheduler path':>24}  {'after the replay: full collection'}")
    for name, v in cell["implementations"].items():
        spread = f"[{v['speedup_min']:.2f}-{v['speedup_max']:.2f}]"
        inside = f"{v['us_per_request']:>7.1f} us {v['speedup']:>5.2f}x {spread}"
        path = f"{v['path_us_per_request']:>7.1f} us {v['path_speedup']:>5.2f}x"
        cost = f"  events on: {v['events_cost']:.2f}x its time without" if "events_cost" in v else ""
        if "core_us_per_request" in v:
            cost = f"  {v['core_us_per_request']:>6.1f} us in its TreeCore ({v['free_core_speedup']:.2f}x if free)"
        gc_cost = f"{v['gc_objects']:>8,} gc objects {v['gc_full_ms']:+.1f} ms"
        print(f"  {name:<27} {inside:>29}  {path:>24}  {gc_cost}{cost}", flush=True)
        if name.startswith("radix"):  # a backend: where its clock goes, SGLang's inherited methods marked
            marked = [(method + "*" * (method in v["sglang_methods"]), us) for method, us in v["methods_us"].items()]
            print(f"  {'':<27} us by method (* SGLang's): " + ", ".join(f"{m} {us:.1f}" for m, us in marked))
    if "memory_floor" in cell:
        floor = cell["memory_floor"]
        print(f"  {'memory floor':<27} {floor['us_per_request']:>7.1f} us {floor['speedup_bound']:>5.2f}x", flush=True)


def verdicts(cells: list[dict]) -> list[tuple[str, bool]]:
    found = []
    for cell in cells:
        where = cell_name(cell)
        found.append((f"{where}: same prefix length for every request", cell["same_prefix_lengths"]))
        results = cell["implementations"]
        targets = TARGETS
        if cell["hicache"] or cell.get("hybrid_window"):
            targets = {"radix native": HYBRID_TARGET if cell.get("hybrid_window") else HICACHE_TARGET}
        for name, minimum in targets.items():
            if minimum is not None:
                got = results[name]["speedup"]
                found.append((f"{where}: {name} {got:.2f}x vs {BASELINE} (target >= {minimum}x)", got >= minimum))
        if NOT_SLOWER_THAN not in results:
            continue
        ours, theirs = results["radix native"]["us_per_request"], results[NOT_SLOWER_THAN]["us_per_request"]
        found.append(
            (f"{where}: radix native not slower than {NOT_SLOWER_THAN} ({theirs / ours:.2f}x)", ours <= theirs)
        )
    return found


def arguments(doc: str | None) -> Any:
    """The options of a replay on the scheduler path."""
    parser = harness.arguments(doc)
    parser.add_argument("--chunk", type=int, default=8192, help="chunked-prefill size in tokens")
    return parser


def start(args: Any) -> list[Request] | None:
    """The environment line, the timing probe and the trace's requests; None without radix-native."""
    radix_sglang_adapter.activate()
    if not harness.native_in_use():
        return None
    global PROBE_SECONDS
    PROBE_SECONDS = probe_seconds()
    print(f"timing probe: {PROBE_SECONDS * 1e9:.0f} ns per call, left out of the in-the-cache clock")
    requests = harness.trace_requests(args.trace, args.requests)
    tokens = sum(len(p) + len(o) for p, o in requests)
    print(f"{Path(args.trace).name}: first {len(requests)} requests, {tokens:,} tokens, chunk {args.chunk}")
    return requests


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--kv-events", action="store_true", help="also run the default and radix native with events")
    parser.add_argument("--hybrid-window", type=int, help="a hybrid sliding-window model's caches, this window")
    args = parser.parse_args()
    names = list(IMPLEMENTATIONS) + (EVENT_RUNS if args.kv_events else [])
    window = args.hybrid_window
    if window is not None:
        names = HYBRID_IMPLEMENTATIONS
    requests = start(args)
    if requests is None:
        return 1
    floor_stream = arrays(requests) if window is None else None  # each request's prompt, tokens, KV slots
    cells = []
    with harness.frozen_heap(), sh.published_server_args() as server_args:
        warm_up(server_args, requests, args.chunk, names, hicache=False, window=window)
        for eagle in (False, True):
            for capacity_name in HYBRID_CAPACITIES if window is not None else CAPACITIES:
                cell = measure(
                    server_args,
                    requests,
                    args.rounds,
                    args.chunk,
                    names,
                    eagle,
                    capacity_name,
                    None,
                    floor_stream,
                    window,
                )
                cells.append(cell)
    print()
    return harness.report(verdicts(cells), {"cells": cells}, args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
