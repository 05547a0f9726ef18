"""The ``radix`` backend for a hybrid sliding-window model against SGLang's own cache, at the scheduler's level.

SGLang 0.5.23 caches a model with full-attention and sliding-window (SWA) layers in its
UnifiedRadixCache with FULL and SWA components, on its Rust TreeCore by default (its Python one
otherwise); ``--radix-cache-backend radix`` runs the same UnifiedRadixCache on RadixTreeCore over
radix-core's WindowedRadixCache. The same random streams (arrivals with shared prefixes, extra keys,
salts and priorities, chunked prefill with checkpoints, decoding with the window freeing KV behind
each request, early releases of a prefill's window lock, finishing, aborts, explicit FULL and SWA
evictions, flushes) run on two CPU "servers" with SGLang's SWA pools, the SWA pool smaller than
the full one so that window values are tombstoned and evicted. After every step both must agree on
each arrival's prefix, every live request's KV row and how far its window has freed, both
allocators' free slots (in order), the full-to-SWA index mapping, the sizes of both components,
and the KV cache events each recorded (both of SGLang's formats).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_testing import sglang_harness as sg

if not sg.HAS_CHECKPOINT:
    pytest.skip("the backend serves SGLang 0.5.22+ (tested on 0.5.23)", allow_module_level=True)

from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402
from sglang.srt.mem_cache.events import KVCacheEventRecorder  # noqa: E402
from sglang.srt.mem_cache.registry import create_tree_cache  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402

from radix_core import WindowedRadixCache  # noqa: E402
from radix_sglang_adapter.backend.factory import build_cache  # noqa: E402
from radix_sglang_adapter.backend.tree_core import RadixTreeCore  # noqa: E402
from radix_testing import scheduler_harness as sh  # noqa: E402  (SGLang 0.5.22+ modules)
from radix_testing.backend_fixtures import python_store_only  # noqa: E402
from radix_testing.request_streams import MAX_LIVE, SEGMENTS, namespaces, play, prompts  # noqa: E402

pytestmark = python_store_only
SWA = ComponentType.SWA
KV_SLOTS = 512
SWA_SLOTS = 224  # less than the full pool: the window's LRU evicts before full attention's

operations = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), prompts, st.sampled_from([8, 16, 40, 1000]), namespaces, st.integers(0, 2)),
        st.tuples(st.just("step"), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("step"), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("step"), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("finish"), st.integers(0, 9)),
        st.tuples(st.just("abort"), st.integers(0, 9)),
        st.tuples(st.just("evict"), st.integers(0, 60)),
        st.tuples(st.just("evict_window"), st.integers(0, 60)),
        st.tuples(st.just("flush")),
    ),
    min_size=10,
    max_size=80,
)


@pytest.fixture(scope="module", autouse=True)
def server_args():
    with sh.published_server_args() as args:
        yield args


def makers(server_args: Any, core: str) -> list:
    """SGLang's cache of a hybrid SWA model (on its ``core`` TreeCore) and the backend's, each from
    SGLang's context of such a model."""

    def context(params: Any) -> Any:
        return sh.build_context(server_args, params, is_hybrid_swa=True, full_tokens_per_layer=KV_SLOTS)

    def sglangs(params: Any) -> Any:
        params.tree_core_backend = core
        return create_tree_cache(context(params))

    def ours(params: Any) -> Any:
        cache = build_cache(context(params))
        assert isinstance(cache.tree_core, RadixTreeCore) and isinstance(cache.tree_core.tree, WindowedRadixCache)
        return cache

    return [sglangs, ours]


def free_slots(allocator: Any, page_size: int) -> list[int]:
    return (allocator.free_pages if page_size == 1 else allocator.get_all_free_pages()).tolist()


def pool_state(server: sh.Server) -> tuple:
    allocator, cache, page = server.allocator, server.cache, server.page_size
    return (
        free_slots(allocator.full_attn_allocator, page),
        free_slots(allocator.swa_attn_allocator, page),
        allocator.full_to_swa_index_mapping.tolist(),
        cache.full_evictable_size(),
        cache.full_protected_size(),
        cache.swa_evictable_size(),
        cache.swa_protected_size(),
        cache.total_size(),
    )


def coalesced(events: list) -> list:
    """``events`` as SGLang's recorder queues them (consecutive removals, and stores along one chain,
    merged): its Rust TreeCore hands them over unmerged."""
    recorder = KVCacheEventRecorder(enabled=True, page_size=1)
    for event in copy.deepcopy(events):
        recorder.enqueue(event)
    return recorder.take()


def run_both(ops: list[tuple], server_args: Any, core: str, page_size: int, window: int, **params: Any) -> dict:
    """Replays ``ops`` on SGLang's cache and the backend's, comparing them after every step;
    returns how much sharing, eviction of each component and window freeing the stream reached."""
    servers = [
        sh.Server(make, page_size=page_size, kv_slots=KV_SLOTS, sliding_window=window, swa_slots=SWA_SLOTS, **params)
        for make in makers(server_args, core)
    ]
    theirs, ours = servers
    live: list[tuple] = []
    seen = {"matched": 0, "evicted": 0, "window_evicted": 0, "slid": 0, "events": 0}
    for step, (name, *args) in enumerate(ops):
        where = f"step {step}: {name}{tuple(args)!r}"
        cached = theirs.cache.total_size()
        if name == "evict_window":
            evicted = [server.cache.evict(EvictParams(swa_num_tokens=args[0])) for server in servers]
            assert evicted[0] == evicted[1], where
        elif name != "arrive":
            play(servers, live, name, args, where)
        elif len(live) < MAX_LIVE:
            prompt, chunk, (extra_key, salt), priority = args
            pair = [server.arrive(prompt, chunk, extra_key, salt, priority) for server in servers]
            assert pair[0].prefix_len == pair[1].prefix_len, where
            seen["matched"] += pair[0].prefix_len
            live.append(tuple(pair))
        events = coalesced(theirs.cache.take_events())
        assert events == coalesced(ours.cache.take_events()), where
        seen["events"] += len(events)
        after = theirs.cache.total_size()
        seen["evicted"] += max(0, cached[0] - after[0])
        seen["window_evicted"] += max(0, cached[1] - after[1])
        assert pool_state(theirs) == pool_state(ours), where
        for their_req, our_req in live:
            assert theirs.row(their_req) == ours.row(our_req), where
            freed = [req.kv.get_evicted_seqlen(SWA) for req in (their_req, our_req)]
            assert freed[0] == freed[1], where
            seen["slid"] += freed[0]
    return seen


CORES = ["python", "rust"]
WINDOWS = [(1, 4), (1, 32), (16, 16), (16, 40)]  # (page size, window)


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize(("page_size", "window"), WINDOWS, ids=[f"page{p}-window{w}" for p, w in WINDOWS])
def test_hybrid_streams_give_the_same_answers(backend_name, server_args, core, page_size, window, is_eagle):
    """Every eviction policy; with EAGLE the draft model's window is wider: what a request keeps
    behind it is the wider."""
    draft_window = {"draft_swa_window": window + 6} if is_eagle else {}

    @settings(max_examples=15)
    @given(
        ops=operations,
        release=st.booleans(),
        events=st.sampled_from([None, "default", "dynamo"]),
        policy=st.sampled_from(["lru", "lfu", "fifo", "mru", "filo", "priority"]),
    )
    def check(ops, release, events, policy):
        options = {"is_eagle": is_eagle, "release_prefill_window": release, "policy": policy, **draft_window}
        run_both(ops, server_args, core, page_size, window, **options, **(sh.event_params(events) if events else {}))

    check()


def busy_stream() -> list[tuple]:
    """60 requests one after another, prompts sharing prefixes, each decoding past its window,
    every fifth aborted, the window's LRU evicted now and then."""
    ops: list[tuple] = []
    for turn in range(60):
        prompt = SEGMENTS[turn % 3] + SEGMENTS[2 + turn % 5] + [100 + turn] * 20
        ops.append(("arrive", prompt, 16, (None, None), 0))
        ops += [("step", turn, turn % 10)] * 12
        ops.append(("finish" if turn % 5 else "abort", turn))
        if turn % 7 == 6:
            ops.append(("evict_window", 40))
    return ops


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize(("release", "events"), [(False, None), (True, "dynamo")], ids=["kept", "released-events"])
@pytest.mark.parametrize(("page_size", "window"), [(1, 4), (16, 16)], ids=["page1-window4", "page16-window16"])
def test_a_busy_hybrid_stream_shares_evicts_and_slides(
    backend_name, server_args, core, page_size, window, release, events
):
    """A long fixed stream, so that the random ones above are known to reach sharing, both
    components' eviction, KV freed behind the window and events."""
    options = {"release_prefill_window": release, **(sh.event_params(events) if events else {})}
    seen = run_both(busy_stream(), server_args, core, page_size, window, **options)
    assert seen["matched"] > 300, "prompts were served from the cache"
    assert seen["evicted"] > 300, "the full pool ran short and the tree gave KV back"
    assert seen["window_evicted"] > 300, "window values were tombstoned or evicted"
    assert seen["slid"] > 0, "the window freed KV behind decoding requests"
    assert (seen["events"] > 100) == bool(events), "events are recorded only when enabled"
