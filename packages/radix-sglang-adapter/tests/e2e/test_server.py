"""SGLang 0.5.23's real HTTP server, on its own cache and on ``--radix-cache-backend radix``.

Each server runs once per session (``fleet``), the next two starting while the one before serves;
a test names the server it checks and the servers it compares with. ``nox -s tests-e2e`` runs this module.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import workloads
from fleet import Served, disagreements, serve

from radix_testing.sglang_server import (
    STARTED_AHEAD,
    VOCAB,
    Lineup,
    Server,
    ServerConfig,
    ServerFailed,
    log_problems,
    write_models,
)

RETRACT_OFTEN = (("SGLANG_TEST_RETRACT", "1"), ("SGLANG_TEST_RETRACT_INTERVAL", "5"))
# Page 16, a pool of 64 pages for prompts of up to 320 tokens, prefill in chunks of 64.
EVICTING = {"page_size": 16, "max_total_tokens": 1024, "chunked_prefill_size": 64}

REFERENCE = ServerConfig("none")
# Windows free KV behind every decoding request at each step (SGLang's default: every 128 tokens).
WINDOWS_SLIDE = (("SGLANG_SWA_EVICTION_INTERVAL", "1"),)
# A model whose every layer is sliding-window attention (page 1, as SGLang's pure-SWA allocator
# takes), under load with retraction, windows sliding, a pool small enough to evict.
PURE_SWA = ServerConfig(
    "radix-native",
    model="pure-swa",
    max_total_tokens=1024,
    chunked_prefill_size=64,
    flags=("--enable-metrics",),
    env=RETRACT_OFTEN + WINDOWS_SLIDE,
)
# A hybrid model (a full-attention and a sliding-window layer), its SWA pool half the full one,
# at page 1 and 16, under the same load: radix serves it on UnifiedRadixCache over its TreeCore.
HYBRID_SWA = [
    ServerConfig(
        cache,
        model="hybrid-swa",
        page_size=page_size,
        max_total_tokens=1024,
        chunked_prefill_size=64,
        flags=("--enable-metrics", "--swa-full-tokens-ratio", "0.5"),
        env=RETRACT_OFTEN + WINDOWS_SLIDE,
    )
    for page_size in (1, 16)
    for cache in ("default", "radix-native")
]


def hicache(policy: str, layout: str = "layer_first") -> tuple[str, ...]:
    """A host tier twice the device pool, copied by SGLang's direct io backend (the CPU's)."""
    return (
        *("--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", layout),
        *("--hicache-ratio", "2", "--hicache-write-policy", policy, "--enable-metrics"),
    )


HICACHED = [
    *(ServerConfig(cache, **EVICTING, flags=hicache("write_through")) for cache in ("default", "radix-native")),
    *(
        ServerConfig(cache, **EVICTING, flags=hicache("write_back", "page_first"))
        for cache in ("default", "radix-native")
    ),
    *(
        ServerConfig(cache, **EVICTING, flags=hicache("write_through_selective"))
        for cache in ("default", "radix-native")
    ),
    *(
        ServerConfig(cache, max_total_tokens=512, chunked_prefill_size=64, flags=hicache("write_through"))
        for cache in ("default", "radix-native")
    ),
    *(
        ServerConfig(cache, **EVICTING, speculative="EAGLE", flags=hicache("write_through"))
        for cache in ("default", "radix-native")
    ),
]
LOADED = {
    *(
        ServerConfig(cache, **EVICTING, flags=("--enable-metrics",), env=RETRACT_OFTEN, tree=tree)
        for cache, tree in (
            ("default", None),
            ("radix-native", None),
            ("radix-python", None),
            ("radix-native", "python"),
        )
    ),
    PURE_SWA,
    *HYBRID_SWA,
}
CHECKED = [
    # 1. sequential chats, branches and trace prompts, page 1 (radix-core's RadixCache on
    # radix-native's tree, its default); the server starts its scheduler as SGLang does (spawn:
    # the adapter activates in a fresh process)
    ServerConfig("default"),
    ServerConfig("radix-native", spawn=True),
    # 2 and 4. page 16, an evicting pool, chunked prefill; then 32 clients, retraction, aborts, flush
    # (there radix-core's RadixCache on its Python tree too: RADIX_CORE_TREE=python)
    *sorted(LOADED - {PURE_SWA, *HYBRID_SWA}, key=lambda config: (config.cache, config.tree or "")),
    # 3. speculative decoding: EAGLE (bigram keys) at page 1 and 16, STANDALONE (drafts accepted)
    ServerConfig("default", speculative="EAGLE"),
    ServerConfig("radix-native", speculative="EAGLE"),
    ServerConfig("default", page_size=16, speculative="EAGLE"),
    ServerConfig("radix-native", page_size=16, speculative="EAGLE"),
    ServerConfig("default", speculative="STANDALONE"),
    ServerConfig("radix-native", speculative="STANDALONE"),
    # 6. HiCache (a host tier under an evicting device pool): write policies, layouts, page 1 and
    # 16, EAGLE; radix serves them on RadixCoreHiCache, and with EAGLE (HiCache's draft pools) on
    # SGLang's UnifiedRadixCache over radix-core's TreeCore
    *HICACHED,
    # 7. every layer sliding-window attention: radix serves it on RadixCorePureSWACache
    PURE_SWA,
    # 8. a hybrid sliding-window model: radix serves it on UnifiedRadixCache over its TreeCore
    *HYBRID_SWA,
]


def servers_compared(config: ServerConfig) -> list[ServerConfig]:
    """The servers a check of ``config`` reads, in order: the no-cache reference (of its model),
    SGLang's default cache with the same flags (for a radix server), ``config`` itself. A pure-SWA
    server has no default twin: SGLang 0.5.23's own pure-SWA cache keys KV its windows freed, and
    with windows sliding its scheduler stops on a pool leak."""
    reference = dataclasses.replace(REFERENCE, model=config.model)
    if config.model == "pure-swa":
        return [reference, config]
    default_twin = dataclasses.replace(config, cache="default", tree=None, spawn=False)
    return [reference, *([default_twin] if config.cache != "default" else []), config]


class Fleet:
    """Each configuration served once per session, on demand, in the order the selected tests read
    them (``plan``): while one server serves and stops, the next ones in the plan start."""

    def __init__(self, directory, plan: list[ServerConfig]):
        self.directory = directory
        self.models = write_models(directory / "models")
        self.plan = plan
        self.served: dict[ServerConfig, Served] = {}
        self.started: set[ServerConfig] = set()
        self.starting: dict[ServerConfig, Server] = {}

    def __call__(self, config: ServerConfig) -> Served:
        if config not in self.served:
            server = self.starting.pop(config, None) or self.server(config)
            load = "sequential" if config.cache == "none" else "concurrent" if config in LOADED else None
            self.served[config] = serve(server, load, when_ready=self.start_next)
        return self.served[config]

    def server(self, config: ServerConfig) -> Server:
        self.started.add(config)
        return Server(config, self.models, self.log_path(config.name))

    def start_next(self) -> None:
        """Starts the plan's next servers not started yet, up to STARTED_AHEAD starting at once."""
        upcoming = [config for config in self.plan if config not in self.started]
        for config in upcoming[: STARTED_AHEAD - len(self.starting)]:
            self.starting[config] = self.server(config).start()

    def close(self) -> None:
        """Stops the servers started ahead that no test read (a deselected or failed test's)."""
        for server in self.starting.values():
            server.stop()

    def log_path(self, name: str):
        return self.directory / f"{name}.log"


def plan_of(items: list[pytest.Item]) -> list[ServerConfig]:
    """The configurations the selected tests read through the fleet, in the order they read them."""
    plan: dict[ServerConfig, None] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "config" in callspec.params and "fleet" in item.fixturenames:
            plan.update(dict.fromkeys(servers_compared(callspec.params["config"])))
    return list(plan)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory, request) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("e2e"), plan_of(request.session.items))
    yield fleet
    fleet.close()


@pytest.mark.parametrize("config", CHECKED, ids=lambda config: config.name)
def test_serves_like_sglang(fleet: Fleet, config: ServerConfig) -> None:
    """Outputs equal the no-cache server's, request by request (under load too); a radix server's
    cached tokens equal SGLang's default cache's with the same flags; a clean log."""
    reference, *default_twin, served = (fleet(server) for server in servers_compared(config))
    found = disagreements(served, reference, default_twin[0] if default_twin else None)
    assert not found, f"{config.name} (log: {fleet.log_path(config.name)}):\n" + "\n".join(found[:20])


@pytest.mark.parametrize(
    "config", [config for config in HICACHED if config.cache == "default"], ids=lambda config: config.name
)
def test_the_host_tier_serves(fleet: Fleet, config: ServerConfig) -> None:
    """Each HiCache stream evicts prefixes to the host and loads some back (else it proves little)."""
    assert fleet(config).loaded_back, f"{config.name} loaded nothing back from the host tier"


STORED_DOCUMENT = tuple(
    workloads.tokens("stored-document", 496, VOCAB)
)  # 31 pages of 16, over the 256-token prefetch floor
L3_FLAGS = ("--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", "wait_complete")


def stored_server(fleet: Fleet, cache: str, store: str) -> Server:
    """A HiCache server whose L3 is SGLang's ``file`` backend in the directory ``l3-{store}``."""
    config = ServerConfig(
        cache,
        **EVICTING,
        flags=hicache("write_through") + L3_FLAGS,
        env=(("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", str(fleet.directory / f"l3-{store}")),),
    )
    name = f"l3-{cache}" if cache == store else f"l3-{cache}-on-{store}"
    return Server(config, fleet.models, fleet.log_path(name))


def ask_about_the_document(server: Server, question: int) -> tuple[int, tuple]:
    """One question on the stored document, answered once the document's pages are in the
    server's L3 store (a page a file): its cached tokens and output."""
    prompt = [*STORED_DOCUMENT, *workloads.tokens(f"stored-question-{question}", 16, VOCAB)]
    store = Path(dict(server.config.env)["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"])
    completion = server.generate(prompt, 8)
    deadline = time.monotonic() + 60
    while len(list(store.glob("*.bin"))) < len(prompt) // 16 and time.monotonic() < deadline:
        time.sleep(0.5)
    return completion.cached_tokens, completion.output_ids


def test_l3_serves_what_a_server_stored_there(fleet: Fleet) -> None:
    """SGLang's ``file`` L3 backend: a server backs a document up to a directory; once a flush has
    emptied its device and host tiers, it finds the document there (prefetch) instead of computing
    it, and so does another server started on that directory. Radix-core names its pages as SGLang
    does: a radix server also reuses what SGLang's default stored."""
    caches = ("default", "radix-native", "radix-python")
    on_defaults_store = stored_server(fleet, "radix-native", "default")
    found = {}
    with Lineup([*(stored_server(fleet, cache, cache) for cache in caches), on_defaults_store]) as lineup:
        for server in lineup:
            if server is on_defaults_store:
                crossed = ask_about_the_document(server, 1)
            else:
                first = ask_about_the_document(server, 0)
                server.post("/flush_cache?timeout=60")  # non-200 (an error here) unless flushed
                second = ask_about_the_document(server, 1)
                assert first[0] == 0 and second[0] == len(STORED_DOCUMENT), (server.config.cache, first[0], second[0])
                found[server.config.cache] = (first, second)
            problems = log_problems(server.log_text())
            assert not problems, f"{server.log.name}: {problems[:5]}"
    for cache in ("radix-native", "radix-python"):
        assert found[cache] == found["default"], f"{cache}: the same answers and cached tokens as SGLang's default"
    assert crossed == found["default"][1], "a radix server reads the default's L3 store as its own"


def test_kill_switch_refuses_to_start(fleet: Fleet) -> None:
    """RADIX_SGLANG_ADAPTER_DISABLE=1: the backend is not registered, and SGLang says so at start."""
    config = ServerConfig("radix-native", env=(("RADIX_SGLANG_ADAPTER_DISABLE", "1"),))
    with pytest.raises(ServerFailed) as failed, Server(config, fleet.models, fleet.log_path("kill-switch")):
        pass
    assert "--radix-cache-backend='radix' is not registered" in str(failed.value)
