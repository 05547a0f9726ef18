"""The one place that decides whether radix_core runs radix-native's kernels or its Python reference.

The decision is made once, at import, from the environment; after that the only change possible is
a one-way switch to Python when a native kernel fails (logged once, never raised into the caller).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
from array import array
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, Literal, TypeVar

from . import __version__

logger = logging.getLogger("radix_core")

BACKEND_ENV = "RADIX_CORE_BACKEND"
BACKEND_CHOICES = ("auto", "python", "native")
# SGLang's own switch for bisecting the bigram path; we honour it as "force python".
SGLANG_KILL_SWITCH_ENV = "SGLANG_DISABLE_TAI_BIGRAM"
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")

# The radix-native kernel contract this radix-core release was written against.
NATIVE_KERNEL_ABI = 2

BackendName = Literal["python", "native"]
RequestedBackend = Literal["auto", "python", "native"]


class BackendConfigError(ValueError):
    """An environment variable that selects the backend holds a value we do not know."""


class NativeBackendUnavailable(ImportError):
    """``RADIX_CORE_BACKEND=native`` was asked for, but radix-native cannot be used."""


@dataclasses.dataclass(frozen=True)
class BackendStatus:
    """Which kernels radix_core runs, and why."""

    active: BackendName
    requested: RequestedBackend
    reason: str
    native_version: str | None = None


def requested_backend(environ: Mapping[str, str] = os.environ) -> RequestedBackend:
    """The backend the environment asks for; raises BackendConfigError on an unknown value."""
    raw = environ.get(BACKEND_ENV, "auto")
    requested = raw.strip().lower() or "auto"
    if requested not in BACKEND_CHOICES:
        raise BackendConfigError(
            f"{BACKEND_ENV}={raw!r} is not a known backend; use one of: {', '.join(BACKEND_CHOICES)}"
        )
    return requested  # type: ignore[return-value]


def sglang_kill_switch(environ: Mapping[str, str] = os.environ) -> bool:
    """True when SGLANG_DISABLE_TAI_BIGRAM asks for the Python path; raises on an unknown value."""
    raw = environ.get(SGLANG_KILL_SWITCH_ENV, "")
    word = raw.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise BackendConfigError(f"{SGLANG_KILL_SWITCH_ENV}={raw!r} is not a boolean; use 1/true/yes/on or 0/false/no/off")


def _self_test(kernels: ModuleType) -> None:
    """Fail now, at load, rather than on a serving request, if the kernels give wrong answers."""
    tokens = [3, 2**40, -1, True]
    pairs = kernels.convert_to_bigram_key(tokens)
    if pairs != [(3, 2**40), (2**40, -1), (-1, True)] or pairs[0][1] is not tokens[1]:
        raise RuntimeError(f"convert_to_bigram_key self-test gave {pairs!r}")
    packed = kernels.pack_bigram_keys([1, 2, 2**31 - 1])
    if list(packed) != [(1 << 32) | 2, (2 << 32) | (2**31 - 1)]:
        raise RuntimeError(f"pack_bigram_keys self-test gave {packed!r}")
    shared = kernels.common_prefix_length(array("q", [5, 1, 2, 3]), 1, array("q", [1, 2, 4]), 0, 3)
    if shared != 2:
        raise RuntimeError(f"common_prefix_length self-test gave {shared!r}")


def _load_native() -> ModuleType:
    """Import radix-native and check it is usable; raises with the reason when it is not."""
    import radix_native

    abi = getattr(radix_native, "KERNEL_ABI", None)
    if abi != NATIVE_KERNEL_ABI:
        raise ImportError(
            f"radix-native {getattr(radix_native, '__version__', '?')} has kernel ABI {abi!r}, "
            f"radix-core {__version__} needs {NATIVE_KERNEL_ABI}; install matching releases"
        )
    _self_test(radix_native)
    return radix_native


def _choose() -> tuple[ModuleType | None, BackendStatus]:
    requested = requested_backend()
    if sglang_kill_switch():
        return None, BackendStatus("python", requested, f"{SGLANG_KILL_SWITCH_ENV}=1 forces the Python reference")
    if requested == "python":
        return None, BackendStatus("python", requested, f"{BACKEND_ENV}=python")
    try:
        kernels = _load_native()
    except Exception as exc:  # a broken install must not break the importer
        if requested == "auto" and isinstance(exc, ModuleNotFoundError) and exc.name == "radix_native":
            logger.debug("radix-native is not installed; using the Python reference")
            return None, BackendStatus("python", requested, "radix-native is not installed")
        reason = f"radix-native is unusable: {type(exc).__name__}: {exc}"
        if requested == "native":
            raise NativeBackendUnavailable(f"{BACKEND_ENV}=native, but {reason}") from exc
        logger.warning("%s; using the Python reference", reason)
        return None, BackendStatus("python", requested, reason)
    version = kernels.__version__
    return kernels, BackendStatus("native", requested, f"radix-native {version} loaded", version)


# The native module while it is trusted, else None. Read on every dispatch, written only under _lock.
native_kernels, _status = _choose()
_lock = threading.Lock()


def backend() -> BackendStatus:
    """Which kernels are in use right now, and why (a native failure switches this to Python)."""
    return _status


def _native_failed(kernel: str, error: BaseException) -> None:
    """Switch the whole process to Python for good; only the first failure is logged."""
    global native_kernels, _status
    with _lock:
        if native_kernels is None:
            return
        native_kernels = None
        reason = f"native {kernel} raised {type(error).__name__}: {error}"
        _status = dataclasses.replace(_status, active="python", reason=reason)
    logger.warning("%s; radix_core uses the Python reference from now on", reason)


@contextlib.contextmanager
def python_reference_only() -> Iterator[None]:
    """Run a block on the Python reference whatever is loaded (tests and benchmarks compare both
    in one process; not meant for use while other threads call the kernels)."""
    global native_kernels
    saved = native_kernels
    native_kernels = None
    try:
        yield
    finally:
        native_kernels = saved


F = TypeVar("F", bound=Callable[..., Any])


def dispatching(kernel: str) -> Callable[[F], F]:
    """Make a Python reference function run the native kernel of the same contract when trusted.

    The native kernel may answer NotImplemented for inputs it leaves to the reference. If it raises,
    the reference runs: when the reference raises too, the input was bad and its error is the
    answer; when it succeeds, the native kernel is at fault and the process switches to Python.
    """

    def decorate(reference: F) -> F:
        @functools.wraps(reference)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            kernels = native_kernels
            if kernels is not None:
                try:
                    result = getattr(kernels, kernel)(*args, **kwargs)
                except Exception as native_error:
                    try:
                        result = reference(*args, **kwargs)
                    except Exception as input_error:
                        raise input_error from None
                    _native_failed(kernel, native_error)
                    return result
                if result is not NotImplemented:
                    return result
            return reference(*args, **kwargs)

        return dispatch  # type: ignore[return-value]

    return decorate
