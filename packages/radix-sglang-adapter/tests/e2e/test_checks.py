"""The end-to-end checker itself: each way a server can be wrong is reported (no server started)."""

from __future__ import annotations

import dataclasses

from fleet import Served, disagreements

from radix_testing.sglang_server import ServerConfig

RADIX_LOG = (
    "[t] radix-sglang-adapter: the prefix cache runs on radix-core native (radix-native 0.1.0 loaded), "
    "page_size=1, eagle=False, policy=lru, tree=native\n"
    "[t] Tree cache initialized: source=registered('radix') impl=RadixCoreCache hybrid_swa=False\n"
    "[t] Ignore import error when loading sglang.srt.models.qwen3_5: no attribute 'fused_sigmoid_mul_cpu'\n"
)
DEFAULT_LOG = "[t] Tree cache initialized: source=default impl=UnifiedRadixCache hybrid_swa=False\n"
# What SGLang's strict idle check logged for a backend whose evictable_size() under-reported a
# page (seen once on the real server, with a deliberately broken RadixCoreCache).
LEAK = (
    "[t] Scheduler hit an exception: Traceback (most recent call last):\n"
    "ValueError: pool memory leak detected! [full] total=1024, available=704, evictable=304, protected=0\n"
)


def served(cache: str, log: str, **changes) -> Served:
    fields = {"outputs": [(5, 6), (7, 8)], "cached_tokens": [0, 12], "load_outputs": {0: (1,), 2: (3,)}, "aborted": 1}
    return Served(config=ServerConfig(cache), log=log, **{**fields, **changes})


REFERENCE = served("none", "", cached_tokens=[0, 0], load_outputs={0: (1,), 1: (2,), 2: (3,)}, aborted=None)
DEFAULT = served("default", DEFAULT_LOG)


def check(radix: Served) -> list[str]:
    return disagreements(radix, REFERENCE, DEFAULT)


def test_a_radix_server_like_the_others_passes() -> None:
    assert check(served("radix-native", RADIX_LOG)) == []
    assert disagreements(DEFAULT, REFERENCE, None) == []


def test_an_output_unlike_the_no_cache_servers_fails() -> None:
    assert check(served("radix-native", RADIX_LOG, outputs=[(5, 6), (7, 9)])) == [
        "request 1: output (7, 9) != no-cache (7, 8)"
    ]
    assert check(served("radix-native", RADIX_LOG, load_outputs={0: (1,), 2: (4,)})) == [
        "load request 2: output (4,) != no-cache (3,)"
    ]


def test_cached_tokens_unlike_sglangs_default_fail() -> None:
    assert check(served("radix-native", RADIX_LOG, cached_tokens=[0, 11])) == [
        "request 1: cached_tokens 11 != SGLang default's 12"
    ]


def test_a_server_not_built_on_radix_core_fails() -> None:
    log = RADIX_LOG.replace("impl=RadixCoreCache", "impl=UnifiedRadixCache")
    assert check(served("radix-native", log)) == ["SGLang built UnifiedRadixCache, not RadixCoreCache"]
    assert check(served("radix-python", RADIX_LOG)) == [
        "radix-core's cache ran on the native tree, not python",
        "radix-core ran native, not python",
    ]
    on_python_nodes = served("radix-native", RADIX_LOG.replace("tree=native", "tree=python"))
    assert check(on_python_nodes) == ["radix-core's cache ran on the python tree, not native"]
    told_python = dataclasses.replace(
        served("radix-native", RADIX_LOG), config=ServerConfig("radix-native", tree="python")
    )
    assert check(told_python) == ["radix-core's cache ran on the native tree, not python"]
    wrong_default = dataclasses.replace(DEFAULT, log=RADIX_LOG)
    assert disagreements(wrong_default, REFERENCE, None) == [
        "SGLang's default cache is RadixCoreCache, not UnifiedRadixCache"
    ]


def test_a_kv_leak_fails() -> None:
    found = check(served("radix-native", RADIX_LOG + LEAK))
    assert len(found) == 2 and all(line.startswith("log: ") for line in found)
    assert "pool memory leak detected!" in found[1]


def test_clients_that_disconnected_but_were_not_aborted_fail() -> None:
    assert check(served("radix-native", RADIX_LOG, aborted=0)) == ["1 clients disconnected, SGLang aborted 0 requests"]
