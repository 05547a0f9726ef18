"""SGLang's own EAGLE RadixCache paths with the adapter off and on: same results, our function called."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import radix_core
import radix_sglang_adapter as adapter
import sglang_harness as sg
from call_counting import count_calls

UTILS = importlib.import_module("sglang.srt.mem_cache.utils")
ORIGINAL = getattr(UTILS, "convert_to_bigram_key", None)
needs_convert = pytest.mark.skipif(not sg.CALLS_CONVERT, reason="this SGLang has no convert_to_bigram_key")

SYSTEM_PROMPT = [(7 * i) % 97 + 3 for i in range(120)]
REQUESTS = [
    (SYSTEM_PROMPT + [11, 12, 13], [40, 41, 42, 43]),
    (SYSTEM_PROMPT + [11, 12, 99], [44, 45]),
    (SYSTEM_PROMPT[:50], [46]),
    ([5, 6, 7, 8], [9, 10]),
    (SYSTEM_PROMPT + [11, 12, 13, 40, 41, 42, 43, 77], [78, 79, 80]),
]


@pytest.fixture(autouse=True)
def restore_sglang(monkeypatch):
    monkeypatch.delenv(adapter.DISABLE_ENV, raising=False)
    yield
    adapter.deactivate()


def serve(page_size: int = 1) -> list:
    """A scheduler's life of each request on an EAGLE RadixCache; returns everything observable."""
    pool = sg.ReqToTokenPool(rows=len(REQUESTS), width=512)
    cache = sg.make_cache(page_size=page_size, is_eagle=True, pool=pool)
    seen: list = []
    for row, (prompt, output) in enumerate(REQUESTS):
        matched, node, indices = sg.match(cache, prompt)
        seen.append(("match", matched, indices.tolist()))
        request = sg.make_request(pool, row, prompt, output, cache.root_node)
        if sg.CALLS_CONVERT:
            cache.inc_lock_ref(node)
            request.last_node = node
            cache.cache_unfinished_req(request)
            seen.append(("unfinished", request.prefix_indices.tolist(), request.cache_protected_len))
            cache.cache_finished_req(request)
        else:
            sg.insert(cache, prompt + output, pool.req_to_token[row, : len(prompt + output)].clone())
        seen.append(("sizes", cache.evictable_size(), cache.protected_size(), cache.total_size()))
    seen.append(("freed", [v.tolist() for v in cache.token_to_kv_pool_allocator.freed]))
    seen.append(("evicted", sg.evict(cache, 60), cache.evictable_size()))
    return seen


@pytest.mark.parametrize("page_size", [1, 4])
def test_results_are_identical_with_and_without_the_adapter(page_size):
    without = serve(page_size)
    adapter.activate()
    assert serve(page_size) == without


@needs_convert
def test_every_conversion_sglang_makes_goes_through_radix_core():
    with count_calls(ORIGINAL, adapter.sglang_convert_to_bigram_key) as off:
        serve()
    adapter.activate()
    with count_calls(ORIGINAL, adapter.sglang_convert_to_bigram_key) as on:
        serve()
    assert off["convert_to_bigram_key"] > 0 and off["sglang_convert_to_bigram_key"] == 0
    assert on["convert_to_bigram_key"] == 0
    assert on["sglang_convert_to_bigram_key"] == off["convert_to_bigram_key"]


@needs_convert
def test_the_replacement_runs_radix_cores_active_backend(monkeypatch):
    adapter.activate()
    calls = []
    monkeypatch.setattr(radix_core.bigram, "python_convert_to_bigram_key", lambda t: calls.append(t) or ORIGINAL(t))
    serve()
    if radix_core.backend().active == "native":
        assert calls == [], "native: the Python reference is not needed"
    else:
        assert calls, "python: the reference does the work"


@needs_convert
def test_kill_switch_restores_sglangs_own_path(monkeypatch):
    adapter.activate()
    monkeypatch.setenv(adapter.DISABLE_ENV, "1")
    adapter.activate()
    with count_calls(ORIGINAL, adapter.sglang_convert_to_bigram_key) as counts:
        serve()
    assert counts["convert_to_bigram_key"] > 0 and counts["sglang_convert_to_bigram_key"] == 0


@needs_convert
def test_a_failing_native_kernel_falls_back_once_and_serving_goes_on(tmp_path):
    if radix_core.backend().active != "native":
        pytest.skip("needs radix-native")
    tests_dir = Path(__file__).parent
    code = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s")
        import sglang_cpu_shim; sglang_cpu_shim.install()
        import radix_native, radix_core, radix_sglang_adapter
        from test_sglang_paths import serve
        expected = serve()
        radix_sglang_adapter.activate()
        def broken(tokens):
            raise RuntimeError("simulated kernel crash")
        radix_native.convert_to_bigram_key = broken
        assert serve() == expected, "same answers while the kernel is broken"
        assert serve() == expected
        print("BACKEND", radix_core.backend().active, radix_core.backend().reason)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BACKEND python native convert_to_bigram_key raised RuntimeError: simulated kernel crash" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("LOG radix_core")]
    assert len(warnings) == 1 and "simulated kernel crash" in warnings[0]
