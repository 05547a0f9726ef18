"""Test-only: the request streams the scheduler-level differential tests replay on two servers."""

from __future__ import annotations

from hypothesis import strategies as st

# Prompts are a few of these segments and a short tail: they share prefixes, diverge inside nodes,
# and (at page 16) end inside pages.
SEGMENTS = [[0] * 17, [1, 2] * 9, list(range(3, 40)), [4] * 5, [5, 6, 7], [8] * 33, list(range(40, 60))]
prompts = st.tuples(
    st.lists(st.sampled_from(range(len(SEGMENTS))), min_size=1, max_size=3), st.lists(st.integers(0, 9), max_size=8)
).map(lambda parts: [t for i in parts[0] for t in SEGMENTS[i]] + parts[1])
# The namespaces of arrivals: (extra_key, cache_salt), an empty salt being none.
namespaces = st.sampled_from([(None, None), ("lora-a", None), (None, "salt-1"), ("lora-a", "salt-1"), ("lora-b", "")])
MAX_LIVE = 3  # prompts <= 130 tokens plus a few outputs: never more than the pool can hold locked


def play(servers: list, live: list[tuple], name: str, args: list, where: str) -> None:
    """One operation of a stream other than an arrival, on both servers alike; ``live`` holds a
    tuple per live request (its request on each server)."""
    if name == "step" and live:
        which, token = args
        for server, req in zip(servers, live[which % len(live)]):
            server.step(req, token)
    elif name in ("finish", "abort") and live:
        for server, req in zip(servers, live.pop(args[0] % len(live))):
            getattr(server, name)(req)
    elif name == "evict":
        theirs, ours = servers
        assert theirs.evict(args[0]) == ours.evict(args[0]), where
    elif name == "flush" and not live:
        for server in servers:
            server.flush()
