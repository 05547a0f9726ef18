"""SGLang 0.5.10's EAGLE RadixCache paths with radix-sglang-adapter off, on (pure) and on (native).

A scheduler's cache work per request is replayed on SGLang's own RadixCache: match the prompt,
``cache_unfinished_req`` after every 8k-token prefill chunk, then ``cache_finished_req``. Requests
are 8k-34k tokens (shared system prompts, follow-up turns, fresh documents). Two clocks run: the
whole path, and the time spent inside ``convert_to_bigram_key`` (the same timing wrapper wraps
whichever function SGLang calls). Configurations alternate round by round, on fresh caches.

Needs SGLang 0.5.10 (the release that calls convert_to_bigram_key); uses the adapter's test shim
to import on a CPU-only machine.

    python benchmarks/benchmark_sglang_cache_path.py [--check] [--json FILE]
"""

from __future__ import annotations

import importlib.metadata
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from radix_testing import sglang_cpu_shim  # test-only shim: SGLang imports on CPU

sglang_cpu_shim.install()

import harness  # noqa: E402
from sglang.srt.mem_cache import radix_cache  # noqa: E402

import radix_sglang_adapter  # noqa: E402
from radix_testing import sglang_harness as sg  # noqa: E402
from radix_testing.backends import python_reference_only  # noqa: E402

VOCAB = 152_064
CHUNK = 8192
TARGET_CONVERSION_SPEEDUP = 2.2  # adapter on (native) vs off, time inside convert_to_bigram_key


def stream(rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) pairs, every prompt 8k+ tokens."""

    def tokens(n: int) -> list[int]:
        return [rng.randrange(VOCAB) for _ in range(n)]

    systems = [tokens(4096) for _ in range(3)]
    requests: list[tuple[list[int], list[int]]] = []
    for _ in range(36):
        kind = rng.random()
        if kind < 0.4 or not requests:  # a new question on a shared system prompt
            prompt = rng.choice(systems) + tokens(rng.randrange(4096, 12000))
        elif kind < 0.8:  # a follow-up turn of an earlier conversation
            earlier_prompt, earlier_output = rng.choice(requests)
            prompt = earlier_prompt + earlier_output + tokens(rng.randrange(500, 4000))
        else:  # a fresh long document
            prompt = tokens(rng.randrange(8192, 24000))
        requests.append((prompt[:34000], tokens(rng.randrange(200, 1000))))
    return requests


@contextmanager
def conversion_clock() -> Iterator[list[float]]:
    """Times every call SGLang's radix cache makes to convert_to_bigram_key, whatever it is now."""
    current = radix_cache.convert_to_bigram_key
    spent = [0.0]

    def convert_to_bigram_key(tokens):
        start = time.perf_counter()
        result = current(tokens)
        spent[0] += time.perf_counter() - start
        return result

    radix_cache.convert_to_bigram_key = convert_to_bigram_key
    try:
        yield spent
    finally:
        radix_cache.convert_to_bigram_key = current


def serve(requests: list[tuple[list[int], list[int]]]) -> tuple[float, float, list[int]]:
    """(whole-path seconds, seconds inside the conversion, matched lengths) for one fresh cache."""
    width = max(len(p) + len(o) for p, o in requests)
    pool = sg.ReqToTokenPool(rows=1, width=width)
    cache = sg.make_cache(page_size=1, is_eagle=True, pool=pool)
    matched, elapsed = [], 0.0
    with conversion_clock() as in_conversion:
        for prompt, output in requests:
            request = sg.make_request(pool, 0, prompt, output, cache.root_node)
            start = time.perf_counter()
            prefix_len, node, _ = sg.match(cache, prompt)
            cache.inc_lock_ref(node)
            request.last_node = node
            for end in range(CHUNK, len(prompt) + CHUNK, CHUNK):
                request.fill_ids = prompt[:end]
                cache.cache_unfinished_req(request)
            cache.cache_finished_req(request)
            elapsed += time.perf_counter() - start
            matched.append(prefix_len)
    return elapsed, in_conversion[0], matched


def adapter_off(requests):
    radix_sglang_adapter.deactivate()
    return serve(requests)


def adapter_pure(requests):
    radix_sglang_adapter.activate()
    try:
        with python_reference_only():
            return serve(requests)
    finally:
        radix_sglang_adapter.deactivate()


def adapter_native(requests):
    radix_sglang_adapter.activate()
    try:
        return serve(requests)
    finally:
        radix_sglang_adapter.deactivate()


CONFIGS: dict[str, Callable] = {
    "adapter off": adapter_off,
    "adapter on, pure": adapter_pure,
    "adapter on, native": adapter_native,
}


def main() -> int:
    parser = harness.arguments(__doc__, requests=None, rounds=7)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    version = importlib.metadata.version("sglang")
    if not harness.native_in_use(torch_threads=False) or not sg.CALLS_CONVERT:
        print("needs SGLang 0.5.10 (which calls convert_to_bigram_key) and radix-native", file=sys.stderr)
        return 1
    requests = stream(random.Random(args.seed))
    tokens = sum(len(p) + len(o) for p, o in requests)
    print(f"{len(requests)} requests, {tokens:,} tokens, prompts {min(len(p) for p, _ in requests):,}-"
          f"{max(len(p) for p, _ in requests):,} tokens, prefill chunks of {CHUNK}")  # fmt: skip

    def one(name: str) -> harness.Replay:
        whole, inside, matched = CONFIGS[name](requests)
        return harness.Replay({"path": whole / len(requests), "conversion": inside / len(requests)}, matched)

    names = list(CONFIGS)
    with harness.frozen_heap():
        runs = harness.interleave(names, one, args.rounds, footprint=False)

    same = harness.same_answers(runs, "adapter off")
    rows = {}
    print("\nper request, median of rounds; speedup vs adapter off [min-max over rounds]")
    print("| configuration | whole path | speedup | inside convert_to_bigram_key | speedup |")
    print("|---|---|---|---|---|")
    for name in names:
        whole = harness.timing(runs, name, "adapter off", "path")
        inside = harness.timing(runs, name, "adapter off", "conversion")
        rows[name] = {
            "path_ms_per_request": whole["us_per_request"] / 1e3,
            "path_speedup": whole["speedup"],
            "conversion_ms_per_request": inside["us_per_request"] / 1e3,
            "conversion_speedup": inside["speedup"],
        }
        row = rows[name]
        print(
            f"| {name} | {row['path_ms_per_request']:.2f} ms | {row['path_speedup']:.2f}x "
            f"[{whole['speedup_min']:.2f}-{whole['speedup_max']:.2f}] | {row['conversion_ms_per_request']:.2f} ms | "
            f"{row['conversion_speedup']:.2f}x [{inside['speedup_min']:.2f}-{inside['speedup_max']:.2f}] |"
        )
    got = rows["adapter on, native"]["conversion_speedup"]
    verdicts = [
        ("same prefix lengths in every configuration", same),
        (f"time inside the conversion, native adapter: {got:.2f}x (target >= {TARGET_CONVERSION_SPEEDUP}x)",
         got >= TARGET_CONVERSION_SPEEDUP),
    ]  # fmt: skip
    print()
    payload = {"sglang": version, "requests": len(requests), "tokens": tokens, "rows": rows}
    return harness.report(verdicts, payload, args.json, args.check)


if __name__ == "__main__":
    sys.exit(main())
