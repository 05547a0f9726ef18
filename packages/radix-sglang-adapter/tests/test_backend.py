"""The ``radix`` radix-cache backend in a real SGLang: selection, refusals, misuse, fallback, status."""

from __future__ import annotations

import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
from array import array

import pytest
import torch

import radix_core
import radix_sglang_adapter as adapter
from radix_testing import sglang_harness as sg
from radix_testing.spawn_targets import build_tree_cache_in_sglang_child

needs_backend = pytest.mark.skipif(not sg.HAS_CHECKPOINT, reason="the backend serves SGLang 0.5.22+ (tested on 0.5.23)")

if sg.HAS_CHECKPOINT:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.mem_cache.registry import create_tree_cache

    from radix_sglang_adapter.backend.cache import RadixCoreCache
    from radix_testing import scheduler_harness as sh


@pytest.fixture(autouse=True)
def restore_sglang(monkeypatch):
    monkeypatch.delenv(adapter.DISABLE_ENV, raising=False)
    yield
    adapter.deactivate()


def in_spawned_child(monkeypatch, backend_name: str, **env: str) -> dict:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(build_tree_cache_in_sglang_child, (backend_name,))


@needs_backend
def test_sglang_builds_the_backend_in_a_spawned_child_through_its_plugin(monkeypatch):
    child = in_spawned_child(monkeypatch, adapter.BACKEND_NAME)
    assert child.get("cache") == "RadixCoreCache", child
    native_tree = radix_core._backend.native_tree_module() is not None  # the child loads the same
    assert child["tree"] == ("native" if native_tree else "python")
    assert any("source=registered('radix') impl=RadixCoreCache" in line for line in child["log"]), child["log"]
    assert any("prefix cache runs on radix-core" in line for line in child["log"])


@needs_backend
def test_with_the_kill_switch_sglang_says_the_backend_is_not_registered(monkeypatch):
    child = in_spawned_child(monkeypatch, adapter.BACKEND_NAME, **{adapter.DISABLE_ENV: "1"})
    assert "is not registered" in child.get("error", ""), child
    assert "Registered backends" in child["error"]


@needs_backend
def test_status_reports_the_registration_and_the_tree():
    assert not adapter.status().cache_backend.registered
    report = adapter.activate()
    assert report.cache_backend.registered and "--radix-cache-backend radix" in report.cache_backend.detail
    assert "radix-cache backend 'radix': registered" in report.format()
    assert report.format().count(radix_core.backend().active) >= 1
    assert not adapter.deactivate().cache_backend.registered


@pytest.mark.skipif(sg.HAS_CHECKPOINT, reason="only SGLang without the registry (0.5.10 here)")
def test_releases_without_the_registry_say_why():
    report = adapter.activate()
    assert not report.cache_backend.registered
    assert "has no radix-cache registry" in report.cache_backend.detail and "0.5.13" in report.cache_backend.detail


# ----- building it: what SGLang's create_tree_cache() gets ----------------------------------------


@pytest.fixture
def server_args():
    with sh.published_server_args(radix_cache_backend=adapter.BACKEND_NAME) as args:
        yield args


def build(server_args, page_size=1, is_eagle=True, policy="lru", context=None, **params):
    adapter.activate()
    pool, allocator = sh.small_pools(page_size)
    cache_params = sh.cache_params(pool, allocator, page_size, is_eagle, policy, **params)
    return create_tree_cache(sh.build_context(server_args, cache_params, **(context or {})))


@needs_backend
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("is_eagle", [False, True])
@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "mru", "filo", "priority"])
def test_the_backend_takes_sglangs_settings(server_args, page_size, is_eagle, policy):
    cache = build(server_args, page_size, is_eagle, policy.upper() if policy == "lru" else policy)
    assert isinstance(cache, RadixCoreCache)
    assert (cache.tree.page_size, cache.tree.is_eagle, cache.tree.eviction_policy) == (page_size, is_eagle, policy)


@needs_backend
def test_a_model_whose_every_layer_is_sliding_window_gets_the_pure_swa_cache(server_args, caplog):
    from radix_sglang_adapter.backend.cache import RadixCorePureSWACache

    adapter.activate()
    pool, allocator = sh.pure_swa_pools(256)
    params = sh.cache_params(pool, allocator, 1, False, "lru", sliding_window_size=8)
    context = sh.build_context(server_args, params, is_hybrid_swa=True, full_tokens_per_layer=0)
    with caplog.at_level(logging.INFO, logger="radix_sglang_adapter"):
        cache = create_tree_cache(context)
    assert type(cache) is RadixCorePureSWACache and cache.supports_swa() and cache.sliding_window_size == 8
    assert (cache.swa_evictable_size(), cache.full_evictable_size(), cache.full_protected_size()) == (0, 0, 0)
    assert "prefix cache of a sliding-window model (window 8) runs on radix-core" in caplog.text
    with sh.published_server_args(radix_cache_backend=adapter.BACKEND_NAME) as args:
        hicache = sh.build_context(args, params, is_hybrid_swa=True, full_tokens_per_layer=0)
        hicache.enable_hierarchical_cache = True
        with pytest.raises(ValueError, match="--enable-hierarchical-cache with a model whose every layer is sliding"):
            create_tree_cache(hicache)
    with pytest.raises(ValueError, match="a sliding-window cache needs a window, got None"):
        RadixCorePureSWACache(sh.cache_params(pool, allocator, 1, False, "lru"))


@needs_backend
def test_a_hybrid_sliding_window_model_gets_unified_radix_cache_on_radix_cores_tree(server_args, caplog):
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from radix_core import WindowedRadixCache
    from radix_sglang_adapter.backend.tree_core import RadixTreeCore

    adapter.activate()
    pool, allocator = sh.hybrid_swa_pools(16, 256, 128)
    params = sh.cache_params(pool, allocator, 16, True, "lru", sliding_window_size=8, draft_swa_window=20)
    context = sh.build_context(server_args, params, is_hybrid_swa=True, full_tokens_per_layer=256)
    with caplog.at_level(logging.INFO, logger="radix_sglang_adapter"):
        cache = create_tree_cache(context)
    core = cache.tree_core
    assert type(cache) is UnifiedRadixCache and cache.supports_swa() and isinstance(core, RadixTreeCore)
    assert isinstance(core.tree, WindowedRadixCache) and core.tree.window == 20, "the draft's window is the wider"
    assert (core.tree.page_size, core.tree.is_eagle) == (16, True)
    assert "hybrid sliding-window model (window 8), its TreeCore runs on radix-core" in caplog.text


@needs_backend
@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"context": {"is_hybrid_ssm": True}}, "mamba"),
        ({"enable_session_radix_cache": True}, "--enable-session-radix-cache"),
        ({"policy": "slru"}, "--radix-eviction-policy slru"),
        ({"policy": "tlru"}, "--radix-eviction-policy tlru"),
        ({"eviction_policy_config": {"tail": 3}}, "--radix-eviction-policy-config"),
    ],
)
def test_what_radix_core_cannot_do_is_refused_naming_the_option(server_args, settings, named):
    with pytest.raises(ValueError, match="--radix-cache-backend radix cannot serve with") as refused:
        build(server_args, **settings)
    assert named in str(refused.value)


@needs_backend
@pytest.mark.parametrize(
    ("options", "settings", "named"),
    [
        ({"hicache_host_memory_mode": "buffer_only"}, {}, "--hicache-host-memory-mode buffer_only"),
        ({}, {"enable_kv_cache_events": True}, "--kv-events-config and --enable-hierarchical-cache"),
        ({}, {"context": {"is_hybrid_swa": True}}, "--enable-hierarchical-cache with a hybrid sliding-window"),
    ],
)
def test_what_radix_core_cannot_do_with_hicache_is_refused_naming_the_option(options, settings, named):
    """With HiCache on, the backend serves SGLang's UnifiedRadixCache on radix-core's TreeCore
    (tests/e2e); what that core does not serve yet is refused before anything is built."""
    context = {"enable_hierarchical_cache": True, **settings.pop("context", {})}
    with sh.published_server_args(radix_cache_backend=adapter.BACKEND_NAME, **options) as args:
        with pytest.raises(ValueError, match="--radix-cache-backend radix cannot serve with") as refused:
            build(args, context=context, **settings)
    assert named in str(refused.value)


@needs_backend
@pytest.mark.parametrize(
    ("components", "settings", "named"),
    [
        (("FULL", "SWA"), {"enable_session_radix_cache": True}, "--enable-session-radix-cache"),
        (("FULL", "MAMBA"), {}, "mamba"),
        (("FULL",), {"enable_session_radix_cache": True}, "--enable-session-radix-cache"),
        (("FULL",), {"enable_kv_cache_events": True}, "--kv-events-config with SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"),
        (("FULL",), {"eviction_policy": "slru"}, "--radix-eviction-policy slru"),
    ],
)
def test_the_tree_core_refuses_what_the_factory_refuses(server_args, components, settings, named):
    """SGLang may build radix's TreeCore by name (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND), past the
    factory: it reads the same refusals."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    from radix_sglang_adapter.backend.tree_core import RadixTreeCore

    pool, allocator = sh.small_pools()
    params = sh.cache_params(pool, allocator, 1, False, settings.pop("eviction_policy", "lru"), **settings)
    with pytest.raises(ValueError, match="--radix-cache-backend radix cannot serve with") as refused:
        RadixTreeCore(params, {ComponentType[name]: None for name in components})
    assert named in str(refused.value)


@needs_backend
def test_options_of_sglangs_own_memory_config_are_refused(monkeypatch):
    with sh.published_server_args(radix_cache_backend=adapter.BACKEND_NAME, enable_flexkv=True) as args:
        with pytest.raises(ValueError, match="--enable-flexkv"):
            build(args)


@needs_backend
def test_a_disabled_radix_cache_is_left_to_sglang(server_args):
    cache = build(server_args, context={"disable_radix_cache": True}, disable=True)
    assert not isinstance(cache, RadixCoreCache) and not cache.supports_prefix_sharing()
    with pytest.raises(ValueError, match="--disable-radix-cache"):
        pool, allocator = sh.small_pools()
        RadixCoreCache(sh.cache_params(pool, allocator, 1, False, "lru", disable=True))


# ----- where SGLang's RadixCache and radix-core differed ------------------------------------------


def both_caches(page_size=1, is_eagle=True, policy="lru"):
    """SGLang's RadixCache and the backend over pools of their own, with recording allocators."""
    return [make(sg.make_cache_params(page_size, is_eagle, policy)) for make in (RadixCache, RadixCoreCache)]


def key(tokens, extra_key=None, salt=None):
    return RadixKey(array("q", tokens), extra_key, cache_salt=salt)


def matched(cache, tokens, extra_key=None, salt=None):
    result = cache.match_prefix(MatchPrefixParams(key=key(tokens, extra_key, salt)))
    return result.device_prefix_len, cache.path_device_indices(result.last_device_node).tolist()


@needs_backend
@pytest.mark.parametrize("values", [4, 5, 6], ids=["n-1", "n", "n+1"])
def test_eagle_inserts_with_a_raw_key_take_the_leading_values_as_sglang_does(backend_name, values):
    tokens = [1, 2, 3, 4, 5]
    answers = []
    for cache in both_caches():
        result = cache.insert(InsertParams(key=key(tokens), value=torch.arange(100, 100 + values)))
        answers.append((result.prefix_len, matched(cache, tokens + [9])))
    assert answers[0] == answers[1] == (0, (4, [100, 101, 102, 103]))


@needs_backend
def test_too_few_values_are_an_error_not_a_corrupt_tree(backend_name):
    (_, ours) = both_caches(page_size=2, is_eagle=False)
    with pytest.raises(ValueError, match="values for a key of 4"):
        ours.insert(InsertParams(key=key([1, 2, 3, 4, 5]), value=torch.arange(3)))
    assert ours.total_size() == 0
    ours.insert(InsertParams(key=key([1, 2, 3, 4, 5]), value=torch.arange(4)))  # the whole pages suffice
    assert ours.total_size() == 4


@needs_backend
def test_inserts_without_values_store_the_token_ids_as_sglang_does(backend_name):
    answers = []
    for cache in both_caches(is_eagle=False):
        cache.insert(InsertParams(key=key([7, 8, 9])))
        cache.insert(InsertParams(key=key([7, 8, 1]), value=torch.tensor([70, 80, 10])))  # then tensors
        answers.append((matched(cache, [7, 8, 9]), matched(cache, [7, 8, 1])))
    assert answers[0] == answers[1] == ((3, [7, 8, 9]), (3, [7, 8, 10]))


@needs_backend
def test_cache_salt_and_extra_key_are_namespaces(backend_name):
    answers = []
    for cache in both_caches(is_eagle=False):
        cache.insert(InsertParams(key=key([1, 2, 3], "lora", "salt"), value=torch.tensor([1, 2, 3])))
        namespaces = [("lora", "salt"), ("lora", None), (None, "salt"), (None, None), ("lora", "other")]
        answers.append([matched(cache, [1, 2, 3], *namespace)[0] for namespace in namespaces])
    assert answers[0] == answers[1] == [3, 0, 0, 0, 0]


@needs_backend
def test_misuse_sglang_tolerates_is_logged_and_changes_nothing(backend_name, caplog):
    caplog.set_level(logging.ERROR, logger="radix_sglang_adapter")
    _, cache = both_caches(is_eagle=False)
    cache.insert(InsertParams(key=key([1, 2, 3]), value=torch.tensor([1, 2, 3])))
    cache.insert(InsertParams(key=key([4, 5]), value=torch.tensor([4, 5])))
    node = cache.match_prefix(MatchPrefixParams(key=key([1, 2, 3]))).last_device_node
    sizes = (cache.evictable_size(), cache.protected_size(), cache.total_size())

    assert cache.dec_lock_ref(node).delta == 0, "an unlock without a lock"
    assert cache.evict(EvictParams(num_tokens=-1)).num_tokens_evicted == 0
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == sizes
    assert cache.evict(EvictParams(num_tokens=100)).num_tokens_evicted == 5
    assert cache.inc_lock_ref(node).delta == 0, "a lock on an evicted node"
    assert cache.dec_lock_ref(node).delta == 0
    assert (cache.evictable_size(), cache.protected_size(), cache.total_size()) == (0, 0, 0)
    messages = [record.getMessage() for record in caplog.records]
    assert sum("ignored" in message for message in messages) == 3 and any("negative" in m for m in messages)
    with pytest.raises(ValueError, match="no longer"):
        cache.path_device_indices(node)
    cache.insert(InsertParams(key=key([1, 2, 3]), value=torch.tensor([1, 2, 3])))
    assert matched(cache, [1, 2, 3]) == (3, [1, 2, 3]), "the cache still serves"


@needs_backend
def test_reset_empties_the_tree_and_the_sizes(backend_name):
    _, cache = both_caches()
    cache.insert(InsertParams(key=key([1, 2, 3]), value=torch.tensor([1, 2, 3])))
    cache.reset()
    assert (cache.total_size(), cache.evictable_size()) == (0, 0)
    assert cache.match_prefix(MatchPrefixParams(key=key([1, 2, 3]))).device_prefix_len == 0
    assert cache.path_device_indices(cache.root_node).dtype == torch.int64


# ----- a native failure while serving --------------------------------------------------------------

NATIVE_FAILURE = """
    import logging
    from radix_testing import sglang_cpu_shim; sglang_cpu_shim.install()
    from radix_testing import scheduler_harness as sh
    import radix_core, radix_native, radix_native._tree
    from radix_sglang_adapter.backend.cache import RadixCoreCache
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")

    def serve(server):
        answers = []
        for turn in range(6):
            req = server.arrive(list(range(40)) + [turn] * 5, chunk=16)
            answers.append(req.prefix_len)
            while server.prefilling(req):
                server.step(req, 0)
            server.finish(req)
        return answers

    with sh.published_server_args():
        healthy = serve(sh.Server(RadixCoreCache, is_eagle=True, kv_slots=200))
        def broken(*args):
            raise RuntimeError("injected native failure")
        for kernel in ("descend", "common_prefix_length"):  # what a walk of the Python tree calls
            setattr(radix_native, kernel, broken)
        for call in ("match", "insert"):  # radix-native's tree, the default one
            setattr(radix_native._tree.Tree, call, broken)
        after = serve(sh.Server(RadixCoreCache, is_eagle=True, kv_slots=200))
    print("ANSWERS", healthy == after, radix_core.backend().active)
"""


@pytest.mark.skipif(os.environ.get("RADIX_EXPECT_BACKEND") != "native", reason="needs radix-native")
@needs_backend
def test_a_native_failure_while_serving_falls_back_to_python_once():
    script = textwrap.dedent(NATIVE_FAILURE)
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", script], capture_output=True, text=True, timeout=300)
    assert "ANSWERS True python" in done.stdout, done.stdout + done.stderr[-3000:]
    assert done.stderr.count("injected native failure") == 1, done.stderr[-3000:]
