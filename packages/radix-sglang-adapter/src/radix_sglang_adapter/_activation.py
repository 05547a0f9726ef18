"""activate() / deactivate() / status(): one state, one release check and one kill switch for both
parts of the adapter (``patching``, ``backend``). Automatic activation runs each part once the SGLang
module it needs is imported (``_startup``); an explicit ``activate()`` runs both.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Literal

from . import backend, patching
from ._settings import (
    ACCELERATE_ENV,
    DISABLE_ENV,
    TESTED_RELEASES,
    AdapterError,
    Release,
    boolean_env,
    release_of,
    release_text,
    sglang_version,
)
from .backend import BackendRegistration
from .patching import PatchPoint

logger = logging.getLogger("radix_sglang_adapter")

State = Literal["inactive", "active", "disabled", "refused", "failed"]
Part = Literal["patching", "backend"]
PARTS: tuple[Part, ...] = ("patching", "backend")


@dataclasses.dataclass(frozen=True)
class AdapterStatus:
    """What the adapter knows: SGLang's version, each patch point, the backend, radix-core's kernels."""

    state: State
    reason: str
    sglang_version: str | None
    activated_by: str | None
    patch_points: tuple[PatchPoint, ...]
    cache_backend: BackendRegistration
    radix_core_backend: str

    def format(self) -> str:
        lines = [
            f"radix-sglang-adapter: {self.state} ({self.reason})",
            f"SGLang: {self.sglang_version or 'not installed'}"
            + (f", activated by {self.activated_by}" if self.activated_by else ""),
            f"radix-core backend: {self.radix_core_backend}",
            self.cache_backend.format(),
        ]
        lines += [f"  {p.state:>19}  {p.target}" + (f"  ({p.detail})" if p.detail else "") for p in self.patch_points]
        return "\n".join(lines)


_lock = threading.RLock()
_state: State = "inactive"
_reason = "activate() has not been called"
_activated_by: str | None = None
_points: tuple[PatchPoint, ...] = ()


def status() -> AdapterStatus:
    try:
        import radix_core

        kernels = radix_core.backend()
        kernels_text = f"{kernels.active} ({kernels.reason})"
    except Exception as exc:  # status must answer even when radix-core is broken
        kernels_text = f"unavailable: {type(exc).__name__}: {exc}"
    version = sglang_version()
    registration = backend.registration(release_of(version) if version else None)
    return AdapterStatus(_state, _reason, version, _activated_by, _points, registration, kernels_text)


def _set(state: State, reason: str) -> AdapterStatus:
    global _state, _reason
    _state, _reason = state, reason
    return status()


def activate(
    *, source: str = "activate()", accelerate_match: bool | None = None, parts: tuple[Part, ...] = PARTS
) -> AdapterStatus:
    """Patch SGLang and register the ``radix`` radix-cache backend (idempotent). Raises
    AdapterError for an untested SGLang release or a failure; with the kill switch set it
    touches nothing and says so.

    ``accelerate_match`` (default: RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH) also replaces
    ``RadixKey.match_at`` of SGLang 0.5.12+ with one whose comparison is radix-core's
    ``common_prefix_length``. ``parts`` limits which parts are run (automatic activation runs each
    part once its SGLang module is imported). Activations accumulate: only ``deactivate()`` (or the
    kill switch) takes them back."""
    global _activated_by, _points
    with _lock:
        if boolean_env(DISABLE_ENV):  # the kill switch
            deactivate()
            return _set("disabled", f"{DISABLE_ENV} is set: SGLang keeps its own functions and cache")
        if accelerate_match is None:
            accelerate_match = boolean_env(ACCELERATE_ENV)
        version = sglang_version()
        if version is None:
            _set("refused", "SGLang is not installed")
            raise AdapterError("SGLang is not installed: nothing to patch")
        release = release_of(version)
        if release is None or not TESTED_RELEASES[0] <= release <= TESTED_RELEASES[1]:
            low, high = (release_text(r) for r in TESTED_RELEASES)
            reason = f"SGLang {version} is outside the releases this adapter was tested with ({low} to {high})"
            _set("refused", reason)
            raise AdapterError(f"{reason}; refusing to patch. Upgrade radix-sglang-adapter or set {DISABLE_ENV}=1")
        try:
            import radix_core  # noqa: F401  (fail here, not on SGLang's first call)

            if "patching" in parts:
                _points = tuple(patching.apply(version, accelerate_match))
            if "backend" in parts:
                backend.register(release)
        except Exception as exc:
            failed = "cannot import what activation needs" if isinstance(exc, ImportError) else "activation failed"
            reason = f"{failed}: {type(exc).__name__}: {exc}"
            _set("failed", reason)
            raise AdapterError(reason) from exc
        done = _describe(version, release)
        if (_state, _reason) != ("active", done):
            logger.info("radix-sglang-adapter active in SGLang %s (%s): %s", version, source, done)
        _activated_by = _activated_by or source
        return _set("active", done)


def _describe(version: str, release: Release) -> str:
    """One line saying what SGLang now runs of ours."""
    patched = patching.replaced(_points)
    parts = [f"SGLang {version} runs radix-core's {' and '.join(patched)}"] if patched else []
    if backend.registration(release).registered:
        parts.append(f"can serve its prefix cache on radix-core ({backend.SELECT_FLAG})")
    return "; ".join(parts) or f"nothing to patch or register in SGLang {version}"


def deactivate() -> AdapterStatus:
    """Put SGLang's own functions back and unregister the backend (idempotent), whatever the last
    activation did: a failed one may have patched part of SGLang before it failed."""
    global _activated_by, _points
    with _lock:
        if _state == "inactive":
            return status()
        _points = tuple(patching.restore())
        backend.unregister()
        _activated_by = None
        logger.info("radix-sglang-adapter deactivated: SGLang uses its own functions and cache again")
        return _set("inactive", "deactivate() restored SGLang's own functions and unregistered the backend")


def activate_guarded(source: str, parts: tuple[Part, ...] = PARTS) -> None:
    """Automatic activation: never raises into SGLang; a refusal or failure is logged."""
    try:
        activate(source=source, parts=parts)
    except Exception as exc:
        logger.warning("radix-sglang-adapter not activated (%s): %s", source, exc)
