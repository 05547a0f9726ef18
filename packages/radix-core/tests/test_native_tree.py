"""RadixCache on radix-native's tree: what only that tree has (the cache tests run on both trees
through ``backend_name``): which tree a cache gets, handles, the garbage collector, and moving to a
Python tree without losing anything."""

from __future__ import annotations

import gc
import logging
import weakref
from array import array

import pytest

from radix_core import RadixCache, RadixKey, TreeNode, _backend
from radix_testing.backends import python_reference_only, tree_by_default
from radix_testing.cache_invariants import check_invariants


def test_which_tree_a_cache_gets(native_tree):
    assert RadixCache(tree="native").tree_kind == "native"
    assert RadixCache(tree="python").tree_kind == "python"
    with_state = type("WithState", (TreeNode,), {"__slots__": ("mine",)})
    assert RadixCache(node_class=with_state, tree="native").tree_kind == "python"
    with pytest.raises(ValueError, match="tree must be one of"):
        RadixCache(tree="rust")
    with tree_by_default("native"):
        assert RadixCache().tree_kind == "native"
        with python_reference_only():
            assert RadixCache().tree_kind == "python"
    with tree_by_default("python"):
        assert RadixCache().tree_kind == "python"


def test_a_filled_cache_adds_no_object_per_node_to_the_garbage_collectors_walk(native_tree):
    gc.collect()
    before = len(gc.get_objects())
    cache = RadixCache(page_size=1, tree="native")
    for request in range(500):
        cache.insert(array("q", [request % 7, request % 11, request, request + 1, request * 3]))
    assert cache.node_count() > 500
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_one_handle_per_node_while_held_and_none_after(native_tree):
    cache = RadixCache(tree="native")
    last = cache.insert([1, 2, 3]).last_node
    assert cache.match_prefix([1, 2, 3]).last_node is last
    assert cache.root_node.children[1] is last and last.parent is cache.root_node
    assert (last.key, list(last.value), last.lock_ref) == (RadixKey([1, 2, 3]), [1, 2, 3], 0)
    cache.reset()
    with pytest.raises(ValueError, match="not \\(or no longer\\) in this cache"):
        cache.inc_lock_ref(last)
    with pytest.raises(ValueError, match="not \\(or no longer\\) in this cache"):
        _ = last.key
    with pytest.raises(ValueError, match="not \\(or no longer\\) in this cache"):
        cache.inc_lock_ref(RadixCache(tree="python").insert([1]).last_node)


def test_removed_nodes_keep_their_key_value_and_page_hashes(native_tree):
    removed: list[TreeNode] = []
    cache = RadixCache(page_size=2, on_remove=removed.append, tree="native")
    node = cache.insert(RadixKey([1, 2, 3, 4], extra_key="tenant")).last_node
    node.page_hashes = ["a", "b"]
    upper = cache.match_prefix(RadixKey([1, 2, 9, 9], extra_key="tenant")).last_node
    assert (upper.page_hashes, node.page_hashes) == (["a"], ["b"]), "a split cuts them with the node"
    assert cache.evict(4) == 4
    assert [(n.key, list(n.value), n.page_hashes, n.parent) for n in removed] == [
        (RadixKey([3, 4], extra_key="tenant"), [3, 4], ["b"], None),
        (RadixKey([1, 2], extra_key="tenant"), [1, 2], ["a"], None),
    ]


def test_values_it_cannot_hold_give_a_python_tree_while_empty(native_tree, caplog):
    cache = RadixCache(tree="native")
    with caplog.at_level(logging.WARNING, logger="radix_core"):
        cache.insert([1, 2], [10, 2**70])
    assert cache.tree_kind == "python" and not caplog.records
    assert cache.match_prefix([1, 2]).indices == [10, 2**70]


@pytest.mark.parametrize("kind", ["array", "numpy", "torch"])
def test_int32_values_are_held_as_int64_in_one_copy(native_tree, kind):
    """SGLang's KV index rows are int32: the tree widens them as it copies, no conversion first."""

    def int32(items: list[int]):
        if kind == "array":
            return array("i", items)
        if kind == "numpy":
            return pytest.importorskip("numpy").array(items, dtype="int32")
        torch = pytest.importorskip("torch")
        return torch.tensor(items, dtype=torch.int32)

    row = int32([7, -8, 2**31 - 1, 5])
    cache = RadixCache(tree="native")
    cache.insert([1, 2, 3, 4], row[:4])
    row[0] = 0  # the tree holds a copy, not the caller's row
    cache.insert([1, 2, 9], int32([7, -8, 6]))
    assert cache.tree_kind == "native"
    found = cache.match_prefix([1, 2, 3, 4]).indices
    assert [int(v) for v in found] == [7, -8, 2**31 - 1, 5]
    check_invariants(cache)


def test_a_later_value_it_cannot_hold_moves_the_tree_to_python_with_nothing_lost(native_tree, caplog):
    np = pytest.importorskip("numpy")
    freed: list = []
    cache = RadixCache(eviction_policy="lru", on_evict=freed.append, tree="native")
    locked = cache.insert([1, 2, 3], np.array([10, 20, 30], dtype=np.uint64)).last_node
    cache.insert([1, 2, 4], np.array([10, 20, 40], dtype=np.uint64))
    cache.inc_lock_ref(locked)
    with caplog.at_level(logging.WARNING, logger="radix_core"):
        cache.insert([5], np.array([2**63], dtype=np.uint64))
    assert cache.tree_kind == "python" and "moves its tree to Python" in caplog.text
    assert _backend.backend().active == "native", "an odd value is no native failure"
    assert list(cache.match_prefix([1, 2, 3]).indices) == [10, 20, 30]
    assert list(cache.match_prefix([5]).indices) == [2**63]
    assert (cache.evictable_size(), cache.protected_size(), cache.node_count()) == (2, 3, 4)
    assert cache.dec_lock_ref(locked) == 3, "handles given out before resolve to the rebuilt nodes"
    assert locked.lock_ref == 0 and list(locked.value) == [30]
    check_invariants(cache)
    assert cache.evict(10) == 5 and sorted(int(v) for value in freed for v in value) == [10, 20, 30, 40, 2**63]


def test_after_a_move_an_evicted_node_no_handle_holds_is_released(native_tree):
    np = pytest.importorskip("numpy")
    cache = RadixCache(eviction_policy="lru", tree="native")
    cache.insert([1, 2, 3], np.array([10, 20, 30], dtype=np.uint64))
    held = cache.insert([1, 2, 4], np.array([10, 20, 40], dtype=np.uint64)).last_node
    cache.insert([5], np.array([2**63], dtype=np.uint64))  # moves the tree to Python
    assert cache.tree_kind == "python"
    rebuilt = cache.match_prefix([1, 2, 3]).last_node  # a Python node: no handle was given out for it
    value = weakref.ref(rebuilt.value)
    del rebuilt
    assert cache.evict(10) == 5
    gc.collect()
    assert value() is None, "nothing but the tree held that node, and the tree evicted it"
    assert held.value.tolist() == [40], "a handle given out before the move still reads its node"


def test_a_failing_native_tree_moves_to_python_once_and_keeps_serving(native_tree, monkeypatch, caplog):
    failures: list[str] = []
    monkeypatch.setattr(_backend, "_native_failed", lambda kernel, reason: failures.append(f"{kernel}: {reason}"))
    cache = RadixCache(tree="native")
    held = cache.insert([1, 2, 3]).last_node
    cache.inc_lock_ref(held)

    monkeypatch.setattr(cache._store, "_tree", _MatchRaises(cache._store._tree))
    with caplog.at_level(logging.WARNING, logger="radix_core"):
        result = cache.match_prefix([1, 2, 3, 4])
    assert result.prefix_len == 3 and list(result.indices) == [1, 2, 3]
    assert cache.tree_kind == "python" and failures == ["tree: match raised RuntimeError: arena corrupted"]
    assert caplog.text.count("moves its tree to Python") == 1
    assert cache.protected_size() == 3 and cache.dec_lock_ref(held) == 3
    check_invariants(cache)


class _MatchRaises:
    """A native tree whose match raises, as a broken kernel would."""

    def __init__(self, tree):
        self.tree = tree

    def match(self, *args):
        raise RuntimeError("arena corrupted")

    def __getattr__(self, name):
        return getattr(self.tree, name)


def test_namespaces_are_forgotten_with_their_last_node(native_tree):
    cache = RadixCache(tree="native")
    for salt in range(50):
        cache.insert(RadixKey([1, 2, 3], extra_key=f"salt-{salt}"))
        assert cache.match_prefix(RadixKey([1, 2], extra_key=f"other-{salt}")).prefix_len == 0
    cache.insert([1, 2])
    assert len(cache._store._namespaces) == 51
    cache.evict(150)
    assert (
        cache._store._namespaces == {None: 0} and cache.match_prefix(RadixKey([1], extra_key="salt-3")).prefix_len == 0
    )
    assert cache.insert(RadixKey([1, 2, 3], extra_key="salt-3")).prefix_len == 0


class _Described(TreeNode):
    """A node class adding behaviour only, as the SGLang backend's HashedTreeNode does."""

    __slots__ = ()

    @property
    def description(self) -> str:
        return f"{len(self.key)} units, lock {self.lock_ref}"


def test_a_node_class_adding_behaviour_only_gets_handles_that_behave_as_it(native_tree):
    removed: list[TreeNode] = []
    cache = RadixCache(node_class=_Described, on_remove=removed.append, tree="native")
    assert cache.tree_kind == "native"
    node = cache.insert([1, 2, 3]).last_node
    assert isinstance(node, _Described) and node.description == "3 units, lock 0"
    cache.inc_lock_ref(node)
    assert cache.match_prefix([1, 2, 3]).last_node.description == "3 units, lock 1"
    cache.dec_lock_ref(node)
    cache.evict(3)
    assert type(removed[0]) is _Described and removed[0].description == "3 units, lock 0"
