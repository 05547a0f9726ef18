"""radix-sglang-adapter: SGLang runs radix-core, in every SGLang process.

The adapter has two parts:
- the patches (``patching``): SGLang's ``convert_to_bigram_key`` (0.5.10-0.5.11) and, on request
  (``RADIX_SGLANG_ADAPTER_ACCELERATE_MATCH=1``), 0.5.12+'s ``RadixKey.match_at`` run radix-core's kernels.
- the backend (``backend``): SGLang 0.5.22+ can serve its whole prefix cache on radix-core's tree with
  ``--radix-cache-backend radix``.
``activate()`` / ``deactivate()`` / ``status()`` drive both; automatic activation (SGLang plugin,
or the ``RADIX_SGLANG_ADAPTER=1`` startup hook) reaches SGLang's spawned scheduler too.
``RADIX_SGLANG_ADAPTER_DISABLE=1`` keeps SGLang untouched. ``python -m radix_sglang_adapter doctor``
reports what is in place. See docs/adapter.md.
"""

__version__ = "0.1.0"

from ._activation import AdapterStatus, activate, deactivate, status  # noqa: E402
from ._settings import ACCELERATE_ENV, AUTO_ENV, DISABLE_ENV, TESTED_RELEASES, AdapterError  # noqa: E402
from .backend import BACKEND_NAME, BackendRegistration  # noqa: E402
from .patching import (  # noqa: E402
    PatchPoint,
    accelerated_match_at,
    original_convert_to_bigram_key,
    sglang_convert_to_bigram_key,
)

__all__ = [
    "ACCELERATE_ENV",
    "AUTO_ENV",
    "BACKEND_NAME",
    "DISABLE_ENV",
    "TESTED_RELEASES",
    "AdapterError",
    "AdapterStatus",
    "BackendRegistration",
    "PatchPoint",
    "__version__",
    "accelerated_match_at",
    "activate",
    "deactivate",
    "original_convert_to_bigram_key",
    "sglang_convert_to_bigram_key",
    "status",
]
