"""KV cache events of the ``radix`` backend (``--kv-events-config``): the stream SGLang's RadixCache records.

SGLang's RadixCache records a ``BlockStored`` for each node an insert adds and a ``BlockRemoved``
for each leaf eviction takes, in its ``KVCacheEventRecorder``, which coalesces them and which the
scheduler's publisher drains after every batch. radix-core reports the same nodes (``on_store``,
``on_remove``); here they are hashed as SGLang hashes them and handed to SGLang's own recorder,
so coalescing, the event classes and publishing stay SGLang's.

Block hashes are SGLang's: one SHA-256 per page over its tokens, chained from the page before (the
parent node's last page for a node's first), published as int64s namespaced as SGLang's recorder
does (``block_hashes``, ``TreeEvents``). A node's digests are computed once, when it is stored, by
SGLang's own compiled hash (``compiled_hash``) or else ``python_page_digests``, the reference, and
kept in its ``page_hashes`` (32 bytes a page), which radix-core cuts with the node in a split.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
from array import array
from collections.abc import Callable, Iterable
from typing import Any

from sglang.srt.disaggregation.kv_events import (
    BlockRemoved,
    BlockStored,
    StorageMedium,
    kv_event_namespace_seed,
    namespaced_block_hash,
)
from sglang.srt.mem_cache.radix_cache import RadixKey

import radix_core

from .translation import split_namespace

logger = logging.getLogger("radix_sglang_adapter")

DIGEST_BYTES = 32
_SALT_CHAIN_SEED = b"sglang-cache-salt-v1\0"
_WIDE_PAGE_TAG = b"\xff"
_U32_MAX = 0xFFFFFFFF


def chain_seed(cache_salt: str | None) -> bytes | None:
    """The digest a namespace's chain starts from at the root: SGLang seeds salted chains only."""
    if cache_salt is None:
        return None
    return hashlib.sha256(_SALT_CHAIN_SEED + cache_salt.encode("utf-8")).digest()


@functools.cache
def compiled_hash() -> Callable[..., list[str]] | None:
    """SGLang's compiled page hash (``get_hash_str``, hex digests), loaded (built by SGLang the
    first time) now; None, logged once, where it cannot load: hashing is then done in Python."""
    from sglang.srt.mem_cache.utils import get_hash_str

    try:
        get_hash_str(RadixKey(array("q", [0])), None, 1)
    except Exception as exc:  # a missing compiler or OpenSSL header: the same hashes in Python
        logger.warning("KV events: SGLang's compiled page hash did not load (%s); hashing in Python", exc)
        return None
    return get_hash_str


def page_digests(tokens: array, is_bigram: bool, page_size: int, prior: bytes | None) -> bytes:
    """The chained SHA-256 digests (32 bytes each, joined) of the pages of a node's raw ``tokens``
    (a bigram node's include the token its last pair ends with), from ``prior``, as SGLang hashes
    them; ValueError for a negative token id, which SGLang refuses too."""
    hashed = compiled_hash()
    if hashed is None:
        return python_page_digests(tokens, is_bigram, page_size, prior)
    try:
        hexes = hashed(RadixKey(tokens, is_bigram=is_bigram), prior.hex() if prior else None, page_size)
    except Exception as exc:  # a token it refuses (the reference raises ValueError), or a broken kernel
        digests = python_page_digests(tokens, is_bigram, page_size, prior)
        _kernel_failed_on_valid_tokens(type(exc).__name__)
        return digests
    return bytes.fromhex("".join(hexes))


@functools.cache
def _kernel_failed_on_valid_tokens(error: str) -> None:
    """Logged once per kind of error: the Python reference hashed what SGLang's kernel did not."""
    logger.warning("KV events: SGLang's compiled page hash raised %s on tokens Python hashed instead", error)


def python_page_digests(tokens: array, is_bigram: bool, page_size: int, prior: bytes | None) -> bytes:
    """:func:`page_digests` in Python, from SGLang's kernel (``mem_cache/cpp_utils/hash_binding.cpp``)."""
    pages: Iterable[bytes | memoryview]
    try:
        data = memoryview(_little_endian(_unit_words(array("I", tokens), is_bigram)))
    except OverflowError:  # a token past u32, or a negative one: page by page
        pages = _pages_with_wide_tokens(tokens, is_bigram, page_size)
    else:
        step = 4 * (2 * page_size if is_bigram else page_size)  # bytes a page
        pages = (data[start : start + step] for start in range(0, len(data), step))
    digests = bytearray()
    for page in pages:
        prior = hashlib.sha256(prior + page if prior else page).digest()
        digests += prior
    return bytes(digests)


def _pages_with_wide_tokens(tokens: array, is_bigram: bool, page_size: int) -> list[bytes]:
    """Each page's bytes: u32 words, or 0xff then u64 words where a token does not fit u32."""
    pages = []
    units = len(tokens) - 1 if is_bigram else len(tokens)
    for start in range(0, units, page_size):
        raw = tokens[start : start + page_size + is_bigram]
        if min(raw) < 0:
            raise ValueError("token ids must be non-negative to be hashed for KV events")
        if max(raw) > _U32_MAX:
            pages.append(_WIDE_PAGE_TAG + _little_endian(_unit_words(array("Q", raw), is_bigram)))
        else:
            pages.append(_little_endian(_unit_words(array("I", raw), is_bigram)))
    return pages


def _unit_words(tokens: array, is_bigram: bool) -> array:
    """The tokens as the words SGLang hashes: themselves, or each bigram's two tokens in turn."""
    if not is_bigram:
        return tokens
    pairs = array(tokens.typecode, bytes(tokens.itemsize * 2 * (len(tokens) - 1)))
    pairs[0::2] = tokens[:-1]
    pairs[1::2] = tokens[1:]
    return pairs


def _little_endian(words: array) -> bytes:
    if sys.byteorder != "little":
        words = array(words.typecode, words)
        words.byteswap()
    return words.tobytes()


def block_hashes(digests: bytes) -> list[int]:
    """The int64 SGLang publishes for each page of a node's digests (before namespacing): the
    first 8 bytes of each digest, big-endian, signed."""
    words = array("q")
    words.frombytes(digests)
    if sys.byteorder == "little":
        words.byteswap()
    return memoryview(words)[:: DIGEST_BYTES // 8].tolist()


class HashedTreeNode(radix_core.TreeNode):
    """radix-core's node, showing its page hashes where SGLang's TreeNode keeps them for its KV
    events (its tests and tools read them there): a list of hex digests, None until hashed."""

    __slots__ = ()

    @property
    def hash_value(self) -> list[str] | None:
        """The chain of a node outside any namespace (for one inside, SGLang's ``hash_value`` is
        its HiCache storage chain, which this backend has no use for: None); the root's is empty."""
        if self.key.extra_key is not None:
            return None
        return [] if len(self.key) == 0 else self._hex_page_hashes()

    @property
    def event_hash_value(self) -> list[str] | None:
        """The chain a namespaced node publishes (None outside any namespace, as SGLang's)."""
        return None if self.key.extra_key is None else self._hex_page_hashes()

    def _hex_page_hashes(self) -> list[str] | None:
        digests = self.page_hashes
        if digests is None:
            return None
        return [digests[start : start + DIGEST_BYTES].hex() for start in range(0, len(digests), DIGEST_BYTES)]


class TreeEvents:
    """radix-core's ``on_store`` / ``on_remove`` for a cache whose events go to SGLang's ``recorder``.

    A node whose tokens SGLang's hash refuses (a negative id, which SGLang's own recorder raises on
    in the middle of the scheduler's step) is cached but not published, nor is anything below it
    (its pages have no hash to chain from): a router then underestimates this worker, and serving
    goes on. Logged once per cache."""

    def __init__(self, recorder: Any, page_size: int):
        self.recorder = recorder
        self.page_size = page_size
        self._unhashable_logged = False
        compiled_hash()  # SGLang builds it on first use: not in the middle of a request

    def _namespace_seed(self, extra_key: str | None, cache_salt: str | None) -> bytes | None:
        """SGLang's namespacing of published hashes: the default format scopes only LoRA extra keys
        (a registered name) and leaves salts to the chain; the Dynamo format scopes both."""
        if self.recorder.dynamo_format:
            return kv_event_namespace_seed(extra_key=extra_key, cache_salt=cache_salt)
        lora = extra_key if self.recorder.lora_names.get(extra_key) is not None else None
        return kv_event_namespace_seed(extra_key=lora, cache_salt=None)

    def _published(self, digests: bytes, seed: bytes | None) -> list[int]:
        hashes = block_hashes(digests)
        return hashes if seed is None else [namespaced_block_hash(block, namespace_seed=seed) for block in hashes]

    def stored(self, node: Any) -> None:
        key = node.key
        extra_key, cache_salt = split_namespace(key.extra_key)
        parent = node.parent
        tokens = key.token_ids
        if parent.parent is None:  # under the root: the chain starts
            prior, parent_digest = chain_seed(cache_salt), None
        elif parent.page_hashes is None:  # below an unpublished node
            return
        else:
            prior = parent_digest = parent.page_hashes[-DIGEST_BYTES:]
        try:
            digests = page_digests(tokens, key.is_bigram, self.page_size, prior)
        except ValueError as exc:
            if not self._unhashable_logged:
                self._unhashable_logged = True
                logger.error("KV events: a cached prefix is not published, nor anything below it: %s", exc)
            return
        node.page_hashes = digests
        seed = self._namespace_seed(extra_key, cache_salt)
        names = self.recorder.lora_names
        self.recorder.enqueue(
            BlockStored(
                block_hashes=self._published(digests, seed),
                parent_block_hash=None if parent_digest is None else self._published(parent_digest, seed)[0],
                token_ids=list(zip(tokens[:-1], tokens[1:])) if key.is_bigram else tokens.tolist(),
                block_size=self.page_size,
                lora_id=None,
                medium=StorageMedium.GPU,
                cache_salt=cache_salt,
                lora_name=names.resolve(extra_key) if self.recorder.dynamo_format else names.get(extra_key),
            )
        )

    def removed(self, node: Any) -> None:
        if node.page_hashes is None:  # never published
            return
        seed = self._namespace_seed(*split_namespace(node.key.extra_key))
        self.recorder.enqueue(
            BlockRemoved(block_hashes=self._published(node.page_hashes, seed), medium=StorageMedium.GPU)
        )
