"""``python -m radix_sglang_adapter doctor``: activate in this process and report what is in place.

Every patch point, whether the ``radix`` radix-cache backend is registered (and the radix-core
kernels its tree would run). Exit status: 0 when activation did what this SGLang needs (or was
switched off on purpose), 1 when a patch point that should hold the replacement does not, 2 when
activation was refused or failed.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ._activation import activate
from ._settings import DISABLE_ENV, AdapterError, boolean_env
from .backend import REGISTRY_MODULE
from .patching import BINDING_MODULES


def doctor() -> int:
    import_errors = []
    try:
        switched_on = not boolean_env(DISABLE_ENV)
    except AdapterError:
        switched_on = False  # activation refuses and says why
    # What a serving process imports, so that bindings show; switched off (or refused), nothing
    # binds, and the answer needs no SGLang import.
    modules = (*BINDING_MODULES, REGISTRY_MODULE) if switched_on else ()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name == module:
                continue  # this release has no such module
            import_errors.append(f"cannot import {module}: {type(exc).__name__}: {exc}")
    try:
        report = activate(source="doctor")
    except AdapterError as exc:
        print(f"radix-sglang-adapter: activation refused or failed: {exc}")
        return 2
    print(report.format())
    for error in import_errors:
        print(f"  warning: {error}")
    return 1 if any(point.state == "not patched" for point in report.patch_points) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m radix_sglang_adapter", description=__doc__)
    parser.add_argument("command", choices=["doctor"])
    parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    return doctor()


if __name__ == "__main__":
    sys.exit(main())
