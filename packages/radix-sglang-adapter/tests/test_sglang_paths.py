"""SGLang's own EAGLE RadixCache paths with the adapter off and on: same results, our function called."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

import radix_core
import radix_sglang_adapter as adapter
from radix_testing import sglang_harness as sg
from radix_testing.call_counting import count_calls
from radix_testing.sglang_harness import serve

UTILS = importlib.import_module("sglang.srt.mem_cache.utils")
ORIGINAL = getattr(UTILS, "convert_to_bigram_key", None)
needs_convert = pytest.mark.skipif(not sg.CALLS_CONVERT, reason="this SGLang has no convert_to_bigram_key")


@pytest.fixture(autouse=True)
def restore_sglang(monkeypatch):
    monkeypatch.delenv(adapter.DISABLE_ENV, raising=False)
    yield
    adapter.deactivate()


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
    code = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(level=logging.WARNING, format="LOG %(name)s %(message)s")
        from radix_testing import sglang_cpu_shim; sglang_cpu_shim.install()
        import radix_native, radix_core, radix_sglang_adapter
        from radix_testing.sglang_harness import serve
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
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BACKEND python native convert_to_bigram_key raised RuntimeError: simulated kernel crash" in result.stdout
    warnings = [line for line in result.stderr.splitlines() if line.startswith("LOG radix_core")]
    assert len(warnings) == 1 and "simulated kernel crash" in warnings[0]
