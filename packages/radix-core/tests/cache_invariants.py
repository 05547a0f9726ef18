"""Structural invariants of a RadixCache, checked after every operation in the tests."""

from __future__ import annotations

from radix_core import RadixCache, TreeNode


def check_invariants(cache: RadixCache) -> None:
    root = cache.root_node
    assert root.parent is None and root.lock_ref == 1 and len(root.key) == 0
    evictable = protected = nodes = 0
    live_heap_entries = {stamp: (priority, node) for priority, stamp, node in cache._heap}
    stack: list[TreeNode] = list(root.children.values())
    for child_key, child in root.children.items():
        assert child.parent is root and child_key == child.key.child_key(cache.page_size)
    while stack:
        node = stack.pop()
        nodes += 1
        units = len(node.key)
        assert units > 0, "only the root may have an empty key"
        assert units % cache.page_size == 0, "nodes hold whole pages"
        assert len(node.value) == units, "one value item per key unit"
        assert node.key.is_bigram == cache.is_eagle
        assert 2 * node.key.raw_length >= len(node.key._tokens), "a key's array is at most twice the key"
        assert node.lock_ref >= sum(child.lock_ref for child in node.children.values()) >= 0
        if node.lock_ref:
            protected += units
        else:
            evictable += units
        for child_key, child in node.children.items():
            assert child.parent is node, "parent links"
            assert child_key == child.key.child_key(cache.page_size), "children are filed under their child key"
            assert child.key.extra_key == node.key.extra_key, "a namespace never changes down a path"
        if node.lock_ref == 0 and not node.children:
            entry = live_heap_entries.get(node._heap_stamp)
            assert entry is not None and entry[1] is node, "every evictable leaf has a live heap entry"
            assert entry[0] == cache._eviction_priority(node), "with its current eviction priority"
        stack.extend(node.children.values())
    assert cache.evictable_size() == evictable
    assert cache.protected_size() == protected
    assert cache.total_size() == evictable + protected
    assert cache.node_count() == nodes
