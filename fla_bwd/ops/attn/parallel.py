# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn`: causal softmax attention with GQA, forget gates, windows, sinks, packed sequences and the
variants (non-causal, softcap, lse, queries shorter than keys).

A call goes `parallel_attn` -> `autograd` (a torch.library custom op under torch.compile, a plain
autograd.Function in eager code) -> `host` (the plan of the call's route, `dispatch.route`) -> the kernels
(`kernels.py`, their loop bodies in `inner.py`); imports run that one way (ARCHITECTURE.md draws the layers).
The kernels' names are re-exported here, where FLA keeps its kernels beside `parallel_attn`.
"""

from typing import Optional

import torch

from fla_bwd.ops.attn.autograd import (
    EagerParallelAttn,
    NoKeyVisible,
    apply_frame,
    apply_packed_frame,
    frame_packed,
    frame_tail,
    parallel_attn_fwd_op,
)
from fla_bwd.ops.attn.kernels import (  # noqa: F401  (re-exported: FLA's file holds its kernels)
    parallel_attn_bwd_kernel_dkv_ds_per_kv_head,
    parallel_attn_bwd_kernel_dkv_per_kv_head,
    parallel_attn_bwd_kernel_dkv_per_query_head,
    parallel_attn_bwd_kernel_dq,
    parallel_attn_fwd_kernel,
)
from fla_bwd.ops.utils.checks import check_attn_inputs, resolve_scale, resolve_softcap, resolve_window

# ----------------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------------

def parallel_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    window_size: Optional[int] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    chunk_indices: Optional[torch.Tensor] = None,
    *,
    sink_bias: Optional[torch.Tensor] = None,
    causal: bool = True,
    softcap: Optional[float] = None,
    return_lse: bool = False,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    **kwargs,
):
    """Causal softmax attention with GQA, forget gates, a sliding window, attention sinks and packed sequences.

    Args:
        q: `[B, T, HQ, K]` queries, float16, bfloat16 or float32. Or `[B, Tq, HQ, K]` with Tq <= T, k's length: the
            queries of the last Tq positions (bottom-right, flash-attn's rule for seqlen_q < seqlen_k; windows count
            from each query's position; packed: see cu_seqlens_k); o and lse then have Tq rows.
        k: `[B, T, H, K]` keys, q's dtype. HQ must be a multiple of H; query head h reads KV head h // (HQ // H).
        v: `[B, T, H, V]` values, q's dtype. K and V are any sizes from 1 to 256 and may differ.
        g: optional `[B, T, HQ]` log forget gate (Forgetting Transformer), fp16, bf16, fp32 or fp64. With gc its
            cumulative sum over each sequence (fp32), score(i, j) += gc_i - gc_j.
        scale: score scale; defaults to K ** -0.5. Must be finite in fp32.
        window_size: optional W >= 1; query i sees keys [i - W + 1, i] (flash-attn's `(W - 1, 0)`). None (or
            W >= T) is full causal. 0 is FLA's "no key visible", allowed with `sink_bias` only: o is 0 and every
            gradient 0 (the sink takes all the mass). Or flash-attn's pair (left, right): query i sees keys
            i - left .. i + right, -1 for no bound on that side (with causal=True, right is 0 or -1).
        cu_seqlens: optional `[N + 1]` int32/int64 offsets of N packed sequences (FlashAttention convention:
            starts at 0, non-decreasing, ends at T); requires B == 1. Attention never crosses a sequence boundary
            and the gate's cumsum restarts at each sequence start.
        chunk_indices: FLA's precomputed `[NT, 2]` tile list of `cu_seqlens` (`prepare_chunk_indices`); accepted
            and checked for FLA's calls, not read (this package tiles from `cu_seqlens` itself).
        sink_bias: optional `[HQ]` attention-sink logits (GPT-OSS): one extra logit per query head in the softmax
            denominator only; fp16, bf16, fp32 or fp64. Its gradient is computed in fp32, returned in sink_bias's dtype.
        causal: False: every query sees every key of its sequence (within window_size, a pair then), keyword only;
            a gate needs causal=True.
        softcap: optional logit soft-capping (Gemma 2), keyword only: scores become
            softcap * tanh(scale * q.k / softcap) before the gate's bias and the sink. None or 0.0: off.
        return_lse: also return lse (keyword only).
        cu_seqlens_k: packed queries shorter than keys (keyword only): k's `[N + 1]` offsets, with cu_seqlens then
            q's; sequence n's queries are the last ones of its keys (bottom-right), at most as many; g over k's
            tokens. Under torch.compile this call has a graph break where the offsets are read.

    Returns:
        o: `[B, T, HQ, V]` in q's dtype; with `return_lse`, the pair (o, lse), lse `[B, T, HQ]` fp32: the natural log
        of each row's softmax denominator, over its visible keys (scores scale * q.k, plus gc_i - gc_j with a gate)
        and the sink. lse is differentiable too: a loss that uses it gets its gradient in q, k, g and sink_bias
        (v's does not depend on it). Differentiable with respect to q, k, v, g and sink_bias; gradients come
        back in each input's dtype. The backward is deterministic (bitwise identical run to run). A NaN or Inf
        in an input reaches only the outputs and gradients that depend on it; everything else is bitwise what it
        would be without it (`tests/ops/test_attn_nan.py`).

    Raises:
        TypeError / ValueError naming the argument for any invalid input (shapes, dtypes, devices, cu_seqlens,
        window_size, scale, an unknown keyword; FLA's removed `head_first` raises `HeadFirstRemoved`, a
        TypeError), before any kernel runs.

    The package is Triton-only: `FLA_DISABLE_BACKEND_DISPATCH=1` is accepted and changes nothing. Which kernels run
    the backward is decided once per kind of call by `dispatch.route`; `select_backward(q, k, v, ...).explain()`
    prints that route and why. `dkv_path(...)`/FLA_BWD_DKV_PATH force the dK/dV kernel, `dq_path(...)`/
    FLA_BWD_DQ_PATH seven products ("recompute") or five ("from-ds", scratch bounded by FLA_BWD_DS_BUDGET_MIB).
    """
    check_attn_inputs(q, k, v, g, scale, window_size, cu_seqlens, sink_bias, chunk_indices, kwargs, return_lse,
                      softcap, causal, cu_seqlens_k)
    if window_size == 0:  # FLA's meaning: no key visible, the sink (required) takes all the mass
        return NoKeyVisible.apply(q, k, v, g, sink_bias, return_lse)
    if q.is_cuda and torch.is_autocast_enabled("cuda") and q.dtype == torch.float32:
        # Under autocast, attention runs in the autocast dtype; the casts are differentiable, so the gradients
        # come back in the inputs' (fp32) dtypes.
        dtype = torch.get_autocast_dtype("cuda")
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.contiguous() if g is not None else None
    sink_bias = sink_bias.contiguous() if sink_bias is not None else None  # the kernels cast it to fp32 on load
    # The kernels read cu_seqlens with unit stride.
    cu_seqlens = cu_seqlens.contiguous() if cu_seqlens is not None else None
    W, WR = resolve_window(window_size, causal)
    D = max(q.shape[3], v.shape[3])
    pad, rows, cu_seqlens_q = 0, None, None
    if cu_seqlens_k is not None:  # packed queries shorter than keys: laid on the tiles (`frame_packed`)
        frame = frame_packed(cu_seqlens, cu_seqlens_k.contiguous(), q.shape[1], k.shape[1], W, D, q.dtype)
        if frame is not None:
            q, k, v, g = apply_packed_frame(frame, q, k, v, g)
            rows, cu_seqlens_q, cu_seqlens = frame.q_rows, frame.cu_q, frame.cu_k
    elif q.shape[1] != k.shape[1]:  # queries shorter than keys: laid on the tiles (`frame_tail`)
        frame = frame_tail(q.shape[1], k.shape[1], W, D, q.dtype)
        q, k, v, g = apply_frame(frame, q, k, v, g)
        pad = frame.pad
    args = (q, k, v, g, sink_bias, cu_seqlens, resolve_scale(scale, q.shape[-1]), W, return_lse,
            resolve_softcap(softcap), WR, cu_seqlens_q)
    if torch.compiler.is_compiling():
        o, _, _, lse = parallel_attn_fwd_op(*args)
    elif return_lse:
        o, lse = EagerParallelAttn.apply(*args)
    else:
        o, lse = EagerParallelAttn.apply(*args), None
    if pad:  # the query rows `frame_tail` added
        o = o[:, pad:].contiguous()
        lse = lse[:, pad:].contiguous() if return_lse else None
    if rows is not None:  # q's rows in the packed frame
        o = o.index_select(1, rows)
        lse = lse.index_select(1, rows) if return_lse else None
    return (o, lse) if return_lse else o
