"""Test-only launcher: ``python launch_sglang.py [--fake-amx] [--fork] SERVER_ARGS...`` is
``python -m sglang.launch_server SERVER_ARGS...`` (its shims come from sitecustomize, beside this
file). ``--fake-amx`` makes this process's platform report Intel AMX, so SGLang keeps the
``intel_amx`` attention backend that EAGLE's draft needs (see sglang_server_shims). ``--fork``
starts the scheduler and detokenizer by fork instead of SGLang's spawn: they inherit this
process's imports (SGLang, torch, the shims) instead of importing them again, which halves a test
server's start on this CPU."""

from __future__ import annotations

import multiprocessing
import os
import sys

from sglang.launch_server import run_server
from sglang.srt.entrypoints import engine
from sglang.srt.plugins import load_plugins
from sglang.srt.runtime_context import get_platform
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils import kill_process_tree

LAUNCHER_FLAGS = ("--fake-amx", "--fork")

if __name__ == "__main__":
    args = sys.argv[1:]
    flags = set()
    while args[:1] and args[0] in LAUNCHER_FLAGS:
        flags.add(args.pop(0))
    if "--fake-amx" in flags:
        get_platform()._overrides["has_amx"] = True
    if "--fork" in flags:
        multiprocessing.set_start_method("fork", force=True)
        engine.mp.set_start_method = lambda method, force=False: None  # SGLang's "spawn" is not applied
    load_plugins()
    server_args = prepare_server_args(args)
    try:
        run_server(server_args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
