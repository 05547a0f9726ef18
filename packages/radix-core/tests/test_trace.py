"""Mooncake-format traces: reading, checking every line, expanding block ids into tokens."""

from __future__ import annotations

import json

import pytest

from radix_core.trace import BLOCK_TOKENS, TokenExpander, TraceError, TraceRequest, read_trace


def write_trace(tmp_path, lines) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines))
    return str(path)


def request(input_length, hash_ids, output_length=3, timestamp=0):
    return {"timestamp": timestamp, "input_length": input_length, "output_length": output_length, "hash_ids": hash_ids}


def test_requests_are_read_in_order_with_a_limit(tmp_path):
    path = write_trace(tmp_path, [request(600, [1, 2]), "\n", request(10, [1], timestamp=5.5), request(1, [7])])
    assert read_trace(path) == [
        TraceRequest(0.0, 600, 3, (1, 2)),
        TraceRequest(5.5, 10, 3, (1,)),
        TraceRequest(0.0, 1, 3, (7,)),
    ]
    assert len(read_trace(path, limit=2)) == 2


def test_equal_block_ids_expand_to_equal_tokens_and_prompts_have_their_exact_length():
    expander = TokenExpander()
    first = expander.prompt(TraceRequest(0, 2 * BLOCK_TOKENS, 1, (4, 9)))
    second = TokenExpander().prompt(TraceRequest(0, BLOCK_TOKENS + 7, 1, (4, 3)))
    assert len(first) == 2 * BLOCK_TOKENS and len(second) == BLOCK_TOKENS + 7
    assert first[:BLOCK_TOKENS] == second[:BLOCK_TOKENS], "block 4 is the same in every expander"
    assert first[BLOCK_TOKENS:] != expander.block(3)[:BLOCK_TOKENS], "different blocks differ"
    assert all(0 <= token < 65536 for token in first)


def test_outputs_are_unique_per_request():
    expander = TokenExpander()
    shape = TraceRequest(0, 1, 40, (0,))
    assert expander.output(0, shape) != expander.output(1, shape)
    assert expander.output(5, shape) == TokenExpander().output(5, shape) and len(expander.output(5, shape)) == 40


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("{not json\n", "not a JSON object"),
        ("[1, 2]\n", "must be a JSON object"),
        ({"timestamp": 0, "input_length": 5, "hash_ids": [1]}, "missing field(s) output_length"),
        (request(-1, []), "input_length must be a non-negative integer"),
        (request(5, [1], output_length=-3), "output_length must be a non-negative integer"),
        (request(True, [1]), "input_length must be a non-negative integer"),
        (request(5.5, [1]), "input_length must be a non-negative integer"),
        ({**request(5, [1]), "timestamp": "noon"}, "timestamp must be a number"),
        (request(5, [1, "x"]), "hash_ids must be a list of non-negative integers"),
        (request(5, [-1]), "hash_ids must be a list of non-negative integers"),
        (request(5, "1"), "hash_ids must be a list"),
        (request(BLOCK_TOKENS + 1, [1]), "needs 2 block(s) of 512 tokens, hash_ids has 1"),
        (request(10, [1, 2]), "needs 1 block(s) of 512 tokens, hash_ids has 2"),
    ],
)
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, complaint):
    path = write_trace(tmp_path, [request(1, [0]), line])
    with pytest.raises(TraceError) as error:
        read_trace(path)
    assert f"{path}:2: " in str(error.value) and complaint in str(error.value)


def test_empty_missing_and_binary_files_are_errors(tmp_path):
    empty = write_trace(tmp_path, ["\n"])
    with pytest.raises(TraceError, match="no requests"):
        read_trace(empty)
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "absent.jsonl")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not a UTF-8"):
        read_trace(binary)
