"""Benchmark-only (bench-e2e): CPU-time counters inside a test server's scheduler process.

benchmark_e2e.py puts this directory first on its servers' ``PYTHONPATH``, before the test-only
server site (whose shims load first, here). In the scheduler process, the main thread's CPU time
(``time.thread_time``: the scheduler runs its loop, the model and the cache on that one thread,
torch pinned to 1 thread) is split into:
- forward: inside ``ModelRunner.forward`` and ``ModelRunner.sample`` (target and draft models);
- cache: inside any public method of the tree cache's class;
- stand-in kernels: inside the test-only ``sgl_kernel`` stand-in's functions (EAGLE's tree ops in
  Python, where a GPU server runs device kernels: not SGLang's own CPU cost);
each call counted in the part of the outermost timed call it runs in, less the probe's own time
per call (measured at start on a function that does nothing: ``probe_s_per_call``);
and written as JSON to ``$RADIX_E2E_PROBE_DIR/scheduler-<pid>.json`` whenever the scheduler goes
idle (any message wakes it: a record written after a workload's end counts all of it).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import time

from radix_testing import sglang_server_shims

sglang_server_shims.install()

COUNTS = {"forward_s": 0.0, "cache_s": 0.0, "stand_in_kernels_s": 0.0}
CACHE_METHODS: dict[str, list] = {}  # name -> [seconds, calls], the cache's part by method
_inside = [False]  # a timed call is running: calls under it are counted in its part


def _timed(part: str, function):
    """``function`` with its thread time added to COUNTS[part + "_s"] when it is the outermost timed call."""

    @functools.wraps(function)
    def timed(*args, **kwargs):
        if _inside[0]:
            return function(*args, **kwargs)
        _inside[0] = True
        start = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent = time.thread_time() - start
            COUNTS[f"{part}_s"] += spent
            _inside[0] = False
            if part == "cache":
                method = CACHE_METHODS.setdefault(function.__name__, [0.0, 0])
                method[0] += spent
                method[1] += 1

    return timed


def _probe_s_per_call(calls: int = 20_000) -> float:
    """What the probe records for a call of a function that does nothing."""
    noop = _timed("calibration", lambda: None)
    COUNTS["calibration_s"] = 0.0
    for _ in range(calls):
        noop()
    return COUNTS.pop("calibration_s") / calls


def _time_model_runner(module) -> None:
    for name in ("forward", "sample"):
        setattr(module.ModelRunner, name, _timed("forward", getattr(module.ModelRunner, name)))


def _time_tree_cache(module) -> None:
    create = module.create_tree_cache

    @functools.wraps(create)
    def create_timed(*args, **kwargs):
        cache = create(*args, **kwargs)
        cls = type(cache)
        for name, function in inspect.getmembers(cls, inspect.isfunction):
            if not name.startswith("_"):
                setattr(cls, name, _timed("cache", function))
        return cache

    module.create_tree_cache = create_timed


def _time_stand_in_kernels(module) -> None:
    for name, function in inspect.getmembers(module, inspect.isfunction):
        if not name.startswith("_") and function.__module__ == module.__name__:
            setattr(module, name, _timed("stand_in_kernels", function))


def _write_when_idle(module) -> None:
    on_idle = module.Scheduler.on_idle
    path = os.path.join(os.environ["RADIX_E2E_PROBE_DIR"], f"scheduler-{os.getpid()}.json")

    @functools.wraps(on_idle)
    def on_idle_written(self):
        record = {**COUNTS, "cache_methods": CACHE_METHODS, "probe_s_per_call": PROBE_S_PER_CALL}
        record.update(thread_s=time.thread_time(), written_at=time.time())
        with open(path + ".tmp", "w") as out:
            json.dump(record, out)
        os.replace(path + ".tmp", path)
        return on_idle(self)

    module.Scheduler.on_idle = on_idle_written


if os.environ.get("RADIX_E2E_PROBE_DIR"):
    PROBE_S_PER_CALL = _probe_s_per_call()
    sglang_server_shims.patch_after_import("sglang.srt.model_executor.model_runner", _time_model_runner)
    sglang_server_shims.patch_after_import("sglang.srt.mem_cache.registry", _time_tree_cache)
    sglang_server_shims.patch_after_import("sglang.srt.managers.scheduler", _write_when_idle)
    sglang_server_shims.patch_after_import("sgl_kernel", _time_stand_in_kernels)
