"""activate() / deactivate() / status() in a real SGLang process (0.5.10 and 0.5.23 wheels)."""

from __future__ import annotations

import importlib
import logging
import sys
import types

import pytest
import torch

import radix_sglang_adapter as adapter
from radix_sglang_adapter import _activation, patching
from radix_sglang_adapter._startup import activate_when_imported
from radix_testing import sglang_harness as sg

UTILS = importlib.import_module("sglang.srt.mem_cache.utils")
ORIGINAL = getattr(UTILS, "convert_to_bigram_key", None)  # before any activation in this process
needs_convert = pytest.mark.skipif(not sg.CALLS_CONVERT, reason="this SGLang has no convert_to_bigram_key")
lacks_convert = pytest.mark.skipif(sg.CALLS_CONVERT, reason="this SGLang still has convert_to_bigram_key")


@pytest.fixture(autouse=True)
def restore_sglang(monkeypatch):
    monkeypatch.delenv(adapter.DISABLE_ENV, raising=False)
    yield
    monkeypatch.delenv(adapter.DISABLE_ENV, raising=False)
    adapter.deactivate()


def binding_modules() -> list[types.ModuleType]:
    return [importlib.import_module(name) for name in patching.BINDING_MODULES]


def make_swa_cache():
    """A real SWARadixCache (EAGLE): it copies convert_to_bigram_key into key_convert_fn."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.swa_memory_pool import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache

    allocator = SWATokenToKVPoolAllocator.__new__(SWATokenToKVPoolAllocator)  # only its type is checked
    allocator.device = torch.device("cpu")
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        is_eagle=True,
        sliding_window_size=4,
    )
    return SWARadixCache(params)


def test_status_reports_sglang_and_the_backend():
    report = adapter.status()
    assert report.sglang_version == sg.SGLANG_VERSION
    assert report.state == "inactive" and report.activated_by is None
    assert report.radix_core_backend.startswith(("python", "native"))
    assert sg.SGLANG_VERSION in report.format()


@needs_convert
def test_activation_replaces_every_binding_and_deactivation_restores_them():
    modules = binding_modules()
    report = adapter.activate()
    assert report.state == "active" and report.activated_by == "activate()"
    replacement = adapter.sglang_convert_to_bigram_key
    assert UTILS.convert_to_bigram_key is replacement
    assert all(module.convert_to_bigram_key is replacement for module in modules)
    states = {point.target: point.state for point in report.patch_points}
    assert states["sglang.srt.mem_cache.utils.convert_to_bigram_key"] == "patched"
    assert all(states[f"{module.__name__}.convert_to_bigram_key"] == "patched" for module in modules)
    assert adapter.original_convert_to_bigram_key() is ORIGINAL

    assert adapter.activate().patch_points == report.patch_points, "idempotent"
    assert adapter.original_convert_to_bigram_key() is ORIGINAL, "the original is saved once"

    restored = adapter.deactivate()
    assert restored.state == "inactive"
    assert UTILS.convert_to_bigram_key is ORIGINAL
    assert all(module.convert_to_bigram_key is ORIGINAL for module in modules)
    assert adapter.deactivate().state == "inactive", "idempotent"


@needs_convert
def test_modules_imported_after_activation_bind_the_replacement_and_are_restored():
    adapter.activate()
    late = types.ModuleType("sglang.srt.late_consumer")
    exec("from sglang.srt.mem_cache.utils import convert_to_bigram_key", late.__dict__)
    sys.modules[late.__name__] = late
    try:
        assert late.convert_to_bigram_key is adapter.sglang_convert_to_bigram_key
        adapter.deactivate()
        assert late.convert_to_bigram_key is ORIGINAL
    finally:
        del sys.modules[late.__name__]


@needs_convert
def test_swa_caches_built_before_and_after_activation_use_the_replacement():
    before = make_swa_cache()
    assert before.key_convert_fn is ORIGINAL
    report = adapter.activate()
    after = make_swa_cache()
    assert before.key_convert_fn is adapter.sglang_convert_to_bigram_key
    assert after.key_convert_fn is adapter.sglang_convert_to_bigram_key
    (swa_point,) = [p for p in report.patch_points if p.target.endswith("key_convert_fn")]
    assert swa_point.state == "patched" and "1 live instance" in swa_point.detail
    assert before.key_convert_fn([1, 2, 3]) == [(1, 2), (2, 3)]
    adapter.deactivate()
    assert before.key_convert_fn is ORIGINAL and after.key_convert_fn is ORIGINAL


@lacks_convert
def test_without_the_function_activation_registers_the_backend_and_says_so_once(caplog):
    caplog.set_level(logging.INFO, logger="radix_sglang_adapter")
    first = adapter.activate()
    adapter.activate()
    assert first.state == "active" and "--radix-cache-backend radix" in first.reason
    assert "runs radix-core's" not in first.reason, "nothing is patched"
    assert [p.state for p in first.patch_points] == ["not in this release"]
    assert first.cache_backend.registered
    said = [r for r in caplog.records if "radix-sglang-adapter active" in r.getMessage()]
    assert len(said) == 1


@lacks_convert
def test_deactivation_also_takes_out_the_tree_core_that_serves_hicache():
    """SGLang selects TreeCores by name too (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND): after
    deactivate(), ``radix`` must resolve to radix-core's in neither registry."""
    from sglang.srt.mem_cache.unified_cache import tree_core_registry

    from radix_sglang_adapter import backend
    from radix_sglang_adapter.backend.registry import register_once
    from radix_sglang_adapter.backend.tree_core import RadixTreeCore

    adapter.activate()
    get, add = tree_core_registry.get_tree_core_factory, tree_core_registry.register_tree_core_backend
    register_once(get, add, RadixTreeCore, "TreeCore")  # what building a HiCache cache does
    assert get(backend.BACKEND_NAME) is RadixTreeCore
    adapter.deactivate()
    assert get(backend.BACKEND_NAME) is None
    assert not adapter.status().cache_backend.registered


def test_kill_switch_keeps_sglang_untouched(monkeypatch):
    adapter.activate()
    monkeypatch.setenv(adapter.DISABLE_ENV, "1")
    report = adapter.activate()
    assert report.state == "disabled" and adapter.DISABLE_ENV in report.reason
    assert getattr(UTILS, "convert_to_bigram_key", None) is ORIGINAL
    if sg.CALLS_CONVERT:
        assert all(module.convert_to_bigram_key is ORIGINAL for module in binding_modules())


def test_unknown_kill_switch_value_raises_when_explicit_and_only_logs_when_automatic(monkeypatch, caplog):
    monkeypatch.setenv(adapter.DISABLE_ENV, "sometimes")
    with pytest.raises(adapter.AdapterError, match="not a boolean"):
        adapter.activate()
    caplog.set_level(logging.WARNING, logger="radix_sglang_adapter")
    activate_when_imported("test")
    assert any("not a boolean" in r.getMessage() for r in caplog.records)
    assert getattr(UTILS, "convert_to_bigram_key", None) is ORIGINAL


@pytest.mark.parametrize("version", ["0.5.9", "0.5.24", "0.6.0", "1.0.0", "nightly"])
def test_untested_sglang_releases_are_refused(monkeypatch, caplog, version):
    monkeypatch.setattr(_activation, "sglang_version", lambda: version)
    with pytest.raises(adapter.AdapterError, match="refusing to patch"):
        adapter.activate()
    assert adapter.status().state == "refused"
    caplog.set_level(logging.WARNING, logger="radix_sglang_adapter")
    activate_when_imported("test")
    assert any("refusing to patch" in r.getMessage() for r in caplog.records)
    assert getattr(UTILS, "convert_to_bigram_key", None) is ORIGINAL


def test_an_import_failure_during_activation_is_reported(monkeypatch, caplog):
    monkeypatch.setattr(patching, "UTILS_MODULE", "sglang.srt.mem_cache.no_such_module")
    with pytest.raises(adapter.AdapterError, match="cannot import"):
        adapter.activate()
    assert adapter.status().state == "failed"
    assert adapter.deactivate().state == "inactive"  # whatever a failed activation did is undone
