"""radix-core's host tier (TieredRadixCache) against SGLang 0.5.23's own, step by step.

SGLang keeps its HiCache tree in the Python TreeCore of UnifiedRadixCache (FULL component). Both
trees get the same random stream (inserts, matches, device and host locks, write-through backups,
load-backs, L3 inserts, device and host eviction) on CPU, driven as UnifiedRadixCache drives its
core (the cache controller's copies stand in as index bookkeeping); after every step both must
hold the same pages on each tier with the same indices, report the same prefixes, host hits and
sizes, and free the same indices. Evictions run to exhaustion, so that their order (each tree's
clock) cannot matter; the order itself is each tree's own policy heap.
"""

from __future__ import annotations

import random
import types
from array import array
from collections import defaultdict

import pytest
import torch

import radix_core
from radix_core import TieredRadixCache

pytest.importorskip("sglang.srt.mem_cache.unified_cache.unified_tree_core")

from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.full import FullComponent  # noqa: E402
from sglang.srt.mem_cache.unified_cache.unified_tree_core import UnifiedTreeCore  # noqa: E402

FULL = ComponentType.FULL
EVERYTHING = 10**9
THRESHOLDS = {"write_through": 1, "write_through_selective": 2, "write_back": 1}


def host_items(extra_key, units: list, start: int, stop: int) -> list[int]:
    """The host slots a unit's KV lands in: a function of its namespace and path, so both trees
    get the same ones whatever order their backups run in."""
    return [hash((extra_key, tuple(units[: i + 1]))) % 2**40 + 2**41 for i in range(start, stop)]


class SGLangTiers:
    """SGLang's Python TreeCore with HiCache on, driven as UnifiedRadixCache drives it."""

    def __init__(self, page_size: int, policy: str, write_policy: str):
        params = CacheInitParams(
            req_to_token_pool=None,
            token_to_kv_pool_allocator=None,
            page_size=page_size,
            disable=False,
            tree_components=(FULL,),
            eviction_policy=policy,
            is_eagle=False,
        )
        owner = types.SimpleNamespace(enable_session_radix_cache=False)
        self.core = UnifiedTreeCore(params, {FULL: FullComponent(owner, params)})
        self.core.set_hicache_enabled()
        self.core.is_write_back = write_policy == "write_back"
        self.core.write_through_threshold = THRESHOLDS[write_policy]
        self.freed: list[int] = []
        self.host_freed: list[int] = []

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

    def path_units(self, node) -> list:
        parts = []
        while node is not self.core.root_node:
            parts.append(node.key.token_ids.tolist())
            node = node.parent
        return [unit for part in reversed(parts) for unit in part]

    def back_up(self, node_id: int) -> None:
        node = self.core.node_by_id(node_id)
        if node.backuped:
            return
        units = self.path_units(node)
        host = host_items(node.key.extra_key, units, len(units) - len(node.key), len(units))
        self.core.commit_backup(node_id, torch.tensor(host, dtype=torch.int64), {})

    def insert(self, tokens: list[int], extra_key, values: list[int]) -> int:
        step = self.core.begin_insert(
            InsertParams(key=RadixKey(array("q", tokens), extra_key), value=torch.tensor(values, dtype=torch.int64))
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

    def insert_host(self, node_id: int, tokens: list[int], extra_key, host: list[int]) -> list[int]:
        """An L3 prefetch below ``node_id``; returns the host slots the caller frees."""
        pages = len(tokens) // self.core.page_size
        result = self.core.insert_host(
            node_id, RadixKey(array("q", tokens), extra_key), torch.tensor(host), [str(i) for i in range(pages)]
        )
        assert not result.cache_actions
        return host if result.host_insert_dropped else host[: result.prefix_len]

    def host_copies_below_none(self) -> bool:
        """Whether a node's host copy hangs below a node with none (not the root)."""
        stack = list(self.core.root_node.children.values())
        while stack:
            node = stack.pop()
            below = list(node.children.values())
            if node.component_data[FULL].host_value is None:
                if any(child.component_data[FULL].host_value is not None for child in below):
                    return True
            stack.extend(below)
        return False

    def evict_host(self) -> None:
        result = self.core.drive_host_eviction(FULL, EVERYTHING)
        self.drain(result)

    def pages(self) -> dict:
        found = {}
        stack = [(child, []) for child in self.core.root_node.children.values()]
        while stack:
            node, above = stack.pop()
            units = above + node.key.token_ids.tolist()
            data = node.component_data[FULL]
            page = self.core.page_size
            for i in range(0, len(node.key), page):
                label = (node.key.extra_key, tuple(units[: len(above) + i + page]))
                device = None if data.value is None else tuple(data.value[i : i + page].tolist())
                host = None if data.host_value is None else tuple(data.host_value[i : i + page].tolist())
                found[label] = (device, host)
            stack.extend((child, units) for child in node.children.values())
        return found


class RadixTiers:
    """radix-core's TieredRadixCache, driven as the adapter will drive it."""

    def __init__(self, page_size: int, policy: str, write_policy: str):
        self.freed: list[int] = []
        self.host_freed: list[int] = []
        self.tree = TieredRadixCache(
            page_size,
            False,
            policy,
            write_policy,
            on_evict=lambda value: self.freed.extend(value),
            on_host_evict=lambda value: self.host_freed.extend(value),
            back_up=self.host_value,
        )

    def host_value(self, node) -> array:
        units = self.path_units(node)
        return array("q", host_items(node.key.extra_key, units, len(units) - len(node.key), len(units)))

    def path_units(self, node) -> list:
        units: list = []
        for ancestor in reversed(self.tree._path_to_root(node)):
            units.extend(ancestor.key)
        return units

    def insert(self, tokens: list[int], extra_key, values: list[int]) -> int:
        result = self.tree.insert(radix_core.RadixKey(tokens, extra_key), array("q", values))
        adopted = {unit for start, stop in result.adopted for unit in range(start, stop)}
        self.freed.extend(values[unit] for unit in range(result.prefix_len) if unit not in adopted)
        for node in result.to_back_up:
            for part in self.tree.backup_chain(node):
                self.tree.commit_backup(part, self.host_value(part))
        return result.prefix_len

    def insert_host(self, node, tokens: list[int], extra_key, host: list[int]) -> list[int]:
        result = self.tree.insert_host(node, radix_core.RadixKey(tokens, extra_key), array("q", host))
        adopted = {unit for start, stop in result.adopted for unit in range(start, stop)}
        return [slot for unit, slot in enumerate(host) if unit not in adopted]

    def match(self, tokens: list[int], extra_key):
        result = self.tree.match_prefix(radix_core.RadixKey(tokens, extra_key))
        return result, list(result.indices), len(self.path_units(result.best_node))

    def pages(self) -> dict:
        found = {}
        stack = [(child, []) for child in self.tree.root_node.children.values()]
        while stack:
            node, above = stack.pop()
            units = above + list(node.key)
            page = self.tree.page_size
            for i in range(0, len(node.key), page):
                label = (node.key.extra_key, tuple(units[: len(above) + i + page]))
                device = None if node.value is None else tuple(node.value[i : i + page])
                host = None if node.host_value is None else tuple(node.host_value[i : i + page])
                found[label] = (device, host)
            stack.extend((child, units) for child in node.children.values())
        return found


def same_state(sglang: SGLangTiers, radix: RadixTiers, what: str) -> None:
    assert radix.pages() == sglang.pages(), f"after {what}: the pages on each tier differ"
    assert sorted(radix.freed) == sorted(sglang.freed), f"after {what}: freed device indices differ"
    assert sorted(radix.host_freed) == sorted(sglang.host_freed), f"after {what}: freed host indices differ"
    core = sglang.core
    assert (radix.tree.evictable_size(), radix.tree.protected_size()) == (
        core.full_evictable_size(),
        core.full_protected_size(),
    ), f"after {what}: sizes differ"
    for trees in (sglang, radix):
        trees.freed.clear()
        trees.host_freed.clear()


SEGMENTS = [[7, 7, 7, 7], [1, 2, 3, 4, 5, 6], [9, 8]]


def random_tokens(rng: random.Random) -> list[int]:
    tokens = [t for _ in range(rng.randrange(4)) for t in rng.choice(SEGMENTS)]
    return tokens + [rng.randrange(4) for _ in range(rng.randrange(7))]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("page_size", [1, 2])
@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_the_host_tier_is_sglangs_step_by_step(backend_name, write_policy, page_size, seed):
    rng = random.Random(f"{write_policy}-{page_size}-{seed}")
    sglang = SGLangTiers(page_size, "lru", write_policy)
    radix = RadixTiers(page_size, "lru", write_policy)
    numbers = iter(range(1, 10**9))
    locks: list = []
    host_locks: list = []
    operations = ["insert"] * 4 + ["match", "lock", "unlock", "evict", "evict_host", "load_back"]
    operations += ["host_lock", "host_unlock", "insert_host"]
    for step in range(150):
        op = rng.choice(operations)
        tokens, extra_key = random_tokens(rng), rng.choice([None, "lora-a"])
        if op == "insert":
            values = [next(numbers) for _ in tokens]
            assert radix.insert(tokens, extra_key, values) == sglang.insert(tokens, extra_key, values)
        elif op == "match":
            theirs, their_indices, their_best = sglang.match(tokens, extra_key)
            ours, our_indices, our_best = radix.match(tokens, extra_key)
            assert (ours.prefix_len, ours.host_hit_length, our_best) == (
                theirs.device_prefix_len,
                theirs.host_hit_length,
                their_best,
            )
            assert our_indices == their_indices
        elif op == "lock":
            theirs, _, _ = sglang.match(tokens, extra_key)
            ours, _, _ = radix.match(tokens, extra_key)
            receipt = sglang.core.inc_lock_ref(theirs.last_device_node)
            radix.tree.inc_lock_ref(ours.last_node)
            locks.append((theirs.last_device_node, receipt, ours.last_node))
        elif op == "unlock" and locks:
            node_id, receipt, node = locks.pop(rng.randrange(len(locks)))
            sglang.core.dec_lock_ref(node_id, receipt.to_dec_params())
            radix.tree.dec_lock_ref(node)
        elif op == "host_lock":
            theirs, _, _ = sglang.match(tokens, extra_key)
            ours, _, _ = radix.match(tokens, extra_key)
            receipt = sglang.core.inc_host_lock_ref(theirs.best_match_node)
            mark = radix.tree.inc_host_lock_ref(ours.best_node)
            assert (mark is None) == (FULL not in receipt.component_host_lock_uuids)
            if mark is not None:  # no host copy to lock (outside write_back): no receipt to release
                host_locks.append((theirs.best_match_node, receipt, ours.best_node, mark))
        elif op == "host_unlock" and host_locks:
            node_id, receipt, node, mark = host_locks.pop(rng.randrange(len(host_locks)))
            sglang.core.dec_host_lock_ref(node_id, receipt.to_dec_params())
            radix.tree.dec_host_lock_ref(node, mark)
        elif op == "insert_host":
            # A prefetch, anchored where a match of the first part of the prompt ended on the host
            # (the tree may have grown below since): the rest comes from storage.
            anchored = tokens[: rng.randrange(len(tokens) + 1)]
            theirs, _, depth = sglang.match(anchored, extra_key)
            ours, _, _ = radix.match(anchored, extra_key)
            tail = tokens[depth:] + [rng.randrange(4) for _ in range(rng.randrange(6))]
            tail = tail[: len(tail) - len(tail) % page_size]
            units = tokens[:depth] + tail
            host = host_items(extra_key, units, depth, len(units))
            theirs_freed = sglang.insert_host(theirs.best_match_node, tail, extra_key, host)
            ours_freed = radix.insert_host(ours.best_node, tail, extra_key, host)
            if write_policy != "write_back" and sglang.host_copies_below_none():
                # SGLang refilled below a node with no host copy (an anchor hit once under
                # write_through_selective): evicting that node would orphan them. radix-core keeps
                # host copies rooted and frees those slots instead; the trees differ from here.
                assert write_policy == "write_through_selective" and set(theirs_freed) < set(ours_freed)
                return
            assert ours_freed == theirs_freed
        elif op == "evict":
            sglang.evict()
            radix.tree.evict(EVERYTHING)
        elif op == "evict_host":
            sglang.evict_host()
            radix.tree.evict_host(EVERYTHING)
        elif op == "load_back":
            theirs, _, _ = sglang.match(tokens, extra_key)
            ours, _, _ = radix.match(tokens, extra_key)
            kv_xfer, _ = sglang.core.build_load_back_spec(theirs.best_match_node)
            run = radix.tree.load_back_nodes(ours.best_node)
            assert kv_xfer.host_indices.tolist() == list(radix.tree.host_indices(run))
            if run:  # as UnifiedRadixCache loads back: under a lock on the node, until the copy lands
                device = [next(numbers) for _ in range(len(kv_xfer.host_indices))]
                receipt = sglang.core.inc_lock_ref(theirs.best_match_node)
                sglang.core.commit_load_back(theirs.best_match_node, torch.tensor(device), kv_xfer, {})
                sglang.core.finish_load_back(theirs.best_match_node)
                radix.tree.inc_lock_ref(ours.best_node)
                radix.tree.commit_load_back(run, array("q", device), anchor=ours.best_node)
                radix.tree.finish_load_back(ours.best_node)
                locks.append((theirs.best_match_node, receipt, ours.best_node))
        same_state(sglang, radix, f"step {step}: {op} {tokens} {extra_key}")
