"""Deterministic prompts for servers and benchmarks: the same tokens for every server asked."""

from __future__ import annotations

import random
from pathlib import Path

from radix_core.trace import read_trace

FIRST_TOKEN = 3  # below are the special tokens of a Llama vocabulary


def tokens(seed: str, count: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_TOKEN, vocab) for _ in range(count)]


def trace_prompts(trace: Path, count: int, vocab: int, block_tokens: int = 8, max_blocks: int = 40) -> list[list[int]]:
    """The first ``count`` prompts of a Mooncake trace, each hash-id block expanded to
    ``block_tokens`` tokens (equal ids, equal blocks) and at most ``max_blocks`` blocks long, so
    the trace's prefix sharing survives at a size a CPU forward serves in milliseconds."""
    prompts = []
    for request in read_trace(trace, limit=count):
        blocks = request.hash_ids[:max_blocks]
        prompts.append([token for hash_id in blocks for token in tokens(f"block-{hash_id}", block_tokens, vocab)])
    return prompts
