# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The attention kernels in Triton: the forward, dQ and three dK/dV kernels (query-head-owned, KV-head-owned, and
the KV-head-owned one that also stores dS for the five-product backward). Their loop bodies are in `inner.py`; the
plans (`host.py`) launch them.

Layouts. Inputs are token-major, `[B, T, heads, dim]`. Per-(head, token) fp32 side tensors (log-sum-exp, delta,
the gate's cumulative sum gc and its gradient dgc) are head-major, `[HQ, B * T]`, so a tile of tokens of one head
is one contiguous load. A packed batch (`cu_seqlens`) has B == 1; every kernel maps its tile to (sequence start
`bos`, sequence length `T`) once, in `sequence_bounds` (through the `query_tile`/`key_tile` prologues), and then
addresses through int64 base pointers. G is the GQA group size HQ // H everywhere.
"""

import triton
import triton.language as tl

from fla_bwd.ops.attn.inner import (
    DS_BY_DESCRIPTOR,
    DS_BY_POINTER,
    FIXUP,
    FLAG,
    INLINE,
    LOG2E,
    any_nonfinite,
    band_of,
    dkv_one_head,
    dq_tile,
    fwd_tile,
    key_tile,
    o_lo_encode,
    query_tile,
    score_scales,
)

LN2 = tl.constexpr(0.6931471805599453)  # base-2 lse times ln 2: the user's natural-log lse

_HEURISTICS = {
    "USE_G": lambda args: args["g_cumsum"] is not None,
    "USE_SINK": lambda args: args["sink_bias"] is not None,
    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
    # Tail queries: q holds the last T - Q0 positions of each key sequence (Q0 one offset, or packed: cu_seqlens_q,
    # q's own offsets). Neither: every position is a query, and the kernels compile as before tail queries existed.
    "TAIL_Q": lambda args: args["Q0"] is not None or args["cu_seqlens_q"] is not None,
    # Logit soft-capping (`inner.scores`); None: off, and the kernels compile as they did without it.
    "SOFTCAP": lambda args: args["softcap"] is not None,
    # Causal (WR None: the kernels compile as they did before non-causal calls), or keys up to WR after the query.
    "CAUSAL": lambda args: args["WR"] is None,
}
# The forward also stores o's rounding residual (EXACT_O) and the user's lse (LSE_OUT) where given buffers for them.
_FWD_HEURISTICS = dict(_HEURISTICS, EXACT_O=lambda args: args["o_lo"] is not None,
                       LSE_OUT=lambda args: args["lse_out"] is not None)
# The dQ kernel subtracts the gradient of the user's lse from delta (USE_DLSE) where given it (`return_lse`).
_DQ_HEURISTICS = dict(_HEURISTICS, USE_DLSE=lambda args: args["dlse"] is not None)


# ----------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _query_tile(B, T, Q0, cu_seqlens, cu_seqlens_q, chunk_indices, HQ: tl.constexpr, G: tl.constexpr,
                BT: tl.constexpr, IS_VARLEN: tl.constexpr, TAIL_Q: tl.constexpr):
    """`query_tile`, plus the int64 row of q/o/dO/dq that holds position 0 of the sequence (`qbos`). With TAIL_Q the
    programs cover the T - Q0 query positions [Q0, T) of each sequence (Q0 a multiple of BT; `_tail_start`; packed:
    `chunk_indices` lists the tiles of the query rows): positions stay those of the keys (lse, delta, gc and dgc
    are indexed by them), and only q, o, dO and dq, which hold T - Q0 rows per sequence, are addressed from a base
    Q0 rows back."""
    i_hq, i_h, i_n, bos, T, t0, o_t, m_t = query_tile(B, T, cu_seqlens, chunk_indices, HQ=HQ, G=G, BT=BT,
                                                      IS_VARLEN=IS_VARLEN)
    qbos = bos
    if TAIL_Q:
        Q0, qbos = _tail_start(i_n, bos, T, Q0, cu_seqlens_q, IS_VARLEN=IS_VARLEN)
        t0, o_t = t0 + Q0, o_t + Q0
        m_t = o_t < T
    return i_hq, i_h, bos, T, t0, o_t, m_t, qbos


@triton.jit
def _tail_start(i_n, bos, T, Q0, cu_seqlens_q, IS_VARLEN: tl.constexpr):
    """Tail queries of sequence i_n (first key bos, T keys): (its first query position Q0, the int64 (virtual) row
    of q/o/dO/dq for its position 0). Dense: every sequence's T - Q0 query rows from row (bos // T) * (T - Q0) on;
    packed: its rows [cu_seqlens_q[i_n], cu_seqlens_q[i_n + 1]) of q."""
    if IS_VARLEN:
        q_bos = tl.load(cu_seqlens_q + i_n).to(tl.int64)
        Q0 = T - (tl.load(cu_seqlens_q + i_n + 1).to(tl.int64) - q_bos).to(tl.int32)
        row0 = q_bos - Q0
    else:
        row0 = bos - (bos // T + 1) * Q0.to(tl.int64)
    return Q0, row0


@triton.jit
def _o_tile(base, qbos, i_hq, o_t, o_v, HQ: tl.constexpr, V: tl.constexpr):
    """Pointers to the [BT, BV] tile of o (or o_lo, `[B, T, HQ, V]`) of query head i_hq at rows o_t."""
    return base + (qbos * HQ + i_hq) * V + o_t[:, None].to(tl.int64) * (HQ * V) + o_v[None, :]


@triton.heuristics(_FWD_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "WR", "NTOK", "B"])
def parallel_attn_fwd_kernel(
    q, k, v, o, o_lo, lse, lse_out, nonfinite, g_cumsum, sink_bias, cu_seqlens, cu_seqlens_q, chunk_indices, scale,
    softcap, T, W, WR, NTOK, B, Q0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    CONTAIN: tl.constexpr, TAIL_Q: tl.constexpr, EXACT_O: tl.constexpr, LSE_OUT: tl.constexpr,
    SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """o and the base-2 log-sum-exp (sink included) for one query tile of one query head. CONTAIN says how a NaN/Inf
    input is kept to the outputs that depend on it (see `host.add_contained`). EXACT_O: also o_lo (o's shape, int8),
    how far the fp32 o is from o rounded (`inner.o_lo_encode`): o and o_lo give the fp32 o to 2**-16 of |o|.
    LSE_OUT: also the user's lse (`return_lse`): natural log, fp32, one row per row of q (`[B * (T - Q0), HQ]`)."""
    tl.static_assert(CAUSAL or not USE_G, "a gate needs causal attention")
    tl.static_assert(BT % BS == 0, "key blocks must tile the query tile")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_hq, i_h, bos, T, t0, o_t, m_t, qbos = _query_tile(B, T, Q0, cu_seqlens, cu_seqlens_q, chunk_indices, HQ=HQ,
                                                        G=G, BT=BT, IS_VARLEN=IS_VARLEN, TAIL_Q=TAIL_Q)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    q_base = q + (qbos * HQ + i_hq) * K
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
    qk_scale, cap_in = score_scales(scale, softcap, SOFTCAP=SOFTCAP)
    b_o, b_m, b_l = fwd_tile(
        b_q, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, cap_in, WR, H * K, H * V,
        K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, DOT_PREC=DOT_PREC, SAFE=CONTAIN == FIXUP, SOFTCAP=SOFTCAP,
        CAUSAL=CAUSAL)
    if CONTAIN == INLINE:
        if any_nonfinite(b_o):
            b_o, b_m, b_l = fwd_tile(
                b_q, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, cap_in, WR, H * K, H * V,
                K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, DOT_PREC=DOT_PREC, SAFE=True, SOFTCAP=SOFTCAP,
                CAUSAL=CAUSAL)
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
    b_or = b_o.to(o.dtype.element_ty)
    tl.store(_o_tile(o, qbos, i_hq, o_t, o_v, HQ=HQ, V=V), b_or, mask=m_t[:, None] & (o_v[None, :] < V))
    if EXACT_O:
        tl.store(_o_tile(o_lo, qbos, i_hq, o_t, o_v, HQ=HQ, V=V), o_lo_encode(b_o, b_or),
                 mask=m_t[:, None] & (o_v[None, :] < V))
    tl.store(lse + i_hq.to(tl.int64) * NTOK + bos + o_t, b_m + tl.log2(b_l), mask=m_t)
    if LSE_OUT:  # after the store above, in this order: without LSE_OUT the kernel's PTX is what it was before it
        tl.store(lse_out + (qbos + o_t) * HQ + i_hq, (b_m + tl.log2(b_l)) * LN2, mask=m_t)


@triton.jit
def _dq_rows(
    b_q, b_do, b_lse, b_delta, b_dlse, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, cap_in, WR, stride_k,
    stride_v,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REFINE_DELTA: tl.constexpr, EXACT_DELTA: tl.constexpr, DOT_PREC: tl.constexpr, USE_G: tl.constexpr,
    SAFE: tl.constexpr, USE_DLSE: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """The dQ kernel's loops for its tile: (dq unscaled, the delta to store for the dK/dV kernel, and the
    off-diagonal row sums of P * dP and P that the query side of dgc needs; see `dq_block`). b_delta is
    rowsum(o * dO) (minus b_dlse with USE_DLSE): dq uses it unless EXACT_DELTA, where a first loop computes
    rowsum(P * dP) (two of the three products) for dq and the dK/dV kernel alike; REFINE_DELTA stores rowsum(P * dP)
    for the dK/dV kernel only. USE_DLSE: every delta is less b_dlse, the gradient of the natural lse (`return_lse`):
    lse's gradient in score s_ij is P_ij, so dS_ij = P_ij * (dP_ij - delta_i + dlse_i)."""
    if EXACT_DELTA:
        _, b_delta, b_off_pdp, b_off_p = dq_tile(
            b_q, b_do, b_lse, b_delta, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, cap_in, WR, stride_k,
            stride_v,
            K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, REFINE_DELTA=True, DOT_PREC=DOT_PREC, USE_G=USE_G,
            COMPUTE_DQ=False, SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
        if USE_DLSE:
            b_delta -= b_dlse
    b_dq, b_pdp, b_off_pdp2, b_off_p2 = dq_tile(
        b_q, b_do, b_lse, b_delta, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, cap_in, WR, stride_k,
        stride_v,
        K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, REFINE_DELTA=REFINE_DELTA, DOT_PREC=DOT_PREC, USE_G=USE_G,
        COMPUTE_DQ=True, SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    if REFINE_DELTA:
        b_delta, b_off_pdp, b_off_p = b_pdp, b_off_pdp2, b_off_p2
        if USE_DLSE:
            b_delta -= b_dlse
    elif not EXACT_DELTA:
        b_off_pdp, b_off_p = b_off_pdp2, b_off_p2  # zeros: no row sums without REFINE_DELTA
    return b_dq, b_delta, b_off_pdp, b_off_p


@triton.heuristics(_DQ_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "WR", "NTOK", "B"])
def parallel_attn_bwd_kernel_dq(
    q, k, v, o, do, dq, dgc_q, lse, dlse, delta, nonfinite, g_cumsum, sink_bias, dsink_partial, cu_seqlens,
    cu_seqlens_q, chunk_indices, scale, softcap, T, W, WR, NTOK, B, Q0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, IS_VARLEN: tl.constexpr, REFINE_DELTA: tl.constexpr,
    EXACT_DELTA: tl.constexpr, DOT_PREC: tl.constexpr, CONTAIN: tl.constexpr, TAIL_Q: tl.constexpr,
    USE_DLSE: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """dQ for one query tile of one query head, over the same key ranges as the forward, and delta for the dK/dV
    kernel (`host.add_dq` says which delta). By default it computes delta = rowsum(o * dO) of its rows and stores
    it (no separate preprocess launch: a launch costs more host time than this sum costs the GPU).
    With REFINE_DELTA it then replaces delta by rowsum(P * dP) for the kernels that run next (see the end of this
    kernel), and with gates it stores the query side of dgc (see `dkv_one_head`). With EXACT_DELTA it computes
    rowsum(P * dP) in a first loop over the keys and uses that for dq too (`_dq_rows`). With a sink it stores its
    rows' share of dsink = -sum_i p_sink_i * delta_i into `dsink_partial` `[HQ, programs // HQ]` (summed in a fixed
    order by the dK/dV kernel, `_sum_dsink`). CONTAIN as in the forward kernel. USE_DLSE: the user's lse has a
    gradient `dlse` (fp32, natural log, q's rows: `[B * (T - Q0), HQ]`), which every delta here subtracts
    (`_dq_rows`), so that the kernels after this one need nothing else for it."""
    tl.static_assert(BT % BS == 0, "key blocks must tile the query tile")
    tl.static_assert(CAUSAL or not USE_G, "a gate needs causal attention")
    tl.static_assert(not (REFINE_DELTA and EXACT_DELTA), "one way of computing delta")
    # Whether the delta stored for the dK/dV kernel comes out of the loops (rowsum(P * dP)), not from o and dO.
    LOOP_DELTA: tl.constexpr = REFINE_DELTA or EXACT_DELTA
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_hq, i_h, bos, T, t0, o_t, m_t, qbos = _query_tile(B, T, Q0, cu_seqlens, cu_seqlens_q, chunk_indices, HQ=HQ,
                                                        G=G, BT=BT, IS_VARLEN=IS_VARLEN, TAIL_Q=TAIL_Q)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    k_base = k + (bos * H + i_h) * K
    v_base = v + (bos * H + i_h) * V
    row_base = i_hq.to(tl.int64) * NTOK + bos
    g_base = g_cumsum
    if USE_G:
        g_base = g_cumsum + row_base
    p_q = (qbos * HQ + i_hq) * K + o_t[:, None].to(tl.int64) * (HQ * K) + o_k[None, :]
    m_q = m_t[:, None] & (o_k[None, :] < K)
    # [BT, BK]
    b_q = tl.load(q + p_q, mask=m_q, other=0)
    p_o = (qbos * HQ + i_hq) * V + o_t[:, None].to(tl.int64) * (HQ * V) + o_v[None, :]
    m_o = m_t[:, None] & (o_v[None, :] < V)
    # [BT, BV]
    b_do = tl.load(do + p_o, mask=m_o, other=0)
    b_lse = tl.load(lse + row_base + o_t, mask=m_t, other=float("inf"))
    b_dlse = 0.0
    if USE_DLSE:
        b_dlse = tl.load(dlse + (qbos + o_t) * HQ + i_hq, mask=m_t, other=0)
    if EXACT_DELTA:
        b_delta = tl.zeros([BT], dtype=tl.float32)  # not read: the first loop of `_dq_rows` computes it
    else:
        b_delta = tl.sum(tl.load(o + p_o, mask=m_o, other=0).to(tl.float32) * b_do.to(tl.float32), 1)
        if USE_DLSE:
            b_delta -= b_dlse
        if not LOOP_DELTA:
            # Stored now: kept live across the loops for a store and a check after them, it spilled the fp32
            # kernel's loops (dq 6.6% slower on the H100).
            tl.store(delta + row_base + o_t, b_delta, mask=m_t)
    b_gq = tl.zeros([BT], dtype=tl.float32)
    if USE_G:
        b_gq = tl.load(g_base + o_t, mask=m_t, other=0)
    qk_scale, cap_in = score_scales(scale, softcap, SOFTCAP=SOFTCAP)
    b_dq, b_delta_out, b_off_pdp, b_off_p = _dq_rows(
        b_q, b_do, b_lse, b_delta, b_dlse, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, cap_in, WR, H * K,
        H * V, K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, REFINE_DELTA=REFINE_DELTA, EXACT_DELTA=EXACT_DELTA,
        DOT_PREC=DOT_PREC, USE_G=USE_G, SAFE=CONTAIN == FIXUP, USE_DLSE=USE_DLSE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    if CONTAIN != FIXUP:
        bad = any_nonfinite(b_dq)
        if LOOP_DELTA:  # the row sums the loops computed (a SAFE pass gives o * dO's the same)
            bad = bad | any_nonfinite((b_delta_out + b_off_pdp + b_off_p)[:, None])
        if CONTAIN == INLINE:
            if bad:
                b_dq, b_delta_out, b_off_pdp, b_off_p = _dq_rows(
                    b_q, b_do, b_lse, b_delta, b_dlse, b_gq, k_base, v_base, g_base, o_t, t0, T, W, qk_scale, cap_in,
                    WR,
                    H * K, H * V, K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, REFINE_DELTA=REFINE_DELTA,
                    EXACT_DELTA=EXACT_DELTA, DOT_PREC=DOT_PREC, USE_G=USE_G, SAFE=True, USE_DLSE=USE_DLSE,
                    SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
        else:
            tl.store(nonfinite + tl.program_id(0), bad.to(tl.int8))
    tl.store(dq + p_q, (b_dq * scale).to(dq.dtype.element_ty), mask=m_q)
    # delta = rowsum(o * dO) carries o's rounding to the input dtype, and the gate gradient is a reverse cumsum of
    # differences of dS sums, which turns that error into a random walk along the sequence: gated and
    # sink calls store rowsum(P * dP), the same quantity from fp32 terms, for the dK/dV kernel, which runs next and
    # computes the key side of dgc (and dK, dsink) from it.
    if LOOP_DELTA:
        tl.store(delta + row_base + o_t, b_delta_out, mask=m_t)
    if USE_SINK:
        b_sink = tl.load(sink_bias + i_hq).to(tl.float32) * LOG2E
        tl.store(dsink_partial + tl.program_id(0) // HQ + i_hq.to(tl.int64) * (tl.num_programs(0) // HQ),
                 -tl.sum(b_delta_out * tl.exp2(b_sink - b_lse), 0))
    if USE_G and LOOP_DELTA:  # the host always picks one with gates
        # Query side of dgc_j: sum over keys i < j of P_ji * (dP_ji - delta_j), from the fp32 sums.
        tl.store(dgc_q + row_base + o_t, b_off_pdp - b_delta_out * b_off_p, mask=m_t)


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
def _load_rows_of_head(x, bos, i_head, o_s, m_s, NH: tl.constexpr, N: tl.constexpr, BN: tl.constexpr):
    """The [BT, BN] rows o_s of head i_head of `[B, T, NH, N]` x (zero past N and where m_s is False)."""
    o_n = tl.arange(0, BN)
    return tl.load(x + (bos * NH + i_head) * N + o_s[:, None].to(tl.int64) * (NH * N) + o_n[None, :],
                   mask=m_s[:, None] & (o_n[None, :] < N), other=0)


@triton.jit
def _store_rows_of_head(x, b_x, bos, i_head, o_s, m_s, NH: tl.constexpr, N: tl.constexpr, BN: tl.constexpr):
    """Store b_x [BT, BN] into rows o_s of head i_head of `[B, T, NH, N]` x, cast once to x's dtype."""
    o_n = tl.arange(0, BN)
    tl.store(x + (bos * NH + i_head) * N + o_s[:, None].to(tl.int64) * (NH * N) + o_n[None, :],
             b_x.to(x.dtype.element_ty), mask=m_s[:, None] & (o_n[None, :] < N))


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
    q, do, lse, delta, g_cumsum, dgc_k, ds, dk_in, dv_in, sink_bias, sink_part, b_k, b_v, i_hq0, i_head, ds_slot0,
    ds_base, i_n, bos, s0, o_s, m_s, T, W, NTOK, NTILE, Q0, cu_seqlens_q, qk_scale, cap_in, WR,
    HQ: tl.constexpr, NH: tl.constexpr, NUM_HEADS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
    BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr, DOT_PREC: tl.constexpr,
    SAFE: tl.constexpr, IS_VARLEN: tl.constexpr, TAIL_Q: tl.constexpr, STORE_DS: tl.constexpr, ACC_IN: tl.constexpr,
    SINK_SUM: tl.constexpr, DK_FROM_DS: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """dK, dV (fp32, unscaled) of the key tile from query heads [i_hq0, i_hq0 + NUM_HEADS): per head, its bases,
    then `dkv_one_head`. TAIL_Q: q and dO hold only the query positions [Q0, T) of sequence i_n (`_tail_start`;
    packed: Q0 from cu_seqlens_q). STORE_DS: head
    i_hq0 + i stores its dS tiles into band ds_slot0 + i of the descriptor `ds` (NTILE tiles a band from tile ds_base,
    `from_ds.py`).
    ACC_IN: start from the fp32 sums in dk_in, dv_in (the heads of earlier launches) instead of zeros. SINK_SUM:
    head i_hq's share of the sink's gradient from this key tile into sink_part `[HQ, NTOK // T * cdiv(T, BT)]` at
    (batch, key tile), packed `[HQ, key tiles]` at the program's tile (`inner.dkv_one_head`). DK_FROM_DS: no dK
    (see `inner.dkv_block`); the first block returned is [BT, BS], NaN where a stored dS tile is not finite."""
    qbos = bos
    if TAIL_Q:
        Q0, qbos = _tail_start(i_n, bos, T, Q0, cu_seqlens_q, IS_VARLEN=IS_VARLEN)
    if DK_FROM_DS:
        b_dk = tl.zeros([BT, BS], dtype=tl.float32)  # not dK: `inner.dkv_block`'s flag block
        b_dv = tl.zeros([BT, BV], dtype=tl.float32)
        if ACC_IN:
            b_dv = _load_rows_of_head(dv_in, bos, i_head, o_s, m_s, NH=NH, N=V, BN=BV)
    elif ACC_IN:
        b_dk, b_dv = _load_kv_tile(dk_in, dv_in, bos, i_head, o_s, m_s, H=NH, K=K, V=V, BK=BK, BV=BV)
    else:
        b_dk = tl.zeros([BT, BK], dtype=tl.float32)
        b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    # Unrolled with the dS store: there a runtime head loop made the loops spill 5x more at run time.
    for i_g in tl.range(0, NUM_HEADS, loop_unroll_factor=NUM_HEADS if STORE_DS else None):
        i_hq = i_hq0 + i_g
        row_base = i_hq.to(tl.int64) * NTOK + bos
        g_base, dgk_base, b_gk = g_cumsum, dgc_k, 0.0
        if USE_G:
            g_base = g_cumsum + row_base
            if not STORE_DS:  # else dQ from dS sums the gate's key side (`from_ds.py`): dgc_k is None
                dgk_base = dgc_k + row_base
            o_s = s0 + tl.arange(0, BT)
            b_gk = tl.load(g_base + o_s, mask=o_s < T, other=0)
        ds_tile0 = 0
        if STORE_DS:
            ds_tile0 = ds_base + tl.cast(ds_slot0 + i_g, tl.int64) * NTILE
        sink2 = 0.0
        if SINK_SUM:
            sink2 = tl.load(sink_bias + i_hq).to(tl.float32) * LOG2E
            if IS_VARLEN:  # at (head, key tile of the packed tile list): this program's tile
                dgk_base = sink_part + i_hq.to(tl.int64) * (tl.num_programs(0) // NH) + tl.program_id(0) // NH
            else:
                NT = tl.cdiv(T, BT)
                dgk_base = sink_part + i_hq.to(tl.int64) * (NTOK // T * NT) + bos // T * NT + s0 // BT
        b_dk, b_dv = dkv_one_head(
            b_k, b_v, b_dk, b_dv, b_gk, q + (qbos * HQ + i_hq) * K, do + (qbos * HQ + i_hq) * V, lse + row_base,
            delta + row_base, g_base, dgk_base, ds, ds_tile0, s0, T, W, Q0, qk_scale, cap_in, WR, HQ * K, HQ * V, sink2,
            K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, DOT_PREC=DOT_PREC, SAFE=SAFE, TAIL_Q=TAIL_Q,
            STORE_DS=STORE_DS, SINK_SUM=SINK_SUM, DK_FROM_DS=DK_FROM_DS, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    return b_dk, b_dv


@triton.jit
def _sum_dsink(dsink_partial, dsink, NUM_PARTIALS, HQ: tl.constexpr, BP: tl.constexpr):
    """dsink[h] = the sum of the dQ kernel's partials `[HQ, NUM_PARTIALS]` of head h, in dsink's dtype, added in a
    fixed order by one program: the same on every run, and no launch of its own (issue 19)."""
    o_p = tl.arange(0, BP)
    for i_hq in range(HQ):
        p_part = dsink_partial + i_hq * NUM_PARTIALS  # HQ * programs: far below 2**31
        b_acc = tl.zeros([BP], dtype=tl.float32)
        for i_p in range(0, NUM_PARTIALS, BP):
            b_acc += tl.load(p_part + i_p + o_p, mask=i_p + o_p < NUM_PARTIALS, other=0)
        tl.store(dsink + i_hq, tl.sum(b_acc, 0).to(dsink.dtype.element_ty))


@triton.jit
def _dkv_tile(
    q, k, v, do, dk, dv, dgc_k, lse, delta, nonfinite, g_cumsum, ds, dk_in, dv_in, sink_bias, sink_part, scale,
    softcap, i_h,
    i_hq0, i_head, ds_slot0, ds_base, i_n, bos, s0, o_s, m_s, T, W, WR, NTOK, NTILE, Q0, cu_seqlens_q,
    HQ: tl.constexpr, H: tl.constexpr, NH: tl.constexpr, NUM_HEADS: tl.constexpr, K: tl.constexpr,
    V: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, DOT_PREC: tl.constexpr, CONTAIN: tl.constexpr, IS_VARLEN: tl.constexpr, TAIL_Q: tl.constexpr,
    STORE_DS: tl.constexpr, ACC_IN: tl.constexpr, ACC_OUT: tl.constexpr, SINK_SUM: tl.constexpr,
    DK_FROM_DS: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Both dK/dV kernels' body: K/V tile of KV head i_h, query heads [i_hq0, i_hq0 + NUM_HEADS), store into row
    i_head of `[B, T, NH, *]`, containing NaN/Inf as CONTAIN says (see `host.add_contained`; the key side of dgc
    and the dS tiles are plain stores, so a recomputed tile overwrites them). STORE_DS, ACC_IN: see `_dkv_heads`;
    ACC_OUT: store the fp32 sums unscaled, for the next chunk of heads to continue. SINK_SUM: see `_dkv_heads`.
    DK_FROM_DS: dV alone (dK is `from_ds.parallel_attn_bwd_kernel_dk_from_ds`'s); dk and dk_in are not read."""
    b_k, b_v = _load_kv_tile(k, v, bos, i_h, o_s, m_s, H=H, K=K, V=V, BK=BK, BV=BV)
    qk_scale, cap_in = score_scales(scale, softcap, SOFTCAP=SOFTCAP)
    b_dk, b_dv = _dkv_heads(
        q, do, lse, delta, g_cumsum, dgc_k, ds, dk_in, dv_in, sink_bias, sink_part, b_k, b_v, i_hq0, i_head,
        ds_slot0, ds_base, i_n, bos, s0, o_s, m_s, T, W, NTOK, NTILE, Q0, cu_seqlens_q, qk_scale, cap_in, WR,
        HQ=HQ, NH=NH, NUM_HEADS=NUM_HEADS, K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, DOT_PREC=DOT_PREC,
        SAFE=CONTAIN == FIXUP, IS_VARLEN=IS_VARLEN, TAIL_Q=TAIL_Q, STORE_DS=STORE_DS, ACC_IN=ACC_IN, SINK_SUM=SINK_SUM,
        DK_FROM_DS=DK_FROM_DS, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    if CONTAIN != FIXUP:
        bad = any_nonfinite(b_dk) | any_nonfinite(b_dv)
        if CONTAIN == INLINE:
            if bad:
                b_dk, b_dv = _dkv_heads(
                    q, do, lse, delta, g_cumsum, dgc_k, ds, dk_in, dv_in, sink_bias, sink_part, b_k, b_v, i_hq0,
                    i_head, ds_slot0, ds_base, i_n, bos, s0, o_s, m_s, T, W, NTOK, NTILE, Q0, cu_seqlens_q, qk_scale,
                    cap_in, WR, HQ=HQ, NH=NH, NUM_HEADS=NUM_HEADS, K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G,
                    DOT_PREC=DOT_PREC, SAFE=True, IS_VARLEN=IS_VARLEN, TAIL_Q=TAIL_Q, STORE_DS=STORE_DS,
                    ACC_IN=ACC_IN, SINK_SUM=SINK_SUM, DK_FROM_DS=DK_FROM_DS, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
        else:
            tl.store(nonfinite + tl.program_id(0), bad.to(tl.int8))
    if DK_FROM_DS:
        _store_rows_of_head(dv, b_dv, bos, i_head, o_s, m_s, NH=NH, N=V, BN=BV)
    else:
        if not ACC_OUT:
            b_dk *= scale
        _store_dkv_tile(dk, dv, b_dk, b_dv, bos, i_head, o_s, m_s, NH=NH, K=K, V=V, BK=BK, BV=BV)


# The dK/dV kernels take the dQ kernel's dsink partials instead of the sink itself.
_DKV_HEURISTICS = {"USE_G": _HEURISTICS["USE_G"], "IS_VARLEN": _HEURISTICS["IS_VARLEN"],
                   "TAIL_Q": _HEURISTICS["TAIL_Q"], "SOFTCAP": _HEURISTICS["SOFTCAP"], "CAUSAL": _HEURISTICS["CAUSAL"],
                   "USE_SINK": lambda args: args["dsink"] is not None}
# The dS-storing kernel: how it stores dS follows from CONTAIN (`ds_store_mode`), ACC_IN from its input sums.
_DKV_DS_HEURISTICS = {"USE_G": _HEURISTICS["USE_G"], "SOFTCAP": _HEURISTICS["SOFTCAP"], "CAUSAL": _HEURISTICS["CAUSAL"],
                      "IS_VARLEN": _HEURISTICS["IS_VARLEN"],
                      "USE_SINK": lambda args: args["sink_bias"] is not None,
                      "STORE_DS": lambda args: ds_store_mode(args["ds"], args["CONTAIN"]),
                      "ACC_IN": lambda args: args["dv_in"] is not None}


def ds_store_mode(ds, contain: int) -> int:
    """STORE_DS of the dS-storing kernel, which also says its launch's scratch (`host.add_contained`): none
    without a dS buffer; by pointer in FIXUP launches (a few recomputed tiles: no descriptor); else by descriptor."""
    if ds is None:
        return 0
    return (DS_BY_POINTER if contain == FIXUP.value else DS_BY_DESCRIPTOR).value


@triton.heuristics(_DKV_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "WR", "NTOK", "B", "NUM_PARTIALS"])
def parallel_attn_bwd_kernel_dkv_per_query_head(
    q, k, v, do, dk, dv, dgc_k, lse, delta, nonfinite, g_cumsum, dsink_partial, dsink, cu_seqlens, cu_seqlens_q,
    chunk_indices, scale, softcap, T, W, WR, NTOK, B, NUM_PARTIALS, Q0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    CONTAIN: tl.constexpr, TAIL_Q: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Query-head-owned dK/dV: one program per (key tile, query head). Writes `[B, T, HQ, *]` buffers (fp32 when G > 1;
    the host then sums each group of G heads). With a sink, program 0 also completes dsink (`_sum_dsink`)."""
    tl.static_assert(BT % BS == 0, "query blocks must tile the key tile")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_hq, i_n, bos, T, s0, o_s, m_s = key_tile(B, T, cu_seqlens, chunk_indices, NH=HQ, BT=BT, IS_VARLEN=IS_VARLEN)
    _dkv_tile(
        q, k, v, do, dk, dv, dgc_k, lse, delta, nonfinite, g_cumsum, None, None, None, None, None, scale, softcap,
        i_h=i_hq // G, i_hq0=i_hq, i_head=i_hq, ds_slot0=0, ds_base=0, i_n=i_n, bos=bos, s0=s0, o_s=o_s, m_s=m_s,
        T=T, W=W, WR=WR, NTOK=NTOK, NTILE=0, Q0=Q0, cu_seqlens_q=cu_seqlens_q, HQ=HQ, H=H, NH=HQ, NUM_HEADS=1, K=K,
        V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, DOT_PREC=DOT_PREC, CONTAIN=CONTAIN, IS_VARLEN=IS_VARLEN,
        TAIL_Q=TAIL_Q, STORE_DS=False, ACC_IN=False, ACC_OUT=False, SINK_SUM=False, DK_FROM_DS=False, SOFTCAP=SOFTCAP,
        CAUSAL=CAUSAL)
    if USE_SINK and CONTAIN != FIXUP:
        if tl.program_id(0) == 0:
            _sum_dsink(dsink_partial, dsink, NUM_PARTIALS, HQ=HQ, BP=128)


@triton.heuristics(_DKV_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "WR", "NTOK", "B", "NUM_PARTIALS"])
def parallel_attn_bwd_kernel_dkv_per_kv_head(
    q, k, v, do, dk, dv, dgc_k, lse, delta, nonfinite, g_cumsum, dsink_partial, dsink, cu_seqlens, cu_seqlens_q,
    chunk_indices, scale, softcap, T, W, WR, NTOK, B, NUM_PARTIALS, Q0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, IS_VARLEN: tl.constexpr, DOT_PREC: tl.constexpr,
    CONTAIN: tl.constexpr, SPLIT: tl.constexpr, TAIL_Q: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """GQA dK/dV: one program per (key tile, KV head) owns the final gradient of its tile. It loads K/V once,
    loops over the G query heads of its group with fp32 accumulators, and stores `[B, T, H, *]` in the inputs'
    dtype: no HQ-shaped scratch, no reduction kernel, no atomics (so it is deterministic).

    With SPLIT > 1 the group's heads are dealt to SPLIT programs of G / SPLIT heads each, which store fp32 partials
    into `[B, T, H * SPLIT, *]` for the host to sum: SPLIT times the programs, for calls too short to keep the GPU
    busy with one program per KV head (the dispatch rule is `config.gqa_split`). With a sink, program 0 also
    completes dsink (`_sum_dsink`)."""
    tl.static_assert(BT % BS == 0, "query blocks must tile the key tile")
    tl.static_assert(G % SPLIT == 0, "SPLIT must divide the group")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_part, i_n, bos, T, s0, o_s, m_s = key_tile(B, T, cu_seqlens, chunk_indices, NH=H * SPLIT, BT=BT,
                                                 IS_VARLEN=IS_VARLEN)
    i_hq0 = i_part * (G // SPLIT)
    _dkv_tile(
        q, k, v, do, dk, dv, dgc_k, lse, delta, nonfinite, g_cumsum, None, None, None, None, None, scale, softcap,
        i_h=i_part // SPLIT, i_hq0=i_hq0, i_head=i_part, ds_slot0=0, ds_base=0, i_n=i_n, bos=bos, s0=s0, o_s=o_s,
        m_s=m_s, T=T, W=W, WR=WR, NTOK=NTOK, NTILE=None, Q0=Q0, cu_seqlens_q=cu_seqlens_q, HQ=HQ, H=H, NH=H * SPLIT,
        NUM_HEADS=G // SPLIT, K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, DOT_PREC=DOT_PREC, CONTAIN=CONTAIN,
        IS_VARLEN=IS_VARLEN, TAIL_Q=TAIL_Q,
        STORE_DS=0, ACC_IN=False, ACC_OUT=False, SINK_SUM=False, DK_FROM_DS=False, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    if USE_SINK and CONTAIN != FIXUP:
        if tl.program_id(0) == 0:
            _sum_dsink(dsink_partial, dsink, NUM_PARTIALS, HQ=HQ, BP=128)


@triton.heuristics(_DKV_DS_HEURISTICS)
@triton.jit(do_not_specialize=["T", "W", "WR", "NTOK", "B", "NTILE", "G0", "TILES"])
def parallel_attn_bwd_kernel_dkv_ds_per_kv_head(
    q, k, v, do, dk, dv, lse, delta, nonfinite, g_cumsum, ds, dk_in, dv_in, sink_bias, sink_part, cu_seqlens,
    chunk_indices, ds_offsets, scale, softcap, T, W, WR, NTOK, B, NTILE, G0, TILES,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, USE_SINK: tl.constexpr, DOT_PREC: tl.constexpr, CONTAIN: tl.constexpr, SPLIT: tl.constexpr,
    STORE_DS: tl.constexpr, ACC_IN: tl.constexpr, ACC_OUT: tl.constexpr, CHUNK: tl.constexpr, HEADS: tl.constexpr,
    DK_FROM_DS: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """The five-product backward's dK/dV (`from_ds.py`; every query, dense or packed): the KV-head-owned kernel's
    loops over HEADS query heads of each program's share of a group, heads [G0, G0 + HEADS) of the share, of a
    chunk of CHUNK heads a share whose dS tiles share one buffer. Each program also stores its dS tiles (STORE_DS:
    through a tensor descriptor, whose scratch Triton allocates at launch, or, in FIXUP launches, by plain stores),
    starts from the earlier launches' fp32 sums (ACC_IN) and, but for the last launch, stores fp32 sums unscaled
    (ACC_OUT). The gate's gradient comes from the stored tiles (`from_ds.py`), not from here; with a sink, each head's
    fp32 sums of p_sink_i * dS_ij over the tile go to sink_part (`from_ds.sink_grad_kernel` makes dsink from them).
    DK_FROM_DS: dV alone, dK from the stored tiles afterwards (`from_ds.parallel_attn_bwd_kernel_dk_from_ds`): head dims
    above 128, where dK's and dV's [BT, D] fp32 sums together spill. Packed (IS_VARLEN: cu_seqlens, chunk_indices):
    sequence i_n's bands, of `from_ds.ds_layout` of its length each (not NTILE), start at tile
    ds_offsets[i_n] * (H * SPLIT * CHUNK) (`host.band_offsets`), of the chunk's TILES tiles."""
    tl.static_assert(BT % BS == 0, "query blocks must tile the key tile")
    tl.static_assert(G % SPLIT == 0, "SPLIT must divide the group")
    if CONTAIN == FIXUP:
        if tl.load(nonfinite + tl.program_id(0)) == 0:
            return
    i_part, i_n, bos, T, s0, o_s, m_s = key_tile(B, T, cu_seqlens, chunk_indices, NH=H * SPLIT, BT=BT,
                                                 IS_VARLEN=IS_VARLEN)
    i_hq0 = i_part * (G // SPLIT)
    i_hq0 += G0
    if IS_VARLEN:  # the band of this launch's first head among its sequence's (KV head and share, head in chunk)
        ds_base, NTILE = band_of(ds_offsets, i_n)
        ds_base *= H * SPLIT * CHUNK
        ds_slot0 = i_part * CHUNK + G0 % CHUNK
    else:  # (batch, KV head and share, head in chunk)
        ds_base = 0
        ds_slot0 = (bos // T * (H * SPLIT) + i_part) * CHUNK + G0 % CHUNK
    if STORE_DS == DS_BY_DESCRIPTOR:
        # One [tiles * BT, BS] view of the chunk's tiles (< 2**31 rows: `dispatch.ds_chunk`).
        if IS_VARLEN:
            ds = tl.make_tensor_descriptor(ds, shape=[TILES * BT, BS], strides=[BS, 1], block_shape=[BT, BS])
        else:
            ds = tl.make_tensor_descriptor(ds, shape=[B * (H * SPLIT * CHUNK) * NTILE * BT, BS], strides=[BS, 1],
                                           block_shape=[BT, BS])
    _dkv_tile(
        q, k, v, do, dk, dv, None, lse, delta, nonfinite, g_cumsum, ds, dk_in, dv_in, sink_bias, sink_part, scale,
        softcap,
        i_h=i_part // SPLIT, i_hq0=i_hq0, i_head=i_part, ds_slot0=ds_slot0, ds_base=ds_base, i_n=i_n, bos=bos,
        s0=s0, o_s=o_s, m_s=m_s, T=T, W=W, WR=WR, NTOK=NTOK, NTILE=NTILE, Q0=None, cu_seqlens_q=None, HQ=HQ, H=H,
        NH=H * SPLIT, NUM_HEADS=HEADS, K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, DOT_PREC=DOT_PREC,
        CONTAIN=CONTAIN, IS_VARLEN=IS_VARLEN, TAIL_Q=False,
        STORE_DS=STORE_DS, ACC_IN=ACC_IN, ACC_OUT=ACC_OUT, SINK_SUM=USE_SINK, DK_FROM_DS=DK_FROM_DS, SOFTCAP=SOFTCAP,
        CAUSAL=CAUSAL)
