"""The backend's KV event block hashes against SGLang's own hash function.

The step-by-step differential tests compare whole event streams with SGLang's RadixCache; token
ids there are small, and the backend hashes with SGLang's compiled kernel where it loads. Here the
Python reference (what hashes where that kernel cannot load) is checked against SGLang's kernel on
what those streams rarely reach: token ids past u32 (SGLang hashes such a page as u64 words after
a 0xff tag), a page that mixes both, long pages, bigram pages, any prior digest.
"""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix_testing import sglang_harness as sg

if not sg.HAS_CHECKPOINT:
    pytest.skip("the backend serves SGLang 0.5.22+ (tested on 0.5.23)", allow_module_level=True)

import torch  # noqa: E402
from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache as SGLangRadixCache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402

from radix_sglang_adapter.backend.cache import RadixCoreCache  # noqa: E402
from radix_sglang_adapter.backend.kv_events import (  # noqa: E402
    DIGEST_BYTES,
    block_hashes,
    compiled_hash,
    page_digests,
    python_page_digests,
)
from radix_testing import scheduler_harness as sh  # noqa: E402

token_ids = st.one_of(st.integers(0, 300), st.integers(0, 2**32 - 1), st.integers(2**32 - 2, 2**63 - 1))


def sglang_page_hashes(tokens: list[int], is_bigram: bool, page_size: int, prior: bytes | None) -> list[str]:
    return get_hash_str(RadixKey(array("q", tokens), is_bigram=is_bigram), prior.hex() if prior else None, page_size)


@given(
    pages=st.integers(1, 4),
    page_size=st.sampled_from([1, 2, 16]),
    is_bigram=st.booleans(),
    prior=st.none() | st.binary(min_size=DIGEST_BYTES, max_size=DIGEST_BYTES),
    data=st.data(),
)
def test_page_hashes_are_sglangs(pages, page_size, is_bigram, prior, data):
    count = pages * page_size + is_bigram  # a node's raw tokens: whole pages (and a bigram's last token)
    tokens = data.draw(st.lists(token_ids, min_size=count, max_size=count))
    ours = python_page_digests(array("q", tokens), is_bigram, page_size, prior)
    hexes = [ours[start : start + DIGEST_BYTES].hex() for start in range(0, len(ours), DIGEST_BYTES)]
    assert hexes == sglang_page_hashes(tokens, is_bigram, page_size, prior)
    assert page_digests(array("q", tokens), is_bigram, page_size, prior) == ours
    assert block_hashes(ours) == [int.from_bytes(bytes.fromhex(h[:16]), "big", signed=True) for h in hexes]


def test_sglangs_compiled_hash_loads_here():
    assert compiled_hash() is not None, "the backend would hash in Python: the tests would not see SGLang's kernel"


def test_a_negative_token_id_is_refused_as_sglang_refuses_it():
    with pytest.raises(Exception, match="int64"):
        sglang_page_hashes([5, -1], False, 1, None)
    for digests in (page_digests, python_page_digests):
        with pytest.raises(ValueError, match="non-negative"):
            digests(array("q", [5, -1]), False, 1, None)


@pytest.mark.parametrize("cache_salt", [None, "tenant-a"])
def test_nodes_show_their_hashes_where_sglangs_nodes_keep_them(backend_name, cache_salt):
    """SGLang's TreeNode keeps its page hashes (hex) in ``hash_value``, or ``event_hash_value`` in a
    namespace; its own KV event tests read them there, before and after a split."""
    shown = "hash_value" if cache_salt is None else "event_hash_value"
    seen = []
    for make in (SGLangRadixCache, RadixCoreCache):
        cache = sh.Server(make, page_size=2, enable_kv_cache_events=True).cache
        for tokens in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9]):  # the second splits the first's node
            key = RadixKey(array("q", tokens), cache_salt=cache_salt)
            cache.insert(InsertParams(key=key, value=torch.arange(len(tokens))))
            node = cache.match_prefix(MatchPrefixParams(key=key)).last_device_node
            cache.take_events()
            seen.append([getattr(node, shown), getattr(node.parent, shown)])
    assert seen[:2] == seen[2:] and seen[0][0] is not None


def test_a_prefix_sglang_cannot_hash_is_cached_but_not_published(backend_name, caplog):
    """SGLang's recorder raises mid-step on a negative token id; the backend caches the prefix,
    publishes nothing for it or below it, logs once, and goes on publishing the rest."""
    cache = sh.Server(RadixCoreCache, page_size=1, enable_kv_cache_events=True).cache
    cache.take_events()
    for tokens in ([7, -1, 8], [7, -1, 8, 9], [7, -1, 5], [1, 2]):
        cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=torch.arange(len(tokens))))
    stored = [event for event in cache.take_events() if isinstance(event, BlockStored)]
    assert [event.token_ids for event in stored] == [[1, 2]]
    assert sum("not published" in record.message for record in caplog.records) == 1
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [7, -1, 8, 9])))).device_prefix_len == 4
    cache.evict(EvictParams(num_tokens=100))
    removed = [hash for event in cache.take_events() if isinstance(event, BlockRemoved) for hash in event.block_hashes]
    assert sorted(removed) == sorted(hash for event in stored for hash in event.block_hashes)


def test_a_failing_compiled_hash_leaves_the_hashes_to_python_with_one_warning(monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("a broken kernel")

    monkeypatch.setattr("radix_sglang_adapter.backend.kv_events.compiled_hash", lambda: broken)
    tokens = array("q", [3, 1, 4, 1, 5])
    for _ in range(2):
        assert page_digests(tokens, False, 1, None) == python_page_digests(tokens, False, 1, None)
    assert sum("compiled page hash raised RuntimeError" in record.message for record in caplog.records) == 1
