"""What a filled cache costs Python's garbage collector: the gc-tracked objects it holds,
and what they add to a full collection, as SGLang's scheduler process pays it on every one."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any


def full_collection_seconds(repeats: int = 5) -> float:
    """Median wall time of a full ``gc.collect()`` in this process as it stands."""
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        gc.collect()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def gc_footprint(holder: list[Any]) -> dict[str, float]:
    """The gc-tracked objects and full-collection milliseconds that what ``holder`` holds adds; it
    is emptied on the way (the difference is taken with and without it, in the same process)."""
    gc.collect()
    objects, seconds = len(gc.get_objects()), full_collection_seconds()
    holder.clear()
    gc.collect()
    return {
        "gc_objects": objects - len(gc.get_objects()),
        "gc_full_ms": (seconds - full_collection_seconds()) * 1e3,
    }
