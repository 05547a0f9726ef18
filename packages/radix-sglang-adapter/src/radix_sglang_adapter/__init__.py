"""radix-sglang-adapter: SGLang calls radix-core's bigram kernels, in every SGLang process.

``activate()`` / ``deactivate()`` / ``status()`` patch and unpatch the running process;
automatic activation (SGLang plugin, or the ``RADIX_SGLANG_ADAPTER=1`` startup hook) reaches
SGLang's spawned scheduler too. ``RADIX_SGLANG_ADAPTER_DISABLE=1`` keeps SGLang untouched.
``RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH=1`` (or ``activate(accelerate_match=True)``) also gives
SGLang 0.5.12+'s ``RadixKey.match_at`` radix-core's native comparison.
``python -m radix_sglang_adapter doctor`` reports what is patched. See docs/adapter.md.
"""

__version__ = "0.1.0"

from ._patching import (  # noqa: E402
    ACCELERATE_ENV,
    DISABLE_ENV,
    TESTED_RELEASES,
    AdapterError,
    AdapterStatus,
    PatchPoint,
    accelerated_match_at,
    activate,
    deactivate,
    original_convert_to_bigram_key,
    sglang_convert_to_bigram_key,
    status,
)
from ._startup import AUTO_ENV  # noqa: E402

__all__ = [
    "ACCELERATE_ENV",
    "AUTO_ENV",
    "DISABLE_ENV",
    "TESTED_RELEASES",
    "AdapterError",
    "AdapterStatus",
    "PatchPoint",
    "__version__",
    "accelerated_match_at",
    "activate",
    "deactivate",
    "original_convert_to_bigram_key",
    "sglang_convert_to_bigram_key",
    "status",
]
