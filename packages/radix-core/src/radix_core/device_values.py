"""KV indices kept on their device for radix-native's tree.

On a GPU server SGLang's KV index rows are CUDA tensors. The native tree's own store is host
memory, and copying a row there would wait for the device on every insert; so such a cache used
to keep its nodes in Python. Here the indices stay on their device, in one int64 arena per cache,
and the tree keeps, as each unit's value, the unit's *position* in the arena: host integers it
splits, joins and evicts as it does any value. Positions are handed out in runs of consecutive
slots, so an insert copies its new indices in with one device copy per run, and a match gathers a
path's indices with one narrow per run and one ``cat``. An evicted node's indices are copied out
(for ``on_evict``) before its positions can be reused. Nothing here waits for the device: every
position is a host integer, every device operation is queued on the caller's stream.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["DeviceArena"]

_FIRST_SLOTS = 1024
_STALE_ENTRIES = 64  # the heap of free runs is rebuilt when it holds more than this beyond twice the runs


class DeviceArena:
    """int64 slots on one device. Free slots are kept as runs, merged with their neighbours when
    freed; an insert takes the largest run (most inserts then fit in one run), and several runs,
    largest first, only where none is large enough."""

    def __init__(self, like: Any, consecutive_runs: Callable[[Any], list[tuple[int, int]]]):
        self._torch = sys.modules["torch"]
        self.device = like.device
        self._runs_of = consecutive_runs  # radix-native's: an int64 buffer's runs, in order
        self.clear()

    def holds(self, value: Any) -> bool:
        """Whether ``value`` (a 1-D integer tensor) can be kept here losslessly."""
        return value.device == self.device and value.dtype != self._torch.uint64

    @property
    def slots(self) -> int:
        """The arena's size, in int64 slots (grown, never shrunk, until ``clear``)."""
        return self._items.shape[0]

    @property
    def used(self) -> int:
        return self.slots - self._free_count

    def clear(self) -> None:
        self._items = self._torch.empty(0, dtype=self._torch.int64, device=self.device)
        self._numbers = self._torch.empty(0, dtype=self._torch.int64)  # 0, 1, ... on the host: positions
        self._run_at: dict[int, int] = {}  # a free run's start -> its length
        self._run_ending: dict[int, int] = {}  # a free run's end -> its start
        self._largest: list[tuple[int, int]] = []  # a heap of (-length, start), stale entries skipped
        self._free_count = 0

    def reserve(self, count: int) -> tuple[Any, list[tuple[int, int]]]:
        """``count`` free positions, ascending, as a host int64 tensor and as the runs they form;
        nothing is written until :meth:`commit`."""
        torch = self._torch
        if count > self._free_count:
            self._grow(count - self._free_count)
        runs, needed = [], count
        while needed:
            start, length = self._take_largest()
            if length > needed:
                self._free_run(start + needed, length - needed)
                length = needed
            runs.append((start, length))
            needed -= length
        runs.sort()
        numbers = self._numbers
        if len(runs) <= 1:  # a view: no host work however long the value
            start, length = runs[0] if runs else (0, 0)
            return numbers.narrow(0, start, length), runs
        return torch.cat([numbers.narrow(0, start, length) for start, length in runs]), runs

    def commit(self, value: Any, runs: list[tuple[int, int]], first: int, last: int) -> None:
        """Write ``value[first:last]`` at its reserved positions (``runs``, one per item of
        ``value``); the positions of the other items are freed again (the tree kept none of them)."""
        at = 0
        for start, length in runs:
            keep_from, keep_to = max(first - at, 0), min(last - at, length)
            if keep_from < keep_to:
                self._items.narrow(0, start + keep_from, keep_to - keep_from).copy_(
                    value.narrow(0, at + keep_from, keep_to - keep_from)
                )
                self._free_run(start, keep_from)
                self._free_run(start + keep_to, length - keep_to)
            else:
                self._free_run(start, length)
            at += length

    def gather(self, positions: Any) -> Any:
        """A new device tensor of the items at ``positions`` (a host int64 buffer)."""
        runs = self._runs_of(positions)
        if not runs:
            return self._items[:0].clone()
        if len(runs) == 1:
            start, length = runs[0]
            return self._items.narrow(0, start, length).clone()
        return self._torch.cat([self._items.narrow(0, start, length) for start, length in runs])

    def release(self, positions: Any) -> None:
        """Free one node's ``positions`` (a host int64 buffer, ascending: one reservation's)."""
        count = len(positions)
        if count and positions[count - 1] - positions[0] == count - 1:  # ascending: one run
            self._free_run(positions[0], count)
            return
        for start, length in self._runs_of(positions):
            self._free_run(start, length)

    def _free_run(self, start: int, length: int) -> None:
        """Slots [start, start + length) are free, merged with the free runs either side."""
        if length <= 0:
            return
        self._free_count += length
        before = self._run_ending.pop(start, None)
        if before is not None:
            length += start - before
            start = before
            del self._run_at[start]
        after = self._run_at.pop(start + length, None)
        if after is not None:
            del self._run_ending[start + length + after]
            length += after
        self._run_at[start] = length
        self._run_ending[start + length] = start
        heapq.heappush(self._largest, (-length, start))
        if len(self._largest) > 2 * len(self._run_at) + _STALE_ENTRIES:  # a serving process frees forever
            self._largest = [(-size, first) for first, size in self._run_at.items()]
            heapq.heapify(self._largest)

    def _take_largest(self) -> tuple[int, int]:
        """The largest free run, no longer free."""
        while True:
            negative, start = heapq.heappop(self._largest)
            if self._run_at.get(start) == -negative:  # else merged or taken since it was pushed
                break
        length = -negative
        del self._run_at[start]
        del self._run_ending[start + length]
        self._free_count -= length
        return start, length

    def _grow(self, at_least: int) -> None:
        """At least ``at_least`` more free slots: a larger arena, the old items copied over."""
        torch = self._torch
        old = self.slots
        size = max(2 * old, old + at_least, _FIRST_SLOTS)
        items = torch.empty(size, dtype=torch.int64, device=self.device)
        if old:
            items.narrow(0, 0, old).copy_(self._items)
        self._items = items
        self._numbers = torch.arange(size, dtype=torch.int64)
        self._free_run(old, size - old)
