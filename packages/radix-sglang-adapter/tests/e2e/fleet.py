"""Test-only: the servers the end-to-end suite compares, each run once, and the checks between them.

Every server gets the same request stream (greedy, fixed length). The no-cache server
(``--disable-radix-cache``) is the reference for outputs; SGLang's default cache, with the same
flags, is the reference for ``cached_tokens``; ``--radix-cache-backend radix`` must match both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import workloads

from radix_testing.sglang_server import (
    VOCAB,
    Server,
    ServerConfig,
    cache_impl,
    log_problems,
    radix_core_backend,
    radix_core_tree,
    tree_core,
)

MAX_NEW_TOKENS = 8
LOAD_CLIENTS = 32
LOAD_NEW_TOKENS = 16
DROPPED_EVERY = 4  # every 4th load request is streamed and dropped by its client mid-generation,
DROPPED_NEW_TOKENS = 1000  # asking for more tokens than it can produce before SGLang aborts it
ABORTED = "sglang:num_aborted_requests_total"
LOADED_BACK = "sglang:load_back_tokens_total"  # HiCache: tokens copied back from the host tier
HICACHE = "--enable-hierarchical-cache"
# The cache (and TreeCore) SGLang builds for each test model, by default and with --radix-cache-backend radix.
DEFAULT_CACHE = {"llama": "UnifiedRadixCache", "pure-swa": "PureSWARadixCache", "hybrid-swa": "UnifiedRadixCache"}
RADIX_CACHE = {
    "llama": ("RadixCoreCache", None),
    "pure-swa": ("RadixCorePureSWACache", None),
    "hybrid-swa": ("UnifiedRadixCache", "RadixTreeCore"),
}


@dataclasses.dataclass
class Served:
    """What one server answered, and its whole log."""

    config: ServerConfig
    outputs: list[tuple[int, ...]]
    cached_tokens: list[int]
    load_outputs: dict[int, tuple[int, ...]] | None
    log: str
    aborted: int | None = None
    loaded_back: int | None = None


def serve(server: Server, load: str | None, when_ready: Callable[[], object] = lambda: None) -> Served:
    """The sequential stream, then the load prompts: one after another (``load="sequential"``, the
    reference), or from concurrent clients followed by a flush when idle (``"concurrent"``).
    ``when_ready`` runs once the server is up (the fleet starts the next server then)."""
    config = server.config
    steps = workloads.sequential_stream(VOCAB)
    prompts = workloads.load_prompts(VOCAB)
    outputs: list[tuple[int, ...]] = []
    cached: list[int] = []
    load_outputs = aborted = loaded_back = None
    with server:
        when_ready()
        for _ in steps:
            completion = server.generate(workloads.prompt_of(steps, outputs), MAX_NEW_TOKENS)
            outputs.append(completion.output_ids)
            cached.append(completion.cached_tokens)
        if load == "sequential":
            load_outputs = reference_load(server, prompts)
        elif load == "concurrent":
            load_outputs = run_load(server, prompts)
            server.post("/flush_cache?timeout=60")  # waits for idle; non-200 (an error here) if never
            # SGLang's idle check (strict: a leak is an error) runs before the scheduler sleeps;
            # one more request after it proves the scheduler is still serving.
            server.generate(prompts[0], 1)
            aborted = int(server.metric(ABORTED))
        if HICACHE in config.flags:
            loaded_back = int(server.metric(LOADED_BACK))
    return Served(config, outputs, cached, load_outputs, server.log_text(), aborted, loaded_back)


def reference_load(server: Server, prompts: list[list[int]]) -> dict[int, tuple[int, ...]]:
    """The load prompts one after another, no client dropped: the reference outputs."""
    return {i: server.generate(prompt, LOAD_NEW_TOKENS).output_ids for i, prompt in enumerate(prompts)}


def run_load(server: Server, prompts: list[list[int]]) -> dict[int, tuple[int, ...]]:
    """``prompts`` from LOAD_CLIENTS concurrent clients; the completed requests' outputs."""

    def client(index: int) -> tuple[int, tuple[int, ...] | None]:
        if index % DROPPED_EVERY == DROPPED_EVERY - 1:
            server.generate_and_disconnect(prompts[index], DROPPED_NEW_TOKENS)
            return index, None
        return index, server.generate(prompts[index], LOAD_NEW_TOKENS).output_ids

    with ThreadPoolExecutor(LOAD_CLIENTS) as pool:
        answers = list(pool.map(client, range(len(prompts))))
    return {index: output for index, output in answers if output is not None}


def hicache_route(config) -> tuple[str, str | None]:
    """The cache (and TreeCore) ``--radix-cache-backend radix`` serves a HiCache server on:
    RadixCoreHiCache; with speculative decoding or L3 storage, which it leaves to SGLang's
    UnifiedRadixCache, that cache on radix-core's TreeCore."""
    if config.speculative or "--hicache-storage-backend" in config.flags:
        return "UnifiedRadixCache", "RadixTreeCore"
    return "RadixCoreHiCache", None


def cache_name(impl: str | None, core: str | None) -> str:
    return f"{impl}" if core is None else f"{impl} over {core}"


def disagreements(served: Served, reference: Served, default_twin: Served | None) -> list[str]:
    """Everything wrong with ``served``: log problems, the wrong cache, outputs unlike the no-cache
    server's, cached tokens unlike SGLang's default cache's (for a radix server)."""
    config = served.config
    found = [f"log: {line}" for line in log_problems(served.log)]
    impl = cache_impl(served.log)
    hicache = HICACHE in config.flags
    if config.cache.startswith("radix-"):
        built, wanted = (impl, tree_core(served.log)), hicache_route(config) if hicache else RADIX_CACHE[config.model]
        if built != wanted:
            found.append(f"SGLang built {cache_name(*built)}, not {cache_name(*wanted)}")
        elif not hicache and radix_core_tree(served.log) != config.radix_core_tree:
            found.append(
                f"radix-core's cache ran on the {radix_core_tree(served.log)} tree, not {config.radix_core_tree}"
            )
        expected_backend = config.cache.removeprefix("radix-")
        if radix_core_backend(served.log) != expected_backend:
            found.append(f"radix-core ran {radix_core_backend(served.log)}, not {expected_backend}")
        if default_twin is None and not any(served.cached_tokens):
            found.append("no request was served from the cache")
    elif config.cache == "default" and impl != DEFAULT_CACHE[config.model]:
        found.append(f"SGLang's default cache is {impl}, not {DEFAULT_CACHE[config.model]}")
    found += [
        f"request {i}: output {got} != no-cache {want}"
        for i, (got, want) in enumerate(zip(served.outputs, reference.outputs, strict=True))
        if got != want
    ]
    if default_twin is not None:
        found += [
            f"request {i}: cached_tokens {got} != SGLang default's {want}"
            for i, (got, want) in enumerate(zip(served.cached_tokens, default_twin.cached_tokens, strict=True))
            if got != want
        ]
        if served.loaded_back != default_twin.loaded_back:
            found.append(
                f"{served.loaded_back} tokens loaded back from the host, SGLang default {default_twin.loaded_back}"
            )
    if served.load_outputs is not None:
        dropped = len(reference.load_outputs) - len(served.load_outputs)
        if served.aborted is not None and served.aborted < dropped:
            found.append(f"{dropped} clients disconnected, SGLang aborted {served.aborted} requests")
        found += [
            f"load request {i}: output {got} != no-cache {reference.load_outputs[i]}"
            for i, got in sorted(served.load_outputs.items())
            if got != reference.load_outputs[i]
        ]
    return found
