"""radix-core's host tier against SGLang 0.5.23's own, step by step, through the TreeCore interface.

SGLang keeps its HiCache tree in the TreeCore of UnifiedRadixCache (its Python core, FULL
component). RadixTreeCore serves the same interface on radix-core's TieredRadixCache. Both cores
get the same random stream (inserts, matches, device and host locks, write-through backups,
load-backs under a lock, L3 prefetch inserts, device and host eviction), driven as
UnifiedRadixCache drives a core (the cache controller's copies stand in as index bookkeeping);
after every step both must hold the same pages on each tier with the same indices, report the same
prefixes, host hits and sizes, and free the same indices. Evictions run to exhaustion, so that
their order (each tree's own clock and heap) cannot matter.
"""

from __future__ import annotations

import gc
import random
import types
from array import array
from collections import defaultdict

import pytest
import torch

pytest.importorskip("sglang.srt.mem_cache.unified_cache.unified_tree_core")

from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str  # noqa: E402

from radix_sglang_adapter.backend.tree_core import RadixTreeCore  # noqa: E402
from radix_testing.backend_fixtures import python_store_only  # noqa: E402

pytestmark = python_store_only

FULL = ComponentType.FULL
EVERYTHING = 10**9
THRESHOLDS = {"write_through": 1, "write_through_selective": 2, "write_back": 1}


def host_items(extra_key, units: list, start: int, stop: int) -> list[int]:
    """The host slots a unit's KV lands in: a function of its namespace and path, so both trees
    get the same ones whatever order their backups run in."""
    return [hash((extra_key, tuple(units[: i + 1]))) % 2**40 + 2**41 for i in range(start, stop)]


class CoreDriver:
    """A TreeCore with HiCache on, driven as UnifiedRadixCache drives it; reads its tree through
    ``view`` (each core keeps its own kind of node)."""

    def __init__(self, make_core, page_size: int, policy: str, write_policy: str, is_eagle: bool, storage: bool):
        params = CacheInitParams(
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            page_size=page_size,
            disable=False,
            tree_components=(FULL,),
            eviction_policy=policy,
            is_eagle=is_eagle,
        )
        owner = types.SimpleNamespace(enable_session_radix_cache=False)
        self.core = make_core(params, {FULL: FullComponent(owner, params)})
        self.core.set_hicache_enabled()
        self.core.is_write_back = write_policy == "write_back"
        self.core.write_through_threshold = THRESHOLDS[write_policy]
        self.core.enable_storage = storage  # L3 on: every node keeps its pages' storage hashes
        self.sglang = isinstance(self.core, UnifiedTreeCore)
        self.freed: list[int] = []
        self.host_freed: list[int] = []

    # ----- reading either core's nodes ---------------------------------------------------------

    @staticmethod
    def units(node) -> list:
        """A node's key units: token ids, or (EAGLE) bigrams of them."""
        return list(node.key)

    def values(self, node) -> tuple:
        """A node's device value, host value and storage hashes (one a page)."""
        if self.sglang:
            data = node.component_data[FULL]
            return data.value, data.host_value, node.hash_value
        return node.value, node.host_value, node.page_hashes

    def path_units(self, node) -> list:
        parts = []
        while node is not self.core.root_node:
            parts.append(self.units(node))
            node = node.parent
        return [unit for part in reversed(parts) for unit in part]

    def pages(self) -> dict:
        found = {}
        page = self.core.page_size
        stack = [(child, []) for child in self.core.root_node.children.values()]
        while stack:
            node, above = stack.pop()
            units = above + self.units(node)
            device, host, hashes = self.values(node)
            for i in range(0, len(units) - len(above), page):
                label = (node.key.extra_key, tuple(units[: len(above) + i + page]))
                indices = tuple(None if v is None else tuple(v[i : i + page].tolist()) for v in (device, host))
                found[label] = (*indices, None if hashes is None else hashes[i // page])
            stack.extend((child, units) for child in node.children.values())
        return found

    def host_copies_below_none(self) -> bool:
        """Whether a node's host copy hangs below a node with none (not the root)."""
        stack = list(self.core.root_node.children.values())
        while stack:
            node = stack.pop()
            below = list(node.children.values())
            if self.values(node)[1] is None and any(self.values(child)[1] is not None for child in below):
                return True
            stack.extend(below)
        return False

    # ----- driving ----------------------------------------------------------------------------

    def drain(self, result) -> None:
        """What UnifiedRadixCache does with a step's frees (each result must be drained)."""
        for values in result.device_frees.pop(FULL, []):
            self.freed.extend(values.tolist())
        for values in result.host_frees.pop(FULL, []):
            self.host_freed.extend(values.tolist())
        result.device_frees.clear()
        result.host_frees.clear()
        assert not result.cache_actions
        result.cache_actions.clear()

    def back_up(self, node_id: int) -> None:
        if self.core.is_backuped(node_id):
            return
        node = self.core.node_by_id(node_id)
        units = self.path_units(node)
        host = host_items(node.key.extra_key, units, len(units) - len(node.key), len(units))
        self.core.commit_backup(node_id, torch.tensor(host, dtype=torch.int64), {})

    def insert(self, tokens: list[int], extra_key, values: list[int], own: int = 0) -> int:
        """Insert ``tokens`` with their KV ``values``, of which the first ``own`` are the request's
        cached prefix (the tree's own indices, as a chunked request inserts again)."""
        key = RadixKey(array("q", tokens), extra_key)
        step = self.core.begin_insert(
            InsertParams(key=key, value=torch.tensor(values, dtype=torch.int64), prev_prefix_len=own)
        )
        actions = list(step.actions)
        while step.result is None:
            step = self.core.resume_insert()
            actions += step.actions
        actions += self.core.end_insert()
        for action in actions:
            if type(action).__name__ == "FreeDeviceKV":
                for values_freed in action.indices:
                    self.freed.extend(values_freed.tolist())
            elif type(action).__name__ == "BackupKV":
                for node_id in action.node_ids:
                    self.back_up(node_id)
            else:
                raise AssertionError(f"unexpected action {action!r}")
        return step.result.prefix_len

    def match(self, tokens: list[int], extra_key):
        result = self.core.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), extra_key)))
        indices = self.core.collect_full_device_indices(result.last_device_node, self.core.root_node.id).tolist()
        best = self.core.node_by_id(result.best_match_node)
        return result, indices, len(self.path_units(best))

    def evict(self) -> None:
        tracker: dict = defaultdict(int)
        self.core.evict_device_start(FULL, EVERYTHING)
        try:
            while True:
                step = self.core.evict_device_next_node(FULL, tracker)
                self.drain(step)
                for ct, n in step.tracker.items():
                    tracker[ct] += n
                if step.node_id is None:
                    break
                leaf = self.core.evict_device_leaf(step.node_id, self.core.is_write_back)
                self.drain(leaf)
                for ct, n in leaf.tracker.items():
                    tracker[ct] += n
                if leaf.backup_kv is not None:
                    for node_id in leaf.backup_kv.node_ids:
                        self.back_up(node_id)
                    demoted = self.core.demote(step.node_id)
                    self.drain(demoted)
                    for ct, n in demoted.tracker.items():
                        tracker[ct] += n
        finally:
            self.core.evict_device_end(FULL)

    def evict_host(self) -> None:
        self.drain(self.core.drive_host_eviction(FULL, EVERYTHING))

    def insert_host(self, node_id: int, tokens: list[int], extra_key, host: list[int]) -> list[int]:
        """An L3 prefetch below ``node_id`` (its pages hashed as storage keys them, chained from
        the anchor's last hash); returns the host slots the caller frees."""
        key = RadixKey(array("q", tokens), extra_key)
        prior = self.core.get_last_hash_value(node_id)
        hashes = get_storage_hash_str(key, prior, page_size=self.core.page_size) if tokens else []
        result = self.core.insert_host(node_id, key, torch.tensor(host, dtype=torch.int64), hashes)
        assert not result.cache_actions
        return host if result.host_insert_dropped else host[: result.prefix_len]


def same_state(drivers: list[CoreDriver], what: str) -> None:
    theirs, ours = drivers
    assert ours.pages() == theirs.pages(), f"after {what}: the pages on each tier differ"
    assert sorted(ours.freed) == sorted(theirs.freed), f"after {what}: freed device indices differ"
    assert sorted(ours.host_freed) == sorted(theirs.host_freed), f"after {what}: freed host indices differ"
    sizes = [(d.core.full_evictable_size(), d.core.full_protected_size(), d.core.total_size()) for d in drivers]
    assert sizes[0] == sizes[1], f"after {what}: sizes differ"
    for driver in drivers:
        driver.freed.clear()
        driver.host_freed.clear()


SEGMENTS = [[7, 7, 7, 7], [1, 2, 3, 4, 5, 6], [9, 8]]


def random_tokens(rng: random.Random) -> list[int]:
    tokens = [t for _ in range(rng.randrange(4)) for t in rng.choice(SEGMENTS)]
    return tokens + [rng.randrange(4) for _ in range(rng.randrange(7))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("storage", [False, True], ids=["l2", "l3"])
@pytest.mark.parametrize(("page_size", "is_eagle"), [(1, False), (2, False), (1, True)])
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_radix_tree_core_is_sglangs_step_by_step(backend_name, write_policy, page_size, is_eagle, storage, seed):
    rng = random.Random(f"{write_policy}-{page_size}-{is_eagle}-{storage}-{seed}")
    cores = (UnifiedTreeCore, RadixTreeCore)
    drivers = [CoreDriver(make, page_size, "lru", write_policy, is_eagle, storage) for make in cores]
    numbers = iter(range(1, 10**9))
    locks: list = []
    host_locks: list = []
    operations = ["insert"] * 4 + ["chunked", "match", "lock", "unlock", "evict", "evict_host", "load_back"]
    operations += ["host_lock", "host_unlock"] + ["insert_host"] * (not is_eagle)  # L3 keys are no bigrams
    operations += ["storage_backup"] * storage
    for step in range(150):
        op = rng.choice(operations)
        tokens, extra_key = random_tokens(rng), rng.choice([None, "lora-a"])
        if op == "insert":
            values = [next(numbers) for _ in tokens]
            prefixes = [d.insert(tokens, extra_key, values) for d in drivers]
            assert prefixes[0] == prefixes[1]
        elif op == "chunked":  # a request's first chunk, cached; then the whole, from its own prefix
            cut = rng.randrange(len(tokens) + 1)
            values = [next(numbers) for _ in tokens]
            for driver in drivers:
                driver.insert(tokens[:cut], extra_key, values[:cut])
            owned = [d.match(tokens[:cut], extra_key) for d in drivers]
            assert owned[0][1] == owned[1][1]
            own = owned[0][1] + values[len(owned[0][1]) :]
            prefixes = [d.insert(tokens, extra_key, own, len(owned[0][1])) for d in drivers]
            assert prefixes[0] == prefixes[1]
        elif op == "match":
            matches = [d.match(tokens, extra_key) for d in drivers]
            found = [
                (m.device_prefix_len, m.host_hit_length, m.full_kv_hit_length, indices, best)
                for m, indices, best in matches
            ]
            assert found[0] == found[1]
            # the read-only views the scheduler takes: a device match, paths, their order
            key = RadixKey(array("q", tokens), extra_key)
            device = [d.core.match_full_device_prefix(key) for d in drivers]
            assert (device[0][0], device[0][2]) == (device[1][0], device[1][2])  # node ids differ
            views = []
            for driver, (match, _, _) in zip(drivers, matches):
                ends = [match.best_match_node, match.last_device_node, driver.core.root_node.id]
                paths = driver.core.collect_path_info(ends)
                shapes = [[(i.path_start, i.path_end, i.full_value_len, i.num_children) for i in p] for p in paths]
                views.append((shapes, driver.core.dfs_weight_order(ends), driver.core.is_write_through_compatible()))
            assert views[0] == views[1]
        elif op == "lock":
            receipts = [d.core.inc_lock_ref(d.match(tokens, extra_key)[0].last_device_node) for d in drivers]
            assert receipts[0].delta == receipts[1].delta
            locks.append(receipts)
        elif op == "unlock" and locks:
            for driver, receipt in zip(drivers, locks.pop(rng.randrange(len(locks)))):
                driver.core.dec_lock_ref(receipt.node_id, receipt.to_dec_params())
        elif op == "host_lock":
            receipts = [d.core.inc_host_lock_ref(d.match(tokens, extra_key)[0].best_match_node) for d in drivers]
            locked = [FULL in receipt.component_host_lock_uuids for receipt in receipts]
            assert locked[0] == locked[1]
            if locked[0]:  # no host copy to lock (outside write_back): no receipt to release
                host_locks.append(receipts)
        elif op == "host_unlock" and host_locks:
            for driver, receipt in zip(drivers, host_locks.pop(rng.randrange(len(host_locks)))):
                driver.core.dec_host_lock_ref(receipt.node_id, receipt.to_dec_params())
        elif op == "insert_host":
            # A prefetch, anchored where a match of the first part of the prompt ended on the host
            # (the tree may have grown below since): the rest comes from storage.
            anchored = tokens[: rng.randrange(len(tokens) + 1)]
            anchors = [d.match(anchored, extra_key) for d in drivers]
            depth = anchors[0][2]
            tail = tokens[depth:] + [rng.randrange(4) for _ in range(rng.randrange(6))]
            tail = tail[: len(tail) - len(tail) % page_size]
            units = tokens[:depth] + tail
            host = host_items(extra_key, units, depth, len(units))
            freed = [d.insert_host(m.best_match_node, tail, extra_key, host) for d, (m, _, _) in zip(drivers, anchors)]
            if write_policy != "write_back" and drivers[0].host_copies_below_none():
                # SGLang refilled below a node with no host copy (an anchor hit once under
                # write_through_selective): evicting that node would orphan them. radix-core keeps
                # host copies rooted and frees those slots instead; the trees differ from here.
                assert write_policy == "write_through_selective" and set(freed[0]) < set(freed[1])
                return
            assert freed[0] == freed[1]
        elif op == "storage_backup":  # what a backup to L3 reads of the deepest node matched
            specs = []
            for driver in drivers:
                node_id = driver.match(tokens, extra_key)[0].best_match_node
                spec = driver.core.build_storage_backup_spec(node_id, True)
                chain = (driver.core.get_prefix_hash_values(node_id), driver.core.get_last_hash_value(node_id))
                if spec is None:
                    specs.append((None, chain))
                else:
                    fields = (spec.host_value.tolist(), list(spec.token_ids), spec.hash_value, spec.prefix_keys)
                    specs.append((fields, chain))
            assert specs[0] == specs[1]
        elif op == "evict":
            for driver in drivers:
                driver.evict()
        elif op == "evict_host":
            for driver in drivers:
                driver.evict_host()
        elif op == "load_back":
            matches = [d.match(tokens, extra_key)[0] for d in drivers]
            specs = [d.core.build_load_back_spec(m.best_match_node)[0] for d, m in zip(drivers, matches)]
            assert specs[0].host_indices.tolist() == specs[1].host_indices.tolist()
            if specs[0].nodes_to_load:  # as UnifiedRadixCache loads back: under a lock until the copy lands
                device = torch.tensor([next(numbers) for _ in range(len(specs[0].host_indices))])
                receipts = []
                for driver, match, spec in zip(drivers, matches, specs):
                    receipts.append(driver.core.inc_lock_ref(match.best_match_node))
                    driver.core.commit_load_back(match.best_match_node, device, spec, {})
                    driver.core.finish_load_back(match.best_match_node)
                locks.append(receipts)
        same_state(drivers, f"step {step}: {op} {tokens} {extra_key}")


def test_a_reset_or_dead_cores_tree_is_freed(backend_name):
    """radix-native's walk keeps every node class it reads for the process's life; what a core's
    node class holds must not keep a tree alive past a reset (SGLang's flush_cache) or the core."""
    driver = CoreDriver(RadixTreeCore, 1, "lru", "write_through", False, False)
    node_class = type(driver.core.root_node)
    for number in range(20):
        driver.insert([number, 1, 2, 3], None, [4 * number + item for item in range(4)])
        driver.match([number, 1], None)  # a split

    def nodes_alive() -> int:
        gc.collect()
        return sum(type(item) is node_class for item in gc.get_objects())

    assert nodes_alive() > 20
    driver.core.reset()
    assert nodes_alive() == 1  # the new root
    del driver
    assert nodes_alive() == 0
