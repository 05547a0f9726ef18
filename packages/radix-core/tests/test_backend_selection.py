"""Backend choice and fallback, in fresh interpreters: the environment is read once, at import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from radix_core import BACKEND_ENV, SGLANG_KILL_SWITCH_ENV
from radix_core._backend import NATIVE_KERNEL_ABI

# A stand-in radix_native; each test appends definitions that make it misbehave its own way.
FAKE_NATIVE = f"""
__version__ = "0.1.0"
KERNEL_ABI = {NATIVE_KERNEL_ABI}
calls = 0

def _pairs(tokens):
    return [(tokens[i], tokens[i + 1]) for i in range(len(tokens) - 1)]

def convert_to_bigram_key(tokens):
    global calls
    calls += 1
    if type(tokens) not in (list, tuple):
        return NotImplemented
    if tokens and isinstance(tokens[0], tuple):
        return tokens
    return _pairs(tokens)

def pack_bigram_keys(tokens, out=None):
    from array import array
    return array("q", [(a << 32) | b for a, b in _pairs(list(tokens))])

def common_prefix_length(a, a_start, b, b_start, length):
    shared = 0
    while shared < length and a[a_start + shared] == b[b_start + shared]:
        shared += 1
    return shared
"""

REPORT = "import radix_core; s = radix_core.backend(); print(s.active, '|', s.requested, '|', s.reason)"


def run_child(code: str, tmp_path: Path, fake_native: str | None = None, **env: str) -> subprocess.CompletedProcess:
    child_env = {k: v for k, v in os.environ.items() if k not in (BACKEND_ENV, SGLANG_KILL_SWITCH_ENV)}
    child_env.update(env)
    if fake_native is not None:
        package = tmp_path / "fake" / "radix_native"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(FAKE_NATIVE + textwrap.dedent(fake_native))
        child_env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), child_env.get("PYTHONPATH", "")])
    prelude = (
        "import logging; logging.basicConfig(level=logging.WARNING, format='LOG %(levelname)s %(name)s %(message)s')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def active_of(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout.split("|")[0].strip()


def warnings_in(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("LOG WARNING radix_core")]


@pytest.mark.parametrize("value", ["bogus", "Native2", "1"])
def test_unknown_backend_value_fails_at_import_naming_the_choices(tmp_path, value):
    result = run_child(REPORT, tmp_path, RADIX_CORE_BACKEND=value)
    assert result.returncode != 0
    assert "BackendConfigError" in result.stderr and "auto, python, native" in result.stderr


def test_python_backend_is_used_when_asked(tmp_path):
    result = run_child(REPORT, tmp_path, fake_native="", RADIX_CORE_BACKEND="python")
    assert active_of(result) == "python"
    assert "RADIX_CORE_BACKEND=python" in result.stdout


@pytest.mark.parametrize("requested", ["auto", "native", " NATIVE "])
def test_sglang_kill_switch_forces_python(tmp_path, requested):
    result = run_child(REPORT, tmp_path, fake_native="", RADIX_CORE_BACKEND=requested, SGLANG_DISABLE_TAI_BIGRAM="1")
    assert active_of(result) == "python"
    assert "SGLANG_DISABLE_TAI_BIGRAM=1" in result.stdout


def test_sglang_kill_switch_off_keeps_native(tmp_path):
    result = run_child(REPORT, tmp_path, fake_native="", SGLANG_DISABLE_TAI_BIGRAM="0")
    assert active_of(result) == "native"


def test_unknown_kill_switch_value_is_an_error(tmp_path):
    result = run_child(REPORT, tmp_path, SGLANG_DISABLE_TAI_BIGRAM="maybe")
    assert result.returncode != 0 and "SGLANG_DISABLE_TAI_BIGRAM='maybe'" in result.stderr


HIDE_NATIVE = "import sys; sys.modules['radix_native'] = None\n"


def test_missing_native_means_python_without_a_warning(tmp_path):
    result = run_child(HIDE_NATIVE + REPORT, tmp_path)
    assert active_of(result) == "python"
    assert "not installed" in result.stdout and warnings_in(result) == []


def test_missing_native_is_an_error_when_native_is_required(tmp_path):
    result = run_child(HIDE_NATIVE + REPORT, tmp_path, RADIX_CORE_BACKEND="native")
    assert result.returncode != 0 and "NativeBackendUnavailable" in result.stderr


BROKEN_NATIVES = {
    "import_error": ("raise ImportError('undefined symbol: _ZN5radix')", "undefined symbol"),
    "os_error": ("raise OSError('cannot open shared object file')", "cannot open shared object"),
    "missing_submodule": ("import radix_native._kernels_gone", "_kernels_gone"),
    "abi_mismatch": ("KERNEL_ABI = 999", "kernel ABI 999"),
    "wrong_answer": ("def convert_to_bigram_key(tokens):\n    return []", "self-test"),
    "self_test_raises": ("def pack_bigram_keys(tokens, out=None):\n    raise MemoryError('oom')", "oom"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_NATIVES))
def test_broken_native_falls_back_once_with_the_reason(tmp_path, case):
    body, reason = BROKEN_NATIVES[case]
    code = REPORT + "\nprint(radix_core.convert_to_bigram_key([1, 2, 3]))"
    result = run_child(code, tmp_path, fake_native=body)
    assert active_of(result) == "python"
    assert reason in result.stdout
    assert "[(1, 2), (2, 3)]" in result.stdout
    (warning,) = warnings_in(result)
    assert reason in warning


@pytest.mark.parametrize("case", sorted(BROKEN_NATIVES))
def test_broken_native_is_an_error_when_native_is_required(tmp_path, case):
    body, reason = BROKEN_NATIVES[case]
    result = run_child(REPORT, tmp_path, fake_native=body, RADIX_CORE_BACKEND="native")
    assert result.returncode != 0
    assert "NativeBackendUnavailable" in result.stderr and reason in result.stderr


# Passes the load-time self-test, then fails on real traffic.
FAILS_AFTER_LOAD = """
_loaded_convert = convert_to_bigram_key
def convert_to_bigram_key(tokens):
    if len(tokens) > 4:
        raise RuntimeError("kernel exploded")
    return _loaded_convert(tokens)
"""


def test_a_failing_call_returns_the_python_result_and_switches_for_good(tmp_path):
    code = """
    import radix_core, radix_native
    print(radix_core.convert_to_bigram_key([1, 2, 3, 4, 5]))
    print(radix_core.backend().active, radix_core.backend().reason)
    calls = radix_native.calls
    print(radix_core.convert_to_bigram_key([1, 2]))
    print("native calls after fallback:", radix_native.calls - calls)
    try:
        radix_core.convert_to_bigram_key(7)
    except TypeError as exc:
        print("bad input:", exc)
    """
    result = run_child(code, tmp_path, fake_native=FAILS_AFTER_LOAD)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "[(1, 2), (2, 3), (3, 4), (4, 5)]"
    assert lines[1] == "python native convert_to_bigram_key raised RuntimeError: kernel exploded"
    assert lines[2] == "[(1, 2)]"
    assert lines[3] == "native calls after fallback: 0"
    assert lines[4] == "bad input: tokens must be a sequence of token ids, not int"
    (warning,) = warnings_in(result)
    assert "kernel exploded" in warning


def test_bad_input_raises_the_reference_error_and_keeps_native(tmp_path):
    code = """
    import radix_core
    try:
        radix_core.pack_bigram_keys([1, -2])
    except ValueError as exc:
        print(type(exc).__name__, exc.__cause__, exc.__suppress_context__)
    print(radix_core.backend().active)
    """
    # The load-time self-test needs a working pack: fail only on negative ids.
    fake = """
_loaded_pack = pack_bigram_keys
def pack_bigram_keys(tokens, out=None):
    if min(tokens) < 0:
        raise ValueError("native says no")
    return _loaded_pack(tokens, out)
"""
    result = run_child(code, tmp_path, fake_native=fake)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["ValueError None True", "native"]
    assert warnings_in(result) == []


def test_concurrent_failures_warn_once_and_every_call_gets_the_right_answer(tmp_path):
    code = """
    import threading, radix_core
    tokens = list(range(50))
    want = [(i, i + 1) for i in range(49)]
    wrong = []
    def work():
        for _ in range(200):
            if radix_core.convert_to_bigram_key(tokens) != want:
                wrong.append(1)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(len(wrong), radix_core.backend().active)
    """
    result = run_child(code, tmp_path, fake_native=FAILS_AFTER_LOAD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0", "python"]
    assert len(warnings_in(result)) == 1
