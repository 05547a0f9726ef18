"""The adapter's patches: SGLang's own functions replaced by radix-core's, wherever SGLang holds them.

SGLang 0.5.10 defines ``convert_to_bigram_key`` in ``mem_cache.utils`` but its callers bind it by
name at import (``from ...utils import convert_to_bigram_key``), and SWA caches also keep it per
instance (``self.key_convert_fn``). Patching the ``utils`` attribute alone reaches none of the
calls, so ``apply`` also rebinds every ``sglang.*`` module attribute and every live SWA cache that
holds the original. Modules imported later bind the replacement from ``utils`` by themselves.
Optionally (0.5.12+), ``RadixKey.match_at`` gets radix-core's native comparison.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import sys
from collections.abc import Callable
from typing import Any, Literal

UTILS_MODULE = "sglang.srt.mem_cache.utils"
FUNCTION = "convert_to_bigram_key"
# Where SGLang 0.5.10 binds the function by name (each may or may not be imported yet).
BINDING_MODULES = (
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.mem_cache.swa_radix_cache",
    "sglang.srt.mem_cache.hiradix_cache",
)
SWA_MODULE, SWA_CLASS = "sglang.srt.mem_cache.swa_radix_cache", "SWARadixCache"
RADIX_KEY_MODULE = "sglang.srt.mem_cache.radix_cache"
CONVERSION_TARGET = f"{UTILS_MODULE}.{FUNCTION}"
MATCH_AT_TARGET = f"{RADIX_KEY_MODULE}.RadixKey.match_at"

# "not patched" is the one bad state: SGLang holds something else than what activation put there.
PointState = Literal["patched", "restored", "binds at import", "not in this release", "not patched"]


@dataclasses.dataclass(frozen=True)
class PatchPoint:
    """One place where SGLang holds ``convert_to_bigram_key``, and what activation did there."""

    target: str
    state: PointState
    detail: str = ""


# radix_core is imported inside the functions below, never at module level: this module is imported
# by the .pth startup hook, where a bad RADIX_CORE_BACKEND must not turn into a start-up traceback.


def sglang_convert_to_bigram_key(tokens: Any) -> Any:
    """What SGLang calls once activated: radix-core's dispatcher (native when available, and
    degrading to the Python reference, once, on any native failure)."""
    import radix_core

    return radix_core.convert_to_bigram_key(tokens)


def accelerated_match_at(self: Any, other: Any, offset: int, page_size: int = 1) -> int:
    """SGLang 0.5.12+'s ``RadixKey.match_at`` with its comparison done by radix-core.

    SGLang finds the first differing raw token by galloping slice compares; radix-core's
    ``common_prefix_length`` answers the same question (natively over ``array('q')``). The checks
    before it and the unit arithmetic after it are the same as SGLang's: same results, same errors.
    """
    self._check_compatible(other)
    if self.is_bigram != other.is_bigram:
        raise ValueError("RadixKey.match_at needs both keys in the same bigram mode")
    if offset < 0 or offset > len(other):
        raise IndexError(f"RadixKey offset {offset} is outside [0, {len(other)}]")
    mine, theirs = self.token_ids, other.token_ids
    assert type(mine) is type(theirs), (type(mine), type(theirs))
    raw_tokens = min(self._raw_len(), other._raw_len() - offset)
    import radix_core

    same_tokens = radix_core.common_prefix_length(mine, 0, theirs, offset, raw_tokens)
    if self.is_bigram:
        units = max(0, min(same_tokens - 1, len(self), len(other) - offset))
    else:
        units = min(same_tokens, len(self), len(other) - offset)
    return units - units % page_size if page_size > 1 else units


_original: Callable[..., Any] | None = None  # SGLang's own function, saved once
_original_match_at: Callable[..., Any] | None = None  # SGLang's RadixKey.match_at, when replaced


def original_convert_to_bigram_key() -> Callable[..., Any] | None:
    """SGLang's own function, as it was before activation (None before the first activation)."""
    return _original


def apply(version: str, accelerate_match: bool) -> list[PatchPoint]:
    """Patch this process's SGLang (idempotent) and report every patch point."""
    utils = importlib.import_module(UTILS_MODULE)
    points = _patch_conversion(utils)
    if accelerate_match:
        points.append(_patch_match_at(importlib.import_module(RADIX_KEY_MODULE), version))
    return points


def replaced(points: list[PatchPoint] | tuple[PatchPoint, ...]) -> list[str]:
    """The SGLang functions that ``apply`` replaced, by name, from its patch points."""
    names = {CONVERSION_TARGET: FUNCTION, MATCH_AT_TARGET: "RadixKey.match_at"}
    return [names[point.target] for point in points if point.state == "patched" and point.target in names]


def restore() -> list[PatchPoint]:
    """Put SGLang's own functions back everywhere the replacements went (idempotent)."""
    points = []
    utils = sys.modules.get(UTILS_MODULE)
    if _original is not None and getattr(utils, FUNCTION, None) is sglang_convert_to_bigram_key:
        setattr(utils, FUNCTION, _original)
        points += _rebind_elsewhere(sglang_convert_to_bigram_key, _original, "restored")
    radix_key = getattr(sys.modules.get(RADIX_KEY_MODULE), "RadixKey", None)
    if radix_key is not None and radix_key.__dict__.get("match_at") is accelerated_match_at:
        radix_key.match_at = _original_match_at
        points.append(PatchPoint(MATCH_AT_TARGET, "restored"))
    return points


def _patch_conversion(utils: Any) -> list[PatchPoint]:
    """convert_to_bigram_key, wherever SGLang holds it (releases up to 0.5.11)."""
    global _original
    current = getattr(utils, FUNCTION, None)
    if current is None:
        return [PatchPoint(CONVERSION_TARGET, "not in this release")]
    if current is not sglang_convert_to_bigram_key:
        _original = _original or current
        setattr(utils, FUNCTION, sglang_convert_to_bigram_key)
    return _rebind_elsewhere(_original, sglang_convert_to_bigram_key, "patched")


def _patch_match_at(radix_cache: Any, version: str) -> PatchPoint:
    """RadixKey.match_at (0.5.12+): the class attribute, so every key and every tree sees it."""
    global _original_match_at
    radix_key = getattr(radix_cache, "RadixKey", None)
    current = getattr(radix_key, "match_at", None)
    if radix_key is None or current is None:
        return PatchPoint(MATCH_AT_TARGET, "not patched", f"requested, but SGLang {version} has no RadixKey.match_at")
    if current is not accelerated_match_at:
        _original_match_at = current
        radix_key.match_at = accelerated_match_at
    return PatchPoint(MATCH_AT_TARGET, "patched")


def _rebind_elsewhere(old: Any, new: Any, done: PointState) -> list[PatchPoint]:
    """``utils`` holds ``new`` now: the same swap wherever else SGLang holds ``old``."""
    return [
        PatchPoint(CONVERSION_TARGET, done),
        *_rebind_modules(old, new, done),
        _rebind_swa_instances(old, new, done),
    ]


def _rebind_modules(old: Any, new: Any, done: PointState) -> list[PatchPoint]:
    """Swap ``old`` for ``new`` in every sglang.* module attribute named FUNCTION."""
    points = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang.") and name != UTILS_MODULE and getattr(module, FUNCTION, None) is old:
            setattr(module, FUNCTION, new)
            points[name] = PatchPoint(f"{name}.{FUNCTION}", done)
    for name in (name for name in BINDING_MODULES if name not in points):
        held = getattr(sys.modules.get(name), FUNCTION, None)
        if name not in sys.modules:
            points[name] = PatchPoint(f"{name}.{FUNCTION}", "binds at import", "not imported yet")
        elif held is new:
            points[name] = PatchPoint(f"{name}.{FUNCTION}", done)
        else:
            points[name] = PatchPoint(f"{name}.{FUNCTION}", "not patched", f"holds {held!r}")
    return list(points.values())


def _rebind_swa_instances(old: Any, new: Any, done: PointState) -> PatchPoint:
    """SWA caches copy the function into ``self.key_convert_fn`` when built: swap it in live ones."""
    target = f"{SWA_MODULE}.{SWA_CLASS}().key_convert_fn"
    cls = getattr(sys.modules.get(SWA_MODULE), SWA_CLASS, None)
    if cls is None:
        return PatchPoint(target, "binds at import", "no SWA cache module imported yet")
    swapped = 0
    for obj in gc.get_objects():
        if isinstance(obj, cls) and obj.__dict__.get("key_convert_fn") is old:
            obj.key_convert_fn = new
            swapped += 1
    return PatchPoint(target, done, f"{swapped} live instance(s); new ones bind at construction")
