"""The tree walk kernel (descend) against its reference, on trees that real inserts built."""

from __future__ import annotations

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_core import RadixCache, RadixKey
from radix_core.cache import TreeNode, descend, python_descend
from radix_testing.examples import examples

# Few distinct tokens, so that keys share prefixes and branch at every depth.
token_lists = st.lists(st.integers(0, 3), min_size=0, max_size=24)
namespaces = st.sampled_from([None, "lora-a", ("lora-b", "salt"), 7, b"raw"])


def cache_key(cache: RadixCache, tokens: list[int], extra_key: object) -> RadixKey:
    key = RadixKey(tokens, extra_key)
    return (key.as_bigram() if cache.is_eagle else key).page_aligned(cache.page_size)


def walk_both(node: TreeNode, key: RadixKey, position: int, page_size: int) -> tuple:
    dispatched = descend(node, key, position, page_size)
    reference = python_descend(node, key, position, page_size)
    assert dispatched == reference  # the very same nodes (TreeNode compares by identity), the same ends
    return reference


@settings(max_examples=examples(300))
@given(
    page_size=st.sampled_from([1, 2, 4]),
    is_eagle=st.booleans(),
    inserts=st.lists(st.tuples(token_lists, namespaces), max_size=12),
    queries=st.lists(st.tuples(token_lists, namespaces), min_size=1, max_size=6),
)
def test_descend_finds_what_the_reference_finds(backend_name, page_size, is_eagle, inserts, queries):
    cache = RadixCache(page_size, is_eagle)
    for tokens, extra_key in inserts:
        cache.insert(RadixKey(tokens, extra_key))
    for tokens, extra_key in queries:
        key = cache_key(cache, tokens, extra_key)
        path, ends = walk_both(cache.root_node, key, 0, page_size)
        for node, end in zip(path[:-1], ends):  # the walk again from every node it passed whole
            walk_both(node, key, end, page_size)


def test_descend_changes_nothing(backend_name):
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    before = cache.root_node.children[1]
    path, ends = descend(cache.root_node, RadixKey([1, 2, 9]), 0, 1)
    assert (path, ends) == ([before], [2])
    assert cache.root_node.children[1] is before and len(before.key) == 4 and cache.node_count() == 1


class OddNamespace:
    """A namespace whose hash and equality are Python code: the walk leaves it to the reference."""

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OddNamespace)


def test_a_namespace_of_python_objects_walks_as_the_reference(backend_name):
    cache = RadixCache()
    cache.insert(RadixKey([1, 2, 3], OddNamespace()))
    assert cache.match_prefix(RadixKey([1, 2, 5], OddNamespace())).prefix_len == 2


def test_stand_ins_without_slots_walk_as_the_reference(backend_name):
    edge = RadixKey([5, 6])
    child = types.SimpleNamespace(children={}, key=edge)
    root = types.SimpleNamespace(children={5: child}, key=RadixKey())
    assert descend(root, RadixKey([5, 6, 7]), 0, 1) == ([child], [2])


def test_a_key_too_short_for_a_page_raises_as_the_reference(backend_name):
    cache = RadixCache(page_size=4)
    cache.insert([1, 2, 3, 4])
    with pytest.raises(IndexError):
        descend(cache.root_node, RadixKey([1, 2, 3, 4, 5, 6]), 4, 4)
