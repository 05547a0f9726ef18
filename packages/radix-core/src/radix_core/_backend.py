"""The one place that decides whether radix_core runs radix-native's kernels or its Python reference.

The decision is made once, at import, from the environment; after that the only change possible is
a one-way switch to Python when a native kernel fails (logged once, never raised into the caller).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import os
import threading
from array import array
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Literal, TypeVar

from . import __version__

logger = logging.getLogger("radix_core")

BACKEND_ENV = "RADIX_CORE_BACKEND"
BACKEND_CHOICES = ("auto", "python", "native")
# SGLang's own switch for bisecting the bigram path; we honour it as "force python".
SGLANG_KILL_SWITCH_ENV = "SGLANG_DISABLE_TAI_BIGRAM"
# The share of native calls also run on the reference and compared (canary deployments).
VERIFY_ENV = "RADIX_CORE_VERIFY"
# Which tree a RadixCache keeps its nodes in unless it is told (radix_core.native_tree).
TREE_ENV = "RADIX_CORE_TREE"
TREE_CHOICES = ("python", "native")
# The tree of a cache whose values are tensors on a device (a GPU's KV index rows): ``native``
# keeps them in a device arena for radix-native's tree (radix_core.device_values).
DEVICE_TREE_ENV = "RADIX_CORE_DEVICE_TREE"
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")

# The radix-native kernel contract this radix-core release was written against.
NATIVE_KERNEL_ABI = 4
# The contract of radix-native's tree (radix_native._tree) it was written against.
NATIVE_TREE_ABI = 8

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


def verify_fraction(environ: Mapping[str, str] = os.environ) -> float:
    """The share of native calls RADIX_CORE_VERIFY asks to check against the reference (0: none);
    raises BackendConfigError unless it is a number from 0 to 1."""
    raw = environ.get(VERIFY_ENV, "")
    try:
        fraction = float(raw) if raw.strip() else 0.0
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:  # NaN fails this too
        raise BackendConfigError(f"{VERIFY_ENV}={raw!r} is not a share of calls; use a number from 0 to 1, e.g. 0.01")
    return fraction


def requested_tree(environ: Mapping[str, str] = os.environ, name: str = TREE_ENV, unset: str = "native") -> str:
    """The tree RADIX_CORE_TREE (or ``name``) asks RadixCache to use by default (``unset`` unless
    set); raises BackendConfigError on an unknown value. ``native`` is radix-native's tree where
    the native backend is in use and the tree usable, else the Python tree."""
    raw = environ.get(name, unset)
    tree = raw.strip().lower() or unset
    if tree not in TREE_CHOICES:
        raise BackendConfigError(f"{name}={raw!r} is not a known tree; use one of: {', '.join(TREE_CHOICES)}")
    return tree


def _stride(fraction: float) -> int:
    """Check every n-th native call for a share ``fraction`` of them (0: never)."""
    return 0 if fraction == 0 else max(1, round(1 / fraction))


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
    # A two-edge tree of stand-ins with the slots descend reads (radix_core.python_tree imports this module).
    node_type = type("Node", (), {"__slots__": ("children", "key")})
    key_type = type("Key", (), {"__slots__": ("_tokens", "_start", "_stop", "extra_key", "is_bigram")})

    def node(children: dict, tokens: list[int]) -> Any:
        made, key = node_type(), key_type()
        key._tokens, key._start, key._stop = array("q", tokens), 0, len(tokens)
        key.extra_key, key.is_bigram = "ns", False
        made.children, made.key = children, key
        return made

    lower = node({}, [9, 4])
    upper = node({("ns", 9): lower}, [7, 8])
    root = node({("ns", 7): upper}, [])
    walked = kernels.descend(root, node({}, [6, 7, 8, 9, 5]).key, 1, 1)
    if walked != ([upper, lower], [3, 4]) or walked[0][0] is not upper:
        raise RuntimeError(f"descend self-test gave {walked!r}")


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
default_tree = requested_tree()
# For device tensor values: the Python tree unless asked (the device arena is not yet measured on a GPU).
device_tree = requested_tree(os.environ, DEVICE_TREE_ENV, "python")
_lock = threading.Lock()
# Every _verify_stride-th native call is also run on the reference (0: none); the countdown is
# shared by all kernels and threads, so the share is approximate under concurrency.
_verify_stride = _stride(verify_fraction())
_calls_to_verify = _verify_stride


def backend() -> BackendStatus:
    """Which kernels are in use right now, and why (a native failure switches this to Python)."""
    return _status


_tree_module: ModuleType | None = None
_tree_unusable: str | None = None


def native_tree_module() -> ModuleType | None:
    """radix-native's tree module while the native backend is trusted and the tree's ABI is the
    one this release needs, else None (a mismatch is logged once; the Python tree serves)."""
    global _tree_module, _tree_unusable
    if native_kernels is None or _tree_unusable is not None:
        return None
    if _tree_module is None:
        try:
            from radix_native import _tree

            abi = getattr(_tree, "TREE_ABI", None)
            if abi != NATIVE_TREE_ABI:
                raise ImportError(f"its tree ABI is {abi!r}, radix-core {__version__} needs {NATIVE_TREE_ABI}")
        except Exception as exc:  # an old or broken radix-native keeps its kernels, not its tree
            _tree_unusable = f"radix-native's tree is unusable: {type(exc).__name__}: {exc}"
            logger.warning("%s; RadixCache keeps its Python tree", _tree_unusable)
            return None
        _tree_module = _tree
    return _tree_module


def _native_failed(kernel: str, reason: str) -> None:
    """Switch the whole process to Python for good; only the first failure is logged."""
    global native_kernels, _status
    with _lock:
        if native_kernels is None:
            return
        native_kernels = None
        reason = f"native {kernel} {reason}"
        _status = dataclasses.replace(_status, active="python", reason=reason)
    logger.warning("%s; radix_core uses the Python reference from now on", reason)


def _observed(result: Any) -> Any:
    """What a result shows, kept before the reference runs: the reference writes into the same
    ``out`` buffer, so a buffer's bytes are copied (with its type)."""
    if isinstance(result, (list, tuple, int)):
        return result
    try:
        with memoryview(result) as view:
            return type(result), view.tobytes()
    except TypeError:
        return result


def _same(native: Any, reference: Any) -> bool:
    """Equal and of the same type, pairs holding the very same item objects."""
    try:
        if type(native) is not type(reference) or native != reference:
            return False
        if type(native) is list:
            return all(x is y for pair, expected in zip(native, reference) for x, y in zip(pair, expected))
        return True
    except Exception:  # a wrong answer holding items whose __eq__ raises is still a wrong answer
        return False


def _describe(args: tuple[Any, ...]) -> str:
    """An input's shape for a log line (never its content)."""
    shapes = []
    for arg in args:
        size = len(arg) if hasattr(arg, "__len__") else None
        shapes.append(type(arg).__name__ + (f"[{size}]" if size is not None else ""))
    return ", ".join(shapes)


F = TypeVar("F", bound=Callable[..., Any])


def dispatching(kernel: str) -> Callable[[F], F]:
    """Make a Python reference function run the native kernel of the same contract when trusted.

    Only a broken kernel may switch the process to Python; an odd call or input never does. The
    kernels take positional arguments: keywords are bound to positions first (a call the
    reference's signature rejects goes to the reference, which raises). A kernel answers
    NotImplemented for inputs it leaves to the reference. If it raises, the reference runs: when
    the reference raises too, the input was bad and its error is the answer; when it succeeds, the
    kernel is at fault (unless it ran out of memory) and the process switches to Python. With
    RADIX_CORE_VERIFY, a share of native answers is compared with the reference's, and a
    difference switches too.
    """

    def decorate(reference: F) -> F:
        as_positional = _binder(reference)

        @functools.wraps(reference)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            global _calls_to_verify
            kernels = native_kernels
            if kernels is None:
                return reference(*args, **kwargs)
            positional = as_positional(args, kwargs) if kwargs else args
            if positional is None:  # a call the reference's signature rejects: it raises
                return reference(*args, **kwargs)
            try:
                result = getattr(kernels, kernel)(*positional)
            except Exception as native_error:
                try:
                    result = reference(*args, **kwargs)
                except Exception as input_error:
                    raise input_error from None
                if not isinstance(native_error, MemoryError):
                    _native_failed(kernel, f"raised {type(native_error).__name__}: {native_error}")
                return result
            if result is NotImplemented:
                return reference(*args, **kwargs)
            if _verify_stride:
                _calls_to_verify -= 1
                if _calls_to_verify <= 0:
                    _calls_to_verify = _verify_stride
                    return _verified(kernel, reference, args, kwargs, result)
            return result

        return dispatch  # type: ignore[return-value]

    return decorate


def _binder(reference: Callable[..., Any]) -> Callable[[tuple, dict], tuple | None]:
    """A function giving a call of ``reference`` as positional arguments (defaults filled in), or
    None for a call its signature rejects. inspect.Signature.bind does this in microseconds; the
    references have plain positional-or-keyword parameters, so a loop does it in a fraction."""
    parameters = list(inspect.signature(reference).parameters.values())
    names = [parameter.name for parameter in parameters]
    defaults = [parameter.default for parameter in parameters]

    def as_positional(args: tuple, kwargs: dict) -> tuple | None:
        if len(args) > len(names):
            return None
        bound = list(args)
        used = 0
        for name, default in zip(names[len(args) :], defaults[len(args) :]):
            if name in kwargs:
                bound.append(kwargs[name])
                used += 1
            elif default is not inspect.Parameter.empty:
                bound.append(default)
            else:
                return None
        return tuple(bound) if used == len(kwargs) else None

    return as_positional


def _verified(kernel: str, reference: Callable[..., Any], args: tuple, kwargs: dict, result: Any) -> Any:
    """The reference's answer for a call the native kernel answered with ``result``; a different
    one switches the process to Python."""
    native_view = _observed(result)
    expected = reference(*args, **kwargs)
    if not _same(native_view, _observed(expected)):
        _native_failed(kernel, f"answered differently from the reference for ({_describe(args)}) ({VERIFY_ENV})")
    return expected
