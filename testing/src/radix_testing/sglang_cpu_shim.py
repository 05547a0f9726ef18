"""Test-only: lets SGLang's radix-cache modules import on a CPU machine without torchvision.

No torchvision wheel works beside the local CPU torch, yet SGLang's config import chain imports
``torchvision.transforms`` at module level (the radix tree never uses it), and SGLang 0.5.10 also
imports ``sgl_kernel``. We first let ``transformers`` conclude that torchvision is absent, then
serve inert stand-in modules for those names. Never shipped: only tests and benchmarks use it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STAND_IN_ROOTS = ("torchvision", "sgl_kernel")


class _InertMeta(type):
    """Any attribute, call or subscript of an inert class gives the class itself."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __call__(cls, *args, **kwargs):
        return cls

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())


class Inert(metaclass=_InertMeta):
    pass


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]):
        self.roots = roots

    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install() -> None:
    """Idempotent; call before anything imports SGLang."""
    if any(isinstance(finder, _StandInFinder) for finder in sys.meta_path):
        return
    from transformers.utils import import_utils

    if import_utils.is_torchvision_available():
        return  # a real torchvision is here: nothing to stand in for
    missing = tuple(root for root in STAND_IN_ROOTS if importlib.util.find_spec(root) is None)
    sys.meta_path.insert(0, _StandInFinder(missing))
