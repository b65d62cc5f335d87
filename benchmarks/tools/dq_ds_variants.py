# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Experiment harness (issue 18): variants of the dQ-from-dS kernel timed alone on synthetic dS tiles, each checked
bitwise against the package's kernel (same inputs, same sums in the same order). Kernel time only: CUDA events, L2
flushed (`triton.testing.do_bench`), medians.

    python -m benchmarks.tools.dq_ds_variants --rows mha-long,gqa4-long,g8-T8192

Variants: "base" (the package's kernel at `config.DQ_FROM_DS_LAUNCH`), "wide" (the bulk loop as one [2 BQ, BK]
product per key tile: the two blocks' dS tiles loaded as one [BT, 2 BQ] block), "wide8" (that at 8 warps), and
"pre" (the base kernel's bulk loop with the next key tile's loads issued before this tile's products).
"""

import argparse
import json

import torch
import triton
import triton.language as tl

from fla_bwd.ops.attn import config
from fla_bwd.ops.attn.from_ds import (_dq_ds_edge, _dq_ds_edge_block, _key_ranges, ds_layout,
                                      parallel_attn_bwd_kernel_dq_from_ds)
from fla_bwd.ops.attn.inner import any_nonfinite, ds_tile_index, finite_rows, load_rows
from fla_bwd.utils import cdiv

def _old_kernel():
    """The previous session's kernel (exp/old_from_ds.py, not in the repository), if present: the A of an A/B."""
    try:
        from exp.old_from_ds import parallel_attn_bwd_kernel_dq_from_ds as old
        return old
    except ImportError:
        return parallel_attn_bwd_kernel_dq_from_ds


# name -> (B, T, H, G, CHUNK): the five-product backward's dQ launches of these registry rows (chunk at 1 GiB).
ROWS = {"mha-long": (2, 2048, 32, 1, 1), "gqa4-long": (2, 2048, 8, 4, 4), "g8-T8192": (1, 8192, 4, 8, 2),
        "g2-T2048-D128": (2, 2048, 16, 2, 2)}


@triton.jit
def _prologue(NUM_BANDS: tl.constexpr, H: tl.constexpr, CHUNK: tl.constexpr, G: tl.constexpr, T, W, G0,
              BT: tl.constexpr, BQ: tl.constexpr):
    i_band = tl.program_id(0) % NUM_BANDS
    i_p = tl.num_programs(0) // NUM_BANDS - 1 - tl.program_id(0) // NUM_BANDS
    i_b, i_h, i_c = i_band // (H * CHUNK), i_band // CHUNK % H, i_band % CHUNK
    return i_band, i_p, i_b, i_h, i_h * G + G0 + i_c


@triton.jit
def _store_pair(dq, b_dqa, b_dqb, bos, i_hq, ta, T, scale, HQ: tl.constexpr, K: tl.constexpr, BQ: tl.constexpr,
                BK: tl.constexpr):
    o_k = tl.arange(0, BK)
    p_dq = dq + (bos * HQ + i_hq) * K + o_k[None, :]
    o_t = ta + tl.arange(0, BQ)
    tl.store(p_dq + o_t[:, None].to(tl.int64) * (HQ * K), (b_dqa * scale).to(dq.dtype.element_ty),
             mask=(o_t < T)[:, None] & (o_k < K)[None, :])
    o_t += BQ
    tl.store(p_dq + o_t[:, None].to(tl.int64) * (HQ * K), (b_dqb * scale).to(dq.dtype.element_ty),
             mask=(o_t < T)[:, None] & (o_k < K)[None, :])


@triton.jit(do_not_specialize=["T", "W", "NTILE", "G0"])
def dq_from_ds_wide(
    k, ds, dq, scale, T, W, NTILE, G0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, CHUNK: tl.constexpr, K: tl.constexpr,
    BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NUM_BANDS: tl.constexpr, PREFETCH: tl.constexpr,
):
    """The package kernel with its bulk loop as one [2 BQ, BK] product a key tile (PREFETCH=False), or the bulk
    loop of the package kernel with the next tile's loads issued first (PREFETCH=True)."""
    i_band, i_p, i_b, i_h, i_hq = _prologue(NUM_BANDS, H, CHUNK, G, T, W, G0, BT, BQ)
    bos = i_b.to(tl.int64) * T
    qa = 2 * i_p
    ta = qa * BQ
    lo_a, mid_a, hi_a = _key_ranges(ta, W, BT=BT, BQ=BQ)
    lo_b, mid_b, hi_b = _key_ranges(ta + BQ, W, BT=BT, BQ=BQ)
    b_exists = ta + BQ < T
    ds_base = ds + i_band.to(tl.int64) * NTILE * (BT * BQ)
    k_base = k + (bos * H + i_h) * K
    o_r = tl.arange(0, BT)
    b_dqa = tl.zeros([BQ, BK], dtype=tl.float32)
    b_dqb = tl.zeros([BQ, BK], dtype=tl.float32)
    m = tl.minimum(tl.maximum(mid_a, mid_b), hi_a)
    for i_j in range(lo_a, m):
        b_dqa, b_dqb = _dq_ds_edge(b_dqa, b_dqb, ds_base, k_base, qa, i_j, lo_a, mid_a, hi_a, lo_b, mid_b, hi_b,
                                   b_exists, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK)
    i_ta = ds_tile_index(qa, 0, W, BQ=BQ, BT=BT).to(tl.int32)
    i_tb = tl.where(b_exists, ds_tile_index(qa + 1, 0, W, BQ=BQ, BT=BT).to(tl.int32), i_ta)
    o_kr = o_r[:, None] * (H * K) + tl.arange(0, BK)[None, :]
    m_k = (tl.arange(0, BK) < K)[None, :]
    if PREFETCH:
        o_c = tl.arange(0, BQ)
        o_ds = o_r[:, None] * BQ + o_c[None, :]
        i_first = tl.minimum(m, tl.maximum(hi_a - 1, 0))
        m_first = (o_r < T)[:, None] & m_k
        b_k = tl.load(k_base + tl.cast(i_first, tl.int64) * (BT * H * K) + o_kr, mask=m_first, other=0)
        b_dsta = tl.load(ds_base + (i_ta + i_first) * (BT * BQ) + o_ds)
        b_dstb = tl.load(ds_base + (i_tb + i_first) * (BT * BQ) + o_ds)
        for i_j in range(m, hi_a):
            i_n = tl.minimum(i_j + 1, hi_a - 1)
            b_kn = tl.load(k_base + tl.cast(i_n, tl.int64) * (BT * H * K) + o_kr, mask=m_k, other=0)
            b_dstan = tl.load(ds_base + (i_ta + i_n) * (BT * BQ) + o_ds)
            b_dstbn = tl.load(ds_base + (i_tb + i_n) * (BT * BQ) + o_ds)
            b_dqa += tl.dot(tl.trans(b_dsta), b_k)
            b_dqb += tl.dot(tl.trans(b_dstb), b_k)
            b_k, b_dsta, b_dstb = b_kn, b_dstan, b_dstbn
    else:
        # [2 BQ, BK]: rows [0, BQ) block a, [BQ, 2 BQ) block b
        b_dq = tl.reshape(tl.permute(tl.join(b_dqa, b_dqb), (2, 0, 1)), (2 * BQ, BK))
        o_c2 = tl.arange(0, 2 * BQ)
        i_col = tl.where(o_c2 < BQ, i_ta, i_tb)
        o_ds2 = o_r[:, None] * BQ + (o_c2 % BQ)[None, :]
        for i_j in range(m, hi_a):
            b_k = tl.load(k_base + tl.cast(i_j, tl.int64) * (BT * H * K) + o_kr, mask=m_k, other=0)
            # [BT, 2 BQ]
            b_dst = tl.load(ds_base + ((i_col + i_j) * (BT * BQ))[None, :] + o_ds2)
            b_dq += tl.dot(tl.trans(b_dst), b_k)
        b_dqa, b_dqb = tl.split(tl.permute(tl.reshape(b_dq, (2, BQ, BK)), (1, 2, 0)))
    for i_j in range(hi_a, tl.where(b_exists, hi_b, hi_a) + 1):
        b_dqa, b_dqb = _dq_ds_edge(b_dqa, b_dqb, ds_base, k_base, qa, i_j, lo_a, mid_a, hi_a, lo_b, mid_b, hi_b,
                                   b_exists, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK)
    _store_pair(dq, b_dqa, b_dqb, bos, i_hq, ta, T, scale, HQ=HQ, K=K, BQ=BQ, BK=BK)


@triton.jit
def _multi_edge(b_dq, ds_base, k_base, i_j, o_col, lo_c, mid_c, hi_c, i_col, m_col, T, stride_k,
                K: tl.constexpr, BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NB: tl.constexpr):
    """dq += dS K for key tile i_j, which some of the NB blocks see in part or not at all (their dS loads as 0).
    Column c of the [BT, NB * BQ] dS^T block belongs to block c // BQ (its o_col entry). A tile seen in part
    multiplies K with its non-finite rows zeroed, one seen whole K itself; only when the tile has a non-finite row
    do the two differ, and then each block takes its own product (rows of the others kept)."""
    o_r = tl.arange(0, BT)
    seen = m_col & (i_j >= lo_c) & (i_j <= hi_c)
    # [BT, NB * BQ]
    b_dst = tl.load(ds_base + ((i_col + i_j) * (BT * BQ))[None, :] + o_r[:, None] * BQ + (o_col % BQ)[None, :],
                    mask=seen[None, :], other=0)
    # [BT, BK]
    b_k = load_rows(k_base, i_j * BT + o_r, T, stride_k, N=K, BN=BK, FULL=False)
    if any_nonfinite(b_k):
        b_kf, _ = finite_rows(b_k)
        whole = (i_j >= mid_c) & (i_j < hi_c)
        for x in tl.static_range(NB):
            w = tl.sum(tl.where(o_col == x * BQ, whole.to(tl.int32), 0), 0) != 0
            b_dq = tl.where((o_col // BQ == x)[:, None], tl.dot(tl.trans(b_dst), tl.where(w, b_k, b_kf), b_dq), b_dq)
    else:
        b_dq = tl.dot(tl.trans(b_dst), b_k, b_dq)
    return b_dq


@triton.jit(do_not_specialize=["T", "W", "NTILE", "G0"])
def dq_from_ds_multi(
    k, ds, dq, scale, T, W, NTILE, G0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, CHUNK: tl.constexpr, K: tl.constexpr,
    BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NUM_BANDS: tl.constexpr, NB: tl.constexpr,
):
    """dq of NB consecutive query blocks as one [NB * BQ, BK] accumulator: each key tile is loaded once for all NB
    (the K reads through L2 were as many bytes as the dS reads at NB = 2)."""
    i_band, i_p, i_b, i_h, i_hq = _prologue(NUM_BANDS, H, CHUNK, G, T, W, G0, BT, BQ)
    bos = i_b.to(tl.int64) * T
    t0 = i_p * (NB * BQ)
    o_col = tl.arange(0, NB * BQ)
    # per column: its block's first query, key ranges, existence, first tile
    t_col = t0 + o_col // BQ * BQ
    lo_c = tl.maximum(t_col - W + 1, 0) // BT
    hi_c = t_col // BT
    mid_c = tl.maximum(lo_c, tl.minimum(tl.cdiv(tl.maximum(t_col + BQ - W, 0), BT), hi_c))
    m_col = t_col < T
    i_col = ds_tile_index(tl.where(m_col, t_col // BQ, t0 // BQ), 0, W, BQ=BQ, BT=BT).to(tl.int32)
    lo_a, mid_a, hi_a = _key_ranges(t0, W, BT=BT, BQ=BQ)
    hi_last = (tl.minimum(t0 + (NB - 1) * BQ, (T - 1) // BQ * BQ)) // BT
    m = tl.minimum(tl.max(mid_c, 0), hi_a)  # [m, hi_a): every block sees the tile whole
    ds_base = ds + i_band.to(tl.int64) * NTILE * (BT * BQ)
    k_base = k + (bos * H + i_h) * K
    o_r = tl.arange(0, BT)
    b_dq = tl.zeros([NB * BQ, BK], dtype=tl.float32)
    for i_j in range(lo_a, m):
        b_dq = _multi_edge(b_dq, ds_base, k_base, i_j, o_col, lo_c, mid_c, hi_c, i_col, m_col, T, H * K,
                           K=K, BT=BT, BQ=BQ, BK=BK, NB=NB)
    o_kr = o_r[:, None] * (H * K) + tl.arange(0, BK)[None, :]
    m_k = (tl.arange(0, BK) < K)[None, :]
    o_ds = o_r[:, None] * BQ + (o_col % BQ)[None, :]
    for i_j in range(m, hi_a):
        b_k = tl.load(k_base + tl.cast(i_j, tl.int64) * (BT * H * K) + o_kr, mask=m_k, other=0)
        # [BT, NB * BQ]
        b_dst = tl.load(ds_base + ((i_col + i_j) * (BT * BQ))[None, :] + o_ds)
        b_dq = tl.dot(tl.trans(b_dst), b_k, b_dq)
    for i_j in range(hi_a, hi_last + 1):
        b_dq = _multi_edge(b_dq, ds_base, k_base, i_j, o_col, lo_c, mid_c, hi_c, i_col, m_col, T, H * K,
                           K=K, BT=BT, BQ=BQ, BK=BK, NB=NB)
    o_k = tl.arange(0, BK)
    o_t = t0 + o_col
    tl.store(dq + (bos * HQ + i_hq) * K + o_t[:, None].to(tl.int64) * (HQ * K) + o_k[None, :],
             (b_dq * scale).to(dq.dtype.element_ty), mask=(o_t < T)[:, None] & (o_k < K)[None, :])



@triton.jit
def _quad_edge(b_dqa, b_dqb, b_dqc, b_dqd, ds_base, k_base, qa, i_j, r_a, r_b, r_c, r_d, e_b, e_c, e_d, T, W,
               stride_k, K: tl.constexpr, BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr):
    """Key tile i_j for query blocks qa .. qa + 3 where at least one of them does not see it whole; r_x are block
    x's (lo, mid, hi), e_x whether it exists."""
    b_k = load_rows(k_base, i_j * BT + tl.arange(0, BT), T, stride_k, N=K, BN=BK, FULL=False)
    b_kf, _ = finite_rows(b_k)
    b_dqa = _dq_ds_edge_block(b_dqa, ds_base, b_k, b_kf, qa, i_j, r_a[0], r_a[1], r_a[2], True, W, BT=BT, BQ=BQ)
    b_dqb = _dq_ds_edge_block(b_dqb, ds_base, b_k, b_kf, qa + 1, i_j, r_b[0], r_b[1], r_b[2], e_b, W, BT=BT, BQ=BQ)
    b_dqc = _dq_ds_edge_block(b_dqc, ds_base, b_k, b_kf, qa + 2, i_j, r_c[0], r_c[1], r_c[2], e_c, W, BT=BT, BQ=BQ)
    b_dqd = _dq_ds_edge_block(b_dqd, ds_base, b_k, b_kf, qa + 3, i_j, r_d[0], r_d[1], r_d[2], e_d, W, BT=BT, BQ=BQ)
    return b_dqa, b_dqb, b_dqc, b_dqd


@triton.jit
def _store_block(dq, b_dq, bos, i_hq, t0, T, scale, HQ: tl.constexpr, K: tl.constexpr, BQ: tl.constexpr,
                 BK: tl.constexpr):
    o_k = tl.arange(0, BK)
    o_t = t0 + tl.arange(0, BQ)
    tl.store(dq + (bos * HQ + i_hq) * K + o_t[:, None].to(tl.int64) * (HQ * K) + o_k[None, :],
             (b_dq * scale).to(dq.dtype.element_ty), mask=(o_t < T)[:, None] & (o_k < K)[None, :])


@triton.jit(do_not_specialize=["T", "W", "NTILE", "G0"])
def dq_from_ds_quad(
    k, ds, dq, scale, T, W, NTILE, G0, NTOK,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, CHUNK: tl.constexpr, K: tl.constexpr,
    BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NUM_BANDS: tl.constexpr, TMA: tl.constexpr,
):
    """dq of four consecutive query blocks a..d, each key tile loaded once for the four (half the pair kernel's K
    reads per block); the bulk loop's tiles through tensor descriptors (TMA) or pointers."""
    i_band, i_p, i_b, i_h, i_hq = _prologue(NUM_BANDS, H, CHUNK, G, T, W, G0, BT, BQ)
    bos = i_b.to(tl.int64) * T
    qa = 4 * i_p
    ta = qa * BQ
    r_a = _key_ranges(ta, W, BT=BT, BQ=BQ)
    r_b = _key_ranges(ta + BQ, W, BT=BT, BQ=BQ)
    r_c = _key_ranges(ta + 2 * BQ, W, BT=BT, BQ=BQ)
    r_d = _key_ranges(ta + 3 * BQ, W, BT=BT, BQ=BQ)
    e_b = ta + BQ < T
    e_c = ta + 2 * BQ < T
    e_d = ta + 3 * BQ < T
    ds_base = ds + i_band.to(tl.int64) * NTILE * (BT * BQ)
    k_base = k + (bos * H + i_h) * K
    b_dqa = tl.zeros([BQ, BK], dtype=tl.float32)
    b_dqb = tl.zeros([BQ, BK], dtype=tl.float32)
    b_dqc = tl.zeros([BQ, BK], dtype=tl.float32)
    b_dqd = tl.zeros([BQ, BK], dtype=tl.float32)
    hi_a = r_a[2]
    m = tl.minimum(tl.maximum(tl.maximum(r_a[1], r_b[1]), tl.maximum(r_c[1], r_d[1])), hi_a)
    for i_j in range(r_a[0], m):
        b_dqa, b_dqb, b_dqc, b_dqd = _quad_edge(b_dqa, b_dqb, b_dqc, b_dqd, ds_base, k_base, qa, i_j, r_a, r_b, r_c,
                                                r_d, e_b, e_c, e_d, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK)
    i_ta = ds_tile_index(qa, 0, W, BQ=BQ, BT=BT)
    i_tb = tl.where(e_b, ds_tile_index(qa + 1, 0, W, BQ=BQ, BT=BT), i_ta)
    i_tc = tl.where(e_c, ds_tile_index(qa + 2, 0, W, BQ=BQ, BT=BT), i_ta)
    i_td = tl.where(e_d, ds_tile_index(qa + 3, 0, W, BQ=BQ, BT=BT), i_ta)
    if TMA:
        d_ds = tl.make_tensor_descriptor(ds, shape=[NUM_BANDS * NTILE * BT, BQ], strides=[BQ, 1],
                                         block_shape=[BT, BQ])
        d_k = tl.make_tensor_descriptor(k, shape=[NTOK, H * K], strides=[H * K, 1], block_shape=[BT, BK])
        row0 = (i_band * NTILE).to(tl.int32)
        for i_j in range(m, hi_a):
            b_k = d_k.load([(bos + i_j * BT).to(tl.int32), i_h * K])
            b_dsta = d_ds.load([((row0 + i_ta + i_j) * BT).to(tl.int32), 0])
            b_dstb = d_ds.load([((row0 + i_tb + i_j) * BT).to(tl.int32), 0])
            b_dstc = d_ds.load([((row0 + i_tc + i_j) * BT).to(tl.int32), 0])
            b_dstd = d_ds.load([((row0 + i_td + i_j) * BT).to(tl.int32), 0])
            b_dqa = tl.dot(tl.trans(b_dsta), b_k, b_dqa)
            b_dqb = tl.dot(tl.trans(b_dstb), b_k, b_dqb)
            b_dqc = tl.dot(tl.trans(b_dstc), b_k, b_dqc)
            b_dqd = tl.dot(tl.trans(b_dstd), b_k, b_dqd)
    else:
        o_r = tl.arange(0, BT)
        o_ds = o_r[:, None] * BQ + tl.arange(0, BQ)[None, :]
        o_kr = o_r[:, None] * (H * K) + tl.arange(0, BK)[None, :]
        m_k = (tl.arange(0, BK) < K)[None, :]
        for i_j in range(m, hi_a):
            b_k = tl.load(k_base + tl.cast(i_j, tl.int64) * (BT * H * K) + o_kr, mask=m_k, other=0)
            b_dqa = tl.dot(tl.trans(tl.load(ds_base + (i_ta + i_j) * (BT * BQ) + o_ds)), b_k, b_dqa)
            b_dqb = tl.dot(tl.trans(tl.load(ds_base + (i_tb + i_j) * (BT * BQ) + o_ds)), b_k, b_dqb)
            b_dqc = tl.dot(tl.trans(tl.load(ds_base + (i_tc + i_j) * (BT * BQ) + o_ds)), b_k, b_dqc)
            b_dqd = tl.dot(tl.trans(tl.load(ds_base + (i_td + i_j) * (BT * BQ) + o_ds)), b_k, b_dqd)
    hi_last = tl.where(e_d, r_d[2], tl.where(e_c, r_c[2], tl.where(e_b, r_b[2], hi_a)))
    for i_j in range(hi_a, hi_last + 1):
        b_dqa, b_dqb, b_dqc, b_dqd = _quad_edge(b_dqa, b_dqb, b_dqc, b_dqd, ds_base, k_base, qa, i_j, r_a, r_b, r_c,
                                                r_d, e_b, e_c, e_d, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK)
    _store_block(dq, b_dqa, bos, i_hq, ta, T, scale, HQ=HQ, K=K, BQ=BQ, BK=BK)
    _store_block(dq, b_dqb, bos, i_hq, ta + BQ, T, scale, HQ=HQ, K=K, BQ=BQ, BK=BK)
    _store_block(dq, b_dqc, bos, i_hq, ta + 2 * BQ, T, scale, HQ=HQ, K=K, BQ=BQ, BK=BK)
    _store_block(dq, b_dqd, bos, i_hq, ta + 3 * BQ, T, scale, HQ=HQ, K=K, BQ=BQ, BK=BK)


VARIANTS = {
    "base": (parallel_attn_bwd_kernel_dq_from_ds, {}, None),
    "old": (_old_kernel(), {}, None),
    "wide": (dq_from_ds_wide, dict(num_warps=4, num_stages=3), False),
    "wide8": (dq_from_ds_wide, dict(num_warps=8, num_stages=3), False),
    "wide8s2": (dq_from_ds_wide, dict(num_warps=8, num_stages=2), False),
    "pre": (dq_from_ds_wide, dict(num_warps=4, num_stages=1), True),
    "quad": (dq_from_ds_quad, dict(num_warps=8, num_stages=3), False),
    "quadtma": (dq_from_ds_quad, dict(num_warps=8, num_stages=3), True),
    "quadtma4": (dq_from_ds_quad, dict(num_warps=8, num_stages=4), True),
    "quadtma2": (dq_from_ds_quad, dict(num_warps=8, num_stages=2), True),
    "multi2": (dq_from_ds_multi, dict(num_warps=4, num_stages=3), 2),
    "multi4w8": (dq_from_ds_multi, dict(num_warps=8, num_stages=3), 4),
    "multi4w8s2": (dq_from_ds_multi, dict(num_warps=8, num_stages=2), 4),
    "multi4w4": (dq_from_ds_multi, dict(num_warps=4, num_stages=2), 4),
}


def make(row, D=128, W=None, device="cuda", BT=64, BQ=64):
    B, T, H, G, CHUNK = ROWS[row]
    W = T if W is None else W
    gen = torch.Generator(device="cpu").manual_seed(0)
    k = torch.randn(B, T, H, D, generator=gen).to(device, torch.bfloat16)
    ntile = ds_layout(T, W, BQ, BT)
    bands = B * H * CHUNK
    ds = (torch.randn(bands * ntile * BT * BQ, generator=gen) * 0.1).to(device, torch.bfloat16)
    return dict(k=k, ds=ds, scale=D ** -0.5, T=T, W=W, NTILE=ntile, G0=0, HQ=H * G, H=H, G=G, CHUNK=CHUNK, K=D,
                BT=BT, BQ=BQ, BK=D, NUM_BANDS=bands), (B, T, H * G, D), cdiv(T, 2 * BQ) * bands


def launch(name, args, shape, grid):
    kernel, opts, prefetch = VARIANTS[name]
    dq = torch.full(shape, float("nan"), device=args["k"].device, dtype=torch.bfloat16)
    extra = {} if prefetch is None else dict(NB=prefetch) if kernel is dq_from_ds_multi else dict(PREFETCH=prefetch)
    if kernel is dq_from_ds_quad:
        extra = dict(TMA=prefetch, NTOK=shape[0] * shape[1])
        grid = cdiv(args["T"], 4 * args["BQ"]) * args["NUM_BANDS"]
    opts = opts or config.DQ_FROM_DS_LAUNCH
    if kernel is dq_from_ds_multi:
        grid = cdiv(args["T"], prefetch * args["BQ"]) * args["NUM_BANDS"]
    fn = lambda: kernel[(grid,)](dq=dq, **args, **extra, **opts)  # noqa: E731
    return dq, fn


def _scratch(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


def main():
    triton.set_allocator(_scratch)
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="mha-long,gqa4-long,g8-T8192")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out = []
    for row in a.rows.split(","):
        args, shape, grid = make(row)
        nbytes = args["ds"].numel() * 2
        ref, fn = launch("base", args, shape, grid)
        fn()
        res = {"row": row, "ds_MB": round(nbytes / 1e6, 1)}
        for name in a.variants.split(","):
            try:
                dq, fn = launch(name, args, shape, grid)
                fn()
                torch.cuda.synchronize()
                chunks = dq.view(shape[0], shape[1], -1, args["G"], shape[3])[:, :, :, :args["CHUNK"]]
                want = ref.view_as(dq).view(shape[0], shape[1], -1, args["G"], shape[3])[:, :, :, :args["CHUNK"]]
                us = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3
                res[name] = dict(us=round(us, 1), TBps=round(nbytes / us / 1e6, 2),
                                 bitwise=bool(torch.equal(chunks, want)),
                                 written=bool(not torch.isnan(chunks).any()))
            except Exception as e:  # report and go on: one variant's compile error must not hide the others
                res[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
        print(json.dumps(res), flush=True)
        out.append(res)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
