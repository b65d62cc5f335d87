# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Causal softmax attention in Triton: forward, dQ, and two dK/dV kernels (query-head-owned and KV-head-owned).

Layers, top to bottom: kernels; host launchers; the dK/dV dispatch; autograd (two torch.library custom ops, which
torch.compile sees, and a plain autograd.Function over the same implementations for eager calls); `parallel_attn`.

Layouts. Inputs are token-major, `[B, T, heads, dim]`. Per-(head, token) fp32 side tensors (log-sum-exp, delta,
the gate's cumulative sum G and its gradient dG) are head-major, `[HQ, B * T]`, so a tile of tokens of one head is
one contiguous load. A packed batch (`cu_seqlens`) has B == 1; every kernel maps its tile to (sequence start
`bos`, sequence length `T`) once, in `sequence_bounds` (through the `query_tile`/`key_tile` prologues), and then
addresses through int64 base pointers.
"""

import contextlib
import functools
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from fla_bwd.ops.attn.inner import (
    FIXUP,
    FLAG,
    INLINE,
    LOG2E,
    any_nonfinite,
    dkv_one_head,
    dq_tile,
    fwd_tile,
    key_tile,
    query_tile,
)
from fla_bwd.ops.utils.checks import check_attn_inputs, check_cu_seqlens_values, resolve_scale
from fla_bwd.ops.utils.cumsum import gate_cumsum, gate_grad
from fla_bwd.ops.utils.group_sum import group_sum
from fla_bwd.ops.utils.index import chunk_indices, seqlen_offsets
from fla_bwd.ops.utils.launch import Launcher
from fla_bwd.utils import cdiv, empty, is_interpreter, next_power_of_2

_HEURISTICS = {
    "USE_G": lambda args: args["g_cumsum"] is not None,
    "USE_SINK": lambda args: args["sink_bias"] is not None,
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
}


# ----------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------

@triton.heuristics(_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "NTOK", "B"])
def parallel_attn_fwd_kernel(
    q, k, v, o, lse, nonfinite, g_cumsum, sink_bias, cu_seqlens, chunk_indices, scale, T, W, NTOK, B,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    CONTAIN: tl.constexpr,
):
    """o and the base-2 log-sum-exp (sink included) for one query tile of one query head. CONTAIN says how a NaN/Inf
    input is kept to the outputs that depend on it (see `_launch_contained`)."""
    tl.static_assert(BT % BS == 0, "key blocks must tile the query tile")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_hq, i_h, bos, T, t0, o_t, m_t = query_tile(B, T, cu_seqlens, chunk_indices, HQ, G, BT, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    q_base = q + (bos * HQ + i_hq) * K
    k_base = k + (bos * H + i_h) * K
    v_base = v + (bos * H + i_h) * V
    g_base = g_cumsum
    if USE_G:
        g_base = g_cumsum + i_hq.to(tl.int64) * NTOK + bos
    # [BT, BK]
    b_q = tl.load(q_base + o_t[:, None].to(tl.int64) * (HQ * K) + o_k[None, :],
                  mask=m_t[:, None] & (o_k[None, :] < K), other=0)
    b_gq = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        b_gq = tl.load(g_base + o_t, mask=m_t, other=0)
    qk_scale = scale * LOG2E
    b_o, b_m, b_l = fwd_tile(b_q, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, H * K, H * V,
                             K, V, BT, BS, BK, BV, USE_G, DOT_PREC, CONTAIN == FIXUP)
    if CONTAIN == INLINE:
        if any_nonfinite(b_o):
            b_o, b_m, b_l = fwd_tile(b_q, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, H * K, H * V,
                                     K, V, BT, BS, BK, BV, USE_G, DOT_PREC, True)
    if CONTAIN == FLAG:
        tl.store(nonfinite + tl.program_id(0), any_nonfinite(b_o).to(tl.int8))
    if USE_SINK:
        # The sink is one more logit in the denominator: fold exp(sink) into l at a common maximum.
        b_sink = tl.load(sink_bias + i_hq).to(tl.float32) * LOG2E
        b_m_new = tl.maximum(b_m, b_sink)
        b_alpha = tl.exp2(b_m - b_m_new)
        b_l = b_l * b_alpha + tl.exp2(b_sink - b_m_new)
        b_o = b_o * b_alpha[:, None]
        b_m = b_m_new
    b_o = b_o / b_l[:, None]
    tl.store(o + (bos * HQ + i_hq) * V + o_t[:, None].to(tl.int64) * (HQ * V) + o_v[None, :],
             b_o.to(o.dtype.element_ty), mask=m_t[:, None] & (o_v[None, :] < V))
    tl.store(lse + i_hq.to(tl.int64) * NTOK + bos + o_t, b_m + tl.log2(b_l), mask=m_t)


@triton.heuristics({n: _HEURISTICS[n] for n in ("USE_G", "IS_VARLEN")})
@triton.jit(do_not_specialize=["T", "W", "NTOK", "B"])
def parallel_attn_bwd_kernel_dq(
    q, k, v, o, do, dq, dG, lse, delta, nonfinite, g_cumsum, cu_seqlens, chunk_indices, scale, T, W, NTOK, B,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, IS_VARLEN: tl.constexpr, DELTA_FROM_O: tl.constexpr, REFINE_DELTA: tl.constexpr,
    COMPUTE_DQ: tl.constexpr, DOT_PREC: tl.constexpr, CONTAIN: tl.constexpr,
):
    """dQ for one query tile of one query head, over the same key ranges as the forward. With DELTA_FROM_O it
    computes delta = rowsum(o * dO) of its rows and stores it for the dK/dV kernel (no separate preprocess
    launch: one kernel launch costs 26-43 us of host time on the H200 machine, PERF.md #13); otherwise it reads
    delta. With REFINE_DELTA it also replaces delta by rowsum(P * dP) for the kernels that run next (see the end
    of this kernel), and with gates it stores the query side of dG (see `dkv_one_head`); without COMPUTE_DQ it
    does only that (the first of two passes, see `attn_bwd_dq`). CONTAIN as in the forward kernel."""
    tl.static_assert(BT % BS == 0, "key blocks must tile the query tile")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_hq, i_h, bos, T, t0, o_t, m_t = query_tile(B, T, cu_seqlens, chunk_indices, HQ, G, BT, IS_VARLEN)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    k_base = k + (bos * H + i_h) * K
    v_base = v + (bos * H + i_h) * V
    row_base = i_hq.to(tl.int64) * NTOK + bos
    g_base = g_cumsum
    if USE_G:
        g_base = g_cumsum + row_base
    p_q = (bos * HQ + i_hq) * K + o_t[:, None].to(tl.int64) * (HQ * K) + o_k[None, :]
    m_q = m_t[:, None] & (o_k[None, :] < K)
    # [BT, BK]
    b_q = tl.load(q + p_q, mask=m_q, other=0)
    p_o = (bos * HQ + i_hq) * V + o_t[:, None].to(tl.int64) * (HQ * V) + o_v[None, :]
    m_o = m_t[:, None] & (o_v[None, :] < V)
    # [BT, BV]
    b_do = tl.load(do + p_o, mask=m_o, other=0)
    b_lse = tl.load(lse + row_base + o_t, mask=m_t, other=float("inf"))
    if DELTA_FROM_O:
        b_delta = tl.sum(tl.load(o + p_o, mask=m_o, other=0).to(tl.float32) * b_do.to(tl.float32), 1)
        if not REFINE_DELTA:
            tl.store(delta + row_base + o_t, b_delta, mask=m_t)
    elif COMPUTE_DQ:
        b_delta = tl.load(delta + row_base + o_t, mask=m_t, other=0)
    else:
        # The first pass of the "exact" delta (sinks, see `attn_bwd_dq`) computes delta; nothing has written it yet,
        # and that pass does not use it.
        b_delta = tl.zeros([BT], dtype=tl.float32)
    b_gq = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        b_gq = tl.load(g_base + o_t, mask=m_t, other=0)
    qk_scale = scale * LOG2E
    b_dq, b_pdp, b_off_pdp, b_off_p = dq_tile(
        b_q, b_do, b_lse, b_delta, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, H * K, H * V,
        K, V, BT, BS, BK, BV, REFINE_DELTA, DOT_PREC, USE_G, COMPUTE_DQ, CONTAIN == FIXUP)
    if CONTAIN != FIXUP:
        bad = any_nonfinite(b_dq) | any_nonfinite((b_pdp + b_off_pdp + b_off_p)[:, None])
        if CONTAIN == INLINE:
            if bad:
                b_dq, b_pdp, b_off_pdp, b_off_p = dq_tile(
                    b_q, b_do, b_lse, b_delta, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, H * K, H * V,
                    K, V, BT, BS, BK, BV, REFINE_DELTA, DOT_PREC, USE_G, COMPUTE_DQ, True)
        else:
            tl.store(nonfinite + tl.program_id(0), bad.to(tl.int8))
    if COMPUTE_DQ:
        tl.store(dq + p_q, (b_dq * scale).to(dq.dtype.element_ty), mask=m_q)
    if REFINE_DELTA:
        # delta = rowsum(o * dO) carries o's rounding to the input dtype (relative error ~1e-3 in bf16), and the
        # gate gradient is a reverse cumsum of differences of dS sums, which turns that error into a random walk
        # along the sequence (bf16 dg error ratio 2.9e-2 against the oracle at T = 100). rowsum(P * dP) is the
        # same quantity from fp32 terms; this program owns these rows, so it overwrites delta in place for the
        # dK/dV kernel, which runs next and computes the key side of dG (and dK, and dsink) from it. With this,
        # that ratio is 2e-6 and dk's improves too (3.7e-3 -> 2.6e-3).
        tl.store(delta + row_base + o_t, b_pdp, mask=m_t)
        if USE_G:
            # Query side of dG_j: sum over keys i < j of P_ji * (dP_ji - delta_j), from the fp32 sums.
            tl.store(dG + row_base + o_t, b_off_pdp - b_pdp * b_off_p, mask=m_t)


@triton.jit
def _load_kv_tile(k, v, bos, i_h, o_s, m_s, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr):
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    # [BT, BK], [BT, BV]
    b_k = tl.load(k + (bos * H + i_h) * K + o_s[:, None].to(tl.int64) * (H * K) + o_k[None, :],
                  mask=m_s[:, None] & (o_k[None, :] < K), other=0)
    b_v = tl.load(v + (bos * H + i_h) * V + o_s[:, None].to(tl.int64) * (H * V) + o_v[None, :],
                  mask=m_s[:, None] & (o_v[None, :] < V), other=0)
    return b_k, b_v


@triton.jit
def _store_dkv_tile(dk, dv, b_dk, b_dv, bos, i_head, o_s, m_s, NH: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Store a dK/dV tile into `[B, T, NH, K]` / `[B, T, NH, V]` buffers, casting once to the buffer's dtype."""
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    tl.store(dk + (bos * NH + i_head) * K + o_s[:, None].to(tl.int64) * (NH * K) + o_k[None, :],
             b_dk.to(dk.dtype.element_ty), mask=m_s[:, None] & (o_k[None, :] < K))
    tl.store(dv + (bos * NH + i_head) * V + o_s[:, None].to(tl.int64) * (NH * V) + o_v[None, :],
             b_dv.to(dv.dtype.element_ty), mask=m_s[:, None] & (o_v[None, :] < V))


@triton.jit
def _dkv_heads(
    q, do, lse, delta, g_cumsum, dGk, dsink_partial, sink_bias, b_k, b_v, i_hq0, i_slot, NUM_SLOTS, bos,
    s0, T, W, NTOK, qk_scale,
    HQ: tl.constexpr, NUM_HEADS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, USE_SINK: tl.constexpr,
    DOT_PREC: tl.constexpr, SAFE: tl.constexpr,
):
    """dK, dV (fp32, unscaled) of the key tile from query heads [i_hq0, i_hq0 + NUM_HEADS): per head, its bases,
    then `dkv_one_head`. i_slot indexes the tile's dsink partial among NUM_SLOTS."""
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    for i_g in range(NUM_HEADS):
        i_hq = i_hq0 + i_g
        row_base = i_hq.to(tl.int64) * NTOK + bos
        g_base, dgk_base, dsink_ptr, b_gk, b_sink = g_cumsum, dGk, dsink_partial, 0.0, 0.0
        if USE_G:
            g_base, dgk_base = g_cumsum + row_base, dGk + row_base
            o_s = s0 + tl.arange(0, BT)
            b_gk = tl.load(g_base + o_s, mask=o_s < T, other=0)
        if USE_SINK:
            dsink_ptr = dsink_partial + i_hq.to(tl.int64) * NUM_SLOTS + i_slot
            b_sink = tl.load(sink_bias + i_hq).to(tl.float32) * LOG2E
        b_dk, b_dv = dkv_one_head(
            b_k, b_v, b_dk, b_dv, b_gk, q + (bos * HQ + i_hq) * K, do + (bos * HQ + i_hq) * V, lse + row_base,
            delta + row_base, g_base, dgk_base, b_sink, dsink_ptr, s0, T, W, qk_scale, HQ * K, HQ * V,
            K, V, BT, BS, BK, BV, USE_G, USE_SINK, DOT_PREC, SAFE)
    return b_dk, b_dv


@triton.jit
def _dkv_tile(
    q, k, v, do, dk, dv, dGk, dsink_partial, lse, delta, nonfinite, g_cumsum, sink_bias, scale, i_h, i_hq0, i_head,
    i_slot, num_slots, bos, s0, o_s, m_s, T, W, NTOK,
    HQ: tl.constexpr, H: tl.constexpr, NH: tl.constexpr, NUM_HEADS: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, DOT_PREC: tl.constexpr, CONTAIN: tl.constexpr,
):
    """Both dK/dV kernels' body: K/V tile of KV head i_h, query heads [i_hq0, i_hq0 + NUM_HEADS), store into row
    i_head of `[B, T, NH, *]`, containing NaN/Inf as CONTAIN says (see `_launch_contained`; the dsink partials
    and the key side of dG are plain stores, so a recomputed tile overwrites them)."""
    b_k, b_v = _load_kv_tile(k, v, bos, i_h, o_s, m_s, H, K, V, BK, BV)
    b_dk, b_dv = _dkv_heads(
        q, do, lse, delta, g_cumsum, dGk, dsink_partial, sink_bias, b_k, b_v, i_hq0, i_slot, num_slots, bos, s0, T,
        W, NTOK, scale * LOG2E, HQ, NUM_HEADS, K, V, BT, BS, BK, BV, USE_G, USE_SINK, DOT_PREC, CONTAIN == FIXUP)
    if CONTAIN != FIXUP:
        bad = any_nonfinite(b_dk) | any_nonfinite(b_dv)
        if CONTAIN == INLINE:
            if bad:
                b_dk, b_dv = _dkv_heads(
                    q, do, lse, delta, g_cumsum, dGk, dsink_partial, sink_bias, b_k, b_v, i_hq0, i_slot, num_slots,
                    bos, s0, T, W, NTOK, scale * LOG2E, HQ, NUM_HEADS, K, V, BT, BS, BK, BV, USE_G, USE_SINK,
                    DOT_PREC, True)
        else:
            tl.store(nonfinite + tl.program_id(0), bad.to(tl.int8))
    _store_dkv_tile(dk, dv, b_dk * scale, b_dv, bos, i_head, o_s, m_s, NH, K, V, BK, BV)


@triton.heuristics(_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "NTOK", "B"])
def parallel_attn_bwd_kernel_dkv_per_query_head(
    q, k, v, do, dk, dv, dGk, dsink_partial, lse, delta, nonfinite, g_cumsum, sink_bias, cu_seqlens, chunk_indices,
    scale, T, W, NTOK, B,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    CONTAIN: tl.constexpr,
):
    """Legacy dK/dV: one program per (key tile, query head). Writes `[B, T, HQ, *]` buffers (fp32 when G > 1;
    the host then sums each group of G heads)."""
    tl.static_assert(BT % BS == 0, "query blocks must tile the key tile")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_hq, i_slot, num_slots, bos, T, s0, o_s, m_s = key_tile(B, T, cu_seqlens, chunk_indices, HQ, BT, IS_VARLEN)
    _dkv_tile(q, k, v, do, dk, dv, dGk, dsink_partial, lse, delta, nonfinite, g_cumsum, sink_bias, scale, i_hq // G,
              i_hq, i_hq, i_slot, num_slots, bos, s0, o_s, m_s, T, W, NTOK, HQ, H, HQ, 1, K, V, BT, BS, BK, BV, USE_G,
              USE_SINK, DOT_PREC, CONTAIN)


@triton.heuristics(_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "NTOK", "B"])
def parallel_attn_bwd_kernel_dkv_per_kv_head(
    q, k, v, do, dk, dv, dGk, dsink_partial, lse, delta, nonfinite, g_cumsum, sink_bias, cu_seqlens, chunk_indices,
    scale, T, W, NTOK, B,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    CONTAIN: tl.constexpr, SPLIT: tl.constexpr,
):
    """GQA dK/dV: one program per (key tile, KV head) owns the final gradient of its tile. It loads K/V once,
    loops over the G query heads of its group with fp32 accumulators, and stores `[B, T, H, *]` in the inputs'
    dtype: no HQ-shaped scratch, no reduction kernel, no atomics (so it is deterministic).

    With SPLIT > 1 the group's heads are dealt to SPLIT programs of G / SPLIT heads each, which store fp32 partials
    into `[B, T, H * SPLIT, *]` for the host to sum: SPLIT times the programs, for calls too short to keep the GPU
    busy with one program per KV head (the dispatch rule is `_gqa_split`)."""
    tl.static_assert(BT % BS == 0, "query blocks must tile the key tile")
    tl.static_assert(G % SPLIT == 0, "SPLIT must divide the group")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_part, i_slot, num_slots, bos, T, s0, o_s, m_s = key_tile(B, T, cu_seqlens, chunk_indices, H * SPLIT, BT,
                                                               IS_VARLEN)
    _dkv_tile(q, k, v, do, dk, dv, dGk, dsink_partial, lse, delta, nonfinite, g_cumsum, sink_bias, scale,
              i_part // SPLIT, i_part * (G // SPLIT), i_part, i_slot, num_slots, bos, s0, o_s, m_s, T, W, NTOK, HQ, H,
              H * SPLIT, G // SPLIT, K, V, BT, BS, BK, BV, USE_G, USE_SINK, DOT_PREC, CONTAIN)


# ----------------------------------------------------------------------------------------------------------------
# Host launchers
# ----------------------------------------------------------------------------------------------------------------

_launch_fwd = Launcher(parallel_attn_fwd_kernel)
_launch_dq = Launcher(parallel_attn_bwd_kernel_dq)
_launch_dkv_per_query_head = Launcher(parallel_attn_bwd_kernel_dkv_per_query_head)
_launch_dkv_per_kv_head = Launcher(parallel_attn_bwd_kernel_dkv_per_kv_head)


CONTAINMENTS = ("auto", "inline", "two-launch")
# Calls with less work than this (B * HQ * T * min(T, W) * max(K, V)) contain inline: the second launch's host time
# (~8-11 us on the H200 machine, the C launcher alone since `Launcher.run_each`) exceeds what inline costs the GPU.
# Inline costs ~74 us of kernel time at 2**32 (B4 T512 HQ32 D128 backward: dK/dV 160 -> 91 us, dQ 59 -> 54 us
# two-launch; PERF.md #31), so, scaled by the work, the two break even near 2**29.
_INLINE_CONTAINMENT_WORK = 2**29


def containment(B: int, HQ: int, T: int, W: int, D: int) -> str:
    """How the kernels of one call keep a NaN/Inf input to the outputs that depend on it: "inline" or "two-launch"
    (see `_launch_contained`); both contain exactly. The environment variable FLA_BWD_CONTAINMENT forces either
    (for A/B timing and the tests, which run every NaN/Inf case both ways)."""
    forced = os.environ.get("FLA_BWD_CONTAINMENT", "auto")
    if forced not in CONTAINMENTS:
        raise ValueError(f"FLA_BWD_CONTAINMENT must be one of {CONTAINMENTS}, got {forced!r}")
    if forced != "auto":
        return forced
    return "inline" if B * HQ * T * min(T, W) * D < _INLINE_CONTAINMENT_WORK else "two-launch"


def _launch_contained(launch: Launcher, programs: int, kwargs: dict) -> None:
    """Launch a kernel over `programs` programs with NaN/Inf containment (a non-finite input reaches only the
    outputs that depend on it), in one of two ways, both exact (see `any_nonfinite`):
    - "two-launch": a FLAG launch computes every tile plainly and stores per program whether its outputs are not
      finite; a FIXUP launch recomputes only the flagged tiles with containment and overwrites their outputs (the
      other programs read one byte and return);
    - "inline": one launch; a program whose outputs are not finite recomputes its tile with containment at once.
    Inline keeps the SAFE copy of the loops in the kernel, which makes the compiler schedule the plain loops worse:
    on the H200, g8-T16384-W256 backward 1526 us inline vs 1015 two-launch (976 without containment), forward 466
    vs 397 (PERF.md #17, #18); B4 T512 HQ32 D128 dK/dV kernel 160 vs 91 us (#31). Two-launch costs one more
    launch per kernel, the C launcher alone (`Launcher.run_each` binds and keys the arguments once), ~8-11 us of
    host time on the H200 machine; `containment` picks by the amount of work."""
    B, T, W = kwargs["B"], kwargs["T"], kwargs["W"]
    # `kwargs` is the caller's fresh dict: completed in place and passed on whole (no copy per launch).
    if containment(B, kwargs["HQ"], T, W, max(kwargs["K"], kwargs["V"])) == "inline":
        kwargs.update(nonfinite=None, CONTAIN=INLINE.value)
        launch.run((programs,), kwargs)
        return
    kwargs["nonfinite"] = torch.empty(programs, dtype=torch.int8, device=kwargs["q"].device)
    launch.run_each((programs,), kwargs, "CONTAIN", (FLAG.value, FIXUP.value))


# Tile sizes and launch shape per (input class, kernel); built once, read on every launch (`_config`).
_CONFIGS = {
    "fp32": {
        "fwd": dict(BT=64, BS=32, num_warps=4, num_stages=2),
        "dq": dict(BT=64, BS=32, num_warps=8, num_stages=2),
        "dkv": dict(BT=64, BS=32, num_warps=8, num_stages=2),
    },
    "fp32-large": {
        "fwd": dict(BT=64, BS=32, num_warps=4, num_stages=2),
        "dq": dict(BT=32, BS=32, num_warps=4, num_stages=2),
        "dkv": dict(BT=32, BS=32, num_warps=4, num_stages=2),
    },
    "16bit": {
        "fwd": dict(BT=128, BS=128, num_warps=8, num_stages=2),
        "dq": dict(BT=64, BS=64, num_warps=4, num_stages=2),
        "dkv": dict(BT=64, BS=64, num_warps=4, num_stages=2),
    },
    "16bit-large": {
        "fwd": dict(BT=64, BS=32, num_warps=8, num_stages=2),
        "dq": dict(BT=64, BS=32, num_warps=8, num_stages=2),
        "dkv": dict(BT=64, BS=32, num_warps=8, num_stages=2),
    },
}
_INTERPRETER_CONFIG = dict(BT=32, BS=16, num_warps=4, num_stages=1)


def _config(kernel: str, D: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Tile sizes and launch shape per kernel, head dim (the larger of K and V) and input dtype (read-only: callers
    spread it into launch arguments). Under the CPU interpreter small tiles make the tests' short sequences cross
    every range (window, unmasked, diagonal) of the loops. On the GPU: PERF.md has the measurements behind the
    16-bit tiles; fp32 (a correctness fallback using exact fp32 products) halves them to fit the 227 KB of shared
    memory a block may use (fwd 128x128 needs 256 KB in fp32 at D = 128). `tests/ops/test_kernel_resources.py`
    compiles every class for sm_90 and checks the fit."""
    if is_interpreter():
        return _INTERPRETER_CONFIG
    cls = ("fp32" if dtype == torch.float32 else "16bit") + ("-large" if D > 128 else "")
    return _CONFIGS[cls][kernel]


def _dims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """Head counts, head dims and their blocks, dot precision: launch arguments fixed by the inputs' shapes and
    dtype (read-only: callers spread it into launch arguments)."""
    return _dims_of(q.shape[2], k.shape[2], q.shape[3], v.shape[3], q.dtype)


@functools.lru_cache(maxsize=None)
def _dims_of(HQ: int, H: int, K: int, V: int, dtype: torch.dtype) -> dict:
    return dict(HQ=HQ, H=H, G=HQ // H, K=K, V=V, BK=max(16, next_power_of_2(K)), BV=max(16, next_power_of_2(V)),
                DOT_PREC="ieee" if dtype == torch.float32 else "tf32")


def _tiles(B: int, T: int, cu_seqlens: Optional[torch.Tensor], BT: int):
    """(number of tiles per head program, chunk_indices or None)."""
    if cu_seqlens is None:
        return cdiv(T, BT), None
    indices = chunk_indices(cu_seqlens, BT)
    return indices.shape[0], indices


def attn_fwd(q, k, v, g_cumsum, sink_bias, scale: float, W: int, cu_seqlens):
    """Returns o `[B, T, HQ, V]` (q's dtype) and the base-2 log-sum-exp `[HQ, B * T]` (fp32)."""
    B, T, HQ, _ = q.shape
    dims = _dims(q, k, v)
    cfg = _config("fwd", max(dims["K"], dims["V"]), q.dtype)
    o = empty(B, T, HQ, dims["V"], dtype=q.dtype, device=q.device)
    lse = empty(HQ, B * T, dtype=torch.float32, device=q.device)
    NT, indices = _tiles(B, T, cu_seqlens, cfg["BT"])
    if NT > 0:
        _launch_contained(_launch_fwd, NT * B * HQ, dict(
            q=q, k=k, v=v, o=o, lse=lse, g_cumsum=g_cumsum, sink_bias=sink_bias, cu_seqlens=cu_seqlens,
            chunk_indices=indices, scale=scale, T=T, W=W, NTOK=B * T, B=B, **dims, **cfg,
        ))
    return o, lse


# (DELTA_FROM_O, REFINE_DELTA, COMPUTE_DQ) for each launch of the dQ kernel, per delta mode (see `attn_bwd_dq`).
_DQ_PASSES = {"rounded": ((True, False, True),), "refine": ((True, True, True),),
              "exact": ((False, True, False), (False, False, True))}


def attn_bwd_dq(q, k, v, o, do, lse, g_cumsum, dG, scale: float, W: int, cu_seqlens, delta_mode: str):
    """dq in q's dtype, and delta `[HQ, B * T]` fp32 for the dK/dV kernel. `delta_mode` says how delta
    (rowsum(o * dO), from the rounded o) is computed and treated:
    - "rounded": used as is (no gate, no sink: its ~1e-3 relative error costs dq and dk little);
    - "refine": dq uses it, then overwrites it with the fp32 rowsum(P * dP) for the dK/dV kernel (gates: dG is a
      reverse cumsum of dS sums, which turns delta's error into a random walk along the sequence); with gates
      it also stores the query side of dG into `dG` (see `dkv_one_head`);
    - "exact": a first pass computes rowsum(P * dP) (two of dQ's three products), then dq uses it (sinks: with a
      sink, dP - delta = p_sink * dP on a row that sees few keys, a small difference that the rounded delta
      swamps; bf16 dq error ratio 1.2e-2 at T = 1, 6.6e-3 at W = 1, against 1.6e-3 with the exact delta).
    """
    B, T, HQ, _ = q.shape
    dims = _dims(q, k, v)
    cfg = _config("dq", max(dims["K"], dims["V"]), q.dtype)
    dq = empty(*q.shape, dtype=q.dtype, device=q.device)
    delta = empty(HQ, B * T, dtype=torch.float32, device=q.device)
    NT, indices = _tiles(B, T, cu_seqlens, cfg["BT"])
    for from_o, refine, compute_dq in _DQ_PASSES[delta_mode] if NT > 0 else ():
        _launch_contained(_launch_dq, NT * B * HQ, dict(
            q=q, k=k, v=v, o=o, do=do, dq=dq, dG=dG, lse=lse, delta=delta, g_cumsum=g_cumsum, cu_seqlens=cu_seqlens,
            chunk_indices=indices, scale=scale, T=T, W=W, NTOK=B * T, B=B, DELTA_FROM_O=from_o,
            REFINE_DELTA=refine, COMPUTE_DQ=compute_dq, **dims, **cfg,
        ))
    return dq, delta


def attn_bwd_dkv(q, k, v, do, lse, delta, g_cumsum, sink_bias, scale: float, W: int, cu_seqlens, path: str):
    """dk, dv in the inputs' dtypes; dGk `[HQ, B * T]` fp32, minus the key side of the gradient w.r.t. the gate's
    cumsum (None without a gate; the dQ kernel stored the query side, `gate_grad` adds the two); dsink `[HQ]` fp32
    (None without a sink). `path` is one of `DKV_PATHS` but "auto": "gqa" (KV-head-owned kernel), "gqa-split2" /
    "gqa-split4" (the same kernel, each group's heads dealt to 2 / 4 programs, then their sum) or "legacy"
    (query-head-owned kernel + group sum)."""
    B, T, HQ, K = q.shape
    dims = _dims(q, k, v)
    H, G, V = dims["H"], dims["G"], dims["V"]
    cfg = _config("dkv", max(K, V), q.dtype)
    if path == "legacy":
        # The legacy kernel writes one dK/dV per query head; with G > 1 they are summed in fp32 below.
        kernel, NH, extra = _launch_dkv_per_query_head, HQ, {}
    else:
        split = _dkv_split(path, G)
        kernel, NH, extra = _launch_dkv_per_kv_head, H * split, {"SPLIT": split}
    heads = B * NH
    acc_dtype = q.dtype if NH == H else torch.float32
    dk = empty(B, T, NH, K, dtype=acc_dtype, device=q.device)
    dv = empty(B, T, NH, V, dtype=acc_dtype, device=q.device)
    NT, indices = _tiles(B, T, cu_seqlens, cfg["BT"])
    partial = empty(HQ, NT * B, dtype=torch.float32, device=q.device) if sink_bias is not None else None
    dGk = empty(*lse.shape, dtype=torch.float32, device=q.device) if g_cumsum is not None else None
    if NT > 0:
        _launch_contained(kernel, NT * heads, dict(
            q=q, k=k, v=v, do=do, dk=dk, dv=dv, dGk=dGk, dsink_partial=partial, lse=lse, delta=delta,
            g_cumsum=g_cumsum, sink_bias=sink_bias, cu_seqlens=cu_seqlens, chunk_indices=indices, scale=scale, T=T,
            W=W, NTOK=B * T, B=B, **dims, **cfg, **extra,
        ))
    if NH != H:
        dk, dv = group_sum(dk, dv, H, q.dtype)
    dsink = partial.sum(1) if partial is not None else None
    return dk, dv, dGk, dsink


# ----------------------------------------------------------------------------------------------------------------
# dK/dV dispatch
# ----------------------------------------------------------------------------------------------------------------

DKV_PATHS = ("auto", "gqa", "gqa-split2", "gqa-split4", "legacy")


_SPLITS = {"gqa": 1, "gqa-split2": 2, "gqa-split4": 4}


def _dkv_split(path: str, G: int) -> int:
    """How many programs share a group's query heads on a "gqa*" path; it must divide G."""
    split = _SPLITS[path]
    if G % split:
        raise ValueError(f"dK/dV path {path!r} deals each group's query heads to {split} programs, so it needs "
                         f"HQ // H to be a multiple of {split}; got HQ // H = {G}")
    return split


_forced_dkv_path: Optional[str] = None


@contextlib.contextmanager
def dkv_path(name: str):
    """Force the dK/dV kernel inside a `with` block: one of `DKV_PATHS` ("auto" is the dispatch). Overrides the
    environment variable FLA_BWD_DKV_PATH, which sets the same for a whole process. Read at backward time."""
    global _forced_dkv_path
    if name not in DKV_PATHS:
        raise ValueError(f"dkv_path must be one of {DKV_PATHS}, got {name!r}")
    previous, _forced_dkv_path = _forced_dkv_path, name
    try:
        yield
    finally:
        _forced_dkv_path = previous


def select_dkv_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: Optional[int] = None,
                      cu_seqlens: Optional[torch.Tensor] = None) -> str:
    """The dK/dV kernel for one call, one of `DKV_PATHS` but "auto": "gqa" (KV-head-owned), "gqa-split2" /
    "gqa-split4" (the same kernel with each group's heads dealt to 2 / 4 programs, then a sum of the partials) or
    "legacy" (query-head-owned, then a group sum).

    The "gqa" family is taken for fp16/bf16 GQA with K == V in {64, 128} and G in {2, 4, 8}: plain "gqa" unless on
    a GPU the call is load-imbalanced for it, then the smallest split that balances it (see `_gqa_split`), and
    "legacy" if none does. Everything else keeps "legacy": MHA has nothing to reduce, and fp32, K != V, other head
    dims and G > 8 have not been measured to win. `dkv_path(...)` or the environment variable FLA_BWD_DKV_PATH
    force any path; all are correct for every input they accept (a split must divide G). PERF.md has the figures.
    """
    forced = _forced_dkv_path or os.environ.get("FLA_BWD_DKV_PATH", "auto")
    if forced not in DKV_PATHS:
        raise ValueError(f"FLA_BWD_DKV_PATH must be one of {DKV_PATHS}, got {forced!r}")
    if forced != "auto":
        return forced
    B, T, HQ, K = q.shape
    H, V = k.shape[2], v.shape[3]
    G = HQ // H
    if not (q.dtype in (torch.float16, torch.bfloat16) and K == V and K in (64, 128) and G in (2, 4, 8)):
        return "legacy"
    if q.device.type != "cuda":
        return "gqa"
    lengths = (T,) * B if cu_seqlens is None else _lengths(cu_seqlens)
    W = T if window_size is None else window_size
    split = _gqa_split(lengths, H, G, K, W, _sm_count(q.device.index))
    return "legacy" if split is None else "gqa" if split == 1 else f"gqa-split{split}"


@functools.cache
def _sm_count(device_index: int) -> int:
    # Read once per device: the dispatch runs on every backward call.
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _lengths(cu_seqlens: torch.Tensor) -> tuple:
    offsets = seqlen_offsets(cu_seqlens)
    return tuple(b - a for a, b in zip(offsets, offsets[1:]))


@functools.lru_cache(maxsize=256)
def _gqa_split(lengths: tuple, H: int, G: int, D: int, W: int, sms: int) -> Optional[int]:
    """The fewest programs (1, 2 or 4, below G) that can share a group's heads and keep the GPU busy, or None.
    A program's longest run is the first key tile of the longest sequence: G / split times the query blocks that
    tile sees. When that critical path is much longer than the average work per resident program, programs of
    short tiles finish and leave SMs idle while it runs; splitting the heads shortens it at the price of fp32
    partials and their sum (`group_sum`; at G8 T4096 9 us for a split of 2, 39 us for the legacy path's
    sum over G = 8).

    Counted in query-block iterations, with two resident programs per SM (255 registers x 128 threads each).
    Measured on the H200 (PERF.md #23, kernel time of a backward, us): G8 B1 T4096 H4 (critical path 2.0x the
    average) gqa 1286, split2 953, legacy 983; G8 B2 T2048 D128 gqa 724, split2 561, legacy 617; G8 T8192 (1.02x)
    gqa 3596, legacy 3708; GQA B2 T2048 H8 (1.0x) gqa 550, split2 598, legacy 636. G4 B4 T512 (1.8x, but 32
    iterations) with two-launch containment (#31): gqa 90, split2 72 + 10 of sum, legacy 78 + 20: the split saves
    ~8 us of kernel time and adds a launch (~8-11 us of host time on that machine), hence the 64-iteration floor.
    """
    cfg = _config("dkv", D)
    ratio = cfg["BT"] // cfg["BS"]
    span = cdiv(cfg["BT"] + W - 1, cfg["BS"])  # query blocks one key tile can see
    total = longest = 0
    for length in lengths:
        blocks = cdiv(length, cfg["BS"])
        seen = [min(blocks - i * ratio, span) for i in range(cdiv(length, cfg["BT"]))]
        total += H * G * sum(seen)
        longest = max(longest, seen[0] if seen else 0)
    for split in (1, 2, 4):
        critical = G // split * longest
        if split < G and (critical <= 64 or critical <= 1.25 * total / (2 * sms)):
            return split
    return None


# ----------------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------------

# The op pair is registered with torch.library so that `torch.compile(fullgraph=True)` sees two opaque ops with fake
# (meta) implementations instead of tracing into Triton launches, and autograd is attached with `register_autograd`
# rather than a `torch.autograd.Function`. Optional outputs (the gate's cumsum, dg, dsink) are returned as empty
# tensors when absent, since a custom op cannot return None.

def _on_device(device: torch.device):
    """Triton launches on the current CUDA device (and its current stream): inputs on another GPU need it switched
    for the call (a tensor on cuda:1 while cuda:0 is current would otherwise be read from the wrong device)."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _empty_f32(device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=device)


def _parallel_attn_fwd_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], sink_bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor], scale: float, window_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, lse, G * log2 e or empty). `window_size` 0 means full causal."""
    with _on_device(q.device):
        return _parallel_attn_fwd_launch(q, k, v, g, sink_bias, cu_seqlens, scale, window_size)


def _parallel_attn_fwd_launch(q, k, v, g, sink_bias, cu_seqlens, scale, window_size):
    if cu_seqlens is not None:
        check_cu_seqlens_values(cu_seqlens, q.shape[1])
    W = _window(window_size, q.shape[1])
    g_cumsum = gate_cumsum(g, cu_seqlens) if g is not None else None
    sink = sink_bias.float().contiguous() if sink_bias is not None else None
    o, lse = attn_fwd(q, k, v, g_cumsum, sink, scale, W, cu_seqlens)
    return o, lse, g_cumsum if g_cumsum is not None else _empty_f32(q.device)


_parallel_attn_fwd_op = torch.library.custom_op("fla_bwd::parallel_attn_fwd", mutates_args=())(
    _parallel_attn_fwd_impl)


@_parallel_attn_fwd_op.register_fake
def _(q, k, v, g, sink_bias, cu_seqlens, scale, window_size):
    B, T, HQ, _ = q.shape
    lse = q.new_empty(HQ, B * T, dtype=torch.float32)
    g_cumsum = q.new_empty(HQ, B * T, dtype=torch.float32) if g is not None else q.new_empty(0, dtype=torch.float32)
    return q.new_empty(B, T, HQ, v.shape[3]), lse, g_cumsum


def _parallel_attn_bwd_impl(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    g_cumsum: torch.Tensor, g: Optional[torch.Tensor], sink_bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor], scale: float, window_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg or empty, dsink or empty); dg and dsink in g's and sink_bias's dtypes."""
    grads = _parallel_attn_bwd_eager(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale, window_size)
    return tuple(x if x is not None else _empty_f32(q.device) for x in grads)


def _parallel_attn_bwd_eager(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale, window_size):
    """As `_parallel_attn_bwd_impl`, with None for an absent dg or dsink (no placeholder allocations)."""
    with _on_device(q.device):
        return _parallel_attn_bwd_launch(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale,
                                         window_size)


def _parallel_attn_bwd_launch(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale, window_size):
    B, T = q.shape[:2]
    W = _window(window_size, T)
    gc = g_cumsum if g is not None else None
    sink = sink_bias.float().contiguous() if sink_bias is not None else None
    delta_mode = "exact" if sink is not None else "refine" if gc is not None else "rounded"
    # dG (gradient w.r.t. the gate's cumsum): the dQ kernel stores its query side, the dK/dV kernel minus its key
    # side, and the reverse cumsum adds them.
    dG = empty(*lse.shape, dtype=torch.float32, device=q.device) if gc is not None else None
    dq, delta = attn_bwd_dq(q, k, v, o, do, lse, gc, dG, scale, W, cu_seqlens, delta_mode)
    dk, dv, dGk, dsink = attn_bwd_dkv(q, k, v, do, lse, delta, gc, sink, scale, W, cu_seqlens,
                                     select_dkv_kernel(q, k, v, W, cu_seqlens))
    dg = gate_grad(dG, dGk, B, T, cu_seqlens, g.dtype) if g is not None else None
    dsink = dsink.to(sink_bias.dtype) if sink_bias is not None else None
    return dq, dk, dv, dg, dsink


_parallel_attn_bwd_op = torch.library.custom_op("fla_bwd::parallel_attn_bwd", mutates_args=())(
    _parallel_attn_bwd_impl)


@_parallel_attn_bwd_op.register_fake
def _(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale, window_size):
    empty = q.new_empty(0, dtype=torch.float32)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(g) if g is not None else empty,
            torch.empty_like(sink_bias) if sink_bias is not None else empty)


def _window(window_size: int, T: int) -> int:
    # W == T already admits every causal pair; clamping keeps the kernels' int32 range arithmetic small.
    return T if window_size == 0 else min(window_size, max(T, 1))


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, g, sink_bias, cu_seqlens, scale, window_size = inputs
    o, lse, g_cumsum = output
    ctx.save_for_backward(q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens)
    ctx.scale, ctx.window_size = scale, window_size


def _fwd_backward(ctx, do, dlse, dgc, bwd=_parallel_attn_bwd_op):
    q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens = ctx.saved_tensors
    dq, dk, dv, dg, dsink = bwd(do.contiguous(), q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, ctx.scale,
                                ctx.window_size)
    return (dq, dk, dv, dg if g is not None else None, dsink if sink_bias is not None else None, None, None, None)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("parallel_attn does not support double backward (a gradient of its gradient); "
                       "its backward is not differentiable")


def _bwd_setup_context(ctx, inputs, output):
    pass


_parallel_attn_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
_parallel_attn_bwd_op.register_autograd(_no_double_backward, setup_context=_bwd_setup_context)


class _EagerParallelAttn(torch.autograd.Function):
    """The same two implementations and autograd formula as the custom ops, for eager calls. The custom-op
    machinery (schema default filling, dynamo guards, autograd redispatch) costs ~100 us of host time per forward
    on this project's CPU with the kernels stubbed out, more than the whole GPU time of a short row; torch.compile
    needs the ops, eager code does not. `parallel_attn` picks by `torch.compiler.is_compiling()`."""

    @staticmethod
    def forward(ctx, q, k, v, g, sink_bias, cu_seqlens, scale, window_size):
        output = _parallel_attn_fwd_impl(q, k, v, g, sink_bias, cu_seqlens, scale, window_size)
        _fwd_setup_context(ctx, (q, k, v, g, sink_bias, cu_seqlens, scale, window_size), output)
        ctx.mark_non_differentiable(output[1], output[2])
        # lse and G are internal outputs: without this, autograd hands the backward a zero-filled lse-shaped dlse
        # (an allocation and a fill kernel, one more launch of host time per backward) that it never reads.
        ctx.set_materialize_grads(False)
        return output

    @staticmethod
    def backward(ctx, do, dlse, dgc):
        # do is never None: o is the only differentiable output, so autograd calls this only with a gradient for it.
        with torch.no_grad():
            grads = _fwd_backward(ctx, do, dlse, dgc, bwd=_parallel_attn_bwd_eager)
        if not torch.is_grad_enabled():
            return grads
        # create_graph=True: hand back gradients that refuse a second differentiation with a clear error (as the
        # custom op's backward does), rather than silently non-differentiable ones.
        # The saved inputs (which require grad) go in too, so that the outputs carry this node.
        live = [i for i, x in enumerate(grads) if x is not None]
        guarded = _NoDoubleBackward.apply(len(live), *(grads[i] for i in live), *ctx.saved_tensors[:3])
        out = list(grads)
        for i, x in zip(live, guarded):
            out[i] = x
        return tuple(out)


class _NoDoubleBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(x.view_as(x) for x in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        _no_double_backward(ctx)


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
    *,
    sink_bias: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Causal softmax attention with GQA, forget gates, a sliding window, attention sinks and packed sequences.

    Args:
        q: `[B, T, HQ, K]` queries, float16, bfloat16 or float32.
        k: `[B, T, H, K]` keys, q's dtype. HQ must be a multiple of H; query head h reads KV head h // (HQ // H).
        v: `[B, T, H, V]` values, q's dtype. K and V are any sizes from 1 to 256 and may differ.
        g: optional `[B, T, HQ]` log forget gate (Forgetting Transformer), any float dtype. With G its cumulative
            sum over each sequence (fp32), score(i, j) += G_i - G_j.
        scale: score scale; defaults to K ** -0.5. Must be finite.
        window_size: optional W >= 1; query i sees keys [i - W + 1, i]. None (or W >= T) is full causal.
        cu_seqlens: optional `[N + 1]` int32/int64 offsets of N packed sequences (FlashAttention convention:
            starts at 0, non-decreasing, ends at T); requires B == 1. Attention never crosses a sequence boundary
            and the gate's cumsum restarts at each sequence start.
        sink_bias: optional `[HQ]` attention-sink logits (GPT-OSS): one extra logit per query head in the softmax
            denominator only. Its gradient is computed in fp32 and returned in sink_bias's dtype.

    Returns:
        o: `[B, T, HQ, V]` in q's dtype. Differentiable with respect to q, k, v, g and sink_bias; gradients come
        back in each input's dtype. The backward is deterministic (bitwise identical run to run). A NaN or Inf
        in an input reaches only the outputs and gradients that depend on it; everything else is bitwise what it
        would be without it (`tests/ops/test_attn_nan.py`).

    Raises:
        TypeError / ValueError naming the argument for any invalid input (shapes, dtypes, devices, cu_seqlens,
        window_size, scale), before any kernel runs.

    The package is Triton-only: `FLA_DISABLE_BACKEND_DISPATCH=1` is accepted and changes nothing. The dK/dV kernel
    is picked per call by `select_dkv_kernel`; force one with `dkv_path(...)` or FLA_BWD_DKV_PATH.
    """
    check_attn_inputs(q, k, v, g, scale, window_size, cu_seqlens, sink_bias)
    if q.is_cuda and torch.is_autocast_enabled("cuda") and q.dtype == torch.float32:
        # Under autocast, attention runs in the autocast dtype; the casts are differentiable, so the gradients
        # come back in the inputs' (fp32) dtypes.
        dtype = torch.get_autocast_dtype("cuda")
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.contiguous() if g is not None else None
    # The kernels read cu_seqlens with unit stride.
    cu_seqlens = cu_seqlens.contiguous() if cu_seqlens is not None else None
    fwd = _parallel_attn_fwd_op if torch.compiler.is_compiling() else _EagerParallelAttn.apply
    o, _, _ = fwd(q, k, v, g, sink_bias, cu_seqlens, resolve_scale(scale, q.shape[-1]), window_size or 0)
    return o
