"""Tensor values kept on their device by radix-native's tree (``device_values``): the arena
itself, and the whole cache on it, run on CPU tensors through the device path (CI has no GPU)."""

from __future__ import annotations

import gc
import logging
from array import array

import pytest
from hypothesis import settings
from hypothesis.stateful import invariant, run_state_machine_as_test

from radix_core import RadixCache, RadixKey, _backend
from radix_core.device_values import DeviceArena
from radix_testing.backends import device_path
from radix_testing.cache_invariants import check_invariants
from radix_testing.cache_machine import make_machine
from radix_testing.examples import examples

torch = pytest.importorskip("torch")


def arena_cache(**kwargs) -> RadixCache:
    """A native-tree cache whose tensor values take the device path."""
    with device_path():
        cache = RadixCache(tree="native", **kwargs)
    assert cache.tree_kind == "native"
    return cache


def slots(items) -> array:
    """Positions as the tree hands them out: an int64 buffer."""
    return array("q", items.tolist() if hasattr(items, "tolist") else items)


def test_the_arena_hands_out_runs_and_gathers_what_was_written(native_tree):
    arena = DeviceArena(torch.empty(0, dtype=torch.int64), native_tree.consecutive_runs)
    positions, runs = arena.reserve(5)
    assert positions.tolist() == [0, 1, 2, 3, 4] and runs == [(0, 5)]
    arena.commit(torch.tensor([10, 11, 12, 13, 14], dtype=torch.int32), runs, 1, 4)  # items 1-3 kept
    assert arena.used == 3 and arena.gather(slots([1, 2, 3])).tolist() == [11, 12, 13]
    later, later_runs = arena.reserve(3)  # from the largest free run: slot 4 merged into the rest
    assert later.tolist() == [4, 5, 6] and later_runs == [(4, 3)]
    arena.commit(torch.tensor([20, 21, 22]), later_runs, 0, 3)
    gathered = arena.gather(slots([4, 5, 1, 2, 3, 6]))
    assert gathered.dtype == torch.int64 and gathered.tolist() == [20, 21, 11, 12, 13, 22]
    arena.release(slots([1, 2, 4]))
    assert arena.used == 3


def test_where_no_free_run_is_large_enough_a_reservation_takes_several(native_tree):
    arena = DeviceArena(torch.empty(0, dtype=torch.int64), native_tree.consecutive_runs)
    everything, runs = arena.reserve(arena.slots or 1024)
    arena.commit(torch.arange(everything.shape[0]) * 2, runs, 0, everything.shape[0])
    arena.release(slots(range(20, 30)))
    arena.release(slots(range(10)))
    positions, runs = arena.reserve(15)
    assert runs == [(0, 10), (20, 5)] and positions.tolist() == [*range(10), *range(20, 25)]
    arena.commit(torch.arange(100, 115), runs, 0, 15)
    assert arena.gather(slots(positions)).tolist() == list(range(100, 115))
    assert arena.gather(slots(range(10, 20))).tolist() == [2 * i for i in range(10, 20)]
    assert arena.used == arena.slots - 5


def test_a_long_life_of_frees_leaves_no_trail(native_tree):
    """Freed runs merge, and the heap that finds the largest drops the entries merges made stale."""
    arena = DeviceArena(torch.empty(0, dtype=torch.int64), native_tree.consecutive_runs)
    held = []
    for step in range(3000):
        positions, runs = arena.reserve(10)
        arena.commit(torch.arange(10), runs, 2, 8)
        held.append(slots(positions[2:8]))
        if len(held) > 20:
            arena.release(held.pop(step % len(held)))
    assert arena.used == 6 * len(held)
    assert len(arena._largest) <= 2 * len(arena._run_at) + 64


def test_the_arena_grows_and_keeps_what_it_holds(native_tree):
    arena = DeviceArena(torch.empty(0, dtype=torch.int64), native_tree.consecutive_runs)
    first, runs = arena.reserve(1000)
    arena.commit(torch.arange(1000) * 3, runs, 0, 1000)
    more, more_runs = arena.reserve(5000)
    assert arena.slots >= 6000 and arena.used == 6000
    arena.commit(torch.arange(5000), more_runs, 0, 5000)
    assert torch.equal(arena.gather(slots(first)), torch.arange(1000) * 3)
    assert torch.equal(arena.gather(slots(more)), torch.arange(5000))


def test_a_gathered_match_is_a_copy_that_later_inserts_do_not_change(native_tree):
    cache = arena_cache(on_evict=lambda freed: None)
    cache.insert([1, 2, 3], torch.tensor([7, 8, 9]))
    found = cache.match_prefix([1, 2, 3]).indices
    cache.evict(3)
    cache.insert([4, 5, 6], torch.tensor([40, 50, 60]))  # reuses the evicted node's slots
    assert found.tolist() == [7, 8, 9]
    assert cache.match_prefix([4, 5, 6]).indices.tolist() == [40, 50, 60]


@pytest.mark.parametrize("is_eagle", [False, True], ids=["raw", "eagle"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_random_operation_sequences_on_the_device_path(native_tree, page_size, is_eagle):
    """The cache's state machine on device-path tensors; the arena holds exactly the cached units."""
    base = make_machine(
        page_size, is_eagle, "lru", as_value=lambda values: torch.tensor(list(values), dtype=torch.int64)
    )

    class DeviceMachine(base):  # type: ignore[misc, valid-type]
        @invariant()
        def the_arena_holds_the_cached_units_only(self):
            arena = self.cache._store._arena
            assert self.cache.tree_kind == "native"
            assert (0 if arena is None else arena.used) == self.cache.total_size()
            assert arena is None or len(arena._largest) <= 2 * len(arena._run_at) + 64, "stale entries are dropped"

    with device_path():
        run_state_machine_as_test(
            DeviceMachine, settings=settings(max_examples=examples(30), stateful_step_count=40, deadline=None)
        )


def test_a_filled_device_cache_adds_no_object_per_node_to_the_garbage_collectors_walk(native_tree):
    gc.collect()
    before = len(gc.get_objects())
    cache = arena_cache()
    for request in range(500):
        cache.insert([request % 7, request % 11, request, request + 1], torch.arange(request, request + 4))
    assert cache.node_count() > 500
    gc.collect()
    assert len(gc.get_objects()) - before < 50


def test_a_value_the_arena_cannot_hold_moves_the_cache_to_python_with_its_indices(native_tree, caplog):
    cache = arena_cache()
    cache.insert([1, 2, 3, 4], torch.tensor([10, 11, 12, 13]))
    held = cache.match_prefix([1, 2]).last_node
    with caplog.at_level(logging.WARNING, logger="radix_core"):
        cache.insert([1, 2, 5], torch.tensor([10, 11, 2**63], dtype=torch.uint64))
    assert cache.tree_kind == "python" and "cannot hold" in caplog.text
    assert cache.match_prefix([1, 2, 3, 4]).indices.tolist() == [10, 11, 12, 13]
    assert cache.match_prefix(RadixKey([1, 2])).last_node is cache._store._own(held)
    check_invariants(cache)


@pytest.mark.parametrize(("device_tree", "expected"), [("python", "python"), ("native", "native")])
def test_a_cache_of_device_tensors_takes_the_tree_radix_core_device_tree_names(
    native_tree, monkeypatch, device_tree, expected
):
    """A device other than the CPU, without a GPU: torch's meta device (shapes, no data)."""
    monkeypatch.setattr(_backend, "device_tree", device_tree)
    cache = RadixCache(tree="native")
    cache.insert([1, 2, 3], torch.empty(3, dtype=torch.int32, device="meta"))
    assert cache.tree_kind == expected
    found = cache.match_prefix([1, 2, 3, 4]).indices
    assert found.device.type == "meta" and found.shape == (3,)
    if expected == "native":
        assert cache._store._arena.used == 3
        cache.insert([1, 2, 3], torch.arange(3))  # a CPU tensor: not the arena's device
        assert cache.tree_kind == "python" and cache.match_prefix([1, 2, 3]).indices.device.type == "meta"
