"""Structural invariants of a RadixCache, checked after every operation in the tests."""

from __future__ import annotations

from radix_core import RadixCache, TieredNode, TieredRadixCache, TreeNode


def check_invariants(cache: RadixCache) -> None:
    cache = getattr(cache, "_store", cache)  # the store of a RadixCache (a TieredRadixCache is its own)
    root = cache.root_node
    assert root.parent is None and root.lock_ref == 1 and len(root.key) == 0
    evictable = protected = nodes = 0
    native = getattr(cache, "tree_kind", "python") == "native"  # its heap is the tree's (test_tree.py)
    live_heap_entries = {} if native else {stamp: (priority, node) for priority, stamp, node in cache._heap}
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
        assert native or 2 * node.key.raw_length >= len(node.key._tokens), "a key's array is at most twice the key"
        assert node.lock_ref >= sum(child.lock_ref for child in node.children.values()) >= 0
        if node.lock_ref:
            protected += units
        else:
            evictable += units
        for child_key, child in node.children.items():
            assert child.parent is node, "parent links"
            assert child_key == child.key.child_key(cache.page_size), "children are filed under their child key"
            assert child.key.extra_key == node.key.extra_key, "a namespace never changes down a path"
        if node.lock_ref == 0 and not node.children and native:
            assert node._heap_stamp >= 0, "every evictable leaf has a heap entry"
        elif node.lock_ref == 0 and not node.children:
            entry = live_heap_entries.get(node._heap_stamp)
            assert entry is not None and entry[1] is node, "every evictable leaf has a live heap entry"
            assert entry[0] == cache._eviction_priority(node), "with its current eviction priority"
        stack.extend(node.children.values())
    assert cache.evictable_size() == evictable
    assert cache.protected_size() == protected
    assert cache.total_size() == evictable + protected
    assert cache.node_count() == nodes


def check_tiered_invariants(cache: TieredRadixCache) -> None:
    """A TieredRadixCache's tiers: every node on one at least, device nodes (and, outside
    write_back, host nodes) rooted subtrees, sizes per tier, live heap entries for device and host
    leaves with their current priorities, host locks and locks counted along paths."""
    root = cache.root_node
    assert root.parent is None and root.lock_ref == 1 and root.value is None and root.host_value is None
    evictable = protected = host = nodes = 0
    device_heap = {stamp: (priority, node) for priority, stamp, node in cache._heap}
    host_heap = {stamp: (priority, node) for priority, stamp, node in cache._host_heap}
    stack: list[TieredNode] = list(root.children.values())  # type: ignore[arg-type]
    while stack:
        node = stack.pop()
        nodes += 1
        units = len(node.key)
        parent: TieredNode = node.parent  # type: ignore[assignment]
        assert units > 0 and units % cache.page_size == 0 and node.key.is_bigram == cache.is_eagle
        assert parent.children[node.key.child_key(cache.page_size)] is node
        assert node.key.extra_key == parent.key.extra_key or parent is root
        assert node.value is not None or node.host_value is not None, "a node lives on a tier at least"
        assert node.lock_ref >= sum(child.lock_ref for child in node.children.values()) >= 0
        assert node.host_lock_ref >= 0
        if node.value is not None:
            assert len(node.value) == units
            assert parent is root or parent.value is not None, "device nodes form a rooted subtree"
            if node.lock_ref:
                protected += units
            else:
                evictable += units
        if node.host_value is not None:
            assert len(node.host_value) == units
            host += units
            if not cache.write_back:
                assert parent is root or parent.host_value is not None, "host nodes form a rooted subtree"
        device_leaf = (
            node.value is not None
            and not node.lock_ref
            and all(child.value is None for child in node.children.values())
        )
        if device_leaf:
            entry = device_heap.get(node._heap_stamp)
            assert entry is not None and entry[1] is node, "every device leaf has a live heap entry"
            assert entry[0] == cache._eviction_priority(node), "with its current eviction priority"
        host_leaf = node.value is None and not node.children and not node.lock_ref and not node.host_lock_ref
        if host_leaf:
            entry = host_heap.get(node._host_stamp)
            assert entry is not None and entry[1] is node, "every host leaf has a live host heap entry"
            assert entry[0] == cache._eviction_priority(node), "with its current eviction priority"
        stack.extend(node.children.values())  # type: ignore[arg-type]
    assert (cache.evictable_size(), cache.protected_size(), cache.host_size()) == (evictable, protected, host)
    assert cache.total_size() == evictable + protected
    assert cache.node_count() == nodes
