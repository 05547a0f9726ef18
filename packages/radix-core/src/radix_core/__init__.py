"""radix-core: an SGLang-compatible radix prefix cache in pure Python, native kernels optional.

``backend()`` tells whether radix-native's kernels are in use and why. The choice is read once from
``RADIX_CORE_BACKEND`` (``auto``, ``python`` or ``native``) and ``SGLANG_DISABLE_TAI_BIGRAM``;
``RADIX_CORE_VERIFY`` (a share of calls, default 0) checks native answers against the reference;
``RADIX_CORE_TREE`` (``native``, the default, or ``python``) picks the tree a ``RadixCache`` keeps its
nodes in; ``RADIX_CORE_DEVICE_TREE`` (``python``, the default, or ``native``) the tree of a cache
whose values are tensors on a device such as a GPU.
"""

__version__ = "0.1.0"

from ._backend import (  # noqa: E402  (the backend reads __version__)
    BACKEND_CHOICES,
    BACKEND_ENV,
    DEVICE_TREE_ENV,
    SGLANG_KILL_SWITCH_ENV,
    TREE_ENV,
    VERIFY_ENV,
    BackendConfigError,
    BackendStatus,
    NativeBackendUnavailable,
    backend,
)
from .bigram import (  # noqa: E402
    PACKED_TOKEN_LIMIT,
    convert_to_bigram_key,
    pack_bigram_keys,
    python_convert_to_bigram_key,
    python_pack_bigram_keys,
)
from .cache import EVICTION_POLICIES, InsertResult, MatchResult, RadixCache, TreeNode  # noqa: E402
from .key import RadixKey, common_prefix_length, python_common_prefix_length  # noqa: E402
from .tiers import (  # noqa: E402
    WRITE_POLICIES,
    HostInsertResult,
    TieredNode,
    TieredRadixCache,
)
from .windows import WindowedRadixCache  # noqa: E402

__all__ = [
    "BACKEND_CHOICES",
    "BACKEND_ENV",
    "PACKED_TOKEN_LIMIT",
    "SGLANG_KILL_SWITCH_ENV",
    "DEVICE_TREE_ENV",
    "TREE_ENV",
    "VERIFY_ENV",
    "EVICTION_POLICIES",
    "BackendConfigError",
    "BackendStatus",
    "InsertResult",
    "MatchResult",
    "NativeBackendUnavailable",
    "RadixCache",
    "RadixKey",
    "HostInsertResult",
    "TieredNode",
    "TieredRadixCache",
    "TreeNode",
    "WindowedRadixCache",
    "WRITE_POLICIES",
    "__version__",
    "backend",
    "common_prefix_length",
    "convert_to_bigram_key",
    "pack_bigram_keys",
    "python_common_prefix_length",
    "python_convert_to_bigram_key",
    "python_pack_bigram_keys",
]
