"""RadixCache behaviour, on both backends, with the structural invariants checked throughout."""

from __future__ import annotations

import io
import random
import time
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from radix_core import EVICTION_POLICIES, RadixCache, RadixKey
from radix_testing.cache_invariants import check_invariants
from radix_testing.cache_machine import make_machine
from radix_testing.examples import examples


def test_sglang_example_tree(backend_name):
    cache = RadixCache()
    assert cache.insert([1, 2, 3]).prefix_len == 0
    assert cache.insert([1, 2, 3]).prefix_len == 3
    assert cache.insert([1, 2, 4, 5]).prefix_len == 2
    assert cache.insert([1, 2, 4, 5, 6, 7]).prefix_len == 4
    assert cache.insert([8, 9, 10, 11, 12]).prefix_len == 0
    result = cache.match_prefix([1, 2, 3, 13, 14])
    assert result.prefix_len == 3 and list(result.indices) == [1, 2, 3]
    assert list(result.last_node.key) == [3]
    assert cache.total_size() == 12 == cache.evictable_size()
    check_invariants(cache)


def test_partial_match_splits_the_node_once(backend_name):
    cache = RadixCache()
    cache.insert(list(range(10)), array("q", range(100, 110)))
    result = cache.match_prefix([0, 1, 2, 3, 99])
    assert result.prefix_len == 4 and list(result.indices) == [100, 101, 102, 103]
    assert cache.node_count() == 2 and len(result.last_node.key) == 4
    assert cache.match_prefix(list(range(10))).prefix_len == 10
    check_invariants(cache)


def test_empty_and_unmatched_keys(backend_name):
    cache = RadixCache()
    for key in ([], [5]):
        result = cache.match_prefix(key)
        assert result.prefix_len == 0 and result.last_node is cache.root_node and len(result.indices) == 0
    assert cache.insert([]).prefix_len == 0 and cache.total_size() == 0


def test_eagle_caches_bigrams_and_cuts_the_value(backend_name):
    cache = RadixCache(is_eagle=True)
    assert cache.insert([1, 2, 3, 4], array("q", [10, 20, 30, 40])).prefix_len == 0
    assert cache.total_size() == 3
    result = cache.match_prefix([1, 2, 3, 9])
    assert result.prefix_len == 2 and list(result.indices) == [10, 20]
    assert list(result.last_node.key) == [(1, 2), (2, 3)]
    assert cache.insert([7]).prefix_len == 0 and cache.total_size() == 3, "one token is no bigram"
    assert cache.insert(RadixKey([1, 2, 3], is_bigram=True), array("q", [10, 20])).prefix_len == 2
    check_invariants(cache)


def test_bigram_keys_need_an_eagle_cache():
    with pytest.raises(ValueError, match="is_eagle"):
        RadixCache().insert(RadixKey([1, 2], is_bigram=True))


def test_pages_are_all_or_nothing(backend_name):
    cache = RadixCache(page_size=4)
    assert cache.insert(list(range(10))).prefix_len == 0
    assert cache.total_size() == 8
    assert cache.match_prefix(list(range(7))).prefix_len == 4
    assert cache.match_prefix([0, 1, 2, 3, 4, 5, 9, 9]).prefix_len == 4
    assert cache.insert([0, 1, 2, 3, 4, 5, 9, 9]).prefix_len == 4
    check_invariants(cache)


def test_extra_keys_never_share_nodes(backend_name):
    cache = RadixCache()
    cache.insert(RadixKey([1, 2, 3], extra_key="lora-a"))
    assert cache.match_prefix(RadixKey([1, 2, 3], extra_key="lora-b")).prefix_len == 0
    assert cache.match_prefix(RadixKey([1, 2, 3])).prefix_len == 0
    assert cache.insert(RadixKey([1, 2, 3], extra_key="lora-b")).prefix_len == 0
    assert cache.match_prefix(RadixKey([1, 2], extra_key="lora-a")).prefix_len == 2
    assert len(cache.root_node.children) == 2
    check_invariants(cache)


def test_insert_tells_where_the_key_ends(backend_name):
    cache = RadixCache()
    leaf = cache.insert([1, 2, 3, 4]).last_node
    assert list(leaf.key) == [1, 2, 3, 4]
    again = cache.insert([1, 2])  # ends inside the leaf: splits it, adds nothing
    assert again.prefix_len == 2 and list(again.last_node.key) == [1, 2] and again.last_node.parent is cache.root_node
    assert cache.insert([]).last_node is cache.root_node


def test_a_request_counts_a_hit_only_past_what_it_inserted_before(backend_name):
    """SGLang's InsertParams.inserted_len: re-inserting one's own growing prefix is no new hit."""
    cache = RadixCache(eviction_policy="lfu")
    first = cache.insert([1, 2, 3]).last_node
    assert first.hit_count == 1
    grown = cache.insert([1, 2, 3, 4, 5], inserted_len=3).last_node
    assert (first.hit_count, grown.hit_count) == (1, 1), "the request's own prefix is not hit again"
    cache.insert([1, 2, 3, 4, 5], inserted_len=5)
    assert (first.hit_count, grown.hit_count) == (1, 1)
    cache.insert([1, 2, 3, 9])  # another request
    assert first.hit_count == 2
    check_invariants(cache)


def test_a_value_may_start_where_the_caller_knows_the_key_is_cached(backend_name):
    cache = RadixCache()
    cache.insert([1, 2, 3], array("q", [10, 20, 30]))
    result = cache.insert([1, 2, 3, 4, 5], array("q", [40, 50]), value_offset=3)
    assert result.prefix_len == 3 and list(result.last_node.value) == [40, 50]
    assert list(cache.match_prefix([1, 2, 3, 4, 5]).indices) == [10, 20, 30, 40, 50]
    assert cache.insert([1, 2], array("q"), value_offset=2).prefix_len == 2, "nothing to store"
    with pytest.raises(ValueError, match="only 2 units are cached"):
        cache.insert([1, 2, 7, 8], array("q", [80]), value_offset=3)
    with pytest.raises(ValueError, match="items"):
        cache.insert([1, 2, 3, 4, 6], array("q", [60]), value_offset=3)
    with pytest.raises(ValueError, match="outside"):
        cache.insert([1, 2], array("q", [1, 2, 3]), value_offset=-1)
    assert cache.total_size() == 5
    check_invariants(cache)


def tree_state(cache: RadixCache) -> list:
    """Everything a walk may change, node by node in a fixed order, and the eviction order."""
    state, stack = [], [(cache.root_node, ())]
    while stack:
        node, path = stack.pop()
        keys = sorted(node.children, key=repr)
        state.append((path, list(node.key), list(node.value or []), node.hit_count, node.priority, node.lock_ref))
        state.append(node.last_access_time)
        stack.extend((node.children[k], (*path, repr(k))) for k in keys)
    freed: list = []
    cache.on_evict = freed.append
    cache.evict(10**9)
    return state + [list(v) for v in freed]


@settings(max_examples=examples(200))
@given(
    turns=st.lists(
        st.tuples(st.lists(st.integers(0, 3), max_size=12), st.integers(0, 3), st.booleans(), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    page_size=st.sampled_from([1, 2]),
    is_eagle=st.booleans(),
)
def test_known_paths_and_split_points_leave_the_tree_plain_walks_leave(
    backend_name, monkeypatch, turns, page_size, is_eagle
):
    """A request growing its key turn by turn, then inserting up to its "prompt" end, as SGLang's
    checkpoint does: with known_path, split_at and prefix_priority (both inserts in one call) on
    one cache, with two plain comparing walks on the other. The two trees stay identical, clock,
    hits, priorities and eviction order included."""
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    caches = [RadixCache(page_size, is_eagle, "lfu") for _ in range(2)]
    rng = random.Random(len(turns))
    others = [[rng.randrange(4) for _ in range(rng.randrange(20))] for _ in range(3)]
    for cache in caches:
        for other in others:
            cache.insert(other)
    key: list[int] = []
    last = [cache.root_node for cache in caches]
    done = 0
    for grow, priority, prompt_split, counted_before in turns:
        now[0] += 1
        key += grow
        units = max(len(key) - is_eagle, 0) // page_size * page_size
        inserted_len = done if counted_before else 0
        prompt_units = units // 2 // page_size * page_size if prompt_split and units > page_size else None
        shortcuts = {"known_path": last[0], "split_at": prompt_units}
        if prompt_units is not None:
            shortcuts["prefix_priority"] = priority + 1
        last[0] = caches[0].insert(RadixKey(key), None, priority, inserted_len=inserted_len, **shortcuts).last_node
        last[1] = caches[1].insert(RadixKey(key), None, priority, inserted_len=inserted_len).last_node
        if prompt_units is not None:
            prompt = RadixKey(key, is_bigram=is_eagle)[:prompt_units]
            caches[1].insert(prompt, None, priority + 1, inserted_len=len(prompt))
        for cache in caches:
            check_invariants(cache)
        done = units
    assert tree_state(caches[0]) == tree_state(caches[1])


def test_without_copies_the_tree_keeps_the_value_itself(backend_name):
    torch = pytest.importorskip("torch")
    cache = RadixCache(tree="python")  # the native tree copies values into its own store
    cache.insert([1, 2], torch.tensor([10, 20]))
    made_for_the_tree = torch.tensor([30, 40])
    leaf = cache.insert([1, 2, 3, 4], made_for_the_tree, value_offset=2, copy=False).last_node
    assert leaf.value.data_ptr() == made_for_the_tree.data_ptr()
    copied = torch.tensor([50])
    assert cache.insert([1, 2, 5], copied, value_offset=2).last_node.value.data_ptr() != copied.data_ptr()
    assert cache.match_prefix([1, 2, 3, 4]).indices.tolist() == [10, 20, 30, 40]
    check_invariants(cache)


def test_a_node_keeps_a_window_of_its_keys_array_only_if_it_is_at_least_half_of_it(backend_name):
    cache = RadixCache(tree="python")  # the native tree copies keys into its own store
    cache.insert([1, 2])
    request = array("q", [1, 2, 3, 4])
    assert cache.insert(RadixKey(request)).last_node.key._tokens is request
    long_request = array("q", [1, 2, 7, 8, 9])
    assert cache.insert(RadixKey(long_request, limit=3)).last_node.key._tokens is not long_request
    whole = array("q", range(100, 110))
    leaf = cache.insert(RadixKey(whole)).last_node
    upper = cache.match_prefix([100, 101, 102, 0]).last_node
    assert leaf.key._tokens is whole and upper.key._tokens is not whole, "a split copies the smaller part"
    halves = array("q", range(200, 210))
    leaf = cache.insert(RadixKey(halves)).last_node
    upper = cache.match_prefix([200, 201, 202, 203, 204, 0]).last_node
    assert leaf.key._tokens is halves and upper.key._tokens is halves
    assert cache.match_prefix(list(range(200, 210))).prefix_len == 10
    check_invariants(cache)


def test_each_node_an_insert_adds_is_reported_top_down_and_each_evicted_node_after_its_free(
    backend_name, ticking_clock
):
    reported = []
    cache = RadixCache(
        on_evict=lambda value: reported.append(("free", list(value))),
        on_store=lambda node: reported.append(("store", list(node.key))),
        on_remove=lambda node: reported.append(("remove", list(node.key))),
    )
    cache.insert([1, 2, 3, 4, 5, 6], split_at=2)
    assert reported == [("store", [1, 2]), ("store", [3, 4, 5, 6])]
    reported.clear()
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.match_prefix([1, 2, 3, 9])
    assert reported == [], "cached keys and splits add no node"
    cache.insert([1, 2, 3, 7])
    cache.evict(3)
    assert reported == [("store", [7]), ("free", [4, 5, 6]), ("remove", [4, 5, 6])]


def test_split_points_fall_on_pages():
    with pytest.raises(ValueError, match="page size 2"):
        RadixCache(page_size=2).insert([1, 2, 3, 4, 5], split_at=1)
    cache = RadixCache(page_size=2)
    leaf = cache.insert([1, 2, 3, 4, 5], split_at=2).last_node
    assert list(leaf.key) == [3, 4] and list(leaf.parent.key) == [1, 2] and leaf.parent.parent is cache.root_node


def test_a_prefix_inserted_again_in_the_same_call_outlives_the_rest(backend_name, ticking_clock):
    cache = RadixCache(eviction_policy="priority")
    leaf = cache.insert([1, 2, 3, 4, 5, 6], split_at=2, prefix_priority=1).last_node
    assert list(leaf.key) == [3, 4, 5, 6] and (leaf.priority, leaf.parent.priority) == (0, 1)
    assert leaf.parent.last_access_time > leaf.last_access_time, "inserted again after the rest"
    assert cache.evict(1) == 4 and cache.match_prefix([1, 2, 3]).prefix_len == 2
    for wrong in ({"prefix_priority": 1}, {"split_at": 0, "prefix_priority": 1}):
        with pytest.raises(ValueError, match="prefix_priority needs a split_at"):
            cache.insert([7, 8], **wrong)
    assert cache.match_prefix([7, 8]).prefix_len == 0, "a refused insert changes nothing"
    check_invariants(cache)


def test_touch_marks_a_path_used_as_a_match_would(backend_name, ticking_clock):
    cache = RadixCache(eviction_policy="lru")
    cache.insert([1, 2, 3])
    touched = cache.insert([4, 5, 6]).last_node
    cache.insert([7, 8, 9])
    cache.touch(touched)
    assert touched.last_access_time == cache.root_node.last_access_time
    assert cache.evict(6) == 6 and cache.match_prefix([4, 5, 6]).prefix_len == 3, "the touched leaf goes last"
    check_invariants(cache)
    cache.evict(3)
    with pytest.raises(ValueError, match="not .*in this cache"):
        cache.touch(touched)


def test_match_indices_are_joined_on_first_use_and_equal_path_indices(backend_name):
    cache = RadixCache()
    cache.insert([1, 2, 3], array("q", [10, 20, 30]))
    cache.insert([1, 2, 3, 4, 5], array("q", [10, 20, 30, 40, 50]))
    result = cache.match_prefix([1, 2, 3, 4, 9])
    assert result.prefix_len == 4 and result._parts is not None, "nothing joined yet"
    assert list(result.indices) == [10, 20, 30, 40] and result.indices is result.indices
    assert list(cache.path_indices(result.last_node)) == [10, 20, 30, 40]
    assert len(cache.path_indices(cache.root_node)) == 0
    assert list(cache.path_indices(result.last_node, 1, 3)) == [20, 30], "across the two nodes"
    assert list(cache.path_indices(result.last_node, 3)) == [40] and len(cache.path_indices(result.last_node, 5)) == 0
    for start, stop in ((-1, None), (0, -2)):
        with pytest.raises(ValueError, match="both >= 0"):
            cache.path_indices(result.last_node, start, stop)
    cache.evict(100)
    with pytest.raises(ValueError, match="not .*in this cache"):
        cache.path_indices(result.last_node)


def test_a_match_asked_for_no_indices_changes_the_tree_as_any_match(backend_name, ticking_clock):
    freed: list[list] = [[], []]
    caches = [RadixCache(on_evict=lambda value, i=i: freed[i].append(list(value))) for i in (0, 1)]
    for cache in caches:
        cache.insert([1, 2, 3, 4], array("q", [10, 20, 30, 40]))
        cache.insert([5, 6], array("q", [50, 60]))
    full, bare = caches[0].match_prefix([1, 2, 9]), caches[1].match_prefix([1, 2, 9], indices=False)
    assert (full.prefix_len, list(full.last_node.key)) == (bare.prefix_len, list(bare.last_node.key)) == (2, [1, 2])
    assert list(full.indices) == [10, 20] and bare.indices is None
    assert caches[1].match_prefix([7], indices=False).indices is None
    caches[0].match_prefix([7])
    for cache in caches:  # the same split and access times: the same eviction order
        check_invariants(cache)
        while cache.evict(1):
            pass
    assert freed[0] == freed[1] == [[50, 60], [30, 40], [10, 20]]


def test_locked_nodes_are_never_evicted(backend_name):
    freed = []
    cache = RadixCache(on_evict=freed.append)
    cache.insert([1, 2, 3], array("q", [7, 8, 9]))
    cache.insert([4, 5])
    node = cache.match_prefix([1, 2, 3]).last_node
    assert cache.inc_lock_ref(node) == -3
    assert (cache.evictable_size(), cache.protected_size()) == (2, 3)
    assert cache.evict(100) == 2 and [list(v) for v in freed] == [[4, 5]]
    assert cache.match_prefix([1, 2, 3]).prefix_len == 3
    assert cache.dec_lock_ref(node) == 3
    assert cache.evict(1) == 3 and cache.total_size() == 0
    check_invariants(cache)


def test_a_lock_on_a_split_node_protects_both_parts(backend_name):
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)
    cache.match_prefix([1, 2, 9])  # splits the locked node
    check_invariants(cache)
    assert cache.protected_size() == 4 and cache.evict(10) == 0
    cache.dec_lock_ref(node)
    check_invariants(cache)
    assert cache.evict(10) == 4


def test_bad_unlocks_raise_and_change_nothing(backend_name):
    cache = RadixCache()
    cache.insert([1, 2, 3])
    node = cache.match_prefix([1, 2, 3]).last_node
    with pytest.raises(ValueError, match="not locked"):
        cache.dec_lock_ref(node)
    other = RadixCache()
    other.insert([1, 2, 3])
    with pytest.raises(ValueError, match="not .*in this cache"):
        cache.inc_lock_ref(other.match_prefix([1, 2, 3]).last_node)
    cache.evict(10)
    with pytest.raises(ValueError, match="not .*in this cache"):
        cache.inc_lock_ref(node)
    check_invariants(cache)


def test_a_moved_lock_is_an_unlock_then_a_lock(backend_name):
    moved, stepwise = RadixCache(), RadixCache()
    for cache in (moved, stepwise):
        cache.insert([1, 2, 3, 4, 5, 6])
        cache.insert([1, 2, 3, 7, 8])
        cache.insert([9, 9])
    locks = {}
    for name, cache in (("moved", moved), ("stepwise", stepwise)):
        shallow = cache.match_prefix([1, 2, 3]).last_node
        cache.inc_lock_ref(shallow)
        deep = cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node
        locks[name] = (cache, shallow, deep)
    cache, shallow, deep = locks["moved"]
    delta = cache.move_lock(shallow, deep)
    cache, shallow, deep = locks["stepwise"]
    assert delta == cache.dec_lock_ref(shallow) + cache.inc_lock_ref(deep) == -3
    assert (moved.evictable_size(), moved.protected_size()) == (stepwise.evictable_size(), stepwise.protected_size())
    assert moved.evict(100) == stepwise.evict(100) == 4  # [7, 8] and [9, 9]; the locked path stays
    assert moved.match_prefix([1, 2, 3, 4, 5, 6]).prefix_len == 6


def test_a_bad_moved_lock_raises_and_changes_nothing(backend_name):
    cache = RadixCache()
    cache.insert([1, 2, 3])
    unlocked = cache.match_prefix([1, 2, 3]).last_node
    gone = RadixCache().insert([4]).last_node
    for old, new in ((unlocked, unlocked), (unlocked, gone)):
        with pytest.raises(ValueError):
            cache.move_lock(old, new)
        assert (cache.evictable_size(), cache.protected_size(), unlocked.lock_ref) == (3, 0, 0)
    cache.inc_lock_ref(unlocked)
    with pytest.raises(ValueError):
        cache.move_lock(unlocked, gone)
    assert (cache.evictable_size(), cache.protected_size(), unlocked.lock_ref) == (0, 3, 1)


def test_negative_eviction_counts_are_rejected():
    with pytest.raises(ValueError):
        RadixCache().evict(-1)


@pytest.mark.parametrize("page_size", [0, -1, 1.5, "4"])
def test_bad_page_sizes_are_rejected(page_size):
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(page_size=page_size)


def test_unknown_eviction_policy_names_the_choices():
    with pytest.raises(ValueError, match="lru, lfu, fifo, mru, filo, priority"):
        RadixCache(eviction_policy="random")


def _three_leaves(cache: RadixCache) -> None:
    for first in (1, 2, 3):
        cache.insert([first, 0], priority=10 - first)


@pytest.mark.parametrize(
    "policy, touch, first_victim",
    [("lru", 1, 2), ("mru", 1, 1), ("mru", None, 3), ("fifo", 1, 1), ("filo", None, 3), ("priority", None, 3)],
)
def test_eviction_order_follows_the_policy(backend_name, ticking_clock, policy, touch, first_victim):
    freed = []
    cache = RadixCache(eviction_policy=policy, on_evict=freed.append)
    _three_leaves(cache)
    if touch is not None:
        cache.match_prefix([touch, 0])
    cache.evict(1)
    assert list(freed[0]) == [first_victim, 0]


def test_lfu_evicts_the_least_hit_then_least_recent(backend_name, ticking_clock):
    freed = []
    cache = RadixCache(eviction_policy="lfu", on_evict=freed.append)
    _three_leaves(cache)
    cache.insert([1, 0])
    cache.insert([3, 0])
    cache.evict(1)
    assert list(freed[0]) == [2, 0]


def test_repeated_touches_do_not_grow_the_eviction_heap_without_bound(backend_name):
    cache = RadixCache()
    for first in range(20):
        cache.insert([first, 1, 2])
    for _ in range(5000):
        cache.match_prefix([3, 1, 2])
    heap_size = len(cache._store._heap) if cache.tree_kind == "python" else cache._store._tree.heap_size()
    assert heap_size <= 4 * cache.node_count() + 65
    check_invariants(cache)


def test_values_of_every_kind(backend_name):
    np = pytest.importorskip("numpy")
    for value, joined_type in ((array("q", [5, 6, 7]), array), ([5, 6, 7], list), (np.array([5, 6, 7]), np.ndarray)):
        cache = RadixCache()
        assert len(cache.match_prefix([1]).indices) == 0
        cache.insert([1, 2, 3], value)
        cache.insert([1, 2, 9], value)
        result = cache.match_prefix([1, 2, 3])
        assert type(result.indices) is joined_type and list(result.indices) == [5, 6, 7]
        assert type(cache.match_prefix([4]).indices) is joined_type
        part = cache.path_indices(result.last_node, 1, 3)  # across the split
        assert type(part) is joined_type and list(part) == [6, 7]
        check_invariants(cache)


def test_torch_values_are_cloned_and_joined_with_torch_cat(backend_name):
    torch = pytest.importorskip("torch")
    cache = RadixCache(is_eagle=True)
    value = torch.arange(10, 15)
    cache.insert([1, 2, 3, 4, 5], value)
    value[:] = -1  # the cache keeps its own copy
    result = cache.match_prefix([1, 2, 3, 4, 5])
    assert torch.equal(result.indices, torch.arange(10, 14))
    cache.insert([1, 2, 3, 7], torch.arange(20, 24))  # splits the path at unit 2
    assert torch.equal(cache.path_indices(result.last_node, 1, 3), torch.tensor([11, 12]))
    assert cache.match_prefix([9]).indices.dtype == torch.int64
    with pytest.raises(TypeError):
        cache.insert([1, 2], torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        cache.insert([1, 2], torch.zeros((2, 1), dtype=torch.int64))


@pytest.mark.parametrize(
    "value, error",
    [
        (array("q", [1, 2]), ValueError),
        (array("d", [1.0, 2.0, 3.0]), TypeError),
        ([1, 2.0, 3], TypeError),
        ("abc", TypeError),
        ({1: 2, 3: 4, 5: 6}, TypeError),
    ],
)
def test_bad_values_are_rejected_and_change_nothing(backend_name, value, error):
    cache = RadixCache()
    with pytest.raises(error):
        cache.insert([1, 2, 3], value)
    assert cache.total_size() == 0
    check_invariants(cache)


def test_one_cache_holds_one_kind_of_value():
    cache = RadixCache()
    cache.insert([1, 2], array("q", [1, 2]))
    with pytest.raises(TypeError, match="array values, not list"):
        cache.insert([3, 4], [3, 4])


@pytest.mark.parametrize("bad", [[1.5, 2], ["a"], None, [2**64]])
def test_bad_tokens_are_rejected(bad):
    with pytest.raises((TypeError, ValueError)):
        RadixCache().insert(bad)


def test_pretty_print_shows_the_tree():
    cache = RadixCache()
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    out = io.StringIO()
    cache.pretty_print(file=out)
    text = out.getvalue()
    assert "[1, 2] r=0" in text and "[3] r=0" in text and "#tokens: 4" in text


def test_reset_empties_the_cache():
    cache = RadixCache()
    cache.insert([1, 2, 3])
    cache.reset()
    assert cache.total_size() == 0 and cache.match_prefix([1, 2, 3]).prefix_len == 0
    check_invariants(cache)


# ----- random operation sequences -------------------------------------------------------------


@pytest.mark.parametrize("policy", ["lru", "lfu", "priority"])
@pytest.mark.parametrize("is_eagle", [False, True], ids=["raw", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_random_operation_sequences(backend_name, ticking_clock, page_size, is_eagle, policy):
    run_state_machine_as_test(
        make_machine(page_size, is_eagle, policy),
        settings=settings(max_examples=examples(40), stateful_step_count=40, deadline=None),
    )


@pytest.mark.parametrize("policy", sorted(set(EVICTION_POLICIES) - {"lru", "lfu", "priority"}))
def test_random_operation_sequences_other_policies(backend_name, ticking_clock, policy):
    run_state_machine_as_test(
        make_machine(1, False, policy),
        settings=settings(max_examples=examples(25), stateful_step_count=30, deadline=None),
    )


def test_a_long_random_workload_keeps_the_invariants(backend_name):
    rng = random.Random(7)
    cache = RadixCache(page_size=4, is_eagle=True)
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(1, 300))] for _ in range(30)]
    locked = []
    for step in range(600):
        tokens = rng.choice(prompts)[: rng.randrange(1, 300)] + [rng.randrange(50) for _ in range(rng.randrange(20))]
        op = rng.random()
        if op < 0.5:
            cache.insert(tokens)
        elif op < 0.7:
            locked.append(cache.match_prefix(tokens).last_node)
            cache.inc_lock_ref(locked[-1])
        elif op < 0.85 and locked:
            cache.dec_lock_ref(locked.pop(rng.randrange(len(locked))))
        else:
            cache.evict(rng.randrange(200))
        if step % 50 == 0:
            check_invariants(cache)
    check_invariants(cache)


def test_the_tree_keeps_no_request_array_alive_beyond_its_nodes(backend_name):
    request = array("q", range(1000))
    cache = RadixCache()
    cache.insert(RadixKey(request)[:10])
    (node,) = cache.root_node.children.values()
    assert node.key._tokens is not request and len(node.key._tokens) == 10


def test_a_value_of_the_wrong_length_does_not_set_the_cache_value_kind(backend_name):
    cache = RadixCache()
    with pytest.raises(ValueError):
        cache.insert([1, 2, 3], array("q", [1, 2]))
    cache.insert([1, 2, 3], [7, 8, 9])
    assert cache.match_prefix([1, 2, 3]).indices == [7, 8, 9]


def test_a_split_keeps_the_larger_part_of_a_tensor_value_as_a_view(backend_name):
    torch = pytest.importorskip("torch")
    cache = RadixCache(tree="python")  # the native tree's splits: test_tree.py
    cache.insert(list(range(100)), torch.arange(1000, 1100))
    (node,) = cache.root_node.children.values()
    stored = node.value.untyped_storage().data_ptr()
    upper = cache.match_prefix(list(range(60)) + [-1]).last_node
    lower = upper.children[60]
    assert upper.value.untyped_storage().data_ptr() == stored, "60 of 100: a view"
    assert lower.value.untyped_storage().data_ptr() != stored, "40 of 100: a copy"
    top = cache.match_prefix(list(range(10)) + [-1]).last_node
    assert top.value.untyped_storage().data_ptr() != stored, "10 of a storage of 100: a copy"
    assert top.children[10].value.untyped_storage().data_ptr() == stored, "50 of 100: a view"
    assert torch.equal(cache.match_prefix(list(range(100))).indices, torch.arange(1000, 1100))
    check_invariants(cache)


def test_a_cache_orders_by_the_clock_it_is_given(backend_name):
    """A clock running backwards makes the most recently used entry the oldest: LRU evicts it."""
    readings = iter(range(10_000, 0, -1))
    freed: list[int] = []
    cache = RadixCache(on_evict=freed.extend, clock=lambda: float(next(readings)))
    cache.insert([1, 2, 3])
    cache.insert([7, 8])
    cache.match_prefix([1, 2, 3])
    assert cache.match_prefix([1, 2, 3]).last_node.last_access_time < 10_000
    assert cache.evict(1) == 3
    assert freed == [1, 2, 3]


def test_a_cache_reads_time_monotonic_as_it_is_when_the_cache_is_made(backend_name, monkeypatch):
    made_before = RadixCache()
    monkeypatch.setattr(time, "monotonic", lambda: 42.0)
    assert RadixCache().clock() == 42.0
    assert made_before.clock is not time.monotonic
