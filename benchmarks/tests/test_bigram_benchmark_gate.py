"""The main job's gate (benchmark_convert_to_bigram_key.py): a wrong result fails --check, whatever
the speed; a missed speed target fails only --check-speed."""

import benchmark_convert_to_bigram_key as benchmark
import pytest

from radix_core import convert_to_bigram_key

# Small samples: the gate is about exit statuses and what is printed, not the timings.
QUICK = ["--sizes", "128,1024", "--rounds", "2", "--sample-elements", "8192"]


def swapped_last_pair(tokens):
    pairs = convert_to_bigram_key(tokens)
    first, second = pairs[-1]
    pairs[-1] = (second, first)
    return pairs


def equal_ints_but_new_objects(tokens):
    """Equal pickle bytes, but not the input's item objects: byte-identical means both."""
    return [(int(str(first)), int(str(second))) for first, second in convert_to_bigram_key(tokens)]


# Deliberately wrong stand-ins for radix-native's bigram kernel, as the benchmark calls it.
WRONG_KERNELS = {
    "drops the last pair": lambda tokens: convert_to_bigram_key(tokens)[:-1],
    "swaps the last pair": swapped_last_pair,
    "new int objects": equal_ints_but_new_objects,
    "a tuple, not a list": lambda tokens: tuple(convert_to_bigram_key(tokens)),
}


@pytest.mark.parametrize("flag", ["--check", "--check-speed"])
@pytest.mark.parametrize("wrong_kernel", WRONG_KERNELS.values(), ids=WRONG_KERNELS)
def test_a_wrong_native_result_fails_the_run(monkeypatch, capsys, wrong_kernel, flag):
    monkeypatch.setattr(benchmark, "convert_to_bigram_key", wrong_kernel)
    assert benchmark.main([flag, *QUICK]) == benchmark.EXIT_WRONG_RESULT
    printed = capsys.readouterr().out
    assert "MISMATCH n=128: native tuples is not byte-identical" in printed
    assert printed.splitlines()[-1].startswith("RESULTS WRONG:")


def test_the_real_kernels_pass_check_even_when_every_speed_target_is_missed(monkeypatch, capsys):
    unreachable = [(variant, baseline, sizes, 1e9, kind) for variant, baseline, sizes, _, kind in benchmark.TARGETS]
    monkeypatch.setattr(benchmark, "TARGETS", unreachable)
    assert benchmark.main(["--check", *QUICK]) == 0
    printed = capsys.readouterr().out
    assert "MISS native tuples vs seed-style kernel at n=128" in printed
    assert printed.splitlines()[-1].startswith("RESULTS CORRECT:")
    assert benchmark.main(["--check-speed", *QUICK]) == benchmark.EXIT_SPEED_MISSED
    assert capsys.readouterr().out.splitlines()[-1].startswith("RESULTS CORRECT:")


def test_a_wrong_pure_path_fails_the_run(monkeypatch, capsys):
    """radix-core's pure path is held to the list comprehension as the native kernel is."""
    monkeypatch.setattr(benchmark, "python_convert_to_bigram_key", lambda tokens: convert_to_bigram_key(tokens)[:-1])
    assert benchmark.main(["--check", *QUICK]) == benchmark.EXIT_WRONG_RESULT
    assert "MISMATCH n=128: pure path, list(zip(t, it)) is not byte-identical" in capsys.readouterr().out
