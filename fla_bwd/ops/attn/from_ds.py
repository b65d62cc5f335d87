# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The five-product backward's own kernels and its dS tile layout: dQ from the dS tiles that the dK/dV kernel
already forms.

The seven-product backward runs a dQ kernel that recomputes S = Q K^T and dP = dO V^T for every visible pair (two
products) before its dq += dS K. Here the KV-head-owned dK/dV kernel stores each dS tile it consumes (16-bit, the
exact values its dK product reads: `kernels.parallel_attn_bwd_kernel_dkv_ds_per_kv_head`, or on Hopper
`gluon_dkv.py`), and a dQ kernel reads them back: dq_i = scale * sum_j dS_ij K_j, one product a tile, summed in a
fixed order (deterministic, no atomics). The launches, in order (`host.add_five_product`):

1. `delta_kernel`: delta = rowsum(o * dO) (fp32), which the dK/dV kernel needs before it runs;
2. per chunk of query heads (`dispatch.ds_chunk`): the dS-storing dK/dV kernel over those heads of every group's
   share, one or two heads a launch, carrying fp32 dK/dV sums from launch to launch (bitwise the sums of one
   launch: the same additions in the same order), then `parallel_attn_bwd_kernel_dq_from_ds` for the chunk's dq
   rows (gated: and `key_side_kernel`, which adds up the dQ kernel's partial key sums, or
   `gate_grad_of_band_kernel`, which adds them up and scans dg in one launch); above head dim 128 the dK/dV kernel
   computes dV and dS alone and `parallel_attn_bwd_kernel_dk_from_ds` then sums the chunk's dk from the same tiles
   (dK's and dV's fp32 sums together spill there), carrying its fp32 sums from chunk to chunk;
3. with a split, the shares' fp32 partials summed in order (`add_group_sum`, as the seven-product split paths);
   with a sink, `sink_grad_kernel` makes dsink from delta, lse and the dK/dV kernels' fp32 sums.

Layout of the stored tiles (`ds_layout`): per (batch, KV head, head of the chunk) a band of NTILE tiles; tile
(query block qi of BQ rows, key tile kj of BT keys) for every key tile that qi sees, in query-block order and then
key order, as a row-major [BT keys, BQ queries] block (dS transposed, as the dK/dV kernel holds it). With a window
only the band of visible tiles is stored. BQ and BT are the dK/dV kernel's BS and BT. Packed sequences (ungated,
forced: `dispatch._five`): each sequence's bands hold the tiles of its own length, one after another by sequence
(`host.band_offsets`), and so do the gate's partial key sums; their key side then `key_side_kernel` (never the
by-band kernel).

With a gate, delta comes from o plus the forward's rounding residual o_lo (`dispatch.needs_o_lo`); dQ from dS also
sums both sides of the gate's gradient from the stored 16-bit tiles (the query side per row, the key side as
per-program partial sums that `key_side_kernel` adds in program order; the dK/dV kernels compute none of it): the
reverse cumsum of dg then cancels the pairs both sides share exactly, as it does in seven products, where both
sides are fp32. Where "auto" takes five products, and why, is `dispatch.route`'s.
"""

import triton
import triton.language as tl

from fla_bwd.ops.attn.config import tile_config
from fla_bwd.ops.attn.inner import (
    LOG2E,
    band_of,
    ds_tile_index,
    finite_rows,
    load_rows,
    o_lo_decode,
    sequence_bounds,
)
from fla_bwd.utils import cdiv

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


@triton.heuristics({"EXACT_O": lambda args: args["o_lo"] is not None,
                    "USE_DLSE": lambda args: args["dlse"] is not None})
@triton.jit(do_not_specialize=["R", "NTOK"])
def delta_kernel(o, o_lo, do, dlse, delta, R, NTOK, HQ: tl.constexpr, V: tl.constexpr, BR: tl.constexpr,
                 BV: tl.constexpr, EXACT_O: tl.constexpr, USE_DLSE: tl.constexpr):
    """delta `[HQ, NTOK]` (fp32) = rowsum(o * dO) over the R = NTOK * HQ rows of o, dO `[NTOK, HQ, V]`; EXACT_O:
    with o in fp32, from o and the forward's int8 o_lo (`inner.o_lo_decode`, `parallel_attn_fwd_kernel`). USE_DLSE:
    minus dlse `[NTOK, HQ]`, the gradient of the user's natural lse (see `kernels._dq_rows`): every kernel after
    this one then takes it through delta."""
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
    if USE_DLSE:
        tl.store(delta + o_hq.to(tl.int64) * NTOK + o_tok,
                 tl.sum(b_o * b_do, 1) - tl.load(dlse + o_r, mask=o_r < R, other=0), mask=o_r < R)
    else:
        tl.store(delta + o_hq.to(tl.int64) * NTOK + o_tok, tl.sum(b_o * b_do, 1), mask=o_r < R)


@triton.heuristics({"USE_DLSE": lambda args: args["dlse"] is not None})
@triton.jit(do_not_specialize=["NTOK", "NP"])
def sink_grad_kernel(lse, delta, dlse, sink_bias, sink_part, dsink, NTOK, NP, HQ: tl.constexpr, BN: tl.constexpr,
                     BP: tl.constexpr, USE_DLSE: tl.constexpr):
    """dsink[h] (in dsink's dtype) of query head h (program h): the gradient -sum_i p_sink_i * delta_i of the sink,
    whose logit enters only the denominator (p_sink_i = exp(sink_h - lse_i); lse `[HQ, NTOK]` base 2, the sink
    included). delta `[HQ, NTOK]` comes from the rounded o, whose rounding every row's term would carry (an error
    ratio of 1.5e-2 on dsink at T = 2048): instead, with the real keys' P summing to 1 - p_sink_i,
    sum_i p_sink_i * delta_i = sum_ij p_sink_i * dS_ij + sum_i p_sink_i * (1 - p_sink_i) * delta_i
    exactly for dS_ij = P_ij * (dP_ij - delta_i) with any delta_i: the dK/dV kernels summed the first term in fp32
    per (key tile, head) into sink_part `[HQ, NP]`, before dS was rounded. Both sums in a fixed order
    (deterministic). USE_DLSE: delta is less dlse (`delta_kernel`), which the identity cancels, and the sink's
    gradient through the user's lse (`[NTOK, HQ]`, natural log) is + sum_i p_sink_i * dlse_i: added here."""
    i_hq = tl.program_id(0)
    b_sink = tl.load(sink_bias + i_hq).to(tl.float32) * LOG2E  # lse is base 2
    p_row = i_hq.to(tl.int64) * NTOK
    # [BN]
    b_acc = tl.zeros([BN], dtype=tl.float32)
    for i_n in range(0, NTOK, BN):
        o_n = i_n + tl.arange(0, BN)
        m_n = o_n < NTOK
        b_w = tl.exp2(b_sink - tl.load(lse + p_row + o_n, mask=m_n, other=float("inf")))
        b_acc += b_w * (1 - b_w) * tl.load(delta + p_row + o_n, mask=m_n, other=0)
        if USE_DLSE:
            b_acc -= b_w * tl.load(dlse + o_n.to(tl.int64) * HQ + i_hq, mask=m_n, other=0)
    # [BP]
    b_part = tl.zeros([BP], dtype=tl.float32)
    for i_p in range(0, NP, BP):
        o_p = i_p + tl.arange(0, BP)
        b_part += tl.load(sink_part + i_hq.to(tl.int64) * NP + o_p, mask=o_p < NP, other=0)
    tl.store(dsink + i_hq, (-(tl.sum(b_acc, 0) + tl.sum(b_part, 0))).to(dsink.dtype.element_ty))


@triton.jit
def _dq_ds_edge_block(b_dq, b_rs, b_ks, b_ones_k, b_ones_q, ds_base, b_kf, qi, i_j, lo, hi, exists, W,
                      BT: tl.constexpr, BQ: tl.constexpr, USE_G: tl.constexpr):
    """dq += dS K for query block qi and key tile i_j, which qi may see whole, in part (window edge, diagonal:
    masked) or not at all (outside [lo, hi], or no block qi: its dS loads as 0 and adds exactly 0). b_kf is the key
    tile with its non-finite elements zeroed (`inner.finite_rows`): where a row cannot see a key the stored dS is
    0, and 0 * Inf = NaN would reach rows that do not depend on it, while the rows that see a bad key hold NaN in
    dS (see `inner.finite_rows`). Whole tiles take b_kf too: the tile and b_kf both live spilled.
    USE_G: b_rs += the tile's row sums of dS (`_row_sums`), b_ks += its column sums (`_key_sums`), the diagonal
    dS_pp included in both: it enters dgc at p as +dS_pp and -dS_pp."""
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
    wgmma of the tile already in shared memory; ones made a tile were stored and fenced every tile)."""
    return (tl.zeros([N, 16], dtype=tl.float32) + tl.where(tl.arange(0, 16) == 0, 1.0, 0.0)[None, :]).to(dtype)


@triton.jit
def _row_sums(b_rs, b_dst, b_ones):
    """b_rs `[BQ, 16]` + per query, as its column 0, the sum of a [BT keys, BQ queries] dS^T tile's column: the
    query side of the gate's gradient (`inner.dkv_one_head`: dgc_i gets sum_{j<i} dS_ij), from the 16-bit tiles
    that dq reads, as dS times `_ones_column` (summed over the keys, which lie across the warps, a tl.sum went
    through shared memory every tile and made the kernel 2.4x slower)."""
    return tl.dot(tl.trans(b_dst), b_ones, b_rs)


@triton.jit
def _key_sums(b_ks, b_dst, b_ones):
    """b_ks `[BT, 16]` + per key, as its column 0, the sum of a [BT keys, BQ queries] dS^T tile's row: the key side
    of the gate's gradient (`inner.dkv_one_head`: dgc_j gets minus sum_{i>j} dS_ij) from the same 16-bit values
    as the query side, here rather than in the dK/dV kernel, where the sum cost the Hopper kernel 50 of its 329 us
    at gqa4-long-gated; dS^T times `_ones_column`."""
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


@triton.heuristics({"USE_G": lambda args: args["dgc_q"] is not None,
                    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit(do_not_specialize=["T", "W", "NTILE", "G0", "NTOK"])
def parallel_attn_bwd_kernel_dq_from_ds(
    k, ds, dq, dgc_q, dgk_part, cu_seqlens, chunk_indices, ds_offsets, ks_offsets, scale, T, W, NTILE, G0, NTOK,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr, K: tl.constexpr,
    BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NUM_BANDS: tl.constexpr, USE_G: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """dq of two consecutive query blocks a and b (BQ rows each) of one query head of the chunk [G0, G0 + CHUNK) of
    each of the SPLIT shares of every group (share p: heads p * G / SPLIT ...), from their stored dS tiles
    (NUM_BANDS = B * H * SPLIT * CHUNK bands of NTILE tiles, the dK/dV kernel's order). Each key tile is
    loaded once for both blocks (the K reads through L2 were the kernel's limit); each block's sum
    runs over its tiles in a fixed order: the window edge and the diagonals (tiles either block sees in part) in key
    order, then the tiles both see whole from the highest key down. USE_G: also the query side of the gate's gradient
    into dgc_q `[HQ, B * T]` (fp32, `_row_sums`), and per key tile this program's sums of the key side into
    dgk_part `[programs a band, NUM_BANDS, T]` (fp32, `_key_sums`; `key_side_kernel` adds them up).
    Packed (IS_VARLEN): NUM_BANDS bands a sequence (its KV heads, shares and chunk heads), sequence i_n's from tile
    ds_offsets[i_n] * NUM_BANDS on (`host.band_offsets`); the programs take chunk_indices's (sequence, pair of
    query blocks) entries, the last first; gated, its key sums `[its programs, NUM_BANDS, its length]` from
    element ks_offsets[i_n] * NUM_BANDS of dgk_part on, and dgc_q `[HQ, NTOK]` (NTOK, the packed length: packed
    only, else None)."""
    i_band = tl.program_id(0) % NUM_BANDS
    i_p = tl.num_programs(0) // NUM_BANDS - 1 - tl.program_id(0) // NUM_BANDS  # longest rows first
    i_b, i_h, i_hq = _band_heads(i_band, G0, H=H, G=G, SPLIT=SPLIT, CHUNK=CHUNK)
    if IS_VARLEN:
        i_n, i_p, bos, T = sequence_bounds(0, i_p, T, cu_seqlens, chunk_indices, IS_VARLEN=True)
        tile0, NTILE = band_of(ds_offsets, i_n)
        ds_base = ds + (tile0 * NUM_BANDS + i_band * NTILE) * (BT * BQ)
        p_ks = dgk_part
        if USE_G:
            p_ks = dgk_part + tl.load(ks_offsets + i_n) * NUM_BANDS + (i_p.to(tl.int64) * NUM_BANDS + i_band) * T
    else:
        bos = i_b.to(tl.int64) * T
        ds_base = ds + i_band.to(tl.int64) * NTILE * (BT * BQ)
        NTOK = NUM_BANDS // (H * SPLIT * CHUNK) * T  # B * T
        p_ks = dgk_part
        if USE_G:
            p_ks = dgk_part + (i_p.to(tl.int64) * NUM_BANDS + i_band) * T
    qa = 2 * i_p
    ta = qa * BQ
    lo_a, mid_a, hi_a = _key_ranges(ta, W, BT=BT, BQ=BQ)
    lo_b, mid_b, hi_b = _key_ranges(ta + BQ, W, BT=BT, BQ=BQ)
    b_exists = ta + BQ < T
    k_base = k + (bos * H + i_h) * K
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
    # (C7515). First [lo_a, m) (window edge), then block a's diagonal, then the tiles after it, which
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
        p_dgc = dgc_q + i_hq.to(tl.int64) * NTOK + bos + o_t
        tl.store(p_dgc, tl.sum(b_rsa, 1), mask=o_t < T)
        tl.store(p_dgc + BQ, tl.sum(b_rsb, 1), mask=o_t + BQ < T)
    o_t += BQ
    tl.store(p_dq + o_t[:, None].to(tl.int64) * (HQ * K), (b_dqb * scale).to(dq.dtype.element_ty),
             mask=(o_t < T)[:, None] & (o_k < K)[None, :])


@triton.jit
def _dk_ds_block(b_dk, ds_base, q_base, qi, i_j, T, W, stride_q, K: tl.constexpr, BT: tl.constexpr,
                 BQ: tl.constexpr, BK: tl.constexpr, EDGE: tl.constexpr):
    """b_dk [BT, BK] += dS^T Q over query block qi: its stored [BT keys, BQ queries] tile of key tile i_j and its q
    rows.
    EDGE: a block that sees the key tile in part (diagonal, window edge) or ends past T: its q rows are loaded with
    their row mask and their non-finite elements zeroed (`inner.finite_rows`), since there the stored dS is 0 for the
    pairs a row cannot see and 0 * Inf = NaN would reach keys that do not depend on that row; the keys that see a bad
    row hold NaN in dS already."""
    i_tile = ds_tile_index(qi, i_j, W, BQ=BQ, BT=BT)
    o_t = qi * BQ + tl.arange(0, BQ)
    # [BQ, BK]
    b_q = load_rows(q_base, o_t, T, stride_q, N=K, BN=BK, FULL=not EDGE)
    if EDGE:
        b_q, _ = finite_rows(b_q)
    # [BT, BQ]
    b_dst = tl.load(ds_base + i_tile * (BT * BQ) + tl.arange(0, BT)[:, None] * BQ + tl.arange(0, BQ)[None, :])
    return tl.dot(b_dst, b_q, b_dk)


@triton.heuristics({"ACC_IN": lambda args: args["dk_in"] is not None,
                    "IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit(do_not_specialize=["T", "W", "NTILE", "G0"])
def parallel_attn_bwd_kernel_dk_from_ds(
    q, ds, dk, dk_in, cu_seqlens, chunk_indices, ds_offsets, scale, T, W, NTILE, G0,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr, K: tl.constexpr,
    BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NUM_PARTS: tl.constexpr, ACC_IN: tl.constexpr,
    ACC_OUT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    """dk of one key tile (BT keys) of one share of a group (NUM_PARTS = B * H * SPLIT shares, the dK/dV kernel's
    order) from the stored dS tiles of the chunk [G0, G0 + CHUNK) of the share's heads: dk_j = scale *
    sum_i dS_ij q_i, the dK/dV kernel's dK product moved here where its fp32 sum and dV's together spill (head dims
    above 128; `dispatch.five_route`). Heads in chunk order, then query blocks from the diagonal up: a fixed order
    (deterministic). ACC_IN: start from the fp32 sums dk_in of the earlier chunks; ACC_OUT: store fp32 sums
    unscaled, for the next chunk (dk may be dk_in: a program reads its own tile before it writes it). Packed
    (IS_VARLEN): the key tiles of chunk_indices, each sequence's bands from tile ds_offsets[i_n] * NUM_PARTS * CHUNK
    (`host.band_offsets`)."""
    tl.static_assert(BT % BQ == 0, "query blocks must tile the key tile")
    i_part = tl.program_id(0) % NUM_PARTS
    i_j = tl.program_id(0) // NUM_PARTS  # the first key tiles see the most query blocks: they start first
    i_b, i_share = i_part // (H * SPLIT), i_part % (H * SPLIT)
    if IS_VARLEN:
        i_n, i_j, bos, T = sequence_bounds(0, i_j, T, cu_seqlens, chunk_indices, IS_VARLEN=True)
        tile0, NTILE = band_of(ds_offsets, i_n)
        tile0 *= NUM_PARTS * CHUNK
    else:
        bos = i_b.to(tl.int64) * T
        tile0 = 0
    s0 = i_j * BT
    o_s = s0 + tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    p_dk = (bos * (H * SPLIT) + i_share) * K + o_s[:, None].to(tl.int64) * (H * SPLIT * K) + o_k[None, :]
    m_dk = (o_s < T)[:, None] & (o_k < K)[None, :]
    # [BT, BK]
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    if ACC_IN:
        b_dk = tl.load(dk_in + p_dk, mask=m_dk, other=0)
    # Query blocks [q_lo, full) see the tile in part (diagonal), [full, edge) whole, [edge, q_hi) in part (window
    # edge; the last block of a T that BQ does not divide).
    q_lo = s0 // BQ
    q_hi = tl.minimum(tl.cdiv(T, BQ), tl.cdiv(s0 + BT + W - 1, BQ))
    full = tl.minimum(q_lo + BT // BQ, q_hi)
    edge = tl.maximum(full, tl.minimum((s0 + W) // BQ, T // BQ))
    for i_c in range(CHUNK):
        i_band = i_part * CHUNK + i_c
        ds_base = ds + (tile0 + i_band.to(tl.int64) * NTILE) * (BT * BQ)
        q_base = q + (bos * HQ + i_share * (G // SPLIT) + G0 + i_c) * K
        for qi in range(q_lo, full):
            b_dk = _dk_ds_block(b_dk, ds_base, q_base, qi, i_j, T, W, HQ * K, K=K, BT=BT, BQ=BQ, BK=BK, EDGE=True)
        for qi in range(full, edge):
            b_dk = _dk_ds_block(b_dk, ds_base, q_base, qi, i_j, T, W, HQ * K, K=K, BT=BT, BQ=BQ, BK=BK, EDGE=False)
        for qi in range(edge, q_hi):
            b_dk = _dk_ds_block(b_dk, ds_base, q_base, qi, i_j, T, W, HQ * K, K=K, BT=BT, BQ=BQ, BK=BK, EDGE=True)
    if not ACC_OUT:
        b_dk *= scale
    tl.store(dk + p_dk, b_dk.to(dk.dtype.element_ty), mask=m_dk)


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


@triton.heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit(do_not_specialize=["T", "W", "G0", "NTOK"])
def key_side_kernel(dgk_part, dgc_k, cu_seqlens, chunk_indices, ks_offsets, T, W, G0, NTOK, H: tl.constexpr,
                    G: tl.constexpr, SPLIT: tl.constexpr, CHUNK: tl.constexpr, BT: tl.constexpr, BQ: tl.constexpr,
                    BR: tl.constexpr, BP: tl.constexpr, NUM_BANDS: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The key side of the gate's gradient of BR keys of one band of the chunk: dgc_k `[HQ, B * T]` = minus the
    sum of the partial key sums over the dQ-from-dS programs that stored them (`_key_sums_of_block`). Packed
    (IS_VARLEN): the BR-key blocks of chunk_indices, each sequence's partial sums from element
    ks_offsets[i_n] * NUM_BANDS of dgk_part on (`parallel_attn_bwd_kernel_dq_from_ds`); dgc_k `[HQ, NTOK]`."""
    i_r, i_band = tl.program_id(0), tl.program_id(1)
    i_b, _, i_hq = _band_heads(i_band, G0, H=H, G=G, SPLIT=SPLIT, CHUNK=CHUNK)
    if IS_VARLEN:
        i_n, i_r, bos, T = sequence_bounds(0, i_r, T, cu_seqlens, chunk_indices, IS_VARLEN=True)
        dgk_part += tl.load(ks_offsets + i_n) * NUM_BANDS
    else:
        NTOK = NUM_BANDS // (H * SPLIT * CHUNK) * T  # B * T
        bos = i_b.to(tl.int64) * T
    o_s = i_r * BR + tl.arange(0, BR)
    b_acc = _key_sums_of_block(dgk_part, i_band, i_r * BR, T, W, BT=BT, BQ=BQ, BR=BR, BP=BP, NUM_BANDS=NUM_BANDS)
    tl.store(dgc_k + i_hq.to(tl.int64) * NTOK + bos + o_s, -b_acc, mask=o_s < T)


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
# Scratch
# ----------------------------------------------------------------------------------------------------------------

def band_bytes(T: int, W: int, D: int, gated: bool) -> int:
    """Scratch bytes of one band (one query head of one batch element): its 16-bit dS tiles and, gated, the dQ
    kernel's fp32 key sums, T for each of its cdiv(T, 2 BQ) programs (`key_side_kernel`)."""
    cfg = tile_config("dkv_ds", D)
    tiles = ds_layout(T, W, cfg["BS"], cfg["BT"]) * cfg["BT"] * cfg["BS"] * 2
    return tiles + (cdiv(T, 2 * cfg["BS"]) * T * 4 if gated else 0)
