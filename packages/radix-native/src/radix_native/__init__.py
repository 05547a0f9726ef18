"""Native kernels for radix-core.

Import them through ``radix_core``: it checks ``KERNEL_ABI`` before use and falls back to its
pure-Python reference, logging once, whenever a kernel cannot be used.

Main interpreter only: in a CPython subinterpreter this import raises ImportError at once (the
pybind11 module's initialisation would wait forever for the main interpreter's GIL there).
"""


def _in_main_interpreter() -> bool:
    for name in ("_interpreters", "_xxsubinterpreters"):  # 3.13+, then 3.10-3.12
        try:
            interpreters = __import__(name)
        except ImportError:
            continue
        return interpreters.get_current() == interpreters.get_main()
    return True


if not _in_main_interpreter():
    raise ImportError("radix-native cannot be used in a subinterpreter; radix_core runs its Python reference there")

from ._kernels import (  # noqa: E402
    KERNEL_ABI,
    __version__,
    common_prefix_length,
    convert_to_bigram_key,
    descend,
    pack_bigram_keys,
)

__all__ = [
    "KERNEL_ABI",
    "__version__",
    "common_prefix_length",
    "convert_to_bigram_key",
    "descend",
    "pack_bigram_keys",
]
