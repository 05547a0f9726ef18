"""radix-native's tree against radix-core's Python tree, step by step.

The same random operations go to ``radix_core.RadixCache`` (the reference, int64 values) and to
``radix_native._tree.Tree``; after every step both hold the same nodes (tokens, values, locks,
hit counts, priorities, access and creation times, children), the same sizes, and every answer
agrees: prefix lengths, matched values, lock deltas, what eviction took and in which order. The
Python tree reads its clock once per call and twice per node it makes; here every read is a new
tick, and the native tree is given the times the Python tree read in the same call.
"""

from __future__ import annotations

import collections
import gc
import itertools
import time
from array import array

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import radix_core
from radix_core.cache import EVICTION_POLICIES
from radix_native import _tree  # a missing module fails the native session
from radix_testing.examples import examples

NAMESPACES = [None, "lora-a"]
tokens = st.lists(st.integers(0, 3), max_size=14)


class TickingClock:
    """A clock for the Python tree: a new tick per read, the reads of the running step kept for the
    native tree."""

    def __init__(self) -> None:
        self.ticks = itertools.count(1)
        self.read: list[float] = []

    def monotonic(self) -> float:
        tick = float(next(self.ticks))
        self.read.append(tick)
        return tick

    def times(self) -> array:
        """What the Python tree read in this step (one time if it read none)."""
        return array("d", self.read or [0.0])


def native_bytes(raw: bytes | bytearray) -> list[int]:
    values = array("q")
    values.frombytes(raw)
    return values.tolist()


class TreeAgainstPython(RuleBasedStateMachine):
    @initialize(page=st.sampled_from([1, 2]), eagle=st.booleans(), policy=st.sampled_from(sorted(EVICTION_POLICIES)))
    def build(self, page: int, eagle: bool, policy: str) -> None:
        self.clock = TickingClock()
        self.freed: list[int] = []
        self.python = radix_core.RadixCache(
            page,
            eagle,
            policy,
            on_evict=lambda value: self.freed.extend(value),
            tree="python",
            clock=self.clock.monotonic,
        )
        self.native = _tree.Tree(page, eagle, policy)
        self.namespace_numbers = {name: number for number, name in enumerate(NAMESPACES)}
        self.next_value = 1000
        self.nodes: list[tuple[object, int, int]] = []  # (Python node, native id, generation)
        self.locks: list[tuple[object, int, int]] = []

    def step(self) -> None:
        self.clock.read = []

    @rule(raw=tokens, namespace=st.sampled_from(NAMESPACES), with_values=st.booleans())
    def match(self, raw: list[int], namespace: object, with_values: bool = True) -> None:
        self.step()
        ours = self.python.match_prefix(radix_core.RadixKey(raw, namespace))
        length, node, generation, values = self.native.match(
            array("q", raw), self.namespace_numbers[namespace], self.clock.times(), values=with_values
        )
        assert length == ours.prefix_len
        assert native_bytes(values) == list(ours.indices) if with_values else values is None
        self.nodes.append((ours.last_node, node, generation))

    @rule(
        raw=tokens,
        namespace=st.sampled_from(NAMESPACES),
        priority=st.integers(-2, 2),
        inserted=st.integers(0, 14),
    )
    def insert(self, raw: list[int], namespace: object, priority: int, inserted: int) -> None:
        self.step()
        values = array("q", range(self.next_value, self.next_value + len(raw)))
        self.next_value += len(raw)
        key = radix_core.RadixKey(raw, namespace)
        ours = self.python.insert(key, values, priority, inserted_len=inserted)
        length, node, generation = self.native.insert(
            array("q", raw), self.namespace_numbers[namespace], values, priority, inserted, self.clock.times()
        )
        assert length == ours.prefix_len
        self.nodes.append((ours.last_node, node, generation))

    @rule(
        raw=tokens,
        extra=tokens,
        namespace=st.sampled_from(NAMESPACES),
        priority=st.integers(-2, 2),
        inserted=st.integers(0, 28),
        offset_pick=st.integers(0, 1 << 16),
        split_pick=st.integers(0, 1 << 16),
        follow=st.booleans(),
        again=st.booleans(),
    )
    def checkpoint(self, raw, extra, namespace, priority, inserted, offset_pick, split_pick, follow, again) -> None:
        """What a scheduler's checkpoint does: match a prefix, then insert it grown, following the
        matched node (or not), the values starting inside the cached part, cut where asked; and
        (``again``) the part before the cut inserted again at a higher priority, two inserts on
        the Python tree, one call of the native tree."""
        self.match(raw, namespace)
        python_node, node, generation = self.nodes[-1]
        cached = len(self.python.path_indices(python_node))
        self.step()
        full = raw + extra
        offset = offset_pick % (cached + 1)
        values = array("q", range(self.next_value, self.next_value + len(full) - offset))
        self.next_value += len(full)
        page = self.python.page_size
        units = len(radix_core.RadixKey(full, namespace, is_bigram=self.python.is_eagle))
        split_at = page * (split_pick % (units // page + 2)) if split_pick % 3 else None
        ours = self.python.insert(
            radix_core.RadixKey(full, namespace),
            values,
            priority,
            inserted_len=inserted,
            value_offset=offset,
            known_path=python_node if follow else None,
            split_at=split_at,
        )
        more = {"value_offset": offset, "split_at": -1 if split_at is None else split_at}
        if follow:
            more.update(known_path=node, known_generation=generation)
        times = self.clock.times()
        if again and split_at:
            self.step()
            prefix = radix_core.RadixKey(full, namespace, is_bigram=self.python.is_eagle).page_aligned(page)[:split_at]
            units = len(prefix)
            again_at = {"inserted_len": units, "value_offset": units, "known_path": ours.last_node}
            self.python.insert(prefix, values[:0], priority + 1, **again_at)
            more.update(prefix_priority=priority + 1, prefix_times=self.clock.times())
        length, native_node, native_generation = self.native.insert(
            array("q", full), self.namespace_numbers[namespace], values, priority, inserted, times, **more
        )
        assert length == ours.prefix_len
        self.nodes.append((ours.last_node, native_node, native_generation))

    @precondition(lambda self: self.locks and self.nodes)
    @rule(old=st.integers(0, 1 << 16), new=st.integers(0, 1 << 16))
    def move_lock(self, old: int, new: int) -> None:
        python_old, old_node, old_generation = self.locks[old % len(self.locks)]
        python_new, new_node, new_generation = self.nodes[new % len(self.nodes)]
        moved = self.both(
            lambda: self.python.move_lock(python_old, python_new),
            lambda: self.native.move_lock(old_node, old_generation, new_node, new_generation),
        )
        if moved is not None:
            self.locks[old % len(self.locks)] = (python_new, new_node, new_generation)

    @precondition(lambda self: self.nodes)
    @rule(pick=st.integers(0, 1 << 16))
    def touch(self, pick: int) -> None:
        self.step()
        python_node, node, generation = self.nodes[pick % len(self.nodes)]
        self.both(
            lambda: self.python.touch(python_node), lambda: self.native.touch(node, generation, self.clock.times()[0])
        )

    @precondition(lambda self: self.nodes)
    @rule(pick=st.integers(0, 1 << 16))
    def lock(self, pick: int) -> None:
        python_node, node, generation = self.nodes[pick % len(self.nodes)]
        outcome = self.both(
            lambda: self.python.inc_lock_ref(python_node), lambda: self.native.inc_lock_ref(node, generation)
        )
        if outcome is not None:
            self.locks.append((python_node, node, generation))

    @precondition(lambda self: self.locks)
    @rule(pick=st.integers(0, 1 << 16))
    def unlock(self, pick: int) -> None:
        python_node, node, generation = self.locks.pop(pick % len(self.locks))
        self.both(lambda: self.python.dec_lock_ref(python_node), lambda: self.native.dec_lock_ref(node, generation))

    @rule(units=st.integers(0, 12))
    def evict(self, units: int) -> None:
        self.freed.clear()
        evicted = self.python.evict(units)
        native_evicted, taken = self.native.evict(units)
        assert native_evicted == evicted
        freed = [item for _, n, _, _, values, start in taken for item in native_bytes(values)[start : start + n]]
        assert freed == self.freed
        assert sum(entry[1] for entry in taken) == evicted

    @precondition(lambda self: self.nodes)
    @rule(pick=st.integers(0, 1 << 16), start=st.integers(0, 12), stop=st.none() | st.integers(0, 14))
    def path_values(self, pick: int, start: int, stop: int | None) -> None:
        python_node, node, generation = self.nodes[pick % len(self.nodes)]
        self.both(
            lambda: list(self.python.path_indices(python_node))[start:stop],
            lambda: native_bytes(self.native.path_values(node, generation, start, -1 if stop is None else stop)),
        )

    def both(self, python_call, native_call):
        """Both calls give the same answer, or both refuse (ValueError); returns the answer."""
        try:
            expected = python_call()
        except ValueError:
            with pytest.raises(ValueError):
                native_call()
            return None
        assert native_call() == expected
        return expected

    @invariant()
    def same_trees(self) -> None:
        if not hasattr(self, "native"):
            return
        assert self.native.evictable_size() == self.python.evictable_size()
        assert self.native.protected_size() == self.python.protected_size()
        assert self.native.node_count() == self.python.node_count()
        assert self.shape(self.python.root_node, 0, self.native.root_generation()) is not None
        per_namespace = collections.Counter(self.namespace_numbers[node.key.extra_key] for node in self.python_nodes())
        for name, number in self.namespace_numbers.items():
            assert self.native.namespace_nodes(number) == per_namespace[number], name

    def python_nodes(self) -> list:
        found, stack = [], list(self.python.root_node.children.values())
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(node.children.values())
        return found

    def shape(self, python_node, node: int, generation: int) -> bool:
        state = self.native.node_state(node, generation)
        for field in ("lock_ref", "hit_count", "priority"):
            assert state[field] == getattr(python_node, field), field
        if python_node is not self.python.root_node:  # the root's times never decide anything
            assert native_bytes(state["tokens"]) == list(python_node.key.token_ids)
            assert native_bytes(state["values"]) == list(python_node.value)
            assert self.namespace_numbers[python_node.key.extra_key] == state["namespace"]
            assert state["last_access_time"] == python_node.last_access_time
            assert state["creation_time"] == python_node.creation_time
        children = {}
        for child in state["children"]:
            child_state = self.native.node_state(*child)
            children[child_state["namespace"], tuple(native_bytes(child_state["tokens"]))] = child
        assert len(children) == len(python_node.children)
        for python_child in python_node.children.values():
            key = python_child.key
            self.shape(python_child, *children[self.namespace_numbers[key.extra_key], tuple(key.token_ids)])
        return True


TestTreeAgainstPython = TreeAgainstPython.TestCase
TestTreeAgainstPython.settings = settings(max_examples=examples(300), stateful_step_count=50)


def test_abi_is_what_this_release_expects():
    assert _tree.TREE_ABI == 8


@pytest.mark.parametrize(
    ("values", "runs"),
    [
        ([], []),
        ([7], [(7, 1)]),
        ([3, 4, 5, 9, 10, 2], [(3, 3), (9, 2), (2, 1)]),
        ([5, 5, 6, 4], [(5, 1), (5, 2), (4, 1)]),
        ([2**63 - 2, 2**63 - 1, -(2**63), -(2**63) + 1], [(2**63 - 2, 2), (-(2**63), 2)]),
    ],
)
def test_consecutive_runs(values, runs):
    assert _tree.consecutive_runs(array("q", values)) == runs
    assert _tree.consecutive_runs(memoryview(bytearray(array("q", values))).cast("q")) == runs
    with pytest.raises(TypeError):
        _tree.consecutive_runs(array("i", [1, 2]))


@pytest.mark.parametrize("bad", [array("i", [1, 2]), array("d", [1.0]), b"abcdefgh", [1, 2]])
def test_tokens_must_be_an_int64_buffer(bad):
    with pytest.raises(TypeError):
        _tree.Tree(1, False, "lru").match(bad, 0, array("d", [0.0]))


@pytest.mark.parametrize("bad", [array("f", [1.0]), array("d"), 1.0])
def test_times_must_be_a_buffer_of_doubles(bad):
    with pytest.raises(TypeError, match="times"):
        _tree.Tree(1, False, "lru").match(array("q", [1]), 0, bad)


def test_without_times_the_tree_reads_the_clock_time_monotonic_reads():
    tree = _tree.Tree(1, False, "lru")
    before = time.monotonic()
    _, node, generation = tree.insert(array("q", [1, 2, 3]), 0, array("q", [7, 8, 9]), 0, 0, None)
    tree.insert(array("q", [1, 2, 4]), 0, array("q", [7, 8, 5]), 0, 0, None, split_at=2, prefix_priority=2)
    tree.match(array("q", [1, 2, 3]), 0, None)
    after = time.monotonic()
    state = tree.node_state(node, generation)
    parent = tree.node_state(state["parent"], state["parent_generation"])
    assert before <= parent["creation_time"] <= parent["last_access_time"] <= state["last_access_time"] <= after
    assert parent["priority"] == 2


def test_values_may_be_memory_the_caller_holds():
    tree = _tree.Tree(1, False, "lru")
    for typecode, itemsize in (("q", 8), ("i", 4)):
        held = array(typecode, [-5, 6, 2**31 - 1])
        memory = (held.buffer_info()[0], len(held), itemsize)
        assert tree.insert(array("q", [itemsize, 1, 2]), 0, memory, 0, 0, None)[0] == 0
        assert native_bytes(tree.match(array("q", [itemsize, 1, 2]), 0, None)[3]) == [-5, 6, 2**31 - 1]
    assert tree.insert(array("q"), 0, (0, 0, 8), 0, 0, None)[0] == 0  # no items: no address needed
    for bad in [(0, 1, 8), (16, 1, 2), (16, -1, 8)]:
        with pytest.raises(ValueError, match="address"):
            tree.insert(array("q", [3]), 0, bad, 0, 0, None)
    for bad in [5, (16, 1), (16, 1, 8, 0), (16.0, 1, 8), (-16, 1, 8)]:
        with pytest.raises(TypeError, match="values"):
            tree.insert(array("q", [3]), 0, bad, 0, 0, None)


def test_unknown_policy_and_page_size_are_refused():
    with pytest.raises(ValueError, match="eviction policy"):
        _tree.Tree(1, False, "random")
    with pytest.raises(ValueError, match="page_size"):
        _tree.Tree(0, False, "lru")


def test_a_node_that_is_gone_is_told_apart_from_its_slots_next_tenant():
    tree = _tree.Tree(1, False, "lru")
    _, node, generation = tree.insert(array("q", [1, 2]), 0, array("q", [7, 8]), 0, 0, array("d", [1.0]))
    assert tree.evict(2)[0] == 2
    _, again, again_generation = tree.insert(array("q", [3]), 0, array("q", [9]), 0, 0, array("d", [2.0]))
    assert again == node and again_generation != generation
    with pytest.raises(ValueError, match=r"not \(or no longer\) in this cache"):
        tree.inc_lock_ref(node, generation)
    assert tree.inc_lock_ref(again, again_generation) == -1


def test_int32_values_are_kept_as_int64_and_other_values_refused():
    """SGLang's KV index rows are int32: the tree widens them in the one copy it keeps."""
    tree = _tree.Tree(1, False, "lru")
    times = array("d", [1.0])
    tree.insert(array("q", [1, 2, 3]), 0, array("i", [7, -8, 2**31 - 1]), 0, 0, times)
    assert native_bytes(tree.match(array("q", [1, 2, 3]), 0, times)[3]) == [7, -8, 2**31 - 1]
    for bad in (array("h", [1, 2, 3]), array("d", [1.0, 2.0, 3.0]), [1, 2, 3]):
        with pytest.raises(TypeError):
            tree.insert(array("q", [4, 5, 6]), 0, bad, 0, 0, times)


def test_a_key_array_the_tree_keeps_stays_the_callers_to_grow():
    """The tree keeps the caller's key array (no copy, as the Python tree) but exports it only
    within a call: SGLang extends a request's array in place (Req.full_untruncated_fill_ids).
    An array that loses tokens the tree holds is reported, never read past its end."""
    tree = _tree.Tree(1, False, "lru")
    times = array("d", [1.0])
    key = array("q", [1, 2, 3, 4])
    tree.insert(key, 0, array("q", [5, 6, 7, 8]), 0, 0, times)
    key.extend(range(10_000))  # reallocates: nothing pins the array
    assert tree.match(array("q", [1, 2, 3, 4, 0]), 0, times)[0] == 4
    assert not gc.is_tracked(key)  # it refers to nothing but its type: no cycle can hold it
    del key[2:]
    with pytest.raises(ValueError, match="lost tokens"):
        tree.match(array("q", [1, 2, 3, 4]), 0, times)


def test_values_made_for_the_tree_are_kept_and_handed_out_at_eviction():
    tree = _tree.Tree(1, False, "lru")
    times = array("d", [1.0])
    values = array("q", [10, 20, 30])
    tree.insert(array("q", [1, 2, 3]), 0, values, 0, 0, times, keep_values=True)
    assert not gc.is_tracked(values)
    assert native_bytes(tree.match(array("q", [1, 2, 3]), 0, times)[3]) == [10, 20, 30]
    evicted, [(_, units, _, _, store, start)] = tree.evict(3)
    assert (evicted, store[start : start + units]) == (3, values)


def test_a_short_key_of_a_long_array_is_copied():
    """No array is kept for less than half its tokens (the Python tree's rule)."""
    tree = _tree.Tree(1, False, "lru")
    times = array("d", [1.0])
    key = array("q", range(100))
    tree.insert(key, 0, array("q", range(10)), 0, 0, times, key_stop=10)
    del key[:]
    assert tree.match(array("q", range(10)), 0, times)[0] == 10
    assert gc.is_tracked(key)


def test_a_key_window_is_read_and_evicted_values_are_handed_out():
    tree = _tree.Tree(1, False, "lru")
    times = array("d", [1.0])
    key = array("q", [7, 1, 2, 3, 7])
    assert tree.insert(key, 0, array("q", [10, 20, 30]), 0, 0, times, key_start=1, key_stop=4)[0] == 0
    assert tree.match(array("q", [0, 1, 2, 3]), 0, times, key_start=1)[0] == 3
    with pytest.raises(ValueError, match="key window"):
        tree.match(key, 0, times, key_start=3, key_stop=2)
    evicted, [(_, units, _, _, values, start)] = tree.evict(3)
    assert (evicted, native_bytes(values)[start : start + units]) == (3, [10, 20, 30])


DAEMONS_AT_EXIT = """
import threading
from array import array
from radix_native import _tree
class Finalized:  # cyclic garbage: collections that a tree call's allocations start run Python
    def __del__(self):
        sum(range(50))
def spin(seed):
    tree = _tree.Tree(1, False, "lru")
    keys = [array("q", [seed, n % 7, n % 5, n]) for n in range(64)]
    values = array("q", range(4))
    first, second = array("d", [1.0]), array("d", [2.0])
    while True:
        for key in keys:
            garbage = Finalized(); garbage.cycle = garbage
            tree.insert(key, 0, values, 0, 0, first)
            tree.match(key, 0, second)
        tree.evict(100)
for seed in range(4):
    threading.Thread(target=spin, args=(seed,), daemon=True).start()
"""


def test_daemon_threads_inside_the_tree_at_interpreter_exit_never_crash():
    """As the kernels' test (radix-core's test_backend_selection): CPython ends daemon threads that
    wake after shutdown with pthread_exit, unwinding whatever C++ frames they are in, and a tree
    call's allocations may start a collection whose finalizers run Python (and so switch threads)
    inside the call. 100 exits (examples(100)), none may crash or hang."""
    import signal
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    def one_exit(_: int) -> int | str:
        try:
            return subprocess.run([sys.executable, "-c", DAEMONS_AT_EXIT], capture_output=True, timeout=30).returncode
        except subprocess.TimeoutExpired:
            return "hung"

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(one_exit, range(examples(100))))
    assert "hung" not in outcomes
    if sys.version_info < (3, 11):  # CPython 3.10's own take_gil crash (see the kernels' test)
        outcomes = [0 if outcome == -signal.SIGSEGV else outcome for outcome in outcomes]
    assert outcomes == [0] * len(outcomes)
