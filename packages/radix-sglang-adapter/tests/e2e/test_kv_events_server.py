"""KV cache events (``--kv-events-config``) from SGLang 0.5.23's real server: ``--radix-cache-backend
radix`` publishes the events SGLang's default cache publishes for the same requests.

A ZMQ subscriber decodes each server's frames with SGLang's own ``KVEventBatch``. Batch boundaries
follow the scheduler's steps and SGLang's recorder coalesces consecutive events within a batch, so
the streams compare in a normal form: each ``BlockStored`` page by page (its hash, its parent's
hash, its tokens and the event's other fields), each ``BlockRemoved`` hash by hash, each
``AllBlocksCleared`` as a marker, in the order published (so the order of removes within one
eviction counts). ``nox -s tests-e2e`` runs this module.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import workloads
import zmq
from fleet import MAX_NEW_TOKENS
from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

from radix_testing.sglang_server import (
    VOCAB,
    Lineup,
    Server,
    ServerConfig,
    cache_impl,
    log_problems,
    radix_core_backend,
    request_body,
    write_models,
)

TOPIC = "kv"
EVENTS_TIMEOUT_S = 30
FLUSH_PUBLISHED_S = 5  # an idle server publishes a flush's clear within milliseconds
# Page 16, a pool of 64 pages for prompts of up to 320 tokens, prefill in chunks of 64: evictions.
EVICTING: dict[str, Any] = {"page_size": 16, "max_total_tokens": 1024, "chunked_prefill_size": 64}
# The first chat prompt again in other cache namespaces: salted hash chains, and in the Dynamo
# format hashes namespaced by extra key and salt.
NAMESPACES = ({"cache_salt": "tenant-a"}, {"extra_key": "class-1"}, {"cache_salt": "tenant-b", "extra_key": "class-1"})
# Each radix-core backend against SGLang's default cache in one event format: four servers.
PAIRS = [("default", "radix-native"), ("dynamo", "radix-python")]

Entry = tuple[Any, ...]


class EventSubscriber:
    """A SUB socket bound on loopback; a server given ``kv_events_config`` connects to it."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.RCVHWM, 0)  # queue every frame until read
        self.socket.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
        self.port = self.socket.bind_to_random_port("tcp://127.0.0.1")
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.sequence: list[int] = []
        self.events: list[Any] = []

    def kv_events_config(self, event_format: str) -> str:
        endpoint = f"tcp://127.0.0.1:{self.port}"  # a concrete host: SGLang's publisher connects
        return json.dumps({"publisher": "zmq", "endpoint": endpoint, "topic": TOPIC, "format": event_format})

    def receive(self, timeout_s: float) -> bool:
        """One batch, if one comes within ``timeout_s``."""
        if not self.socket.poll(int(1000 * max(timeout_s, 0))):
            return False
        topic, sequence, payload = self.socket.recv_multipart()
        assert topic == TOPIC.encode()
        self.sequence.append(int.from_bytes(sequence, "big"))
        self.events.extend(self.decoder.decode(payload).events)
        return True

    def start_after_a_clear(self, server: Server) -> None:
        """Flushes the idle server until its clear arrives, then forgets every frame so far. The first
        frames after SGLang's publisher connects can be dropped (seen: the start-up reset and the
        warm-up request's stores), and the flush starts every server's stream from an empty cache."""
        while self.receive(0.5):  # the start-up frames that did arrive
            pass
        self.events = []
        deadline = time.monotonic() + EVENTS_TIMEOUT_S
        while True:
            server.post("/flush_cache?timeout=60")
            if self.receive(FLUSH_PUBLISHED_S):
                break
            if time.monotonic() > deadline:
                raise TimeoutError("no KV events after flushing the server")
        assert self.events == [AllBlocksCleared()], self.events
        self.events, self.sequence = [], self.sequence[-1:]

    def receive_until(self, done: Callable[[list[Any]], bool]) -> None:
        deadline = time.monotonic() + EVENTS_TIMEOUT_S
        while not done(self.events):
            if not self.receive(deadline - time.monotonic()):
                raise TimeoutError(f"KV events stopped after {len(self.events)}")

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


@dataclasses.dataclass
class Published:
    """Every event one server published for the stream, the sequence numbers of its batches (from
    the flush that started it), its whole log (read once it stopped)."""

    events: list[Any]
    sequence: list[int]
    log: str


def publish_stream(server: Server, subscriber: EventSubscriber) -> None:
    """The stream, sequential and greedy, to a ready ``server`` publishing to ``subscriber``: the
    chats and trace prompts, the first prompt again in each namespace, a flush, that prompt once
    more, and a flush, whose clear ends the events."""
    steps = workloads.sequential_stream(VOCAB)
    first_prompt = workloads.prompt_of(steps[:1], [])
    outputs: list[tuple[int, ...]] = []
    subscriber.start_after_a_clear(server)
    for _ in steps:
        outputs.append(server.generate(workloads.prompt_of(steps, outputs), MAX_NEW_TOKENS).output_ids)
    for namespace in NAMESPACES:
        server.post("/generate", {**request_body(first_prompt, MAX_NEW_TOKENS), **namespace})
    server.post("/flush_cache?timeout=60")  # an HTTP error (raised) unless it flushed
    server.generate(first_prompt, MAX_NEW_TOKENS)
    server.post("/flush_cache?timeout=60")
    subscriber.receive_until(lambda events: clears(events) == 2)


def clears(events: list[Any]) -> int:
    return sum(isinstance(event, AllBlocksCleared) for event in events)


def normal_form(events: list[Any]) -> list[Entry]:
    """The stream with coalescing undone: one entry per stored page, removed hash, or clear."""
    entries: list[Entry] = []
    for event in events:
        if isinstance(event, BlockStored):
            entries.extend(stored_pages(event))
        elif isinstance(event, BlockRemoved):
            entries.extend(("removed", block_hash, event.medium) for block_hash in event.block_hashes)
        else:
            assert isinstance(event, AllBlocksCleared), event
            entries.append(("cleared",))
    return entries


def stored_pages(event: BlockStored) -> Iterator[Entry]:
    """A page's entry: its hash, its parent's (the page before it in a multi-page event), its
    tokens, and every other field of the event."""
    size = event.block_size
    assert len(event.token_ids) == size * len(event.block_hashes), event
    fields = (size, event.lora_id, event.medium, event.cache_salt, event.session_id, event.lora_name)
    parent = event.parent_block_hash
    for page, block_hash in enumerate(event.block_hashes):
        yield ("stored", block_hash, parent, tuple(event.token_ids[page * size : (page + 1) * size]), *fields)
        parent = block_hash


def first_difference(got: list[Entry], expected: list[Entry]) -> str:
    index = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    return (
        f"{len(got)} entries, SGLang's default cache {len(expected)}; first difference at {index}:\n"
        f"  radix:   {got[index : index + 2]}\n  default: {expected[index : index + 2]}"
    )


def check_served(published: Published, cache: str, log: Path) -> None:
    """A clean log, the cache asked for, and every batch from the stream's first flush received."""
    problems = log_problems(published.log)
    assert not problems, f"{cache} (log: {log}):\n" + "\n".join(problems[:20])
    if cache == "default":
        assert cache_impl(published.log) == "UnifiedRadixCache"
    else:
        assert cache_impl(published.log) == "RadixCoreCache"
        assert radix_core_backend(published.log) == cache.removeprefix("radix-")
    first = published.sequence[0]
    assert published.sequence == list(range(first, first + len(published.sequence))), "a KV event batch was lost"


@pytest.mark.parametrize(("event_format", "radix_cache"), PAIRS, ids=lambda value: value)
def test_radix_publishes_the_events_sglang_publishes(tmp_path: Path, event_format: str, radix_cache: str) -> None:
    """The same stored pages (hashes, parents, tokens, salts), removed blocks and clears, in the
    same order, as SGLang's default cache (UnifiedRadixCache on its Rust TreeCore) publishes."""
    models = write_models(tmp_path / "models")
    subscribers = {cache: EventSubscriber() for cache in ("default", radix_cache)}
    servers = [
        Server(
            ServerConfig(cache, **EVICTING, flags=("--kv-events-config", subscriber.kv_events_config(event_format))),
            models,
            tmp_path / f"{cache}-{event_format}.log",
        )
        for cache, subscriber in subscribers.items()
    ]
    try:
        with Lineup(servers) as lineup:
            for server in lineup:
                publish_stream(server, subscribers[server.config.cache])
    finally:
        for subscriber in subscribers.values():
            subscriber.close()
    published: dict[str, Published] = {}
    for server in servers:
        subscriber = subscribers[server.config.cache]
        published[server.config.cache] = Published(subscriber.events, subscriber.sequence, server.log_text())
        check_served(published[server.config.cache], server.config.cache, server.log)
    expected = normal_form(published["default"].events)
    kinds = Counter(entry[0] for entry in expected)
    assert kinds["stored"] > 100 and kinds["removed"] > 100 and kinds["cleared"] == 2, kinds
    salts = {event.cache_salt for event in published["default"].events if isinstance(event, BlockStored)}
    assert salts == {None, "tenant-a", "tenant-b"}
    got = normal_form(published[radix_cache].events)
    assert got == expected, first_difference(got, expected)
