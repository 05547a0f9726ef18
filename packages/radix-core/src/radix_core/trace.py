"""Mooncake-format request traces (FAST'25 trace release): read, check, expand into token ids.

One JSON object a line: ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...]}``.
``hash_ids`` name the prompt's 512-token blocks: equal ids are equal blocks, i.e. reusable KV; the
last block may be partial. Traces carry no tokens, so each block id is expanded into 512
deterministic pseudo-random token ids (the same id always gives the same block), and each request
gets output tokens of its own.
"""

from __future__ import annotations

import dataclasses
import json
import random
from array import array
from pathlib import Path

__all__ = ["BLOCK_TOKENS", "TraceError", "TraceRequest", "TokenExpander", "read_trace"]

BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class TraceRequest:
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    """The first ``limit`` requests (all by default) of a trace, in file order, each checked."""
    path = Path(path)
    requests: list[TraceRequest] = []
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if limit is not None and len(requests) >= limit:
                    break
                if line.strip():
                    requests.append(_parse(line, f"{path}:{number}"))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a UTF-8 text file ({exc.reason})") from None
    if not requests:
        raise TraceError(f"{path}: no requests in the trace")
    return requests


def _parse(line: str, where: str) -> TraceRequest:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{where}: not a JSON object: {exc.msg}") from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: a request must be a JSON object, not {type(row).__name__}")
    missing = [field for field in _FIELDS if field not in row]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(missing)}")
    timestamp, input_length, output_length, hash_ids = (row[field] for field in _FIELDS)
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float)):
        raise TraceError(f"{where}: timestamp must be a number, not {timestamp!r}")
    for name, value in (("input_length", input_length), ("output_length", output_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TraceError(f"{where}: {name} must be a non-negative integer, not {value!r}")
    if not isinstance(hash_ids, list) or not all(type(h) is int and h >= 0 for h in hash_ids):
        raise TraceError(f"{where}: hash_ids must be a list of non-negative integers")
    blocks = -(-input_length // BLOCK_TOKENS)
    if len(hash_ids) != blocks:
        raise TraceError(
            f"{where}: input_length {input_length} needs {blocks} block(s) of {BLOCK_TOKENS} tokens, "
            f"hash_ids has {len(hash_ids)}"
        )
    return TraceRequest(float(timestamp), input_length, output_length, tuple(hash_ids))


class TokenExpander:
    """Token ids for trace requests: block ``h`` is always the same 512 ids (below 65536, so
    distinct blocks practically never share a leading token); outputs are unique per request."""

    def __init__(self) -> None:
        self._blocks: dict[int, array] = {}

    def block(self, hash_id: int) -> array:
        tokens = self._blocks.get(hash_id)
        if tokens is None:
            tokens = self._blocks[hash_id] = _pseudo_random_tokens(f"block-{hash_id}", BLOCK_TOKENS)
        return tokens

    def prompt(self, request: TraceRequest) -> array:
        tokens = array("q")
        for hash_id in request.hash_ids:
            tokens += self.block(hash_id)
        del tokens[request.input_length :]
        return tokens

    def output(self, index: int, request: TraceRequest) -> array:
        """The output of the ``index``-th request of a trace: shared with no other request."""
        return _pseudo_random_tokens(f"output-{index}", request.output_length)


def _pseudo_random_tokens(seed: str, count: int) -> array:
    return array("q", array("H", random.Random(seed).randbytes(2 * count)))
