"""The optional native RadixKey.match_at for SGLang 0.5.12+: same answers and errors as SGLang's."""

from __future__ import annotations

import importlib
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

import radix_sglang_adapter as adapter
from radix_testing import sglang_harness as sg
from radix_testing.call_counting import count_calls
from radix_testing.sglang_harness import serve

radix_cache = importlib.import_module("sglang.srt.mem_cache.radix_cache")
SGLANG_MATCH_AT = getattr(radix_cache.RadixKey, "match_at", None)  # before any activation
has_match_at = pytest.mark.skipif(SGLANG_MATCH_AT is None, reason="this SGLang has no RadixKey.match_at")


@pytest.fixture(autouse=True)
def restore_sglang(monkeypatch):
    monkeypatch.delenv(adapter.ACCELERATE_ENV, raising=False)
    monkeypatch.delenv(adapter.DISABLE_ENV, raising=False)
    yield
    adapter.deactivate()


def outcome(call):
    try:
        return ("value", call())
    except Exception as exc:
        return ("error", type(exc))


tokens = st.lists(st.integers(0, 3), max_size=40)
keys = st.builds(
    lambda ids, as_array, bigram, limit, extra: (ids, as_array, bigram, limit, extra),
    tokens,
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 45)),
    st.sampled_from([None, "a"]),
)


def make_key(spec, as_array: bool):
    ids, _, bigram, limit, extra = spec
    ids = array("q", ids) if as_array else list(ids)
    return radix_cache.RadixKey(ids, extra, is_bigram=bigram, limit=limit)


@has_match_at
@given(
    mine=keys,
    theirs=keys,
    offset=st.integers(-2, 45),
    page_size=st.sampled_from([1, 2, 4, 16]),
    as_array=st.booleans(),
)
def test_accelerated_match_at_answers_exactly_as_sglangs(backend_name, mine, theirs, offset, page_size, as_array):
    a, b = make_key(mine, as_array), make_key(theirs, as_array)
    expected = outcome(lambda: SGLANG_MATCH_AT(a, b, offset, page_size))
    assert outcome(lambda: adapter.accelerated_match_at(a, b, offset, page_size)) == expected


@has_match_at
def test_activation_with_acceleration_patches_and_restores_match_at():
    report = adapter.activate(accelerate_match=True)
    assert radix_cache.RadixKey.match_at is adapter.accelerated_match_at
    states = {point.target: point.state for point in report.patch_points}
    assert states["sglang.srt.mem_cache.radix_cache.RadixKey.match_at"] == "patched"
    assert "RadixKey.match_at" in report.reason
    adapter.deactivate()
    assert radix_cache.RadixKey.match_at is SGLANG_MATCH_AT


@has_match_at
def test_the_environment_variable_asks_for_it(monkeypatch):
    monkeypatch.setenv(adapter.ACCELERATE_ENV, "1")
    adapter.activate()
    assert radix_cache.RadixKey.match_at is adapter.accelerated_match_at


@has_match_at
@pytest.mark.parametrize("page_size", [1, 4])
def test_sglangs_cache_gives_the_same_results_through_the_accelerated_match(page_size):
    without = serve(page_size)
    adapter.activate(accelerate_match=True)
    with count_calls(adapter.accelerated_match_at) as calls:
        assert serve(page_size) == without
    assert calls["accelerated_match_at"] > 0


@pytest.mark.skipif(SGLANG_MATCH_AT is not None, reason="only releases without RadixKey.match_at")
def test_asking_for_it_where_it_cannot_apply_is_reported():
    report = adapter.activate(accelerate_match=True)
    (point,) = [p for p in report.patch_points if p.target.endswith("RadixKey.match_at")]
    assert point.state == "not patched" and sg.SGLANG_VERSION in point.detail
