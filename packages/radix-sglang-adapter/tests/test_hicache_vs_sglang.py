"""The ``radix`` backend with HiCache against SGLang's own cache with HiCache, at the scheduler's level.

The same random stream of requests runs on two CPU "servers" (``scheduler_harness``) with a host
tier twice their small device pool, so that prefixes are evicted to the host and loaded back:
one on SGLang's UnifiedRadixCache (on its Rust TreeCore, its default, and on its Python one), one
on ``RadixCoreHiCache``. Both run SGLang's cache controller and host pool,
copying real KV (SGLang's ``direct`` io backend, on the CPU through the test shims). After every
step both must agree on each arrival's device prefix and what it loaded back, every live
request's KV row and the tokens its KV holds, the device allocator's free slots (in order), the
host pool's used slots, and the sizes.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_testing import sglang_harness as sg

if not sg.HAS_CHECKPOINT:
    pytest.skip("the backend serves SGLang 0.5.22+ (tested on 0.5.23)", allow_module_level=True)

from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.registry import create_tree_cache  # noqa: E402

from radix_sglang_adapter.backend.factory import build_cache  # noqa: E402
from radix_sglang_adapter.backend.hicache import RadixCoreHiCache  # noqa: E402
from radix_sglang_adapter.backend.refusals import tree_core_route  # noqa: E402
from radix_testing import scheduler_harness as sh  # noqa: E402  (SGLang 0.5.22+ modules)
from radix_testing.backend_fixtures import python_store_only  # noqa: E402
from radix_testing.request_streams import MAX_LIVE, SEGMENTS, play, prompts  # noqa: E402

pytestmark = python_store_only

operations = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), prompts, st.sampled_from([8, 16, 40, 1000])),
        st.tuples(st.just("step"), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("step"), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("finish"), st.integers(0, 9)),
        st.tuples(st.just("abort"), st.integers(0, 9)),
        st.tuples(st.just("evict"), st.integers(0, 60)),
        st.tuples(st.just("flush")),
    ),
    min_size=10,
    max_size=80,
)
WRITE_POLICIES = ["write_through", "write_through_selective", "write_back"]


def hicache_server_args(write_policy: str, layout: str = "layer_first") -> Any:
    return sh.published_server_args(
        enable_hierarchical_cache=True,
        hicache_ratio=2.0,
        hicache_write_policy=write_policy,
        hicache_io_backend="direct",
        hicache_mem_layout=layout,
    )


def makers(server_args: Any, core: str = "rust") -> list:
    """SGLang's cache with HiCache (on its ``core`` TreeCore) and the backend's, each from SGLang's
    context."""

    def context(params: Any) -> Any:
        return sh.build_context(server_args, params, enable_hierarchical_cache=True, tp_worker=sh.NoForwardWorker())

    def sglangs(params: Any) -> Any:
        params.tree_core_backend = core
        return create_tree_cache(context(params))

    def ours(params: Any) -> Any:
        cache = build_cache(context(params))
        assert isinstance(cache, RadixCoreHiCache)
        return cache

    return [sglangs, ours]


def host_state(server: sh.Server) -> tuple:
    host_pool = server.cache.cache_controller.mem_pool_host.get_pool(PoolName.KV)
    return host_pool.available_size(), host_pool.slot_used.nonzero().flatten().tolist()


def device_total(cache: Any) -> int:
    """Units cached on the device (UnifiedRadixCache answers with its auxiliary units beside them)."""
    total = cache.total_size()
    return total[0] if isinstance(total, tuple) else total


def pool_state(server: sh.Server) -> tuple:
    allocator = server.allocator
    free = allocator.free_pages if server.page_size == 1 else allocator.get_all_free_pages()
    cache = server.cache
    return (free.tolist(), cache.evictable_size(), cache.protected_size(), device_total(cache), host_state(server))


def tokens_of(req: Any) -> list[int]:
    return [*req.origin_input_ids, *req.output_ids][: req.kv.kv_allocated_len]


def run_both(ops: list[tuple], server_args: Any, core: str, page_size: int, is_eagle: bool) -> dict[str, int]:
    """Replays ``ops`` on both servers, comparing them after each step; returns how much of the
    prompts the device served, and the host tier."""
    kv_slots = 512 if page_size > 1 else 448
    servers = [
        sh.Server(make, page_size=page_size, is_eagle=is_eagle, kv_slots=kv_slots, host_tier=True)
        for make in makers(server_args, core)
    ]
    theirs, ours = servers
    live: list[tuple] = []
    seen = {"matched": 0, "loaded_back": 0}
    for step, (name, *args) in enumerate(ops):
        where = f"step {step}: {name}{tuple(args)!r}"
        if name != "arrive":
            play(servers, live, name, args, where)
        elif len(live) < MAX_LIVE:
            prompt, chunk = args
            pair = [server.arrive(prompt, chunk) for server in servers]
            assert (pair[0].prefix_len, pair[0].loaded_back) == (pair[1].prefix_len, pair[1].loaded_back), where
            seen["matched"] += pair[0].prefix_len
            seen["loaded_back"] += pair[0].loaded_back
            live.append(tuple(pair))
        assert pool_state(theirs) == pool_state(ours), where
        for their_req, our_req in live:
            assert theirs.row(their_req) == ours.row(our_req), where
            assert ours.kv_tokens(our_req) == tokens_of(our_req), f"{where}: KV of other tokens"
    return seen


CORES = ["rust", "python"]  # SGLang's TreeCores: its default, and its reference


@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("write_policy", WRITE_POLICIES)
@pytest.mark.parametrize("core", CORES)
def test_request_streams_give_the_same_answers(backend_name, ticking_clock, core, write_policy, page_size, is_eagle):
    with hicache_server_args(write_policy) as server_args:

        @settings(max_examples=30)
        @given(ops=operations)
        def check(ops):
            run_both(ops, server_args, core, page_size, is_eagle)

        check()


def busy_stream() -> list[tuple]:
    """60 requests one after another on six documents, each asked twice in a row (two hits: what
    write_through_selective backs up), then not before the device pool has moved on (evicted to
    the host), then loaded back."""
    documents = [list(range(1000 * number, 1000 * number + 96)) for number in range(6)]
    ops: list[tuple] = []
    for turn in range(60):
        prompt = documents[(turn // 2) % 6] + [100 + turn] * 20
        ops.append(("arrive", prompt, 16))
        ops += [("step", 0, turn % 10)] * 8
        ops.append(("finish" if turn % 5 else "abort", 0))
    return ops


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])  # direct io: what page_first becomes
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("write_policy", WRITE_POLICIES)
@pytest.mark.parametrize("core", CORES)
def test_a_busy_stream_evicts_to_the_host_and_loads_back(
    backend_name, ticking_clock, core, write_policy, page_size, layout
):
    """A long fixed stream, so that the random ones above are known to reach the host tier."""
    with hicache_server_args(write_policy, layout) as server_args:
        seen = run_both(busy_stream(), server_args, core, page_size, False)
    assert seen["matched"] > 300, "prompts were served from the device"
    assert seen["loaded_back"] > 300, "prefixes evicted to the host tier came back from it"


def prompt_boundary_in_a_host_node_stream() -> list[tuple]:
    """Two requests finish after a first chunk, caching ``[0] * 8`` and ``[4] * 5 + [8] * 3``
    (backed up); ``[4] * 5`` then matches 4 units (the last is always computed), the part below is
    evicted to the host, and ``[4] * 5`` finishes after one decoded token: its insert gives the
    host-only node's first two units, ``[4, 8]``, the request's device values, and its prompt
    boundary cuts them in two."""
    return [
        ("arrive", [0] * 17, 8),
        ("finish", 0),
        ("arrive", SEGMENTS[3] + SEGMENTS[5], 8),
        ("finish", 0),
        ("arrive", [4] * 5, 8),
        ("arrive", [0] * 17, 8),
        ("evict", 1),
        ("arrive", [0] * 17, 8),
        ("step", 0, 8),
        ("finish", 0),
    ]


@pytest.mark.parametrize("write_policy", WRITE_POLICIES)
@pytest.mark.parametrize("core", CORES)
def test_an_insert_that_cuts_what_a_host_only_node_took_frees_none_of_it(
    backend_name, ticking_clock, core, write_policy
):
    """Both parts of a host-only node that took a request's device values and was then cut at
    its prompt boundary hold the tree's KV now: freeing either as a duplicate would hand out
    slots the tree still reads."""
    with hicache_server_args(write_policy) as server_args:
        run_both(prompt_boundary_in_a_host_node_stream(), server_args, core, 1, False)


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({}, None),
        ({"hicache_write_policy": "write_back", "hicache_mem_layout": "page_first_direct"}, None),
        ({"speculative_algorithm": "EAGLE"}, "speculative decoding"),
        ({"hicache_storage_backend": "file"}, "L3 storage"),
    ],
)
def test_what_radix_core_hicache_leaves_to_unified_radix_cache_is_named(backend_name, options, refusal):
    """Speculative decoding (HiCache's draft pools) and L3 storage go to SGLang's UnifiedRadixCache
    on radix-core's TreeCore (served end to end in tests/e2e); the rest to RadixCoreHiCache."""
    with sh.published_server_args(enable_hierarchical_cache=True, hicache_io_backend="direct", **options) as args:
        pool, allocator = sh.small_pools(16, 512, kv_pool=True)
        params = sh.cache_params(pool, allocator, 16, False, "lru")
        context = sh.build_context(args, params, enable_hierarchical_cache=True, tp_worker=sh.NoForwardWorker())
        found = tree_core_route(context)
        assert found is None if refusal is None else refusal in found
        if refusal is None:
            assert isinstance(build_cache(context), RadixCoreHiCache)


def test_a_load_back_whose_host_run_is_gone_loads_nothing(backend_name, ticking_clock):
    """Between a request's match and its admission, host eviction may take its host run: it is
    then recomputed (nothing loaded, its device node kept), never an error."""
    with hicache_server_args("write_through") as server_args:
        server = sh.Server(makers(server_args)[1], page_size=16, kv_slots=512, host_tier=True)
        for prompt in ([7] * 96, [8] * 400, [9] * 400):  # the first is backed up, then evicted
            server.finish(server.arrive(prompt, 1000))
        cache = server.cache
        found = cache.match_prefix(MatchPrefixParams(key=sg.key([7] * 96)))
        assert found.host_hit_length == 96
        assert cache.evict_host(10**6) == 496  # every host-only page ([9] * 400 is on the device too)
        req = SimpleNamespace(last_node=found.last_device_node)
        params = InitLoadBackParams(best_match_node=found.best_match_node, host_hit_length=96, req=req)
        assert cache.init_load_back(params) == (0, found.last_device_node)
