"""A deterministic clock for tests whose answers depend on recency (eviction orders)."""

from __future__ import annotations

import itertools
import time

import pytest


@pytest.fixture
def ticking_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.monotonic() that advances by one per call: no two reads tie, so the eviction orders of
    every Python tree in the test (radix-core's, SGLang's) are exact."""
    ticks = itertools.count(1)
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))
