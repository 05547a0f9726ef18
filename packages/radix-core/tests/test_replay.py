"""The trace replay and its command line: hit rates against a brute-force oracle, bad input."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radix_core.__main__ import capacity_list, main
from radix_core.replay import replay, replay_sweep, terminal_progress
from radix_core.trace import BLOCK_TOKENS, TokenExpander, TraceRequest
from radix_testing.examples import examples

# Small traces: a few blocks drawn from a small set, so prompts share prefixes.
requests_strategy = st.lists(
    st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=4), st.integers(0, 511), st.integers(0, 40)),
    min_size=1,
    max_size=10,
).map(
    lambda rows: [
        TraceRequest(float(i), (len(blocks) - 1) * BLOCK_TOKENS + 1 + tail, output, tuple(blocks))
        for i, (blocks, tail, output) in enumerate(rows)
    ]
)


def oracle_hits(requests: list[TraceRequest], page_size: int, eagle: bool) -> list[int]:
    """An unbounded cache by brute force: a prompt hits the longest prefix it shares with any
    earlier prompt + output, in units (bigrams with eagle) of whole pages."""
    expander = TokenExpander()
    seen: list[array] = []
    hits = []
    for index, request in enumerate(requests):
        prompt = expander.prompt(request)
        best = 0
        for earlier in seen:
            shared = 0
            while shared < min(len(prompt), len(earlier)) and prompt[shared] == earlier[shared]:
                shared += 1
            best = max(best, shared)
        units = max(best - 1, 0) if eagle else best
        hits.append(units - units % page_size)
        seen.append(prompt + expander.output(index, request))
    return hits


@settings(max_examples=examples(60), deadline=None)
@given(requests=requests_strategy, page_size=st.sampled_from([1, 16]), eagle=st.booleans())
def test_unbounded_hits_match_a_brute_force_oracle(backend_name, requests, page_size, eagle):
    result = replay(requests, None, "lru", page_size, eagle)
    assert list(result.prefix_lengths) == oracle_hits(requests, page_size, eagle)
    assert result.evicted_units == 0 and result.requests == len(requests)


def test_capacity_zero_caches_nothing_and_a_large_one_everything(backend_name):
    requests = [TraceRequest(float(i), 1200, 10, (1, 2, 3)) for i in range(4)]
    nothing = replay(requests, 0)
    assert nothing.hit_units == 0 and nothing.evicted_units == 4 * 1210
    everything = replay(requests, 10**9)
    assert everything.prefix_lengths == replay(requests).prefix_lengths == (0, 1200, 1200, 1200)
    assert everything.hit_rate == pytest.approx(3 / 4)


def test_requests_run_in_timestamp_order():
    late, early = TraceRequest(5.0, 600, 0, (7, 8)), TraceRequest(1.0, 600, 0, (7, 9))
    assert replay([late, early]).prefix_lengths == (0, 512), "the earlier request ran first"


def test_a_sweep_replays_every_policy_and_capacity():
    requests = [TraceRequest(float(i), 1024, 5, (i % 2, 9)) for i in range(6)]
    results = replay_sweep(requests, [None, 2000], ["lru", "lfu"])
    assert [(r.policy, r.capacity) for r in results] == [("lru", None), ("lru", 2000), ("lfu", None), ("lfu", 2000)]
    assert results[0].hit_rate >= results[1].hit_rate


def test_capacities_read_with_units():
    assert capacity_list("unbounded,1M,200k,4096,1.5k") == [None, 1_000_000, 200_000, 4096, 1500]


def test_progress_is_shown_only_on_a_terminal():
    assert terminal_progress("label") is None  # pytest captures stderr: not a TTY


# ----- the command line ---------------------------------------------------------------------------


def write_trace(tmp_path, lines: list[str]):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = [
    json.dumps({"timestamp": i, "input_length": 700, "output_length": 3, "hash_ids": [1, 2 + i % 2]}) for i in range(5)
]


def test_the_command_prints_a_table_and_writes_json(tmp_path, capsys):
    trace = write_trace(tmp_path, GOOD)
    out = tmp_path / "results.json"
    assert main(["replay", str(trace), "--capacity", "unbounded,1k", "--policy", "lru,fifo", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "5 requests, 3,500 prompt tokens" in printed and "| fifo | 1,000 |" in printed
    results = json.loads(out.read_text())
    assert len(results) == 4 and results[0]["capacity"] is None and 0 < results[0]["hit_rate"] < 1


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ([GOOD[0], "{broken"], ":2: not a JSON object"),
        ([GOOD[0], '{"timestamp": 1, "input_length": 5}'], ":2: missing field(s) output_length, hash_ids"),
        (['{"timestamp": 1, "input_length": -5, "output_length": 1, "hash_ids": []}'], ":1: input_length must be"),
        (['{"timestamp": 1, "input_length": 2000, "output_length": 1, "hash_ids": [1]}'], ":1: input_length 2000"),
        ([""], "no requests"),
    ],
)
def test_bad_traces_exit_2_naming_the_file_and_line(tmp_path, capsys, lines, said):
    trace = write_trace(tmp_path, lines)
    assert main(["replay", str(trace)]) == 2
    error = capsys.readouterr().err
    assert str(trace) in error and said in error and "Traceback" not in error


@pytest.mark.parametrize(
    "arguments",
    [["--capacity", "lots"], ["--policy", "random"], ["--page-size", "0"], ["--requests", "-3"]],
)
def test_bad_options_exit_2(tmp_path, capsys, arguments):
    trace = write_trace(tmp_path, GOOD)
    with pytest.raises(SystemExit) as exit:
        main(["replay", str(trace), *arguments])
    assert exit.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_missing_file_exits_2(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "absent.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_without_matplotlib_the_plot_is_refused_clearly(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert main(["replay", str(write_trace(tmp_path, GOOD)), "--plot", str(tmp_path / "p.png")]) == 2
    assert "pip install 'radix-core[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_the_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "hit-rate.png"
    trace = write_trace(tmp_path, GOOD)
    assert (
        main(["replay", str(trace), "--capacity", "unbounded,1k,2k", "--policy", "lru,lfu", "--plot", str(plot)]) == 0
    )
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_module_runs_as_a_program(tmp_path):
    trace = write_trace(tmp_path, ["{nope"])
    done = subprocess.run([sys.executable, "-m", "radix_core", "replay", str(trace)], capture_output=True, text=True)
    assert done.returncode == 2 and ":1: not a JSON object" in done.stderr and "Traceback" not in done.stderr
