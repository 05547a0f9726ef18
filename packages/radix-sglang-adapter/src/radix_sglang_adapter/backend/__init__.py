"""The backend: SGLang serves its prefix cache on radix-core (``--radix-cache-backend radix``).

``registry`` puts the ``radix`` name in SGLang's registries (importing nothing from SGLang but its
registry); ``factory`` builds the cache SGLang asks for, after ``refusals`` found nothing it cannot
serve: ``cache.RadixCoreCache`` (SGLang's RadixCache on radix-core's tree), with HiCache
``hicache.RadixCoreHiCache`` (radix-core's tiered tree driving SGLang's cache controller) or
SGLang's UnifiedRadixCache on ``tree_core.RadixTreeCore``. Those modules import SGLang.
"""

from .registry import (
    BACKEND_NAME,
    REGISTRY_MODULE,
    SELECT_FLAG,
    BackendRegistration,
    register,
    registration,
    unregister,
)

__all__ = [
    "BACKEND_NAME",
    "REGISTRY_MODULE",
    "SELECT_FLAG",
    "BackendRegistration",
    "register",
    "registration",
    "unregister",
]
