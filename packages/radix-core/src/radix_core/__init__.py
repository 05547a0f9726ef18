"""radix-core: SGLang-compatible radix prefix cache pieces, pure Python, native kernels optional.

``backend()`` tells whether radix-native's kernels are in use and why. The choice is read once from
``RADIX_CORE_BACKEND`` (``auto``, ``python`` or ``native``) and ``SGLANG_DISABLE_TAI_BIGRAM``.
"""

__version__ = "0.1.0"

from ._backend import (  # noqa: E402  (the backend reads __version__)
    BACKEND_CHOICES,
    BACKEND_ENV,
    SGLANG_KILL_SWITCH_ENV,
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

__all__ = [
    "BACKEND_CHOICES",
    "BACKEND_ENV",
    "PACKED_TOKEN_LIMIT",
    "SGLANG_KILL_SWITCH_ENV",
    "BackendConfigError",
    "BackendStatus",
    "NativeBackendUnavailable",
    "__version__",
    "backend",
    "convert_to_bigram_key",
    "pack_bigram_keys",
    "python_convert_to_bigram_key",
    "python_pack_bigram_keys",
]
