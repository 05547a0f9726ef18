"""Replaces SGLang's ``convert_to_bigram_key`` with radix-core's, everywhere SGLang holds it.

SGLang 0.5.10 defines the function in ``mem_cache.utils`` but its callers bind it by name at import
(``from ...utils import convert_to_bigram_key``), and SWA caches also keep it per instance
(``self.key_convert_fn``). Patching the ``utils`` attribute alone reaches none of the calls, so
activation also rebinds every ``sglang.*`` module attribute and every live SWA cache that holds the
original. Modules imported later bind the replacement from ``utils`` by themselves.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.metadata
import logging
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal

logger = logging.getLogger("radix_sglang_adapter")

DISABLE_ENV = "RADIX_SGLANG_ADAPTER_DISABLE"
ACCELERATE_ENV = "RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH"
# Releases this adapter was tested against (inclusive); it refuses to patch any other.
TESTED_RELEASES = ((0, 5, 10), (0, 5, 23))
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
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")

State = Literal["inactive", "active", "disabled", "refused", "failed"]
# "not patched" is the one bad state: SGLang holds something else than what activation put there.
PointState = Literal["patched", "restored", "binds at import", "not in this release", "not patched"]


class AdapterError(RuntimeError):
    """Activation was refused or failed (only an explicit ``activate()`` raises it)."""


@dataclasses.dataclass(frozen=True)
class PatchPoint:
    """One place where SGLang holds ``convert_to_bigram_key``, and what activation did there."""

    target: str
    state: PointState
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class AdapterStatus:
    """What the adapter knows: SGLang's version, each patch point, radix-core's backend."""

    state: State
    reason: str
    sglang_version: str | None
    activated_by: str | None
    patch_points: tuple[PatchPoint, ...]
    radix_core_backend: str

    def format(self) -> str:
        lines = [
            f"radix-sglang-adapter: {self.state} ({self.reason})",
            f"SGLang: {self.sglang_version or 'not installed'}"
            + (f", activated by {self.activated_by}" if self.activated_by else ""),
            f"radix-core backend: {self.radix_core_backend}",
        ]
        lines += [f"  {p.state:>16}  {p.target}" + (f"  ({p.detail})" if p.detail else "") for p in self.patch_points]
        return "\n".join(lines)


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


_lock = threading.RLock()
_original: Callable[..., Any] | None = None  # SGLang's own function, saved once
_original_match_at: Callable[..., Any] | None = None  # SGLang's RadixKey.match_at, when replaced
_state: State = "inactive"
_reason = "activate() has not been called"
_activated_by: str | None = None
_points: tuple[PatchPoint, ...] = ()


def boolean_env(name: str) -> bool:
    """A strict on/off environment variable; AdapterError for any other value."""
    raw = os.environ.get(name, "")
    word = raw.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise AdapterError(f"{name}={raw!r} is not a boolean; use 1/true/yes/on or 0/false/no/off")


def kill_switch() -> bool:
    """True when RADIX_SGLANG_ADAPTER_DISABLE asks to leave SGLang alone; raises on an unknown value."""
    return boolean_env(DISABLE_ENV)


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, int, int] | None:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in found.groups()) if found else None  # type: ignore[return-value]


def original_convert_to_bigram_key() -> Callable[..., Any] | None:
    """SGLang's own function, as it was before activation (None before the first activation)."""
    return _original


def status() -> AdapterStatus:
    try:
        import radix_core

        backend = radix_core.backend()
        backend_text = f"{backend.active} ({backend.reason})"
    except Exception as exc:  # status must answer even when radix-core is broken
        backend_text = f"unavailable: {type(exc).__name__}: {exc}"
    return AdapterStatus(_state, _reason, sglang_version(), _activated_by, _points, backend_text)


def _set(state: State, reason: str, points: tuple[PatchPoint, ...] = ()) -> AdapterStatus:
    global _state, _reason, _points
    _state, _reason, _points = state, reason, points
    return status()


def accelerate_match_requested() -> bool:
    """True when RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH asks for the native RadixKey.match_at."""
    return boolean_env(ACCELERATE_ENV)


def activate(*, source: str = "activate()", accelerate_match: bool | None = None) -> AdapterStatus:
    """Patch SGLang (idempotent). Raises AdapterError for an untested SGLang release or a failure;
    with the kill switch set it patches nothing and says so.

    ``accelerate_match`` (default: RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH) also replaces
    ``RadixKey.match_at`` of SGLang 0.5.12+ with one whose comparison is radix-core's
    ``common_prefix_length``; everything else in it behaves as SGLang's. Patches accumulate:
    only ``deactivate()`` (or the kill switch) takes them back."""
    global _activated_by
    with _lock:
        if kill_switch():
            deactivate()
            return _set("disabled", f"{DISABLE_ENV} is set: SGLang keeps its own functions")
        if accelerate_match is None:
            accelerate_match = accelerate_match_requested()
        version = sglang_version()
        if version is None:
            _set("refused", "SGLang is not installed")
            raise AdapterError("SGLang is not installed: nothing to patch")
        release = _release(version)
        if release is None or not TESTED_RELEASES[0] <= release <= TESTED_RELEASES[1]:
            low, high = (".".join(map(str, r)) for r in TESTED_RELEASES)
            reason = f"SGLang {version} is outside the releases this adapter was tested with ({low} to {high})"
            _set("refused", reason)
            raise AdapterError(f"{reason}; refusing to patch. Upgrade radix-sglang-adapter or set {DISABLE_ENV}=1")
        try:
            import radix_core  # noqa: F401  (fail here, not on SGLang's first call)

            utils = importlib.import_module(UTILS_MODULE)
            radix_cache = importlib.import_module(RADIX_KEY_MODULE) if accelerate_match else None
        except Exception as exc:
            reason = f"cannot import what activation needs: {type(exc).__name__}: {exc}"
            _set("failed", reason)
            raise AdapterError(reason) from exc
        points = _patch_conversion(utils)
        patched = [FUNCTION] if points[0].state == "patched" else []
        if radix_cache is not None:
            points.append(_patch_match_at(radix_cache, version))
            patched += ["RadixKey.match_at"] if points[-1].state == "patched" else []
        if _state != "active":
            if patched:
                logger.info("radix-sglang-adapter active in SGLang %s (%s): %s", version, source, ", ".join(patched))
            else:
                logger.info(
                    "SGLang %s has no %s (EAGLE keys are bigram views there): nothing to patch", version, FUNCTION
                )
        _activated_by = _activated_by or source
        if patched:
            return _set("active", f"SGLang {version} runs radix-core's {' and '.join(patched)}", tuple(points))
        return _set("active", f"nothing to patch in SGLang {version}", tuple(points))


def deactivate() -> AdapterStatus:
    """Put SGLang's own functions back everywhere the replacements went (idempotent)."""
    global _activated_by
    with _lock:
        if _state != "active":
            return status()
        points = []
        if _original is not None:
            utils = sys.modules.get(UTILS_MODULE)
            if utils is not None and getattr(utils, FUNCTION, None) is sglang_convert_to_bigram_key:
                setattr(utils, FUNCTION, _original)
                points += [
                    PatchPoint(f"{UTILS_MODULE}.{FUNCTION}", "restored"),
                    *_rebind_modules(sglang_convert_to_bigram_key, _original, "restored"),
                    _rebind_swa_instances(sglang_convert_to_bigram_key, _original, "restored"),
                ]
        radix_key = getattr(sys.modules.get(RADIX_KEY_MODULE), "RadixKey", None)
        if radix_key is not None and radix_key.__dict__.get("match_at") is accelerated_match_at:
            radix_key.match_at = _original_match_at
            points.append(PatchPoint(f"{RADIX_KEY_MODULE}.RadixKey.match_at", "restored"))
        _activated_by = None
        logger.info("radix-sglang-adapter deactivated: SGLang uses its own functions again")
        return _set("inactive", "deactivate() restored SGLang's own functions", tuple(points))


def _patch_conversion(utils: Any) -> list[PatchPoint]:
    """convert_to_bigram_key, wherever SGLang holds it (releases up to 0.5.11)."""
    global _original
    current = getattr(utils, FUNCTION, None)
    if current is None:
        return [PatchPoint(f"{UTILS_MODULE}.{FUNCTION}", "not in this release")]
    if current is not sglang_convert_to_bigram_key:
        _original = _original or current
        setattr(utils, FUNCTION, sglang_convert_to_bigram_key)
    return [
        PatchPoint(f"{UTILS_MODULE}.{FUNCTION}", "patched"),
        *_rebind_modules(_original, sglang_convert_to_bigram_key, "patched"),
        _rebind_swa_instances(_original, sglang_convert_to_bigram_key, "patched"),
    ]


def _patch_match_at(radix_cache: Any, version: str) -> PatchPoint:
    """RadixKey.match_at (0.5.12+): the class attribute, so every key and every tree sees it."""
    global _original_match_at
    target = f"{RADIX_KEY_MODULE}.RadixKey.match_at"
    radix_key = getattr(radix_cache, "RadixKey", None)
    current = getattr(radix_key, "match_at", None)
    if radix_key is None or current is None:
        return PatchPoint(target, "not patched", f"requested, but SGLang {version} has no RadixKey.match_at")
    if current is not accelerated_match_at:
        _original_match_at = current
        radix_key.match_at = accelerated_match_at
    return PatchPoint(target, "patched")


def _rebind_modules(old: Any, new: Any, done: PointState) -> list[PatchPoint]:
    """Swap ``old`` for ``new`` in every sglang.* module attribute named FUNCTION."""
    points = {}
    for name, module in list(sys.modules.items()):
        if name.startswith("sglang.") and name != UTILS_MODULE and getattr(module, FUNCTION, None) is old:
            setattr(module, FUNCTION, new)
            points[name] = PatchPoint(f"{name}.{FUNCTION}", done)
    for name in BINDING_MODULES:
        if name not in points:
            if name not in sys.modules:
                points[name] = PatchPoint(f"{name}.{FUNCTION}", "binds at import", "not imported yet")
            else:
                held = getattr(sys.modules[name], FUNCTION, None)
                if held is new:
                    points[name] = PatchPoint(f"{name}.{FUNCTION}", done)
                else:
                    points[name] = PatchPoint(f"{name}.{FUNCTION}", "not patched", f"holds {held!r}")
    return list(points.values())


def _rebind_swa_instances(old: Any, new: Any, done: PointState) -> PatchPoint:
    """SWA caches copy the function into ``self.key_convert_fn`` when built: swap it in live ones."""
    target = f"{SWA_MODULE}.{SWA_CLASS}().key_convert_fn"
    module = sys.modules.get(SWA_MODULE)
    cls = getattr(module, SWA_CLASS, None)
    if cls is None:
        return PatchPoint(target, "binds at import", "no SWA cache module imported yet")
    swapped = 0
    for obj in gc.get_objects():
        if isinstance(obj, cls) and obj.__dict__.get("key_convert_fn") is old:
            obj.key_convert_fn = new
            swapped += 1
    return PatchPoint(target, done, f"{swapped} live instance(s); new ones bind at construction")


def activate_guarded(source: str) -> None:
    """Automatic activation: never raises into SGLang; a refusal or failure is logged once."""
    try:
        activate(source=source)
    except Exception as exc:
        logger.warning("radix-sglang-adapter not activated (%s): %s", source, exc)
