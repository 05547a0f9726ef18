"""radix-core's RadixCache against SGLang's own RadixCache, operation by operation.

The same random sequence of inserts, matches, locks, unlocks and evictions runs on both trees;
every answer must agree: prefix lengths, the returned KV indices, lock deltas, what eviction frees
(in order), and the evictable/protected/total sizes after every step.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_core import RadixCache, RadixKey
from radix_testing import sglang_harness as sg

pytestmark = pytest.mark.skipif(sg.CALLS_CONVERT, reason="the differential test targets SGLang >= 0.5.12 (0.5.23)")

SEGMENTS = [[0] * 17, [1, 2] * 9, list(range(3, 26)), [4] * 5, [5, 6, 7], [8] * 33]
tokens_strategy = st.tuples(
    st.lists(st.sampled_from(range(len(SEGMENTS))), max_size=3), st.lists(st.integers(0, 3), max_size=12)
).map(lambda parts: [t for i in parts[0] for t in SEGMENTS[i]] + parts[1])
namespaces = st.sampled_from([None, "lora-a"])
operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), tokens_strategy, namespaces, st.integers(0, 3)),
        st.tuples(st.just("match"), tokens_strategy, namespaces),
        st.tuples(st.just("lock"), tokens_strategy, namespaces),
        st.tuples(st.just("unlock"), st.integers(0, 99)),
        st.tuples(st.just("evict"), st.integers(0, 40)),
    ),
    min_size=8,
    max_size=60,
)


def run_both(operations: list[tuple], page_size: int, is_eagle: bool, policy: str) -> None:
    theirs = sg.make_cache(page_size, is_eagle, policy)
    ours_freed: list = []
    ours = RadixCache(page_size, is_eagle, policy, on_evict=ours_freed.append)
    locks: list[tuple] = []
    for step, (name, *args) in enumerate(operations):
        where = f"step {step}: {name}{tuple(args)!r}"
        if name == "insert":
            tokens, extra_key, priority = args
            value = torch.arange(1000 * step, 1000 * step + len(tokens))
            expected = sg.insert(theirs, tokens, value, extra_key, priority)
            assert ours.insert(RadixKey(tokens, extra_key), value, priority).prefix_len == expected, where
        elif name in ("match", "lock"):
            tokens, extra_key = args
            their_len, their_node, their_indices = sg.match(theirs, tokens, extra_key)
            result = ours.match_prefix(RadixKey(tokens, extra_key))
            assert result.prefix_len == their_len, where
            assert list(result.indices) == their_indices.tolist(), where
            if name == "lock":
                their_delta = theirs.inc_lock_ref(their_node).delta
                assert ours.inc_lock_ref(result.last_node) == their_delta, where
                locks.append((their_node, result.last_node))
        elif name == "unlock" and locks:
            their_node, our_node = locks.pop(args[0] % len(locks))
            assert ours.dec_lock_ref(our_node) == theirs.dec_lock_ref(their_node).delta, where
        elif name == "evict":
            theirs.token_to_kv_pool_allocator.freed.clear()
            ours_freed.clear()
            assert ours.evict(args[0]) == sg.evict(theirs, args[0]), where
            their_freed = theirs.token_to_kv_pool_allocator.freed
            assert [v.tolist() for v in ours_freed] == [v.tolist() for v in their_freed], where
        assert ours.evictable_size() == theirs.evictable_size(), where
        assert ours.protected_size() == theirs.protected_size(), where
        assert ours.total_size() == theirs.total_size(), where


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority"])
@pytest.mark.parametrize("is_eagle", [False, True], ids=["raw", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_same_operations_give_the_same_answers(backend_name, ticking_clock, page_size, is_eagle, policy):
    @settings(max_examples=60)
    @given(ops=operations)
    def check(ops):
        run_both(ops, page_size, is_eagle, policy)

    check()


def test_a_long_eagle_session_with_chunked_prompts(backend_name, ticking_clock):
    """A multi-turn chat: each turn re-inserts the growing history, as cache_unfinished_req does."""
    history: list[int] = []
    ops: list[tuple] = []
    for turn in range(12):
        history += [(turn * 7 + i) % 50 for i in range(40 + turn)]
        ops += [("match", list(history), None), ("insert", list(history), None, 0), ("lock", list(history), None)]
        ops += [("evict", 30), ("unlock", 0)]
    run_both(ops, 1, True, "lru")
