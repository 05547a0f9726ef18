"""The ``radix`` backend against SGLang's own RadixCache, at the scheduler's level.

The same random stream of requests (arrivals with shared prefixes, chunked prefill with
checkpoints, decoding, finishing, aborts, explicit evictions, a small KV pool that forces eviction)
runs on two CPU "servers" built from SGLang's own Req, ReqToTokenPool, allocator and cache
functions: one with SGLang's RadixCache, one with RadixCoreCache (for a model whose every layer is
sliding-window attention: SGLang's PureSWARadixCache and RadixCorePureSWACache, over SGLang's SWA
pools, the window freeing KV behind each decoding request). After every step both must agree on the
prefix length of each arrival, every live request's KV row, the allocator's free slots (in order),
the evictable, protected and total sizes (and SWA's), and the KV cache events each recorded.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_testing import sglang_harness as sg

if not sg.HAS_CHECKPOINT:
    pytest.skip("the backend serves SGLang 0.5.22+ (tested on 0.5.23)", allow_module_level=True)

from sglang.srt.disaggregation.kv_events import KVEventBatch  # noqa: E402
from sglang.srt.mem_cache.pure_swa_radix_cache import PureSWARadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402

from radix_sglang_adapter.backend.cache import (  # noqa: E402
    RadixCoreCache,
    RadixCorePureSWACache,
    window_freed_from,
)
from radix_testing import scheduler_harness as sh  # noqa: E402  (SGLang 0.5.22+ modules)
from radix_testing.backends import device_path  # noqa: E402
from radix_testing.kv_event_router import Router, cached_blocks  # noqa: E402
from radix_testing.request_streams import MAX_LIVE, SEGMENTS, namespaces, play, prompts  # noqa: E402

operations = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), prompts, st.sampled_from([8, 16, 40, 1000]), namespaces, st.integers(0, 2)),
        st.tuples(st.just("step"), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("step"), st.integers(0, 9), st.integers(0, 9)),
        st.tuples(st.just("finish"), st.integers(0, 9)),
        st.tuples(st.just("abort"), st.integers(0, 9)),
        st.tuples(st.just("evict"), st.integers(-1, 60)),
        st.tuples(st.just("flush")),
    ),
    min_size=10,
    max_size=80,
)


@pytest.fixture(scope="module", autouse=True)
def server_args():
    with sh.published_server_args() as args:
        yield args


def busy_stream(namespaces: list[tuple], flush_every: int | None = None) -> list[tuple]:
    """60 requests one after another, prompts sharing prefixes, namespaces taken in turn, every
    fifth aborted, the cache flushed every ``flush_every`` requests."""
    ops: list[tuple] = []
    for turn in range(60):
        if flush_every and turn and turn % flush_every == 0:
            ops.append(("flush",))
        prompt = SEGMENTS[turn % 3] + SEGMENTS[2 + turn % 5] + [100 + turn] * 20
        ops.append(("arrive", prompt, 16, namespaces[turn % len(namespaces)], 0))
        ops += [("step", turn, turn % 10)] * 8
        ops.append(("finish" if turn % 5 else "abort", turn))
    return ops


def published(events: list) -> bytes:
    """The bytes SGLang's ZMQ publisher sends for a batch of ``events`` (equal events may still
    differ there: an int subclass, a list for a tuple)."""
    return msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=events))


class WindowSafePureSWARadixCache(PureSWARadixCache):
    """SGLang's PureSWARadixCache, its checkpoint keying no KV the window freed. SGLang 0.5.23's
    keys the whole sequence of a request that decoded past its window without a prefill floor,
    slots the window freed included, and frees them again when it evicts them."""

    def checkpoint(self, req, *, up_to):
        super().checkpoint(req, up_to=min(up_to, window_freed_from(req.kv, self.page_size)))


PLAIN = (RadixCache, RadixCoreCache)
PURE_SWA = (WindowSafePureSWARadixCache, RadixCorePureSWACache)  # every layer sliding-window attention


def pool_state(server: sh.Server) -> tuple:
    allocator, cache = server.allocator, server.cache
    if server.sliding_window is not None:
        swa = (cache.swa_evictable_size(), cache.swa_protected_size(), cache.available_and_evictable_str())
        return (allocator.swa_attn_allocator.free_pages.tolist(), *swa, cache.total_size())
    free = allocator.free_pages if server.page_size == 1 else allocator.get_all_free_pages()
    return (free.tolist(), cache.evictable_size(), cache.protected_size(), cache.total_size())


def run_both(
    ops: list[tuple],
    page_size: int,
    is_eagle: bool,
    policy: str,
    watch: Any = None,
    caches: tuple[type, type] = PLAIN,
    **params: Any,
) -> dict[str, int]:
    """Replays ``ops`` on SGLang's cache and on the backend (``caches``), both built with ``params``
    (KV events, a sliding window, ...), calling ``watch(backend_server, events)`` after each step if
    given; returns how much sharing, eviction and events the stream exercised."""
    kv_slots = 512 if page_size > 1 else 448
    servers = [
        sh.Server(make, page_size=page_size, is_eagle=is_eagle, policy=policy, kv_slots=kv_slots, **params)
        for make in caches
    ]
    theirs, ours = servers
    live: list[tuple] = []
    seen = {"matched": 0, "evicted": 0, "events": 0}
    for step, (name, *args) in enumerate(ops):
        where = f"step {step}: {name}{tuple(args)!r}"
        cached_before = theirs.cache.total_size()
        if name != "arrive":
            play(servers, live, name, args, where)
        elif len(live) < MAX_LIVE:
            prompt, chunk, (extra_key, salt), priority = args
            pair = [server.arrive(prompt, chunk, extra_key, salt, priority) for server in servers]
            assert pair[0].prefix_len == pair[1].prefix_len, where
            seen["matched"] += pair[0].prefix_len
            live.append(tuple(pair))
        seen["evicted"] += max(0, cached_before - theirs.cache.total_size())
        events, our_events = theirs.cache.take_events(), ours.cache.take_events()
        assert events == our_events, where
        assert published(events) == published(our_events), where
        seen["events"] += len(events)
        if watch is not None:
            watch(ours, our_events)
        assert pool_state(theirs) == pool_state(ours), where
        for their_req, our_req in live:
            assert theirs.row(their_req) == ours.row(our_req), where
    return seen


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority"])
@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_request_streams_give_the_same_answers(backend_name, ticking_clock, page_size, is_eagle, policy):
    @settings(max_examples=25)
    @given(ops=operations)
    def check(ops):
        run_both(ops, page_size, is_eagle, policy)

    check()


def on_the_device_path(server: sh.Server, events: list) -> None:
    """The backend's tree is radix-native's, its KV indices in a device arena once it has any."""
    tree = server.cache.tree
    store = tree._store
    assert tree.tree_kind == "native" and (store._arena is not None or store._value_kind is None)


@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_on_the_device_path_request_streams_give_the_same_answers(native_tree, ticking_clock, page_size, is_eagle):
    """KV index rows kept in a device arena (RADIX_CORE_DEVICE_TREE=native on a GPU), run here on
    CPU tensors: the same answers, rows, free slots and events."""
    seen = {"matched": 0, "evicted": 0}

    @settings(max_examples=25)
    @given(ops=operations)
    def check(ops):
        with device_path():
            found = run_both(ops, page_size, is_eagle, "lru", watch=on_the_device_path, **sh.event_params("default"))
        seen["matched"] += found["matched"]
        seen["evicted"] += found["evicted"]

    check()
    with device_path():
        busy = run_both(
            busy_stream([(None, None)] * 3 + [("lora-a", None)]), page_size, is_eagle, "lru", watch=on_the_device_path
        )
    assert busy["matched"] > 300 and busy["evicted"] > 300


@pytest.mark.parametrize("event_format", ["default", "dynamo"])
@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_kv_events_are_sglangs_step_by_step(backend_name, ticking_clock, page_size, is_eagle, event_format):
    """Stores, removals and clears, coalesced, with SGLang's hashes in both of its formats: the
    same event list from both caches after every step (extra keys, salts, splits, eviction, locks,
    flushes)."""

    @settings(max_examples=25)
    @given(ops=operations)
    def check(ops):
        run_both(ops, page_size, is_eagle, "lru", **sh.event_params(event_format))

    check()


@pytest.mark.parametrize("event_format", [None, "dynamo"])
@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_a_busy_stream_shares_prefixes_and_evicts(backend_name, ticking_clock, page_size, is_eagle, event_format):
    """A long fixed stream, so that the random ones above are known to reach sharing and eviction."""
    ops = busy_stream([(None, None)] * 3 + [("lora-a", None)])
    seen = run_both(ops, page_size, is_eagle, "lru", **(sh.event_params(event_format) if event_format else {}))
    assert seen["matched"] > 300, "prompts were served from the cache"
    assert seen["evicted"] > 300, "the pool ran short and the tree gave KV back"
    assert (seen["events"] > 100) == bool(event_format), "events are recorded only when enabled"


@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_a_router_rebuilds_the_cache_from_its_events_alone(backend_name, ticking_clock, page_size, is_eagle):
    """What a KV-aware router knows from the Dynamo-format events equals, after every step of a
    long stream in five namespaces with flushes, every page the backend's tree holds."""
    router = Router()

    def watch(server: sh.Server, events: list) -> None:
        for event in events:
            router.apply(event)
        assert router.blocks == cached_blocks(server.cache.tree, page_size)

    ops = busy_stream([(None, None), ("lora-a", None), (None, "salt-1"), ("lora-a", "salt-1"), ("lora-b", "")], 20)
    seen = run_both(ops, page_size, is_eagle, "lru", watch, **sh.event_params("dynamo"))
    assert seen["evicted"] > 300 and seen["events"] > 100


@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_twins_prefilled_side_by_side_give_back_their_duplicates(backend_name, ticking_clock, page_size, is_eagle):
    """Two requests with one prompt, admitted together: each checkpoint of the later one finds KV
    the earlier one already put in the tree, frees its own copy and points its row at the tree's."""
    servers = [
        sh.Server(make, page_size=page_size, is_eagle=is_eagle, kv_slots=1024) for make in (RadixCache, RadixCoreCache)
    ]
    prompt = SEGMENTS[2] + SEGMENTS[6] + SEGMENTS[5]
    twins = [[server.arrive(prompt, 16) for _ in range(2)] for server in servers]
    while servers[0].prefilling(twins[0][1]):
        for server, (first, second) in zip(servers, twins):
            server.step(first, 1)
            server.step(second, 1)
        assert pool_state(servers[0]) == pool_state(servers[1])
        assert [servers[0].row(r) for r in twins[0]] == [servers[1].row(r) for r in twins[1]]
    first, second = twins[1]
    shared = second.kv.cache_protected_len
    rows = servers[1].row(first), servers[1].row(second)
    assert shared >= 32 and rows[0][:shared] == rows[1][:shared], "the later twin points at the earlier one's KV"


def test_what_a_sliding_window_evicted_is_not_cached(backend_name, ticking_clock):
    """SGLang's checkpoint keys only up to kv.swa_evict_floor when a window has evicted the rest."""
    servers = [sh.Server(make, page_size=16, kv_slots=512) for make in (RadixCache, RadixCoreCache)]
    reqs = [server.arrive(SEGMENTS[2] + SEGMENTS[5], 8) for server in servers]
    for server, req in zip(servers, reqs):
        req.kv.swa_evict_floor = 20
        while server.prefilling(req):
            server.step(req, 0)
        server.finish(req)
    assert pool_state(servers[0]) == pool_state(servers[1]) and servers[1].cache.total_size() == 32


@pytest.mark.parametrize("prefill_aware", [False, True], ids=["windowed", "prefill-kept"])
@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
@pytest.mark.parametrize("window", [4, 32])
def test_pure_sliding_window_streams_give_the_same_answers(
    backend_name, ticking_clock, window, is_eagle, prefill_aware
):
    """A model whose every layer is sliding-window attention (page 1, as SGLang's allocator takes):
    the window frees KV behind each decoding request, a prefill-aware model keeps its prefills'.
    With EAGLE the draft model's window is wider: what a request keeps behind it is the wider."""
    draft_window = {"draft_swa_window": window + 6} if is_eagle else {}

    @settings(max_examples=25)
    @given(ops=operations)
    def check(ops):
        swa = {"sliding_window": window, "prefill_aware_swa": prefill_aware, **draft_window}
        run_both(ops, 1, is_eagle, "lru", caches=PURE_SWA, **swa)

    check()


@pytest.mark.parametrize("event_format", [None, "default"])
@pytest.mark.parametrize("prefill_aware", [False, True], ids=["windowed", "prefill-kept"])
@pytest.mark.parametrize("is_eagle", [False, True], ids=["plain", "eagle"])
def test_a_busy_pure_sliding_window_stream_shares_evicts_and_slides(
    backend_name, ticking_clock, is_eagle, prefill_aware, event_format
):
    """A long fixed stream, so that the random ones above are known to reach sharing, eviction and
    KV freed behind the window."""
    slid = []

    def window_frees(server: sh.Server, events: list) -> None:
        slid.extend(req.kv.get_evicted_seqlen(ComponentType.SWA) for req in server.live.values())

    ops = busy_stream([(None, None)] * 3 + [("lora-a", None)])
    params = sh.event_params(event_format) if event_format else {}
    seen = run_both(
        ops, 1, is_eagle, "lru", window_frees, PURE_SWA, sliding_window=4, prefill_aware_swa=prefill_aware, **params
    )
    # Without a prefill floor a request is cached only below what its window freed: less to evict.
    assert seen["matched"] > 300 and seen["evicted"] > (300 if prefill_aware else 50)
    assert max(slid) > 0, "the window freed KV behind decoding requests"
    assert (seen["events"] > 100) == bool(event_format)
