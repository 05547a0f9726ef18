"""Test-only stand-in for SGLang's CPU kernel package ``sgl_kernel`` (not on PyPI).

Each op is written in plain torch from the reference kernel SGLang ships for it (the Triton
kernel of the same name without ``_cpu``), and computes what that kernel computes. Any other
name is an import error: a server that reaches an op this stand-in lacks fails loudly instead of
serving a silently wrong answer. This file is not a package, so ``sgl_kernel.<sub>`` does not
import either.

Besides the module-level functions, importing this module registers the two attention ops the
``intel_amx`` attention backend calls, ``torch.ops.sgl_kernel.extend_attention_cpu`` and
``torch.ops.sgl_kernel.decode_attention_cpu``, for plain (unquantized, uncapped) models, full or
sliding-window attention; anything else raises.
"""

from __future__ import annotations

import ctypes

import torch
from torch.nn.functional import scaled_dot_product_attention

# --- request-to-token table and KV cache moves ------------------------------------------------


def _request_spans(req_pool_indices: torch.Tensor, start_offset: torch.Tensor, end_offset: torch.Tensor):
    """Per request: its ``req_to_token`` row, the columns ``[start, end)`` there, and the slice of
    the flat location list that holds them (requests laid out one after another)."""
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        yield row, slice(start, end), slice(taken, taken + end - start)
        taken += end - start


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Row ``req_pool_indices[i]`` of ``req_to_token``, columns ``[start_i, end_i)``, takes the
    next ``end_i - start_i`` locations of ``out_cache_loc`` (requests laid out one after another)."""
    del pool_len  # the row width, which req_to_token's shape already gives
    for row, columns, flat in _request_spans(req_pool_indices, start_offset, end_offset):
        req_to_token[row, columns] = out_cache_loc[flat]


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The reverse of ``assign_req_to_token_pool_cpu``: ``out_cache_loc`` takes, request after
    request, the locations in row ``req_pool_indices[i]`` of ``req_to_token``, columns
    ``[start_i, end_i)``."""
    del pool_len
    for row, columns, flat in _request_spans(req_pool_indices, start_offset, end_offset):
        out_cache_loc[flat] = req_to_token[row, columns]


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """Request i's ``topk * num_cols`` draft slots: the locations in its ``req_to_token`` row from
    column ``seq_lens[i]`` on, written to ``out_cache_loc[i * topk * num_cols:]``."""
    del pool_len
    width = topk * num_cols
    for i, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out_cache_loc[i * width : (i + 1) * width] = req_to_token[row, seq_len : seq_len + width]


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """In every KV buffer (given by its base address and row size in bytes), row ``tgt_loc[i]``
    takes a copy of row ``src_loc[i]``; all sources are read before any target is written."""
    if tgt_loc.numel() == 0:
        return
    num_rows = int(torch.maximum(tgt_loc.max(), src_loc.max())) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (num_rows * row_bytes)).from_address(address)
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(num_rows, row_bytes)
        rows[tgt_loc.long()] = rows[src_loc.long()]


# --- EAGLE draft tree and its verification ----------------------------------------------------


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """A ``req_to_token`` table for the draft decode steps, one row per (request b, branch k), row
    ``b * topk + k``: request b's first ``seq_lens[b]`` locations, then branch k's ``num_steps``
    draft slots, which follow the prefix at columns ``seq_len + k * num_steps`` (the contiguous
    layout; SGLang rejects topk > 1 with page size > 1 on this backend)."""
    out = torch.zeros((seq_lens.numel() * topk, pool_len), dtype=req_to_token.dtype, device=req_to_token.device)
    for b, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        for k in range(topk):
            chain = seq_len + k * num_steps
            out[b * topk + k, :seq_len] = req_to_token[row, :seq_len]
            out[b * topk + k, seq_len : seq_len + num_steps] = req_to_token[row, chain : chain + num_steps]
    return out


_FULL_MASK, _QLEN_ONLY = 0, 1  # TreeMaskMode values this stand-in writes (not QLEN_ONLY_BITPACKING)


def _tree_parents(selected: list[int], parents: list[int], topk: int) -> list[int | None]:
    """Each tree token's parent's tree index (0 = the root; None for the root itself, and for a
    token whose parent was not selected, which the reference kernels skip with a warning)."""
    found = [None]
    for slot in selected:
        parent_slot = slot // topk
        if parent_slot == 0:
            found.append(0)
        elif parents[parent_slot] in selected:
            found.append(selected.index(parents[parent_slot]) + 1)
        else:
            found.append(None)
    return found


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """The verify tree of each request's ``draft_token_num`` tokens (token 0 the root, token i
    the draft ``selected_index[b, i - 1]``, whose parent is ``parent_list[b, selected // topk]``):
    each token's position (``seq_len`` + its depth), its mask row over the tree (itself, its
    ancestors and the root), and the retrieve links (flat index, first child, next sibling;
    children ordered by index). The retrieve tensors come in filled with -1."""
    del depth  # bounds the ancestor walk in the reference kernels; the walk below ends at the root
    if int(tree_mask_mode) not in (_FULL_MASK, _QLEN_ONLY):
        raise NotImplementedError(f"the sgl_kernel stand-in does not build tree mask mode {tree_mask_mode}")
    n = draft_token_num
    prefix_before = 0  # sum of the earlier requests' seq_len, for FULL_MASK's row layout
    for b, seq_len in enumerate(verified_seq_len.tolist()):
        parent = _tree_parents(selected_index[b].tolist(), parent_list[b].tolist(), topk)
        next_token, next_sibling = [-1] * n, [-1] * n
        for i in range(n - 1, 0, -1):  # last to first, so each parent's first child ends up the lowest index
            if parent[i] is not None:
                next_sibling[i] = next_token[parent[i]]
                next_token[parent[i]] = i
        retrive_index[b] = torch.arange(b * n, (b + 1) * n)
        retrive_next_token[b] = torch.tensor(next_token)
        retrive_next_sibling[b] = torch.tensor(next_sibling)

        for i in range(n):
            row = [False] * n
            row[0] = True
            node, token_depth = i, 0
            while node not in (0, None):
                row[node] = True
                token_depth += 1
                node = parent[node]
            positions[b * n + i] = seq_len + token_depth
            if int(tree_mask_mode) == _FULL_MASK:
                start = n * n * b + prefix_before * n + (seq_len + n) * i + seq_len
            else:
                start = n * n * b + n * i
            tree_mask[start : start + n] = torch.tensor(row, dtype=tree_mask.dtype)
        prefix_before += seq_len


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree verification: from each request's root, repeatedly step to the first child
    whose draft token equals the target's prediction at the last accepted token, for at most
    ``accept_index.shape[1] - 1`` steps. Writes the accepted tokens' flat indices (root first) to
    ``accept_index``, their number excluding the root to ``accept_token_num``, and the target's
    prediction at each accepted token to ``predicts`` (flat, indexed like ``target_predict``)."""
    num_steps = accept_index.shape[1]
    flat_target = target_predict.reshape(-1).tolist()
    for b in range(candidates.shape[0]):
        index, next_token, sibling = (t[b].tolist() for t in (retrive_index, retrive_next_token, retrive_next_sibling))
        tokens = candidates[b].tolist()
        accepted = [index[0]]
        node = 0
        for _ in range(1, num_steps):
            child = next_token[node]
            while child != -1 and tokens[child] != flat_target[accepted[-1]]:
                child = sibling[child]
            if child == -1:
                break
            accepted.append(index[child])
            node = child
        accept_index[b, : len(accepted)] = torch.tensor(accepted, dtype=accept_index.dtype)
        accept_token_num[b] = len(accepted) - 1
        for flat in accepted:
            predicts[flat] = flat_target[flat]


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """``bonus_tokens[i]``: request i's last accepted token, ``accept_tokens`` (``accept_stride``
    per request, flat) at ``accept_stride * i + accept_lens[i] - 1``."""
    bs = accept_lens.numel()
    last = torch.arange(bs, device=accept_lens.device) * accept_stride + accept_lens.long() - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[last])


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """The accepted tokens' cache locations, packed: ``accept_out_cache_loc[j]`` is
    ``out_cache_loc[a]`` for the j-th entry ``a`` of ``accept_index`` (flat) that is not -1."""
    flat = accept_index.reshape(-1)
    accepted = flat[flat != -1].long()
    accept_out_cache_loc[: accepted.numel()] = out_cache_loc[accepted]


def _imported_but_not_implemented(name: str):
    """An op SGLang imports at module level on the CPU but this stand-in does not compute."""

    def op(*args, **kwargs):
        raise NotImplementedError(f"the test-only sgl_kernel stand-in does not implement {name}")

    op.__name__ = name
    return op


rotate_input_ids_cpu = _imported_but_not_implemented("rotate_input_ids_cpu")  # multi-layer EAGLE only


# --- attention over the paged KV cache (torch.ops.sgl_kernel.*, used by intel_amx_backend) -----


def _refuse_unsupported(
    k_buffer, key_scale, value_scale, logit_cap, is_cross_attention, sliding_window_size, sinks, tree_mask=None
):
    """Raise for every attention feature these plain ops do not compute."""
    unsupported = {
        "a quantized KV cache": k_buffer.dtype not in (torch.float32, torch.float16, torch.bfloat16),
        "KV scales": key_scale != 1.0 or value_scale != 1.0,
        "logit capping": logit_cap > 0,
        "cross attention": is_cross_attention,
        "sliding-window attention with a tree mask": sliding_window_size > 0 and tree_mask is not None,
        "attention sinks": sinks is not None,
    }
    for feature, used in unsupported.items():
        if used:
            raise NotImplementedError(f"the sgl_kernel stand-in's attention does not support {feature}")


def _window_start(position: int, window: int) -> int:
    """The first key a query at ``position`` sees: ``window`` keys, itself included, when
    ``window > 0`` (intel_amx passes ``layer.sliding_window_size + 1``, the model's window); all
    earlier keys otherwise. SGLang's Triton extend kernel keeps key ``k`` for query ``q`` when
    ``q <= k + layer.sliding_window_size`` (kernels/ops/attention/extend_attention.py:564-569),
    torch_native when ``k >= q - layer.sliding_window_size`` (torch_native_backend.py:48)."""
    return max(position - window + 1, 0) if window > 0 else 0


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible, sm_scale: float) -> torch.Tensor:
    """Softmax attention of ``q`` [Lq, H, D] over ``keys``/``values`` [Lk, Hkv, D]; ``visible``
    [Lq, Lk] (bool) or None for all keys. Returns [Lq, H, Dv]."""
    out = scaled_dot_product_attention(
        q.transpose(0, 1),
        keys.to(q.dtype).transpose(0, 1),
        values.to(q.dtype).transpose(0, 1),
        attn_mask=visible,
        scale=sm_scale,
        enable_gqa=keys.shape[1] != q.shape[1],
    )
    return out.transpose(0, 1)


@torch.library.custom_op("sgl_kernel::extend_attention_cpu", mutates_args=("o",), device_types="cpu")
def extend_attention_cpu(
    q: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Extend (prefill / verify) attention: request i's ``extend_seq_lens[i]`` queries, from
    ``extend_start_loc[i]`` in ``q``, attend to its ``seq_lens[i]`` tokens: the cached prefix (read
    through its ``req_to_token`` row) then the new tokens (``k_extend``/``v_extend``, or the cache
    when those are None). Among the new tokens a query sees the earlier ones and itself when
    causal, those its ``tree_mask`` rows allow (qlen x qlen per request, requests one after
    another) when given, all otherwise. With ``sliding_window_size > 0`` (causal only) a query
    sees no key before its window (``_window_start``). Writes ``o``."""
    del max_extend_len, encoder_lens  # a launch bound, and cross attention's only input
    _refuse_unsupported(
        k_buffer, key_scale, value_scale, logit_cap, is_cross_attention, sliding_window_size, sinks, tree_mask
    )
    if sliding_window_size > 0 and not is_causal:
        raise NotImplementedError("the sgl_kernel stand-in's attention does not support a non-causal window")
    row_shape = k_buffer.shape[1:]
    mask_start = 0
    for row, seq_len, new, start in zip(
        req_pool_indices.tolist(), seq_lens.tolist(), extend_seq_lens.tolist(), extend_start_loc.tolist()
    ):
        prefix = seq_len - new
        # Only the keys some query sees are read: with a window, the prefix's slots before the
        # first query's window may have been freed (SGLang's SWA eviction).
        first = _window_start(prefix, sliding_window_size)
        locs = req_to_token[row, first:seq_len]
        keys, values = k_buffer[locs], v_buffer[locs]  # copies: the cache is not written
        if k_extend is not None:
            keys[prefix - first :] = k_extend[start : start + new].reshape(new, *row_shape)
            values[prefix - first :] = v_extend[start : start + new].reshape(new, *v_buffer.shape[1:])
        visible = None
        if tree_mask is not None or is_causal:
            visible = torch.ones((new, seq_len - first), dtype=torch.bool, device=q.device)
            if tree_mask is not None:
                visible[:, prefix - first :] = tree_mask[mask_start : mask_start + new * new].view(new, new).bool()
                mask_start += new * new
            else:
                visible[:, prefix - first :] = torch.ones((new, new), dtype=torch.bool, device=q.device).tril()
            if sliding_window_size > 0:  # query i (position prefix + i) sees keys from its window's start
                key_positions = torch.arange(first, seq_len, device=q.device)
                query_starts = torch.tensor(
                    [_window_start(prefix + i, sliding_window_size) for i in range(new)], device=q.device
                )
                visible &= key_positions[None, :] >= query_starts[:, None]
        o[start : start + new] = _attend(q[start : start + new], keys, values, visible, sm_scale)


@torch.library.custom_op(
    "sgl_kernel::decode_attention_cpu", mutates_args=("k_buffer", "v_buffer", "o"), device_types="cpu"
)
def decode_attention_cpu(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    o: torch.Tensor,
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    cache_loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """Decode attention: first the new tokens' ``k``/``v`` (when given) go into the cache at
    ``cache_loc``; then query i (one per row of ``q``) attends to all ``seq_lens[i]`` tokens of
    row ``req_pool_indices[i]`` of ``req_to_token`` (with ``sliding_window_size > 0``, only the last
    that many, see ``_window_start``). Writes ``o``; ``attn_logits`` is the kernel's scratch space
    and is left alone."""
    del attn_logits, encoder_lens
    _refuse_unsupported(k_buffer, key_scale, value_scale, logit_cap, is_cross_attention, sliding_window_size, sinks)
    if k is not None:
        k_buffer[cache_loc] = k.reshape(-1, *k_buffer.shape[1:]).to(k_buffer.dtype)
        v_buffer[cache_loc] = v.reshape(-1, *v_buffer.shape[1:]).to(v_buffer.dtype)
    for i, (row, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        locs = req_to_token[row, _window_start(seq_len - 1, sliding_window_size) : seq_len]
        o[i : i + 1] = _attend(q[i : i + 1], k_buffer[locs], v_buffer[locs], None, sm_scale)


def __getattr__(name: str):
    raise AttributeError(f"the test-only sgl_kernel stand-in does not implement {name!r}")
