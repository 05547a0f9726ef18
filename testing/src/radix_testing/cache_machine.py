"""The random-operation state machine of a RadixCache: every operation checked, the structure
checked after each. radix-core's own tests run it on array values, the device-path tests on tensors."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radix_core import RadixCache, RadixKey
from radix_testing.cache_invariants import check_invariants

SEGMENTS = [[0] * 17, [1, 2] * 9, list(range(3, 26)), [4] * 5, [5, 6, 7], [8] * 33]
segment_keys = st.tuples(
    st.lists(st.sampled_from(range(len(SEGMENTS))), min_size=0, max_size=3),
    st.lists(st.integers(0, 3), max_size=12),
).map(lambda parts: [t for i in parts[0] for t in SEGMENTS[i]] + parts[1])
namespaces = st.sampled_from([None, "lora-a"])


def value_items(tokens: list[int], extra_key, is_eagle: bool) -> array:
    """Value i identifies the unit prefix it belongs to, so any match can be checked."""
    units = len(tokens) - 1 if is_eagle else len(tokens)
    width = 2 if is_eagle else 1
    return array("q", [hash((extra_key, tuple(tokens[: i + width]))) % 2**62 for i in range(max(units, 0))])


def make_machine(page_size: int, is_eagle: bool, policy: str, as_value=None) -> type[RuleBasedStateMachine]:
    """Random operations on a cache, checked throughout; values are int64 arrays, or what
    ``as_value`` makes of them."""

    class CacheMachine(RuleBasedStateMachine):
        @initialize()
        def build(self):
            self.freed = []
            self.mirrored: set = set()  # the pages a consumer of on_store / on_remove believes cached
            self.cache = RadixCache(
                page_size, is_eagle, policy, on_evict=self.freed.append, on_store=self.stored, on_remove=self.removed
            )
            self.locks = []

        def page_labels(self, node):
            """One label per page of ``node``: its namespace and every unit from the root to the page's end."""
            units = []
            for ancestor in reversed(self.cache._store._path_to_root(node)):
                units.extend(ancestor.key)
            first = len(units) - len(node.key)
            return tuple(
                (node.key.extra_key, tuple(units[:end])) for end in range(first + page_size, len(units) + 1, page_size)
            )

        def stored(self, node):
            parent = node.parent
            assert node.page_hashes is None and parent.children[node.key.child_key(page_size)] is node
            assert parent is self.cache.root_node or parent.page_hashes is not None, "stored top down"
            node.page_hashes = self.page_labels(node)
            assert not self.mirrored & set(node.page_hashes), "a page is stored once"
            self.mirrored.update(node.page_hashes)

        def removed(self, node):
            assert node.parent is None and not node.children and self.freed[-1] is node.value
            assert set(node.page_hashes) <= self.mirrored
            self.mirrored.difference_update(node.page_hashes)

        def aligned_units(self, tokens):
            units = max(len(tokens) - 1, 0) if is_eagle else len(tokens)
            return units - units % page_size

        @rule(tokens=segment_keys, extra_key=namespaces)
        def insert(self, tokens, extra_key):
            values = value_items(tokens, extra_key, is_eagle)
            raw_values = values if not is_eagle else array("q", list(values) + [0] * (len(tokens) > 0))
            result = self.cache.insert(RadixKey(tokens, extra_key), as_value(raw_values) if as_value else raw_values)
            assert 0 <= result.prefix_len <= self.aligned_units(tokens) and result.prefix_len % page_size == 0
            assert self.path_units(result.last_node) == self.aligned_units(tokens), "the key ends at last_node"
            assert self.cache.match_prefix(RadixKey(tokens, extra_key)).prefix_len == self.aligned_units(tokens)

        @rule(
            tokens=segment_keys,
            extra_key=namespaces,
            indices=st.booleans(),
            start=st.integers(0, 9),
            stop=st.none() | st.integers(0, 10),
        )
        def match(self, tokens, extra_key, indices, start, stop):
            result = self.cache.match_prefix(RadixKey(tokens, extra_key), indices=indices)
            assert 0 <= result.prefix_len <= self.aligned_units(tokens) and result.prefix_len % page_size == 0
            expected = list(value_items(tokens, extra_key, is_eagle))[: result.prefix_len]
            assert list(result.indices) == expected if indices else result.indices is None
            assert self.path_units(result.last_node) == result.prefix_len
            assert list(self.cache.path_indices(result.last_node)) == expected
            assert list(self.cache.path_indices(result.last_node, start, stop)) == expected[start:stop]

        def path_units(self, node):
            units = 0
            while node is not self.cache.root_node:
                units += len(node.key)
                node = node.parent
            return units

        @rule(tokens=segment_keys, extra_key=namespaces)
        def lock(self, tokens, extra_key):
            result = self.cache.match_prefix(RadixKey(tokens, extra_key))
            self.cache.inc_lock_ref(result.last_node)
            self.locks.append((result.last_node, RadixKey(tokens, extra_key), result.prefix_len))

        @precondition(lambda self: self.locks)
        @rule(which=st.randoms(use_true_random=False))
        def unlock(self, which):
            node, _, _ = self.locks.pop(which.randrange(len(self.locks)))
            self.cache.dec_lock_ref(node)

        @precondition(lambda self: self.locks)
        @rule(which=st.randoms(use_true_random=False), tokens=segment_keys, extra_key=namespaces)
        def move_lock(self, which, tokens, extra_key):
            node, _, _ = self.locks.pop(which.randrange(len(self.locks)))
            result = self.cache.match_prefix(RadixKey(tokens, extra_key))
            before = self.cache.evictable_size()
            delta = self.cache.move_lock(node, result.last_node)
            assert self.cache.evictable_size() == before + delta
            self.locks.append((result.last_node, RadixKey(tokens, extra_key), result.prefix_len))

        @rule(num_tokens=st.integers(0, 120))
        def evict(self, num_tokens):
            before = self.cache.evictable_size()
            leaves = [n for n in self._nodes() if n.lock_ref == 0 and not n.children]
            expected_first = min(leaves, key=self.cache._store._eviction_priority, default=None)
            expected_values = None if expected_first is None else list(expected_first.value)
            self.freed.clear()
            evicted = self.cache.evict(num_tokens)
            assert evicted >= min(num_tokens, before)
            assert self.cache.evictable_size() == before - evicted
            assert sum(len(v) for v in self.freed) == evicted
            if num_tokens and expected_first is not None:
                assert list(self.freed[0]) == expected_values, "the lowest-priority leaf goes first"
            for _node, key, prefix_len in self.locks:
                assert self.cache.match_prefix(key).prefix_len >= prefix_len, "locked prefixes survive"

        @rule()
        def unlock_an_unlocked_node(self):
            unlocked = [n for n in self._nodes() if n.lock_ref == 0]
            if unlocked:
                sizes = (self.cache.evictable_size(), self.cache.protected_size())
                with pytest.raises(ValueError):
                    self.cache.dec_lock_ref(unlocked[0])
                assert (self.cache.evictable_size(), self.cache.protected_size()) == sizes

        def _nodes(self):
            stack, found = list(self.cache.root_node.children.values()), []
            while stack:
                node = stack.pop()
                found.append(node)
                stack.extend(node.children.values())
            return found

        @invariant()
        def structure_holds(self):
            check_invariants(self.cache)

        @invariant()
        def stores_and_removes_mirror_the_tree(self):
            nodes = self._nodes()
            for node in nodes:
                assert node.page_hashes == self.page_labels(node), "splits cut the per-page record with the node"
            assert self.mirrored == {label for node in nodes for label in node.page_hashes}

    return CacheMachine
