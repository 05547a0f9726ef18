"""WindowedRadixCache (a hybrid model's tree: full values and sliding-window values) on both
backends, rule by rule. Step-by-step equality with SGLang's own TreeCore is tested at the
scheduler's level in radix-sglang-adapter (test_hybrid_vs_sglang.py)."""

from __future__ import annotations

import itertools
from array import array

import pytest

from radix_core import WindowedRadixCache
from radix_core.windows import FreeValue, PublishWindow, RecoverWindowUnderLock
from radix_testing.backend_fixtures import python_store_only

pytestmark = python_store_only


def values(start: int, count: int) -> array:
    return array("q", range(start, start + count))


class Tree:
    """A windowed tree with what it frees recorded; ``insert`` plays the caller's part of a walk
    (every publish carried out: the window value is the full value plus 1000)."""

    def __init__(self, window: int, page_size: int = 1, **options):
        self.freed: list[list[int]] = []
        self.window_freed: list[list[int]] = []
        self.cache = WindowedRadixCache(
            window,
            page_size,
            on_evict=lambda value: self.freed.append(list(value)),
            on_window_evict=lambda value: self.window_freed.append(list(value)),
            clock=itertools.count(1.0).__next__,
            **options,
        )
        self.actions: list = []

    def insert(self, tokens: list[int], value: array, **known):
        actions, done = [], []
        walk = self.cache.insert_window(tokens, value, self.actions, **known)
        while True:
            try:
                next(walk)
            except StopIteration as end:
                result = end.value
                break
            finally:
                done.extend(self.carry_out())
        done.extend(self.carry_out())
        actions.extend(done)
        return result, actions

    def carry_out(self) -> list:
        taken = list(self.actions)
        self.actions.clear()
        for action in taken:
            if isinstance(action, PublishWindow):
                self.cache.set_window_value(action.node, array("q", (v + 1000 for v in action.full_value)))
            elif isinstance(action, RecoverWindowUnderLock):
                self.cache.set_window_value(action.node, array("q", (v + 1000 for v in action.incoming)))
        return taken


def test_a_new_leaf_is_published_one_window_long(backend_name):
    tree = Tree(window=4)
    result, actions = tree.insert(list(range(10)), values(100, 10))
    assert result.prefix_len == 0 and result.adopted == [(0, 10)] and result.adopted_window == [(0, 10)]
    upper, lower = result.last_node.parent, result.last_node
    assert [len(upper.key), len(lower.key)] == [6, 4], "capped at one window: a lock pins no more"
    assert actions == [PublishWindow(upper, upper.value), PublishWindow(lower, lower.value)]
    assert tree.cache.window_lru() == [lower, upper]
    assert tree.cache.window_evictable_size() == 10 and tree.cache.evictable_size() == 10


def test_only_what_the_window_has_not_freed_is_published(backend_name):
    tree = Tree(window=4)
    result, actions = tree.insert(list(range(10)), values(100, 10), window_floor=7)
    tombstone, leaf = result.last_node.parent, result.last_node
    assert len(tombstone.key) == 7 and tree.cache.window_value(tombstone) is None
    assert actions == [PublishWindow(leaf, leaf.value)] and result.adopted_window == [(7, 10)]
    assert tree.cache.match_window(list(range(10))).prefix_len == 0, "3 units of window: not usable"


def test_a_match_needs_a_full_window_since_the_last_tombstone(backend_name):
    tree = Tree(window=4)
    tree.insert(list(range(12)), values(100, 12), window_floor=4)  # [0, 4) tombstoned
    found = tree.cache.match_window(list(range(12)) + [99])
    assert (found.prefix_len, found.hit_len) == (12, 12)
    found = tree.cache.match_window(list(range(6)))  # splits at 6: [4, 6) is 2 units of window
    assert (found.prefix_len, found.hit_len, len(found.deepest.key)) == (0, 6, 2)
    assert found.last_node is tree.cache.root_node


def test_without_gating_a_tombstone_ends_a_usable_match(backend_name):
    tree = Tree(window=4, gates_prefix_match=False)
    tree.insert(list(range(8)), values(100, 8), window_floor=4)
    found = tree.cache.match_window(list(range(8)))
    assert found.prefix_len == 8
    found = tree.cache.match_window(list(range(3)))
    assert found.prefix_len == 3, "the tombstone itself is usable"


def test_a_window_lock_stops_at_its_mark_even_after_splits(backend_name):
    tree = Tree(window=4)
    result, _ = tree.insert(list(range(4)) + list(range(50, 54)), values(100, 8))
    leaf = result.last_node
    mark = tree.cache.lock_window(leaf)
    assert mark is not None and tree.cache.window_protected_size() == 4
    tree.insert(list(range(2)) + [77], values(200, 3))  # splits the upper node above the locked leaf
    assert tree.cache.window_lock_ref(leaf.parent) == 0
    tree.cache.unlock_window(leaf, mark)
    assert tree.cache.window_protected_size() == 0 and tree.cache.window_lock_ref(leaf) == 0
    with pytest.raises(ValueError, match="holds no window lock"):
        tree.cache.unlock_window(leaf, mark)


def test_a_lock_shorter_than_the_window_reaches_the_root(backend_name):
    tree = Tree(window=8)
    result, _ = tree.insert(list(range(6)), values(100, 6))
    assert tree.cache.lock_window(result.last_node) is None
    tree.cache.unlock_window(result.last_node, None)
    assert tree.cache.window_protected_size() == 0


def test_window_eviction_walks_its_lru_skipping_locks(backend_name):
    tree = Tree(window=2)
    first, _ = tree.insert([1, 2, 3, 4], values(100, 4))
    second, _ = tree.insert([1, 2, 7, 8], values(200, 4))
    shared = first.last_node.parent
    lock = tree.cache.lock_window(second.last_node)
    tree.cache.inc_lock_ref(second.last_node)
    tree.cache.start_window_eviction()
    victims = []
    while (node := tree.cache.next_window_victim()) is not None:
        victims.append(node)
        if not tree.cache.is_device_leaf(node):
            tree.cache.tombstone_window(node)
            assert tree.window_freed[-1] == list(node.value)
    assert victims == [first.last_node, shared], "least recent first; the locked leaf is skipped"
    assert tree.cache.window_value(shared) is None and tree.cache.window_value(first.last_node) is not None
    assert tree.cache.evictable_size() == 2, "a device leaf is the caller's to evict whole"
    tree.cache.evict(2)
    assert tree.freed == [[102, 103]] and tree.window_freed == [[100, 101], [102, 103]]
    tree.cache.unlock_window(second.last_node, lock)


def test_an_insert_over_a_tombstone_restores_its_window(backend_name):
    tree = Tree(window=4)
    result, _ = tree.insert(list(range(8)), values(100, 8))
    upper = result.last_node.parent
    tree.cache.start_window_eviction()
    assert tree.cache.next_window_victim() is upper
    tree.cache.tombstone_window(upper)
    again, actions = tree.insert(list(range(8)), values(300, 8))
    assert actions == [
        FreeValue(array("q", range(100, 104)), window_too=False),
        PublishWindow(upper, array("q", range(300, 304))),
        FreeValue(array("q", range(304, 308)), window_too=True),
    ], "the tombstone takes the insert's values; the leaf's are duplicates"
    assert again.adopted == [(0, 4)] and list(upper.value) == list(range(300, 304))


def test_a_locked_tombstone_keeps_its_full_value(backend_name):
    tree = Tree(window=4)
    result, _ = tree.insert(list(range(8)), values(100, 8))
    upper = result.last_node.parent
    tree.cache.start_window_eviction()
    tree.cache.tombstone_window(tree.cache.next_window_victim())
    tree.cache.inc_lock_ref(upper)
    _, actions = tree.insert(list(range(4)), values(300, 4))
    assert actions == [RecoverWindowUnderLock(upper, upper.value, array("q", range(300, 304)))]
    assert list(upper.value) == list(range(100, 104)) and tree.cache.window_value(upper) is not None


def test_duplicates_below_the_window_floor_free_full_slots_only(backend_name):
    tree = Tree(window=4)
    tree.insert(list(range(8)), values(100, 8))
    _, actions = tree.insert(list(range(8)), values(300, 8), prev_prefix_len=2, window_floor=5)
    assert actions == [
        FreeValue(array("q", range(302, 304)), window_too=False),
        FreeValue(array("q", [304]), window_too=False),
        FreeValue(array("q", range(305, 308)), window_too=True),
    ]


def test_an_early_release_tombstones_an_unlocked_leaf(backend_name):
    tree = Tree(window=4)
    result, _ = tree.insert(list(range(4)), values(100, 4))
    leaf = result.last_node
    mark = tree.cache.lock_window(leaf)
    tree.cache.release_window(leaf, mark)
    assert tree.window_freed == [list(leaf.value)]
    assert tree.cache.window_value(leaf) is None and tree.cache.window_size() == 0


def test_bad_arguments_are_refused(backend_name):
    with pytest.raises(ValueError, match="window must be a positive int"):
        WindowedRadixCache(0)
    tree = Tree(window=4)
    result, _ = tree.insert(list(range(4)), values(100, 4))
    with pytest.raises(ValueError, match="has a window value already"):
        tree.cache.set_window_value(result.last_node, values(0, 4))
    tree.cache.start_window_eviction()
    tree.cache.tombstone_window(tree.cache.next_window_victim())
    with pytest.raises(ValueError, match="items for a node of 4 units"):
        tree.cache.set_window_value(result.last_node, values(0, 3))
    with pytest.raises(ValueError, match="no unlocked window value"):
        tree.cache.tombstone_window(result.last_node)
