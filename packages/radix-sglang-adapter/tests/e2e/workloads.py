"""Request streams for the end-to-end tests and benchmark: the same stream goes to every server.

A step's prompt is either fresh tokens or an earlier step's prompt and output followed by new
tokens (a chat's next turn, or a branch when two steps extend the same one), so the prefixes a
cache can reuse are known by construction. Token ids are deterministic and below the vocabulary.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from radix_testing.prompts import tokens, trace_prompts

TRACE = Path(__file__).resolve().parents[4] / "benchmarks" / "data" / "mooncake_synthetic_trace.jsonl"


@dataclasses.dataclass(frozen=True)
class Step:
    """A request: ``extends`` (an earlier step's index, or None) then ``new_tokens``."""

    new_tokens: tuple[int, ...]
    extends: int | None = None


def prompt_of(steps: list[Step], outputs: list[tuple[int, ...]]) -> list[int]:
    """The prompt of the step after ``outputs`` (the outputs of the steps before it)."""
    step = steps[len(outputs)]
    if step.extends is None:
        return list(step.new_tokens)
    return [*prompt_of(steps[: step.extends + 1], outputs[: step.extends]), *outputs[step.extends], *step.new_tokens]


def chat_stream(vocab: int) -> list[Step]:
    """Two system prompts shared by three chats of four turns each (every turn extends the last
    one with its answer), turns interleaved across chats, and two branches off a chat's second turn."""
    systems = [tuple(tokens(f"system-{s}", 96, vocab)) for s in range(2)]
    steps: list[Step] = []
    last_turn: dict[int, int] = {}
    for turn in range(4):
        for chat in range(3):
            user = tuple(tokens(f"chat-{chat}-turn-{turn}", 24 + 8 * chat, vocab))
            if turn == 0:
                steps.append(Step(systems[chat % 2] + user))
            else:
                steps.append(Step(user, extends=last_turn[chat]))
            last_turn[chat] = len(steps) - 1
            if turn == 1 and chat == 0:
                branch_point = len(steps) - 1
    for branch in range(2):
        steps.append(Step(tuple(tokens(f"branch-{branch}", 20, vocab)), extends=branch_point))
    return steps


def revisited_documents(vocab: int, documents: int = 5, tokens_each: int = 224) -> list[Step]:
    """Questions on documents that together overflow a 1,024-token pool: two on each in turn (a
    second hit, which write_through_selective backs up on), then one more on each from the first:
    a host tier loads those back where a device-only cache has evicted them."""
    texts = [tuple(tokens(f"document-{d}", tokens_each, vocab)) for d in range(documents)]
    asked = [(d, q) for d in range(documents) for q in range(2)] + [(d, 2) for d in range(documents)]
    return [Step(texts[d] + tuple(tokens(f"document-{d}-question-{q}", 16, vocab))) for d, q in asked]


def sequential_stream(vocab: int, trace_requests: int = 16) -> list[Step]:
    """The chats and branches, prompts derived from the trace, then revisited documents."""
    trace = [Step(tuple(prompt)) for prompt in trace_prompts(TRACE, trace_requests, vocab)]
    return chat_stream(vocab) + trace + revisited_documents(vocab)


def load_prompts(vocab: int, count: int = 64) -> list[list[int]]:
    """Independent prompts for concurrent clients: trace-derived, and shared system prompts."""
    systems = [tokens(f"load-system-{s}", 64, vocab) for s in range(3)]
    chats = [systems[i % 3] + tokens(f"load-user-{i}", 16 + i % 24, vocab) for i in range(count // 2)]
    return chats + trace_prompts(TRACE, count - len(chats), vocab, max_blocks=24)
