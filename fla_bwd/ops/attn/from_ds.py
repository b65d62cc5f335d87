# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The five-product backward (issue 18): dQ from the dS tiles that the dK/dV kernel already forms.

The seven-product backward runs a dQ kernel that recomputes S = Q K^T and dP = dO V^T for every visible pair (two
products) before its dq += dS K. Here the KV-head-owned dK/dV kernel stores each dS tile it consumes (16-bit, the
exact values its dK product reads), and a dQ kernel reads them back: dq_i = scale * sum_j dS_ij K_j, one product a
tile, summed in a fixed order (deterministic, no atomics). In order:

1. `delta_kernel`: delta = rowsum(o * dO) (fp32), which the dK/dV kernel needs before it runs;
2. per chunk of query heads (`ds_chunk`): the dK/dV kernel with STORE_DS over those heads of every group's share
   (each group's heads dealt to `split` programs a key tile, `FiveProduct`), one or two heads a launch
   (`config.DS_TWO_HEADS_BELOW_T`), carrying fp32 dK/dV sums from launch to launch (bitwise the sums of one launch:
   the same additions in the same order), then `parallel_attn_bwd_kernel_dq_from_ds` for the chunk's dq rows
   (gated: and `key_side_kernel`, which adds up the dQ kernel's partial key sums, or, up to
   `config.GATE_GRAD_BY_BAND_MAX_T`, `gate_grad_of_band_kernel`, which adds them up and scans dg in one launch);
3. with a split, the shares' fp32 partials summed in order (`add_group_sum`, as the seven-product split paths).

Layout of the stored tiles (`ds_layout`): per (batch, KV head, head of the chunk) a band of NTILE tiles; tile
(query block qi of BQ rows, key tile kj of BT keys) for every key tile that qi sees, in query-block order and then
key order, as a row-major [BT keys, BQ queries] block (dS transposed, as the dK/dV kernel holds it). With a window
only the band of visible tiles is stored. BQ and BT are the dK/dV kernel's BS and BT.

With a gate, delta comes from o plus the forward's rounding residual o_lo (`needs_exact_o`); dQ from dS also sums
both sides of the gate's gradient from the stored 16-bit tiles (the query side per row, the key side as per-program
partial sums that `key_side_kernel` adds in program order; the dK/dV kernels compute none of it, PERF.md #52, #53):
the reverse cumsum of dg then cancels the pairs both sides share exactly, as it does in seven products, where both
sides are fp32 (PERF.md #47).

Scope: dense (no cu_seqlens), 16-bit q/k/v, head dims up to 128, no sink; gated calls only where the forward made
o_lo (eager calls, `host.forward`'s for_backward). "auto" takes it where it
measured faster (`five_product_chunk`): long full-causal MHA and GQA whose launches keep the GPU busy, split where
one program per KV head would not (#42q); windows and D = 64 lost (PERF.md #42). The dS store goes through a
device-side tensor descriptor (a bulk copy from shared memory): per-element pointer stores cost more (#42c). A
launch runs at most two heads of each share: with a head loop around the store the dK/dV kernel spilled 5x more at
run time (#42i). On Hopper, calls with K = V = 128 and T a multiple of 128 run the warp-specialized Gluon kernel
instead (`gluon_dkv.py`, one launch a chunk, its own split rule; FLA_BWD_DS_KERNEL picks, PERF.md #42w).
"""

import functools
import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from fla_bwd import settings
from fla_bwd.ops.attn import config, gluon_dkv
from fla_bwd.ops.attn.config import tile_config
from fla_bwd.ops.attn.inner import ds_tile_index, finite_rows, load_rows, o_lo_decode
from fla_bwd.ops.attn.parallel import dkv_kernel_for
from fla_bwd.ops.utils.cumsum import add_gate_grad
from fla_bwd.ops.utils.group_sum import add_group_sum
from fla_bwd.ops.utils.launch import Ref
from fla_bwd.utils import cdiv, is_interpreter, next_power_of_2

# ----------------------------------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------------------------------

def _floor_sum(n: int, R: int) -> int:
    m = n // R
    return R * m * (m - 1) // 2 + (n % R) * m


def ds_first_tile(qi: int, W: int, BQ: int, BT: int) -> int:
    """The host twin of `inner.ds_tile_index(qi, 0, ...)`: the index of query block qi's tiles in its band, minus
    the first key tile qi sees, so that tile kj of qi is at `ds_first_tile(qi) + kj`."""
    shifted = max(qi - cdiv(W - 1, BQ), 0)
    return qi + _floor_sum(qi, BT // BQ) - _floor_sum(shifted, BT // BQ) - max(qi * BQ + 1 - W, 0) // BT


def ds_layout(T: int, W: int, BQ: int, BT: int) -> int:
    """NTILE: the tiles of one band, i.e. (query block, key tile) pairs that share a visible (query, key) pair for a
    sequence of T tokens and window W (W >= T: causal). Query block qi sees key tiles lo(qi)..hi(qi) with
    lo = max(qi * BQ - W + 1, 0) // BT and hi = qi // (BT // BQ)."""
    nqb = cdiv(T, BQ)
    return ds_first_tile(nqb, W, BQ, BT) + max(nqb * BQ + 1 - W, 0) // BT if nqb else 0


# ----------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.heuristics({"EXACT_O": lambda args: args["o_lo"] is not None})
@triton.jit(do_not_specialize=["R", "NTOK"])
def delta_kernel(o, o_lo, do, delta, R, NTOK, HQ: tl.constexpr, V: tl.constexpr, BR: tl.constexpr,
                 BV: tl.constexpr, EXACT_O: tl.constexpr):
    """delta `[HQ, NTOK]` (fp32) = rowsum(o * dO) over the R = NTOK * HQ rows of o, dO `[NTOK, HQ, V]`; EXACT_O:
    with o in fp32, from o and the forward's int8 o_lo (`inner.o_lo_decode`, `parallel_attn_fwd_kernel`)."""
    o_r = tl.program_id(0) * BR + tl.arange(0, BR)
    o_v = tl.arange(0, BV)
    m = (o_r < R)[:, None] & (o_v < V)[None, :]
    p = o_r.to(tl.int64)[:, None] * V + o_v[None, :]
    # [BR, BV]
    b_o = tl.load(o + p, mask=m, other=0)
    if EXACT_O:
        b_o = o_lo_decode(b_o, tl.load(o_lo + p, mask=m, other=0))
    else:
        b_o = b_o.to(tl.float32)
    b_do = tl.load(do + p, mask=m, other=0).to(tl.float32)
    o_tok, o_hq = o_r // HQ, o_r % HQ
    tl.store(delta + o_hq.to(tl.int64) * NTOK + o_tok, tl.sum(b_o * b_do, 1), mask=o_r < R)


@triton.jit
def _dq_ds_edge_block(b_dq, b_rs, b_ks, b_ones_k, b_ones_q, ds_base, b_kf, qi, i_j, lo, hi, exists, W,
                      BT: tl.constexpr, BQ: tl.constexpr, USE_G: tl.constexpr):
    """dq += dS K for query block qi and key tile i_j, which qi may see whole, in part (window edge, diagonal:
    masked) or not at all (outside [lo, hi], or no block qi: its dS loads as 0 and adds exactly 0). b_kf is the key
    tile with its non-finite elements zeroed (`inner.finite_rows`): where a row cannot see a key the stored dS is
    0, and 0 * Inf = NaN would reach rows that do not depend on it, while the rows that see a bad key hold NaN in
    dS (see `inner.finite_rows`). Whole tiles take b_kf too: the tile and b_kf both live spilled (PERF.md #64).
    USE_G: b_rs += the tile's row sums of dS (`_row_sums`), b_ks += its column sums (`_key_sums`), the diagonal
    dS_pp included in both: it enters dgc at p as +dS_pp and -dS_pp (PERF.md #64)."""
    o_r = tl.arange(0, BT)
    o_c = tl.arange(0, BQ)
    seen = exists & (i_j >= lo) & (i_j <= hi)
    i_tile = ds_tile_index(qi, i_j, W, BQ=BQ, BT=BT)
    # [BT, BQ]
    b_dst = tl.load(ds_base + i_tile * (BT * BQ) + o_r[:, None] * BQ + o_c[None, :],
                    mask=o_r[:, None] < tl.where(seen, BT, 0), other=0)
    if USE_G:
        b_rs = _row_sums(b_rs, b_dst, b_ones_k)
        b_ks = _key_sums(b_ks, b_dst, b_ones_q)
    return b_dq + tl.dot(tl.trans(b_dst), b_kf), b_rs, b_ks


@triton.jit
def _ones_column(N: tl.constexpr, dtype: tl.constexpr):
    """A [N, 16] block whose column 0 is ones and the rest 0: the right operand of `_row_sums` and `_key_sums`,
    made once a program so that the compiler's shared-memory copy of it is made once too (then a tile's sums are
    wgmma of the tile already in shared memory; ones made a tile were stored and fenced every tile, PERF.md #47)."""
    return (tl.zeros([N, 16], dtype=tl.float32) + tl.where(tl.arange(0, 16) == 0, 1.0, 0.0)[None, :]).to(dtype)


@triton.jit
def _row_sums(b_rs, b_dst, b_ones):
    """b_rs `[BQ, 16]` + per query, as its column 0, the sum of a [BT keys, BQ queries] dS^T tile's column: the
    query side of the gate's gradient (`inner.dkv_one_head`: dgc_i gets sum_{j<i} dS_ij), from the 16-bit tiles
    that dq reads, as dS times `_ones_column` (summed over the keys, which lie across the warps, a tl.sum went
    through shared memory every tile and made the kernel 2.4x slower, PERF.md #47)."""
    return tl.dot(tl.trans(b_dst), b_ones, b_rs)


@triton.jit
def _key_sums(b_ks, b_dst, b_ones):
    """b_ks `[BT, 16]` + per key, as its column 0, the sum of a [BT keys, BQ queries] dS^T tile's row: the key side
    of the gate's gradient (`inner.dkv_one_head`: dgc_j gets minus sum_{i>j} dS_ij) from the same 16-bit values
    as the query side, here rather than in the dK/dV kernel, where the sum cost the Hopper kernel 50 of its 329 us
    at gqa4-long-gated (PERF.md #52); dS^T times `_ones_column`."""
    return tl.dot(b_dst, b_ones, b_ks)


@triton.jit
def _store_key_sums(p_ks, b_ks, i_j, T, BT: tl.constexpr):
    """Column 0 of b_ks `[BT, 16]` (`_key_sums`; the other columns are exact zeros): this program's partial key
    sums of key tile i_j, at p_ks + its keys (`key_side_kernel` adds them up)."""
    o_s = i_j * BT + tl.arange(0, BT)
    tl.store(p_ks + o_s, tl.sum(b_ks, 1), mask=o_s < T)


@triton.jit
def _dq_ds_edges(b_dqa, b_dqb, b_rsa, b_rsb, b_ones_k, b_ones_q, ds_base, k_base, p_ks, qa, j0, j1, lo_a, hi_a,
                 lo_b, hi_b, b_exists, T, W, stride_k, K: tl.constexpr, BT: tl.constexpr, BQ: tl.constexpr,
                 BK: tl.constexpr, USE_G: tl.constexpr, WITH_A: tl.constexpr):
    """Key tiles [j0, j1) for query blocks qa and qa + 1, where at least one of them does not see a tile whole;
    WITH_A False: tiles past block qa's diagonal, which only qa + 1 sees. USE_G: each tile's key sums to p_ks."""
    for i_j in range(j0, j1):
        # [BT, BK]
        b_kf, _ = finite_rows(load_rows(k_base, i_j * BT + tl.arange(0, BT), T, stride_k, N=K, BN=BK, FULL=False))
        # [BT, 16]: `_key_sums`
        b_ks = tl.zeros([BT, 16], dtype=tl.float32)
        if WITH_A:
            b_dqa, b_rsa, b_ks = _dq_ds_edge_block(b_dqa, b_rsa, b_ks, b_ones_k, b_ones_q, ds_base, b_kf, qa, i_j,
                                                   lo_a, hi_a, True, W, BT=BT, BQ=BQ, USE_G=USE_G)
        b_dqb, b_rsb, b_ks = _dq_ds_edge_block(b_dqb, b_rsb, b_ks, b_ones_k, b_ones_q, ds_base, b_kf, qa + 1, i_j,
                                               lo_b, hi_b, b_exists, W, BT=BT, BQ=BQ, USE_G=USE_G)
        if USE_G:
            _store_key_sums(p_ks, b_ks, i_j, T, BT=BT)
    return b_dqa, b_dqb, b_rsa, b_rsb


@triton.jit
def _band_heads(i_band, G0, H: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr):
    """(batch element, KV head, query head) of band i_band of a chunk from head G0 (the dK/dV kernel's band order)."""
    i_b, i_part, i_c = i_band // (H * SPLIT * CHUNK), i_band // CHUNK % (H * SPLIT), i_band % CHUNK
    return i_b, i_part // SPLIT, i_part * (G // SPLIT) + G0 + i_c


@triton.jit
def _key_ranges(t0, W, BT: tl.constexpr, BQ: tl.constexpr):
    """(lo, mid, hi) of the query block at t0: it sees key tiles lo..hi, [lo, mid) in part (window edge), [mid, hi)
    whole, hi (the diagonal) in part."""
    lo = tl.maximum(t0 - W + 1, 0) // BT
    hi = t0 // BT
    return lo, tl.maximum(lo, tl.minimum(tl.cdiv(tl.maximum(t0 + BQ - W, 0), BT), hi)), hi


@triton.heuristics({"USE_G": lambda args: args["dgc_q"] is not None})
@triton.jit(do_not_specialize=["T", "W", "NTILE", "G0"])
def parallel_attn_bwd_kernel_dq_from_ds(
    k, ds, dq, dgc_q, dgk_part, scale, T, W, NTILE, G0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr, K: tl.constexpr,
    BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NUM_BANDS: tl.constexpr, USE_G: tl.constexpr,
):
    """dq of two consecutive query blocks a and b (BQ rows each) of one query head of the chunk [G0, G0 + CHUNK) of
    each of the SPLIT shares of every group (share p: heads p * G / SPLIT ...), from their stored dS tiles
    (NUM_BANDS = B * H * SPLIT * CHUNK bands of NTILE tiles, the dK/dV kernel's order). Each key tile is
    loaded once for both blocks (the K reads through L2 were the kernel's limit, PERF.md #42l); each block's sum
    runs over its tiles in a fixed order: the window edge and the diagonals (tiles either block sees in part) in key
    order, then the tiles both see whole from the highest key down. USE_G: also the query side of the gate's gradient
    into dgc_q `[HQ, B * T]` (fp32, `_row_sums`), and per key tile this program's sums of the key side into
    dgk_part `[programs a band, NUM_BANDS, T]` (fp32, `_key_sums`; `key_side_kernel` adds them up)."""
    i_band = tl.program_id(0) % NUM_BANDS
    i_p = tl.num_programs(0) // NUM_BANDS - 1 - tl.program_id(0) // NUM_BANDS  # longest rows first
    i_b, i_h, i_hq = _band_heads(i_band, G0, H=H, G=G, SPLIT=SPLIT, CHUNK=CHUNK)
    bos = i_b.to(tl.int64) * T
    qa = 2 * i_p
    ta = qa * BQ
    lo_a, mid_a, hi_a = _key_ranges(ta, W, BT=BT, BQ=BQ)
    lo_b, mid_b, hi_b = _key_ranges(ta + BQ, W, BT=BT, BQ=BQ)
    b_exists = ta + BQ < T
    ds_base = ds + i_band.to(tl.int64) * NTILE * (BT * BQ)
    k_base = k + (bos * H + i_h) * K
    p_ks = dgk_part
    if USE_G:
        p_ks = dgk_part + (i_p.to(tl.int64) * NUM_BANDS + i_band) * T
    o_r = tl.arange(0, BT)
    o_c = tl.arange(0, BQ)
    # [BQ, BK]
    b_dqa = tl.zeros([BQ, BK], dtype=tl.float32)
    b_dqb = tl.zeros([BQ, BK], dtype=tl.float32)
    # [BQ, 16]: `_row_sums`
    b_rsa = tl.zeros([BQ, 16], dtype=tl.float32)
    b_rsb = tl.zeros([BQ, 16], dtype=tl.float32)
    # [BT, 16] and [BQ, 16]: `_ones_column` (one block where BT = BQ)
    b_ones_k = _ones_column(BT, ds.dtype.element_ty)
    b_ones_q = _ones_column(BQ, ds.dtype.element_ty)
    b_ones_qb = tl.where(b_exists, b_ones_q, 0).to(ds.dtype.element_ty)  # no block b: its tiles are a's again
    m = tl.minimum(tl.maximum(mid_a, mid_b), hi_a)  # [m, hi_a): the tiles both blocks see whole
    # The edges before the bulk loop: a loop after it made ptxas (Triton 3.6) serialize every wgmma of the kernel
    # (C7515, PERF.md #48). First [lo_a, m) (window edge), then block a's diagonal, then the tiles after it, which
    # only block b sees (block a's products with them were all zeros).
    b_dqa, b_dqb, b_rsa, b_rsb = _dq_ds_edges(
        b_dqa, b_dqb, b_rsa, b_rsb, b_ones_k, b_ones_q, ds_base, k_base, p_ks, qa, lo_a, m, lo_a, hi_a, lo_b, hi_b,
        b_exists, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK, USE_G=USE_G, WITH_A=True)
    b_dqa, b_dqb, b_rsa, b_rsb = _dq_ds_edges(
        b_dqa, b_dqb, b_rsa, b_rsb, b_ones_k, b_ones_q, ds_base, k_base, p_ks, qa, hi_a, hi_a + 1, lo_a, hi_a, lo_b,
        hi_b, b_exists, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK, USE_G=USE_G, WITH_A=True)
    b_dqa, b_dqb, b_rsa, b_rsb = _dq_ds_edges(
        b_dqa, b_dqb, b_rsa, b_rsb, b_ones_k, b_ones_q, ds_base, k_base, p_ks, qa, hi_a + 1,
        tl.where(b_exists, hi_b, hi_a) + 1, lo_a, hi_a, lo_b, hi_b, b_exists, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK,
        USE_G=USE_G, WITH_A=False)
    i_ta = ds_tile_index(qa, 0, W, BQ=BQ, BT=BT)
    i_tb = tl.where(b_exists, ds_tile_index(qa + 1, 0, W, BQ=BQ, BT=BT), i_ta)  # no block b: read a's, store none
    # int32 offsets within a tile from int64 scalar bases: 64-bit offset tensors cost the loop its registers.
    o_ds = o_r[:, None] * BQ + o_c[None, :]
    o_kr = o_r[:, None] * (H * K) + tl.arange(0, BK)[None, :]
    m_k = (tl.arange(0, BK) < K)[None, :]
    for i_t in range(m, hi_a):
        i_j = m + hi_a - 1 - i_t  # newest tiles first: the dK/dV launch stored them last, so some are still in L2
        # [BT, BK]
        b_k = tl.load(k_base + tl.cast(i_j, tl.int64) * (BT * H * K) + o_kr, mask=m_k, other=0)
        # [BT, BQ]
        b_dsta = tl.load(ds_base + (i_ta + i_j) * (BT * BQ) + o_ds)
        b_dstb = tl.load(ds_base + (i_tb + i_j) * (BT * BQ) + o_ds)
        if USE_G:
            # First: the store needs them done, and Triton waits for every product in flight (wait 0) before it; here
            # that is the last tile's products, which ran during its store and the loads.
            b_ks = _key_sums(_key_sums(tl.zeros([BT, 16], dtype=tl.float32), b_dsta, b_ones_q), b_dstb, b_ones_qb)
        b_dqa += tl.dot(tl.trans(b_dsta), b_k)
        b_dqb += tl.dot(tl.trans(b_dstb), b_k)
        if USE_G:
            b_rsa = _row_sums(b_rsa, b_dsta, b_ones_k)
            b_rsb = _row_sums(b_rsb, b_dstb, b_ones_k)
            _store_key_sums(p_ks, b_ks, i_j, T, BT=BT)
    o_k = tl.arange(0, BK)
    p_dq = dq + (bos * HQ + i_hq) * K + o_k[None, :]
    o_t = ta + tl.arange(0, BQ)
    tl.store(p_dq + o_t[:, None].to(tl.int64) * (HQ * K), (b_dqa * scale).to(dq.dtype.element_ty),
             mask=(o_t < T)[:, None] & (o_k < K)[None, :])
    if USE_G:
        NTOK = NUM_BANDS // (H * SPLIT * CHUNK) * T  # B * T
        p_dgc = dgc_q + i_hq.to(tl.int64) * NTOK + bos + o_t
        tl.store(p_dgc, tl.sum(b_rsa, 1), mask=o_t < T)
        tl.store(p_dgc + BQ, tl.sum(b_rsb, 1), mask=o_t + BQ < T)
    o_t += BQ
    tl.store(p_dq + o_t[:, None].to(tl.int64) * (HQ * K), (b_dqb * scale).to(dq.dtype.element_ty),
             mask=(o_t < T)[:, None] & (o_k < K)[None, :])


@triton.jit
def _key_sums_of_block(dgk_part, i_band, s0, T, W, BT: tl.constexpr, BQ: tl.constexpr, BR: tl.constexpr,
                       BP: tl.constexpr, NUM_BANDS: tl.constexpr):
    """[BR] the sums of the partial key sums `dgk_part` `[programs, NUM_BANDS, T]` of keys s0 .. s0 + BR - 1 (s0 a
    multiple of BR) of band i_band over the dQ-from-dS programs that stored them, in program order (fixed:
    deterministic). Program p (query blocks 2p and 2p + 1) stored key tiles lo(2p) (the window's first) to the last
    its queries see: key tile kj is in the sums of programs kj BT // (2 BQ) .. cdiv((kj + 1) BT + W - 1, 2 BQ) - 1
    (`_key_ranges`). BP programs' partials a load (one load a program serialized up to T / 128 round trips),
    summed over them in a fixed tree, then block after block."""
    tl.static_assert(BR % BT == 0, "a block of keys holds whole key tiles")
    NP = tl.cdiv(T, 2 * BQ)
    o_s = s0 + tl.arange(0, BR)
    o_j = o_s // BT
    p_first = o_j * BT // (2 * BQ)
    p_last = tl.minimum(tl.cdiv((o_j + 1) * BT + W - 1, 2 * BQ), NP) - 1
    j_last = (tl.minimum(s0 + BR, T) - 1) // BT
    o_p = tl.arange(0, BP)
    # [BR]
    b_acc = tl.zeros([BR], dtype=tl.float32)
    for i_p in range(s0 // (2 * BQ), tl.minimum(tl.cdiv((j_last + 1) * BT + W - 1, 2 * BQ), NP), BP):
        o_pp = i_p + o_p
        m = (o_s < T)[None, :] & (o_pp[:, None] >= p_first[None, :]) & (o_pp[:, None] <= p_last[None, :])
        # [BP, BR]
        b_part = tl.load(dgk_part + (o_pp.to(tl.int64)[:, None] * NUM_BANDS + i_band) * T + o_s[None, :], mask=m,
                         other=0)
        b_acc += tl.sum(b_part, 0)
    return b_acc


@triton.jit(do_not_specialize=["T", "W", "G0"])
def key_side_kernel(dgk_part, dgc_k, T, W, G0, H: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr,
                    CHUNK: tl.constexpr, BT: tl.constexpr, BQ: tl.constexpr, BR: tl.constexpr, BP: tl.constexpr,
                    NUM_BANDS: tl.constexpr):
    """The key side of the gate's gradient of BR keys of one band of the chunk: dgc_k `[HQ, B * T]` = minus the
    sum of the partial key sums over the dQ-from-dS programs that stored them (`_key_sums_of_block`)."""
    i_r, i_band = tl.program_id(0), tl.program_id(1)
    i_b, _, i_hq = _band_heads(i_band, G0, H=H, G=G, SPLIT=SPLIT, CHUNK=CHUNK)
    o_s = i_r * BR + tl.arange(0, BR)
    b_acc = _key_sums_of_block(dgk_part, i_band, i_r * BR, T, W, BT=BT, BQ=BQ, BR=BR, BP=BP, NUM_BANDS=NUM_BANDS)
    NTOK = NUM_BANDS // (H * SPLIT * CHUNK) * T  # B * T
    tl.store(dgc_k + i_hq.to(tl.int64) * NTOK + i_b.to(tl.int64) * T + o_s, -b_acc, mask=o_s < T)


@triton.jit(do_not_specialize=["T", "W", "G0"])
def gate_grad_of_band_kernel(dgk_part, dgc_q, dg, T, W, G0, HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr,
                             SPLIT: tl.constexpr, CHUNK: tl.constexpr, BT: tl.constexpr, BQ: tl.constexpr,
                             BR: tl.constexpr, BP: tl.constexpr, NUM_BANDS: tl.constexpr):
    """The gate's gradient of one band of the chunk, in one program: dg `[B, T, HQ]` = the reverse cumsum over
    the band's keys of dgc = dgc_q (the query side, `[HQ, B * T]` fp32) minus the key side (`_key_sums_of_block`),
    BR keys a block from the last, carrying the running fp32 sum. What `key_side_kernel` and then the reverse scan
    (`cumsum.add_gate_grad`) compute in two launches, for calls whose bands are few and short (its caller decides)."""
    i_band = tl.program_id(0)
    i_b, _, i_hq = _band_heads(i_band, G0, H=H, G=G, SPLIT=SPLIT, CHUNK=CHUNK)
    NTOK = NUM_BANDS // (H * SPLIT * CHUNK) * T  # B * T
    bos = i_b.to(tl.int64) * T
    p_dgc = dgc_q + i_hq.to(tl.int64) * NTOK + bos
    # [1]
    b_carry = tl.zeros([1], dtype=tl.float32)
    NR = tl.cdiv(T, BR)
    for i_c in range(0, NR):
        s0 = (NR - 1 - i_c) * BR
        o_s = s0 + tl.arange(0, BR)
        m_s = o_s < T
        # [BR]
        b_x = tl.load(p_dgc + o_s, mask=m_s, other=0) - _key_sums_of_block(
            dgk_part, i_band, s0, T, W, BT=BT, BQ=BQ, BR=BR, BP=BP, NUM_BANDS=NUM_BANDS)
        b_y = tl.cumsum(b_x, axis=0, reverse=True) + b_carry
        b_carry += tl.sum(b_x, axis=0)
        tl.store(dg + (bos + o_s) * HQ + i_hq, b_y.to(dg.dtype.element_ty), mask=m_s)


# ----------------------------------------------------------------------------------------------------------------
# Dispatch and plan
# ----------------------------------------------------------------------------------------------------------------

def eligible(s) -> bool:
    """Whether the five-product backward can run a call of `host.Shape` s (dense is the caller's to check; a gated
    call also needs the forward's o_lo, `needs_exact_o`)."""
    return (s.dtype in (torch.float16, torch.bfloat16) and max(s.K, s.V) <= 128 and s.sink_dtype is None
            and s.Q0 == 0)


def needs_exact_o(s, dense: bool, forced_dkv: str, aligned: bool) -> bool:
    """Whether the forward of a call of Shape s must make o's rounding residual o_lo (`host.add_fwd`): a gated call
    whose backward, with the settings of now, takes five products. Its delta must then be rowsum(dO * o) with o in
    fp32 (the value the forward accumulates, before it rounds o to 16 bits): from the rounded o, dk and dg come out
    about twice as far from the oracle (3.6e-3 against 2.6e-3 at g8-T8192-gated, and past the 5e-3 bar on sharp
    rows: B1 T130 D64 scale 0.5 gave dk 5.6e-3, dg 5.3e-3; with o_lo 2.8e-3 and 2.5e-3; PERF.md #47, #50). The cost
    is one more store of o's shape in the forward, in int8 (`inner.o_lo_encode`)."""
    if s.g_dtype is None:
        return False
    try:
        return five_product_chunk(s, dense, forced_dkv, aligned, exact_o=True) is not None
    except ValueError:
        return False  # the backward raises it


class FiveProduct(NamedTuple):
    """How a five-product backward runs: each group's query heads dealt to `split` programs a key tile (shares of
    G / split heads, as `config.gqa_split` deals them for the seven-product kernel), `chunk` heads of every
    share whose dS tiles are stored at once (the budget's unit, `ds_chunk`), and whether the Hopper kernel
    (`gluon_dkv`, one launch a chunk) or the Triton kernel (one or two heads a launch) computes dK/dV and dS."""
    split: int
    chunk: int
    hopper: bool = False


def _hopper(s, aligned: bool) -> bool:
    """Whether this five-product backward (an `eligible`, dense call) runs the Hopper dK/dV kernel. FLA_BWD_DS_KERNEL
    "auto": where it can (`gluon_dkv.why_not`, and two-launch containment: it is the FLAG launch) from
    `config.HOPPER_DKV_MIN_T` on (ungated: from `config.FIVE_PRODUCT_MIN_T_HOPPER`); "hopper": wherever it can,
    and ValueError where it cannot; "triton": never."""
    forced = settings.forced_ds_kernel()
    if forced == "triton":
        return False
    why = gluon_dkv.why_not(s, s.device, aligned)
    if why is None and config.contain_inline(s.B, s.HQ, s.T, s.W, max(s.K, s.V)):
        why = "it is the first of two containment launches, and this call contains NaN/Inf inline"
    if forced == "hopper" and why is not None:
        raise ValueError(f"ds kernel 'hopper' (FLA_BWD_DS_KERNEL) cannot run this backward: {why}")
    long_enough = s.T >= (config.HOPPER_DKV_MIN_T if s.g_dtype is not None else config.FIVE_PRODUCT_MIN_T_HOPPER)
    return why is None and (forced == "hopper" or long_enough)


def band_bytes(T: int, W: int, D: int, gated: bool) -> int:
    """Scratch bytes of one band (one query head of one batch element): its 16-bit dS tiles and, gated, the dQ
    kernel's fp32 key sums, T for each of its cdiv(T, 2 BQ) programs (`key_side_kernel`)."""
    cfg = tile_config("dkv", D)
    tiles = ds_layout(T, W, cfg["BS"], cfg["BT"]) * cfg["BT"] * cfg["BS"] * 2
    return tiles + (cdiv(T, 2 * cfg["BS"]) * T * 4 if gated else 0)


@functools.lru_cache(maxsize=256)
def ds_chunk(B: int, T: int, H: int, G: int, W: int, D: int, budget: int, split: int = 1,
             gated: bool = False) -> Optional[int]:
    """Query heads of each share (G / split heads) per chunk: the largest divisor of the share whose scratch
    (B * H * split * chunk bands, `band_bytes`) fits in `budget` bytes, or None if one head of every share does not
    fit (then the seven-product backward runs)."""
    cfg = tile_config("dkv", D)
    rows = ds_layout(T, W, cfg["BS"], cfg["BT"]) * cfg["BT"]  # a band's rows in the dK/dV kernel's descriptor view
    band = band_bytes(T, W, D, gated)
    bands = B * H * split
    for chunk in range(G // split, 0, -1):
        if (G // split) % chunk == 0 and bands * chunk * band <= budget and bands * chunk * rows < 2**31:
            return chunk
    return None


def _busy_splits(s):
    """The splits of `config.FIVE_PRODUCT_SPLITS`, in order, that divide the group and whose launches keep the GPU
    busy (`config.group_fills_gpu`)."""
    G, D = s.HQ // s.H, max(s.K, s.V)
    sms = config.sm_count(s.device)
    return (split for split in config.FIVE_PRODUCT_SPLITS
            if G % split == 0 and config.group_fills_gpu((s.T,) * s.B, s.H, G, D, s.W, sms, split))


def _auto_five(s, aligned: bool) -> Optional[FiveProduct]:
    """How "auto" runs this (eligible, dense) call with five products, or None for seven: where they measured
    faster (`config`): full causal, head dims 65-128, long enough, gated calls only on the Hopper kernel and where
    `config.FIVE_PRODUCT_GATED` allows, ungated calls on the Triton kernel only on GPUs of at least
    `config.TRITON_FIVE_MIN_TBPS`, shorter ungated calls (`config.FIVE_PRODUCT_MIN_T_HOPPER`) on the Hopper kernel
    only, and the first of `_busy_splits` whose dS tiles fit the budget."""
    D = max(s.K, s.V)
    if not (64 < D <= 128 and s.W >= s.T and s.T >= min(config.FIVE_PRODUCT_MIN_T, config.FIVE_PRODUCT_MIN_T_HOPPER)):
        return None
    if s.g_dtype is not None and not config.FIVE_PRODUCT_GATED:
        return None
    hopper = _hopper(s, aligned)
    if s.T < config.FIVE_PRODUCT_MIN_T and not (hopper and s.g_dtype is None):
        return None  # measured faster there: ungated on the Hopper kernel (PERF.md #74)
    if s.g_dtype is not None and not hopper:
        return None  # the gated Triton dK/dV kernel lost: gqa4-long-gated 801 against seven's 650 us (PERF.md #47)
    budget = settings.ds_budget_bytes()
    G = s.HQ // s.H
    if hopper:
        split = gluon_dkv.split_for(s.B, s.T, s.H, G, config.sm_count(s.device))
        chunk = ds_chunk(s.B, s.T, s.H, G, s.W, D, budget, split, s.g_dtype is not None)
        return None if chunk is None else FiveProduct(split, chunk, True)
    if config.hbm_tbps(s.device) < config.TRITON_FIVE_MIN_TBPS:
        return None  # the Triton kernel's dS round trip costs more than it saves at this bandwidth
    for split in _busy_splits(s):
        chunk = ds_chunk(s.B, s.T, s.H, G, s.W, D, budget, split, s.g_dtype is not None)
        if chunk is not None:
            return FiveProduct(split, chunk)
    return None


def five_product_chunk(s, dense: bool, forced_dkv: str, aligned: bool,
                       exact_o: bool = False) -> Optional[FiveProduct]:
    """The split, chunk and dK/dV kernel of a backward of Shape s, or None for the seven-product backward (settings
    read now; `forced_dkv` is the caller's `settings.forced_dkv_path()`; `aligned`: q, k, v and dO start 16-byte
    aligned, which the Hopper kernel's TMA needs; `exact_o`: the forward made o_lo, which a gated call needs,
    `needs_exact_o`).

    "auto": five products only where they measured faster (`_auto_five`: long dense calls that a split keeps
    balanced), no other dK/dV kernel forced and the dS tiles within the budget; else seven. Asked for
    (`settings.dq_path("from-ds")`, FLA_BWD_DQ_PATH=from-ds), the split is the forced dK/dV path's ("gqa": 1,
    "gqa-split2": 2, "gqa-split4": 4) or, under "auto", the Hopper kernel's (`gluon_dkv.split_for`) where it runs
    (`_hopper`), else the first of `config.FIVE_PRODUCT_SPLITS` that keeps the GPU busy (1 where none does); a call
    it cannot run raises ValueError rather than falling back: the
    query-head-owned dK/dV kernel forced, a split that does not divide the group, a call outside `eligible`, packed
    sequences, or a budget (`settings.ds_budget_bytes`) too small for one query head of every share. "recompute":
    seven products."""
    forced = settings.forced_dq_path()
    if forced == "recompute":
        return None
    G, D = s.HQ // s.H, max(s.K, s.V)
    runnable = dense and eligible(s)
    gated_without_o_lo = s.g_dtype is not None and not exact_o
    if forced == "auto":
        return _auto_five(s, aligned) if runnable and forced_dkv == "auto" and not gated_without_o_lo else None
    if forced_dkv == "auto":
        split = next(_busy_splits(s), 1)  # auto's split where one keeps the GPU busy, else 1
    else:
        # The forced path's kernel (`dkv_kernel_for` raises for a split that does not divide the group).
        kernel = dkv_kernel_for(s.B, s.T, s.HQ, s.H, s.K, s.V, s.dtype, s.device, s.W, (s.T,) * s.B, forced_dkv)
        if not kernel.per_kv_head:
            raise ValueError(f"dq path 'from-ds' runs the KV-head-owned dK/dV kernel ('gqa', 'gqa-split2' or "
                             f"'gqa-split4'); dK/dV path {forced_dkv!r} is forced too")
        split = kernel.split
    if not runnable:
        raise ValueError("dq path 'from-ds' (the five-product backward) needs a dense call (no cu_seqlens) with "
                         "16-bit q, k, v, head dims up to 128 and no sink")
    hopper = _hopper(s, aligned)
    if hopper and forced_dkv == "auto":
        split = gluon_dkv.split_for(s.B, s.T, s.H, G, config.sm_count(s.device))
    budget = settings.ds_budget_bytes()
    chunk = ds_chunk(s.B, s.T, s.H, G, s.W, D, budget, split, s.g_dtype is not None)
    if chunk is None:
        raise ValueError(f"dq path 'from-ds': one query head of every KV head's share needs more dS scratch than "
                         f"FLA_BWD_DS_BUDGET_MIB = {budget / 2**20:g} MiB allows")
    # Last: the forward's `needs_exact_o` swallows the reasons above, so they must reach the backward first.
    if gated_without_o_lo:
        raise ValueError("dq path 'from-ds' with a gate needs o's rounding residual from the forward, which it makes "
                         "only in eager calls (not under torch.compile) where FLA_BWD_DQ_PATH was already 'from-ds' "
                         "at the forward")
    return FiveProduct(split, chunk, hopper)


def add_gate_grad_by_band(plan, dgk_part: Ref, dgc_q: Ref, dg: Ref, s, heads_of: dict) -> None:
    """Add `gate_grad_of_band_kernel` for the bands of one chunk (`heads_of`: the chunk's launch arguments) into
    dg: keys a block as many as fill 8 warps' registers with one load of the partials (under the interpreter
    one key tile, so that the tests' sequences cross several blocks)."""
    BT = heads_of["BT"]
    BR = BT if is_interpreter() else max(BT, min(1024, next_power_of_2(s.T)))
    plan.launch(gate_grad_of_band_kernel, (heads_of["NUM_BANDS"],), dgk_part=dgk_part, dgc_q=dgc_q, dg=dg,
                HQ=s.HQ, BR=BR, BP=max(1, min(16, 8192 // BR)), **heads_of, num_warps=8 if BR >= 1024 else 4)


def add_five_product_backward(plan, s, five: FiveProduct, add_dkv_launch) -> None:
    """Add delta, then per chunk its dK/dV launches (`add_dkv_launch(plan, s, out, SPLIT, hopper, **launch args)`:
    host.py's, which adds the buffers and containment; one or two query heads of each share a launch, `config`, or
    with the Hopper kernel the whole chunk) and the
    dQ-from-dS launch, to `plan`; with a split, the shares' fp32 dK/dV partials summed last (`add_group_sum`).
    Buffers: "dq", "delta", "ds" (the chunk's tiles, reused by every chunk), and two fp32 dK/dV sum buffers when
    there are several launches (ping-pong: a FIXUP launch re-reads the sums its FLAG launch started from)."""
    G = s.HQ // s.H
    split, chunk, hopper = five
    cfg = tile_config("dkv", max(s.K, s.V), s.dtype)
    BT, BQ = cfg["BT"], cfg["BS"]
    NTOK = s.B * s.T
    dq = plan.empty("dq", (s.B, s.T, s.HQ, s.K), s.dtype)
    delta = plan.empty("delta", (s.HQ, NTOK), torch.float32)
    R = NTOK * s.HQ
    BV = next_power_of_2(s.V)
    BR = max(1, 4096 // BV)
    gated = s.g_dtype is not None
    if R:
        plan.launch(delta_kernel, (cdiv(R, BR),), o=Ref("o"), o_lo=Ref("o_lo") if gated else None, do=Ref("do"),
                    delta=delta, R=R, NTOK=NTOK, HQ=s.HQ, V=s.V, BR=BR, BV=BV)
    ntile = ds_layout(s.T, s.W, BQ, BT)
    NP = s.H * split  # programs a key tile
    bands = s.B * NP * chunk
    ds = plan.empty("ds", (bands * ntile * BT * BQ,), s.dtype)
    # The gate's gradient: dQ from dS stores its query side, and partial sums of its key side, which
    # `key_side_kernel` adds up, then the reverse scan; or, short calls, `gate_grad_of_band_kernel` both at once
    # (all from the stored tiles; the dK/dV kernels compute no gate gradient here).
    dgc_q = dgc_k = dgk_part = dg = None
    by_band = gated and s.T <= config.GATE_GRAD_BY_BAND_MAX_T
    if gated:
        dgc_q = plan.empty("dgc_q", (s.HQ, NTOK), torch.float32)
        dgk_part = plan.empty("dgk_part", (cdiv(s.T, 2 * BQ), bands, s.T), torch.float32)
        if by_band:
            dg = plan.empty("dg", (s.B, s.T, s.HQ), s.g_dtype)
        else:
            dgc_k = plan.empty("dgc_k", (s.HQ, NTOK), torch.float32)
    # The Hopper kernel runs a chunk a launch; the Triton kernel one or two heads (a head loop spills, #42i).
    heads = chunk if hopper else math.gcd(chunk, 2 if s.T < config.DS_TWO_HEADS_BELOW_T else 1)
    launches = G // split // heads

    def fp32_pair(name):
        return (plan.empty(f"dk_{name}", (s.B, s.T, NP, s.K), torch.float32),
                plan.empty(f"dv_{name}", (s.B, s.T, NP, s.V), torch.float32))

    # (dk, dv) fp32 sum pairs: launch n writes pair n % 2 and the next launch reads it.
    sums = [fp32_pair(f"sum{i}") for i in range(min(launches - 1, 2))]
    last_out = fp32_pair("part") if split > 1 else None  # scaled partials, or None: "dk", "dv" in the inputs' dtype
    for n in range(launches):
        last = n == launches - 1
        dk_in, dv_in = sums[(n - 1) % 2] if n > 0 else (None, None)
        add_dkv_launch(plan, s, last_out if last else sums[n % 2], split, hopper, ds=ds, NTILE=ntile, G0=n * heads,
                       CHUNK=chunk, HEADS=heads, dk_in=dk_in, dv_in=dv_in, ACC_OUT=not last)
        done = (n + 1) * heads  # query heads of each share whose dS tiles are stored
        if done % chunk == 0 and s.T:  # a whole chunk: its dq rows (and the key side of its dgc)
            heads_of = dict(T=s.T, W=s.W, G0=done - chunk, H=s.H, G=G, SPLIT=split, CHUNK=chunk, BT=BT, BQ=BQ,
                            NUM_BANDS=bands)
            plan.launch(parallel_attn_bwd_kernel_dq_from_ds, (cdiv(s.T, 2 * BQ) * bands,), k=Ref("k"), ds=ds,
                        dq=dq, dgc_q=dgc_q, dgk_part=dgk_part, scale=s.scale, NTILE=ntile, HQ=s.HQ, K=s.K,
                        BK=max(16, next_power_of_2(s.K)), **heads_of, **config.DQ_FROM_DS_LAUNCH)
            if by_band:
                add_gate_grad_by_band(plan, dgk_part, dgc_q, dg, s, heads_of)
            elif gated:
                keys = max(BT, 256)  # a program's keys: whole key tiles; 1024 gave 2 programs a band, 9.8 us (#52)
                plan.launch(key_side_kernel, (cdiv(s.T, keys), bands), dgk_part=dgk_part, dgc_k=dgc_k, BR=keys, BP=16,
                            **heads_of, num_warps=4)
    if last_out is not None:
        add_group_sum(plan, *last_out, s.B, s.T, s.H, split, s.K, s.V, s.dtype)
    if gated and not by_band:
        add_gate_grad(plan, dgc_q, dgc_k, None, s.B, s.B, s.T, s.HQ, s.g_dtype)
