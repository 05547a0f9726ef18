"""Replay a request trace through RadixCache: the hit rate a KV capacity and policy give, and the
CPU the cache costs per request.

Requests run one at a time in timestamp order: match the prompt, insert prompt + output (their
token ids as values: no torch needed), then evict, lowest eviction priority first, until at most
``capacity`` units are cached. Units are tokens (bigrams with ``eagle``) in whole pages; the hit
rate is matched units over prompt units.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from ._backend import backend
from .cache import RadixCache
from .key import RadixKey
from .trace import TokenExpander, TraceRequest

__all__ = ["ReplayResult", "replay", "replay_sweep"]

Progress = Callable[[int, int], None]


@dataclasses.dataclass(frozen=True)
class ReplayResult:
    """One replay of a trace at one capacity and policy."""

    capacity: int | None  # units; None: unbounded
    policy: str
    page_size: int
    eagle: bool
    requests: int
    prompt_units: int
    hit_units: int  # prompt units found in the cache: tokens whose KV is not recomputed
    evicted_units: int
    p50_us: float  # CPU time per request (match + insert + evict)
    p99_us: float
    backend: str
    prefix_lengths: tuple[int, ...] = dataclasses.field(repr=False, compare=False)

    @property
    def hit_rate(self) -> float:
        return self.hit_units / self.prompt_units if self.prompt_units else 0.0

    def summary(self) -> dict:
        """The result without the per-request prefix lengths, for JSON."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "prefix_lengths"}
        return {**fields, "hit_rate": self.hit_rate}


def replay(
    requests: Sequence[TraceRequest],
    capacity: int | None = None,
    policy: str = "lru",
    page_size: int = 1,
    eagle: bool = False,
    expander: TokenExpander | None = None,
    progress: Progress | None = None,
) -> ReplayResult:
    """Replays ``requests`` (in timestamp order) on a fresh cache; see the module docstring."""
    if capacity is not None and capacity < 0:
        raise ValueError(f"capacity must be >= 0 units, not {capacity}")
    expander = expander or TokenExpander()
    cache = RadixCache(page_size, eagle, policy)
    evicted = prompt_units = 0
    prefix_lengths, seconds = [], []
    clock = time.perf_counter
    ordered = sorted(range(len(requests)), key=lambda i: requests[i].timestamp)  # stable
    for done, index in enumerate(ordered, 1):
        request = requests[index]
        prompt = expander.prompt(request)
        full = prompt + expander.output(index, request)
        prompt_key = RadixKey(prompt, is_bigram=eagle).page_aligned(page_size)
        start = clock()
        matched = cache.match_prefix(prompt_key, indices=False).prefix_len
        cache.insert(full)
        if capacity is not None:
            excess = cache.evictable_size() + cache.protected_size() - capacity
            if excess > 0:
                evicted += cache.evict(excess)
        seconds.append(clock() - start)
        prefix_lengths.append(matched)
        prompt_units += len(prompt_key)
        if progress is not None:
            progress(done, len(ordered))
    cuts = statistics.quantiles(seconds, n=100) if len(seconds) > 1 else seconds * 99
    return ReplayResult(
        capacity,
        cache.eviction_policy,
        page_size,
        eagle,
        len(ordered),
        prompt_units,
        sum(prefix_lengths),
        evicted,
        cuts[49] * 1e6,
        cuts[98] * 1e6,
        backend().active,
        tuple(prefix_lengths),
    )


def replay_sweep(
    requests: Sequence[TraceRequest],
    capacities: Sequence[int | None],
    policies: Sequence[str],
    page_size: int = 1,
    eagle: bool = False,
    progress: Callable[[str], Progress | None] | None = None,
) -> list[ReplayResult]:
    """One replay per policy and capacity, sharing the expanded tokens."""
    expander = TokenExpander()
    results = []
    for policy in policies:
        for capacity in capacities:
            label = f"{policy}, {'unbounded' if capacity is None else capacity}"
            reporter = progress(label) if progress is not None else None
            results.append(replay(requests, capacity, policy, page_size, eagle, expander, reporter))
    return results


def terminal_progress(label: str, after_seconds: float = 2.0) -> Progress | None:
    """A progress line on stderr for a replay that has run a while; None when stderr is no TTY."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()
    shown = [0.0]

    def report(done: int, total: int) -> None:
        now = time.monotonic()
        if now - started < after_seconds or (now - shown[0] < 0.2 and done < total):
            return
        shown[0] = now
        width = 30
        filled = width * done // total
        end = "\n" if done == total else ""
        sys.stderr.write(f"\r{label}: [{'#' * filled}{'.' * (width - filled)}] {done}/{total} requests{end}")
        sys.stderr.flush()

    return report
