"""TieredRadixCache (the host tier, SGLang's HiCache rules) on both backends: a model of every page
on both tiers checked after every step of random streams, the tree's invariants, and the rules one
by one."""

from __future__ import annotations

import itertools
from array import array

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from radix_core import WRITE_POLICIES, RadixKey, TieredRadixCache
from radix_testing.backend_fixtures import python_store_only
from radix_testing.cache_invariants import check_tiered_invariants
from radix_testing.examples import examples

pytestmark = python_store_only

SEGMENTS = [[7, 7, 7, 7], [1, 2, 3, 4, 5, 6], [9, 8]]
keys = st.tuples(
    st.lists(st.sampled_from(range(len(SEGMENTS))), max_size=3),
    st.lists(st.integers(0, 3), max_size=8),
).map(lambda parts: [t for i in parts[0] for t in SEGMENTS[i]] + parts[1])
namespaces = st.sampled_from([None, "lora-a"])


def make_machine(page_size: int, is_eagle: bool, policy: str, write_policy: str):
    class TieredMachine(RuleBasedStateMachine):
        """The model: for every cached page (its namespace and units from the root), the device
        items and host items it holds, or None. Values are unique, so every free is accounted for."""

        @initialize()
        def build(self):
            self.numbers = itertools.count(1)
            self.freed: list[array] = []
            self.host_freed: list[array] = []
            self.backed_up: list[array] = []
            self.host_room = True
            self.cache = TieredRadixCache(
                page_size,
                is_eagle,
                policy,
                write_policy,
                on_evict=self.freed.append,
                on_host_evict=self.host_freed.append,
                back_up=self.back_up,
            )
            self.model: dict = {}
            self.locks: list = []
            self.host_locks: list = []
            self.pending_backups: list = []
            self.pending_loads: list = []

        # ----- helpers ------------------------------------------------------------------------

        def fresh(self, count: int, base: int = 0) -> array:
            return array("q", [base + next(self.numbers) for _ in range(count)])

        def cache_key(self, tokens, extra_key) -> RadixKey:
            key = RadixKey(tokens, extra_key)
            return key.as_bigram() if is_eagle else key

        def pages(self, key: RadixKey, start: int = 0, prefix: tuple = ()) -> list:
            """(label, first unit, end unit) of each whole page of ``key`` from ``start``."""
            units = list(key)
            end = len(units) - len(units) % page_size
            return [
                ((key.extra_key, prefix + tuple(units[start:stop])), stop - page_size, stop)
                for stop in range(start + page_size, end + 1, page_size)
            ]

        def path_units(self, node) -> tuple:
            units: list = []
            for ancestor in reversed(self.cache._path_to_root(node)):
                units.extend(ancestor.key)
            return tuple(units)

        def tree_pages(self) -> dict:
            found = {}
            stack = [(child, ()) for child in self.cache.root_node.children.values()]
            while stack:
                node, above = stack.pop()
                units = above + tuple(node.key)
                for i in range(0, len(node.key), page_size):
                    label = (node.key.extra_key, units[: len(above) + i + page_size])
                    device = None if node.value is None else tuple(node.value[i : i + page_size])
                    host = None if node.host_value is None else tuple(node.host_value[i : i + page_size])
                    found[label] = [device, host]
                stack.extend((child, units) for child in node.children.values())
            return found

        def node_labels(self, node) -> list:
            units = self.path_units(node)
            first = len(units) - len(node.key)
            return [(node.key.extra_key, units[:stop]) for stop in range(first + page_size, len(units) + 1, page_size)]

        def back_up(self, node):
            if not self.host_room:
                return None
            host_value = self.fresh(len(node.key), 10**9)
            self.backed_up.append(host_value)
            return host_value

        def commit_backups(self, nodes, pending):
            for target in nodes:
                for node in self.cache.backup_chain(target):
                    host_value = self.fresh(len(node.key), 10**9)
                    self.cache.commit_backup(node, host_value)
                    for i, label in enumerate(self.node_labels(node)):
                        self.model[label][1] = tuple(host_value[i * page_size : (i + 1) * page_size])
                    if pending:  # SGLang keeps a write-through's node locked until the copy lands
                        self.cache.mark_backup_pending(node)
                        self.cache.inc_lock_ref(node)
                        self.pending_backups.append(node)

        def check_frees(self, before: dict, after: dict, backed_up: list) -> None:
            """Only frees changed the tiers (and write_back's backups); every free is accounted for."""
            assert after.keys() <= before.keys()
            new_host = {i for v in backed_up for i in v}
            lost_device, lost_host = [], []
            for label, (device, host) in before.items():
                device_now, host_now = after.get(label, [None, None])
                assert device_now in (device, None)
                if device is not None and device_now is None:
                    lost_device.extend(device)
                if host is not None:
                    assert host_now in (host, None)
                    if host_now is None:
                        lost_host.extend(host)
                elif host_now is not None:
                    assert set(host_now) <= new_host, "a host copy appears only through back_up"
            assert sorted(lost_device) == sorted(i for v in self.freed for i in v)
            assert sorted(lost_host) == sorted(i for v in self.host_freed for i in v)
            self.freed.clear()
            self.host_freed.clear()

        # ----- rules --------------------------------------------------------------------------

        @rule(tokens=keys, extra_key=namespaces)
        def insert(self, tokens, extra_key):
            key = self.cache_key(tokens, extra_key)
            values = self.fresh(len(key))
            raw = values if not is_eagle else array("q", list(values) + [0] * (len(tokens) > 0))
            expected_prefix, adopted_units = 0, set()
            new_pages = False
            for label, first, stop in self.pages(key):
                items = tuple(values[first:stop])
                if label in self.model and not new_pages:
                    expected_prefix = stop
                    if self.model[label][0] is None:
                        self.model[label][0] = items
                        adopted_units.update(range(first, stop))
                else:
                    new_pages = True
                    self.model[label] = [items, None]
            result = self.cache.insert(RadixKey(tokens, extra_key), raw)
            assert result.prefix_len == expected_prefix
            assert {u for start, stop in result.adopted for u in range(start, stop)} == adopted_units
            assert len(self.path_units(result.last_node)) == len(self.pages(key)) * page_size
            threshold = WRITE_POLICIES[write_policy]
            for node in result.to_back_up:
                assert threshold is not None and node.hit_count >= threshold and node.host_value is None
            self.commit_backups(result.to_back_up, pending=bool(len(tokens) % 2))

        @rule(tokens=keys, extra_key=namespaces, with_indices=st.booleans())
        def match(self, tokens, extra_key, with_indices):
            key = self.cache_key(tokens, extra_key)
            device_units = best_units = 0
            indices: list = []
            for label, _, stop in self.pages(key):
                if label not in self.model:
                    break
                best_units = stop
                device = self.model[label][0]
                if device is not None and device_units == stop - page_size:
                    device_units = stop
                    indices.extend(device)
            result = self.cache.match_prefix(RadixKey(tokens, extra_key), indices=with_indices)
            assert (result.prefix_len, result.host_hit_length) == (device_units, best_units - device_units)
            assert list(result.indices) == indices if with_indices else result.indices is None
            assert len(self.path_units(result.last_node)) == device_units
            assert len(self.path_units(result.best_node)) == best_units

        @rule(tokens=keys, extra_key=namespaces, deepest=st.booleans())
        def lock(self, tokens, extra_key, deepest):
            result = self.cache.match_prefix(RadixKey(tokens, extra_key))
            node = result.best_node if deepest else result.last_node
            before = self.cache.evictable_size()
            delta = self.cache.inc_lock_ref(node)
            assert self.cache.evictable_size() == before + delta
            self.locks.append(node)

        @precondition(lambda self: self.locks)
        @rule(which=st.randoms(use_true_random=False))
        def unlock(self, which):
            self.cache.dec_lock_ref(self.locks.pop(which.randrange(len(self.locks))))

        @rule(tokens=keys, extra_key=namespaces)
        def host_lock(self, tokens, extra_key):
            node = self.cache.match_prefix(RadixKey(tokens, extra_key)).best_node
            if node is not self.cache.root_node:
                self.host_locks.append((node, self.cache.inc_host_lock_ref(node)))

        @precondition(lambda self: self.host_locks)
        @rule(which=st.randoms(use_true_random=False))
        def host_unlock(self, which):
            self.cache.dec_host_lock_ref(*self.host_locks.pop(which.randrange(len(self.host_locks))))

        @precondition(lambda self: self.pending_backups)
        @rule()
        def backup_lands(self):
            node = self.pending_backups.pop(0)
            self.cache.finish_backup(node)
            self.cache.dec_lock_ref(node)

        @rule(tokens=keys, extra_key=namespaces, land_now=st.booleans())
        def load_back(self, tokens, extra_key, land_now):
            result = self.cache.match_prefix(RadixKey(tokens, extra_key))
            nodes = self.cache.load_back_nodes(result.best_node)
            assert sum(len(node.key) for node in nodes) == result.host_hit_length
            if not nodes:
                return
            assert list(self.cache.host_indices(nodes)) == [
                i for node in nodes for label in self.node_labels(node) for i in self.model[label][1]
            ]
            self.cache.inc_lock_ref(result.best_node)
            device_value = self.fresh(result.host_hit_length)
            self.cache.commit_load_back(nodes, device_value, anchor=result.best_node)
            position = 0
            for node in nodes:
                for label in self.node_labels(node):
                    self.model[label][0] = tuple(device_value[position : position + page_size])
                    position += page_size
            self.pending_loads.append(result.best_node)
            if land_now:
                self.load_lands()

        @precondition(lambda self: self.pending_loads)
        @rule()
        def load_lands(self):
            anchor = self.pending_loads.pop(0)
            self.cache.finish_load_back(anchor)
            self.cache.dec_lock_ref(anchor)

        @rule(
            tokens=keys,
            extra_key=namespaces,
            tail=st.lists(st.integers(0, 3), max_size=8),
            start_at=st.integers(0, 3),
            anchor_at=st.integers(0, 30),
        )
        def insert_host(self, tokens, extra_key, tail, start_at, anchor_at):
            """An L3 prefetch: the units past ``start`` (the root, the device match, the host
            match, or the host match of a first part of the key, below which the tree may hold
            more) come from storage, as host values."""
            whole = self.cache_key(tokens + tail, extra_key)
            result = self.cache.match_prefix(RadixKey(tokens + tail, extra_key))
            anchor = self.cache.match_prefix(RadixKey(tokens[:anchor_at], extra_key)).best_node
            start = [self.cache.root_node, result.last_node, result.best_node, anchor][start_at]
            depth = len(self.path_units(start))
            host_value = self.fresh(len(whole) - depth, 10**9)
            write_back = write_policy == "write_back"
            above_on_host = start is self.cache.root_node or self.model[self.node_labels(start)[-1]][1] is not None
            adopted_units, dropped, new_pages = set(), False, False
            for label, first, stop in self.pages(whole, depth, tuple(list(whole)[:depth])):
                items = tuple(host_value[first - depth : stop - depth])
                if label in self.model and not new_pages:
                    if self.model[label][1] is None and not write_back and above_on_host:
                        self.model[label][1] = items  # host copies only below host copies
                        adopted_units.update(range(first - depth, stop - depth))
                    above_on_host = self.model[label][1] is not None
                    continue
                if not new_pages:
                    dropped = not write_back and not above_on_host  # it would hang below no host copy
                new_pages = True
                if not dropped:
                    self.model[label] = [None, items]
                    adopted_units.update(range(first - depth, stop - depth))
            inserted = self.cache.insert_host(start, whole[depth:], host_value)
            assert {u for a, b in inserted.adopted for u in range(a, b)} == adopted_units
            assert (inserted.last_node is None) == dropped

        @rule(tokens=st.integers(0, 24))
        def evict(self, tokens):
            before = self.tree_pages()
            backups_before = len(self.backed_up)
            evicted = self.cache.evict(tokens)
            freed_units = sum(len(v) for v in self.freed)
            assert evicted == freed_units
            after = self.tree_pages()
            if evicted < tokens:
                assert not self.device_leaves(), "eviction stops only when nothing more can go"
            self.check_frees(before, after, self.backed_up[backups_before:])
            self.model = after

        @rule(tokens=st.integers(0, 24))
        def evict_host(self, tokens):
            before = self.tree_pages()
            freed = self.cache.evict_host(tokens)
            assert freed == sum(len(v) for v in self.host_freed)
            after = self.tree_pages()
            if freed < tokens:
                assert not [n for n in self.nodes() if self.cache._is_host_leaf(n)]
            for label, (device, _) in after.items():
                assert before[label][0] == device, "host eviction leaves the device alone"
            self.check_frees(before, after, [])
            self.model = after

        @rule()
        def toggle_host_room(self):
            self.host_room = not self.host_room

        # ----- checks -------------------------------------------------------------------------

        def nodes(self):
            stack = list(self.cache.root_node.children.values())
            while stack:
                node = stack.pop()
                yield node
                stack.extend(node.children.values())

        def device_leaves(self):
            """Device leaves eviction could still take (a write_back one it cannot back up nor drop
            stays)."""
            leaves = []
            for node in self.nodes():
                if node.lock_ref or node.value is None or any(c.value is not None for c in node.children.values()):
                    continue
                if write_policy == "write_back" and node.host_value is None and not self.host_room:
                    continue
                leaves.append(node)
            return leaves

        @invariant()
        def tiers_are_the_model(self):
            if hasattr(self, "cache"):
                assert self.tree_pages() == self.model
                check_tiered_invariants(self.cache)

    return TieredMachine


@pytest.mark.parametrize("write_policy", list(WRITE_POLICIES))
@pytest.mark.parametrize(("page_size", "is_eagle"), [(1, False), (2, False), (1, True)])
def test_the_tiers_follow_the_model(backend_name, write_policy, page_size, is_eagle):
    run_state_machine_as_test(
        make_machine(page_size, is_eagle, "lru", write_policy),
        settings=settings(max_examples=examples(30), stateful_step_count=40, deadline=None),
    )


@pytest.mark.parametrize("policy", ["lfu", "priority", "filo"])
def test_the_tiers_follow_the_model_under_each_policy(backend_name, policy):
    run_state_machine_as_test(
        make_machine(1, False, policy, "write_through_selective"),
        settings=settings(max_examples=examples(15), stateful_step_count=30, deadline=None),
    )


def chain_backup(cache: TieredRadixCache, nodes, base: int = 1000) -> None:
    for target in nodes:
        for node in cache.backup_chain(target):
            cache.commit_backup(node, array("q", range(base, base + len(node.key))))


def test_write_through_demotes_what_the_host_holds_and_deletes_the_rest(backend_name):
    freed: list = []
    cache = TieredRadixCache(write_policy="write_through", on_evict=freed.append)
    backed = cache.insert([1, 2, 3, 4], array("q", [10, 11, 12, 13]))
    assert backed.to_back_up == [backed.last_node], "write_through backs up a new node at once"
    chain_backup(cache, backed.to_back_up)
    unbacked = cache.insert([5, 6], array("q", [20, 21])).last_node
    assert cache.evict(6) == 6 and sorted(map(list, freed)) == [[10, 11, 12, 13], [20, 21]]
    assert unbacked.parent is None, "no host copy: deleted"
    assert backed.last_node.parent is cache.root_node and backed.last_node.value is None, "demoted"
    result = cache.match_prefix([1, 2, 3, 4, 9])
    assert (result.prefix_len, result.host_hit_length, result.best_node) == (0, 4, backed.last_node)
    assert (cache.total_size(), cache.host_size()) == (0, 4)
    again = cache.insert([1, 2, 3, 4], array("q", [30, 31, 32, 33]))
    assert again.prefix_len == 4 and again.adopted == [(0, 4)], "the host-only node takes the insert's values"
    assert list(cache.match_prefix([1, 2, 3, 4]).indices) == [30, 31, 32, 33]
    check_tiered_invariants(cache)


def test_selective_write_through_backs_up_on_the_second_hit(backend_name):
    cache = TieredRadixCache(write_policy="write_through_selective")
    first = cache.insert([1, 2, 3])
    assert first.to_back_up == []
    second = cache.insert([1, 2, 3, 4])
    assert second.to_back_up == [second.last_node.parent], "the node hit twice, not the new leaf"
    assert cache.backup_chain(second.last_node) == [second.last_node.parent, second.last_node]
    assert cache.insert([1, 2, 3, 4], inserted_len=4).to_back_up == [], "a request's own prefix is no new hit"


def test_write_back_backs_up_at_eviction_or_drops_what_it_cannot(backend_name):
    room = [True]
    backed: list = []

    def back_up(node):
        if not room[0]:
            return None
        backed.append(node)
        return array("q", range(100, 100 + len(node.key)))

    cache = TieredRadixCache(write_policy="write_back", back_up=back_up)
    demoted = cache.insert([1, 2]).last_node
    assert cache.insert([1, 2]).to_back_up == [], "write_back backs up only at eviction"
    assert cache.evict(2) == 2 and backed == [demoted] and demoted.value is None and demoted.host_value is not None
    room[0] = False
    kept = cache.insert([5, 6]).last_node
    mark = cache.inc_host_lock_ref(kept)  # under write_back a device-only node may be host-locked
    leaf = cache.insert([5, 6, 7, 8]).last_node
    assert cache.evict(4) == 2 and leaf.parent is None, "no host room: the unbacked leaf is dropped"
    assert kept.value is not None, "no host room and a host lock: kept on the device"
    check_tiered_invariants(cache)
    assert cache.evict(2) == 0
    cache.dec_host_lock_ref(kept, mark)
    room[0] = True
    assert cache.evict(2) == 2 and backed[-1] is kept and kept.value is None
    check_tiered_invariants(cache)


def test_write_back_host_eviction_reclaims_duplicates_first(backend_name):
    host_freed: list = []
    cache = TieredRadixCache(write_policy="write_back", on_host_evict=host_freed.append)
    upper = cache.insert([1, 2, 3, 4]).last_node
    cache.commit_backup(upper, array("q", [50, 51, 52, 53]))
    lower = cache.insert([1, 2, 3, 4, 5, 6]).last_node
    cache.commit_backup(lower, array("q", [60, 61]))
    other = cache.insert([9, 9]).last_node
    cache.commit_backup(other, array("q", [70, 71]))
    assert cache.evict_host(4) == 4 and [list(v) for v in host_freed] == [[50, 51, 52, 53]], (
        "a duplicate that is no device leaf goes first"
    )
    assert cache.evict_host(1) == 2 and list(host_freed[-1]) == [60, 61], "then device leaves, oldest copy first"
    assert upper.value is not None and lower.host_value is None and other.host_value is not None
    check_tiered_invariants(cache)


def test_a_host_lock_covers_the_parts_a_split_cuts(backend_name):
    cache = TieredRadixCache()
    node = cache.insert([1, 2, 3, 4]).last_node
    chain_backup(cache, [node])
    cache.evict(4)
    mark = cache.inc_host_lock_ref(node)
    upper = cache.match_prefix([1, 2, 9]).best_node
    assert upper.parent is cache.root_node and node.parent is upper
    assert (upper.host_lock_ref, node.host_lock_ref) == (1, 1)
    assert cache.evict_host(10) == 0, "both parts are locked"
    cache.dec_host_lock_ref(node, mark)
    assert (upper.host_lock_ref, node.host_lock_ref) == (0, 0)
    assert cache.evict_host(10) == 4 and cache.node_count() == 0
    with pytest.raises(ValueError, match="no host lock"):
        cache.dec_host_lock_ref(node, mark)


def test_load_back_restores_the_host_run_root_first(backend_name):
    cache = TieredRadixCache(page_size=2)
    cache.insert([1, 2, 3, 4], array("q", [10, 11, 12, 13]))
    deep = cache.insert([1, 2, 3, 4, 5, 6, 7, 8], array("q", [10, 11, 12, 13, 14, 15, 16, 17]))
    chain_backup(cache, [deep.last_node])
    assert cache.evict(8) == 8
    hit = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])
    run = cache.load_back_nodes(hit.best_node)
    assert [len(node.key) for node in run] == [4, 4] and list(cache.host_indices(run)) == list(range(1000, 1004)) * 2
    cache.inc_lock_ref(hit.best_node)
    cache.commit_load_back(run, array("q", range(40, 48)), anchor=hit.best_node)
    assert cache.protected_size() == 8 and all(node.load_back_pending is hit.best_node for node in run)
    cache.finish_load_back(hit.best_node)
    cache.dec_lock_ref(hit.best_node)
    assert list(cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).indices) == list(range(40, 48))
    assert cache.host_size() == 8, "the host copies stay"
    check_tiered_invariants(cache)
    with pytest.raises(ValueError, match="host-only"):
        cache.commit_load_back(run, array("q", range(8)))


def test_insert_host_adds_below_a_host_copy_and_drops_below_none(backend_name):
    stored: list = []
    cache = TieredRadixCache(write_policy="write_through_selective", on_store=stored.append)
    device_only = cache.insert([1, 2]).last_node
    dropped = cache.insert_host(device_only, [3, 4], array("q", [80, 81]))
    assert dropped == ([], None, []), "it would hang below a node with no host copy"
    refilled = cache.insert_host(cache.root_node, [1, 2, 3, 4], array("q", [70, 71, 72, 73]))
    assert refilled.adopted == [(0, 2), (2, 4)] and list(device_only.host_value) == [70, 71]
    assert refilled.refilled == [device_only]
    assert refilled.last_node.value is None and stored[-1] is refilled.last_node
    assert cache.match_prefix([1, 2, 3, 4]).host_hit_length == 2
    with pytest.raises(ValueError, match="items"):
        cache.insert_host(cache.root_node, [5, 6], array("q", [1]))
    check_tiered_invariants(cache)


def test_bad_calls_are_refused(backend_name):
    with pytest.raises(ValueError, match="write policy"):
        TieredRadixCache(write_policy="write_around")
    cache = TieredRadixCache()
    node = cache.insert([1, 2]).last_node
    with pytest.raises(ValueError, match="items for a node"):
        cache.commit_backup(node, array("q", [1]))
    with pytest.raises(ValueError, match="host copy"):
        cache.demote(node)
    chain_backup(cache, [node])
    with pytest.raises(ValueError, match="no host value"):
        cache.commit_backup(node, array("q", [1, 2]))
    with pytest.raises(ValueError, match="without a host copy"):
        cache.drop_subtree(node)
    with pytest.raises(ValueError, match=">= 0"):
        cache.evict_host(-1)


def test_a_prefetch_refills_host_copies_only_below_host_copies(backend_name):
    """SGLang 0.5.23 refills below a node with no host copy (here a prefetch anchored on a node
    hit once under write_through_selective), and deleting that node at device eviction orphans
    the copies below it: the host slots are never freed. Here the refill stops there."""
    host_freed: list = []
    cache = TieredRadixCache(write_policy="write_through_selective", on_host_evict=host_freed.append)
    cache.insert([7, 7, 7, 7], array("q", [1, 2, 3, 4]))
    anchor = cache.match_prefix([7, 7]).best_node
    prefetch = cache.insert_host(anchor, [7, 7, 5], array("q", [100, 101, 102]))
    assert prefetch == ([], None, []), "nothing adopted: the caller frees every slot"
    check_tiered_invariants(cache)
    assert cache.evict(4) == 4 and cache.node_count() == 0 and cache.host_size() == 0
