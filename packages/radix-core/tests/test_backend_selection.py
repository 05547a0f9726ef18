"""Backend choice and fallback, in fresh interpreters: the environment is read once, at import."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from radix_core import BACKEND_ENV, DEVICE_TREE_ENV, SGLANG_KILL_SWITCH_ENV, TREE_ENV, _backend
from radix_core._backend import NATIVE_KERNEL_ABI, VERIFY_ENV
from radix_testing.backend_fixtures import expected_backend
from radix_testing.examples import examples

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

def descend(node, key, position, page_size):  # plain keys, page 1: what the self-test walks
    tokens = key._tokens[key._start : key._stop]
    path, ends = [], []
    while position < len(tokens):
        first = tokens[position]
        child = node.children.get(first if key.extra_key is None else (key.extra_key, first))
        if child is None:
            break
        edge = child.key._tokens[child.key._start : child.key._stop]
        shared = common_prefix_length(edge, 0, tokens, position, min(len(edge), len(tokens) - position))
        position += shared
        path.append(child)
        ends.append(position)
        if shared < len(edge):
            break
        node = child
    return path, ends
"""

REPORT = "import radix_core; s = radix_core.backend(); print(s.active, '|', s.requested, '|', s.reason)"


def run_child(code: str, tmp_path: Path, fake_native: str | None = None, **env: str) -> subprocess.CompletedProcess:
    child_env = {
        k: v
        for k, v in os.environ.items()
        if k not in (BACKEND_ENV, SGLANG_KILL_SWITCH_ENV, VERIFY_ENV, TREE_ENV, DEVICE_TREE_ENV)
    }
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


@pytest.mark.parametrize("variable", [TREE_ENV, DEVICE_TREE_ENV])
@pytest.mark.parametrize("value", ["rust", "auto"])
def test_unknown_tree_value_fails_at_import_naming_the_choices(tmp_path, variable, value):
    result = run_child(REPORT, tmp_path, **{variable: value})
    assert result.returncode != 0
    assert "BackendConfigError" in result.stderr and f"{variable}={value!r}" in result.stderr
    assert "python, native" in result.stderr


@pytest.mark.parametrize(
    ("value", "expected"), [(None, "python"), ("", "python"), ("python", "python"), (" Native", "native")]
)
def test_the_device_tree_env_var_is_read_at_import(tmp_path, value, expected):
    """Python unless asked: the device arena is not yet measured on a GPU (CI has none)."""
    told = {} if value is None else {DEVICE_TREE_ENV: value}
    result = run_child("from radix_core import _backend; print(_backend.device_tree)", tmp_path, **told)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.parametrize("value", ["native", " Native ", "python", "", None])
def test_the_tree_env_var_picks_the_default_tree(tmp_path, value):
    """``native`` unless told: radix-native's tree where it is usable."""
    told = {} if value is None else {"RADIX_CORE_TREE": value}
    result = run_child("import radix_core; print(radix_core.RadixCache().tree_kind)", tmp_path, **told)
    assert result.returncode == 0, result.stderr
    usable = _backend.native_tree_module() is not None  # the child imports the same radix-native
    expected = "native" if (value is None or value.strip().lower() in ("native", "")) and usable else "python"
    assert result.stdout.strip() == expected


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


# ----- RADIX_CORE_VERIFY: a share of native answers checked against the reference ---------------

WRONG_AFTER_LOAD = """
_loaded_convert = convert_to_bigram_key
def convert_to_bigram_key(tokens):
    result = _loaded_convert(tokens)
    if isinstance(result, list) and len(tokens) > 4:
        result[0] = ("wrong", "answer")
    return result
"""


@pytest.mark.parametrize("value", ["lots", "-0.1", "1.5", "nan", "1/100"])
def test_unknown_verify_values_fail_at_import(tmp_path, value):
    result = run_child(REPORT, tmp_path, RADIX_CORE_VERIFY=value)
    assert result.returncode != 0 and "RADIX_CORE_VERIFY" in result.stderr and "from 0 to 1" in result.stderr


def test_a_wrong_answer_is_caught_by_verification_and_switches_once(tmp_path):
    code = """
    import radix_core
    answers = [radix_core.convert_to_bigram_key([1, 2, 3, 4, 5]) for _ in range(4)]
    print(answers[0][0], answers[1][0], answers[2][0], answers[3][0])
    print(radix_core.backend().active, radix_core.backend().reason)
    """
    result = run_child(code, tmp_path, fake_native=WRONG_AFTER_LOAD, RADIX_CORE_VERIFY="0.5")
    assert result.returncode == 0, result.stderr
    first, status = result.stdout.splitlines()
    assert first == "('wrong', 'answer') (1, 2) (1, 2) (1, 2)", (
        "the second call is checked: its answer is the reference's"
    )
    assert status.startswith(
        "python native convert_to_bigram_key answered differently from the reference for (list[5])"
    )
    (warning,) = warnings_in(result)
    assert "RADIX_CORE_VERIFY" in warning and "wrong" not in warning, "the log gives the input's shape, not its content"


def test_without_verification_nothing_is_compared(tmp_path):
    code = """
    import radix_core
    print(radix_core.convert_to_bigram_key([1, 2, 3, 4, 5])[0], radix_core.backend().active)
    """
    result = run_child(code, tmp_path, fake_native=WRONG_AFTER_LOAD, RADIX_CORE_VERIFY="0")
    assert result.stdout.split() == ["('wrong',", "'answer')", "native"]


def test_a_native_out_of_memory_is_no_broken_kernel(tmp_path):
    code = """
    import radix_core
    print(radix_core.convert_to_bigram_key([1, 2, 3, 4, 5]), radix_core.backend().active)
    """
    fake = """
def convert_to_bigram_key(tokens, _loaded=convert_to_bigram_key):
    if len(tokens) > 4:
        raise MemoryError()
    return _loaded(tokens)
"""
    result = run_child(code, tmp_path, fake_native=fake)
    assert result.stdout.split() == ["[(1,", "2),", "(2,", "3),", "(3,", "4),", "(4,", "5)]", "native"]
    assert warnings_in(result) == []


# ----- the real kernels in hostile surroundings (native sessions) ------------------------------

needs_native = pytest.mark.skipif(
    importlib.util.find_spec("radix_native") is None and expected_backend() != "native",
    reason="radix-native is not installed in this session",
)


@needs_native
def test_finalizers_that_grow_the_list_cannot_interrupt_a_conversion(tmp_path):
    code = """
    import gc, radix_core
    tokens = list(range(40_000))
    class Appender:
        def __del__(self):
            tokens.append(-1)
    for _ in range(2000):  # garbage only the cyclic GC frees, whose finalizers grow `tokens`
        a = Appender(); a.cycle = a
    before = list(tokens)
    result = radix_core.convert_to_bigram_key(tokens)
    print(result == radix_core.python_convert_to_bigram_key(before), radix_core.backend().active)
    """
    result = run_child(code, tmp_path)
    assert result.stdout.split() == ["True", "native"], result.stderr


DAEMONS_AT_EXIT = """
import threading, radix_core
class Index:
    def __init__(self, value): self.value = value
    def __index__(self): return self.value
items = [Index(i) for i in range(300)] if {python_items} else list(range(300))
def spin():
    while True:
        radix_core.pack_bigram_keys(items)
        radix_core.convert_to_bigram_key(list(range(300)))
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
"""


@needs_native
def test_daemon_threads_inside_the_kernels_at_interpreter_exit_never_crash():
    """CPython ends daemon threads with pthread_exit when they wake after shutdown; the kernels
    run no Python code and hold nothing a C++ unwind would release without the GIL. 100 exits
    (examples(100)), none may crash or hang (the kernels before this gave hangs and segfaults)."""
    from concurrent.futures import ThreadPoolExecutor

    def one_exit(run: int) -> int | str:
        code = DAEMONS_AT_EXIT.format(python_items=run % 2 == 0)
        try:
            return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30).returncode
        except subprocess.TimeoutExpired:
            return "hung"

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(one_exit, range(examples(100))))
    assert "hung" not in outcomes
    if sys.version_info < (3, 11):
        # CPython 3.10 itself: a daemon thread that gets the GIL after Py_FinalizeEx has freed the
        # interpreter touches it in take_gil and crashes (python/cpython#110052), about one exit in
        # a hundred here; gdb shows only CPython frames on that thread. 3.11+ keeps the main
        # interpreter static, and there every exit must be clean.
        outcomes = [0 if outcome == -signal.SIGSEGV else outcome for outcome in outcomes]
    assert outcomes == [0] * len(outcomes)


SUBINTERPRETER = """
import sys
interpreters = __import__("_interpreters" if sys.version_info >= (3, 13) else "_xxsubinterpreters")
child = interpreters.create()
code = "import radix_core; print('in a subinterpreter:', radix_core.backend().active)"
try:  # 3.10-3.12 raise the subinterpreter's error; 3.13 returns a description of it
    failure = interpreters.run_string(child, code)
except Exception as exc:
    failure = exc
if failure is not None:
    print("refused:", getattr(failure, "msg", failure))
print("main:", __import__("radix_core").backend().active)
"""


@needs_native
@pytest.mark.parametrize(("requested", "answer"), [("auto", "in a subinterpreter: python"), ("native", "refused:")])
def test_a_subinterpreter_gets_an_answer_at_once(tmp_path, requested, answer):
    result = run_child(SUBINTERPRETER, tmp_path, RADIX_CORE_BACKEND=requested)
    assert answer in result.stdout and "main: native" in result.stdout, result.stdout + result.stderr
