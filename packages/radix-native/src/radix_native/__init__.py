"""Native kernels for radix-core.

Import them through ``radix_core``: it checks ``KERNEL_ABI`` before use and falls back to its
pure-Python reference, logging once, whenever a kernel cannot be used.
"""

from ._kernels import KERNEL_ABI, __version__, common_prefix_length, convert_to_bigram_key, pack_bigram_keys

__all__ = ["KERNEL_ABI", "__version__", "common_prefix_length", "convert_to_bigram_key", "pack_bigram_keys"]
