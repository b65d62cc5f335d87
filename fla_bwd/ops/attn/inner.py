# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Triton building blocks shared by the attention kernels in `kernels.py`.

Conventions (FLA's): `i_` program or loop index, `o_` offsets, `m_` masks, `p_` pointers, `b_` on-chip blocks.
Positions (`o_t`, `o_s`, `i_t`, `i_s`) are int32 token positions inside one sequence; every address is built from
an int64 base pointer (`*_base`, already moved to the sequence start and head) plus `position * stride` computed
in int64, so no address overflows when a tensor passes 2**31 elements.

Scores are kept in base-2 units: `qk_scale = scale * log2(e)`, the gate's cumulative sum gc arrives already
multiplied by log2(e), and the softmax uses `exp2`; the saved log-sum-exp `lse` is in the same base-2 units.
Each score adds the gate difference (gc_i - gc_j) as one per-element subtraction of the two fp32 cumsums, not
folded into lse: gc grows like the sequence length, and the fold would round at that magnitude.

Every loop over key (forward, dQ) or query (dK/dV) blocks is split in three ranges by the `*_ranges` helpers:
blocks that need the window mask, blocks every row sees whole (no mask at all), and the causal diagonal. The block
bodies below are called once per range with `MASK` as a compile-time flag, so the unmasked bulk pays no masking.

NaN/Inf containment (a non-finite input reaches only what depends on it) is a second, compile-time `SAFE` variant
of the masked blocks, run only for a tile whose plain computation produced a non-finite output (`any_nonfinite`).
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)

# How a kernel keeps a NaN/Inf input to the outputs that depend on it: its `CONTAIN` constexpr (see `any_nonfinite`
# and `host.add_contained`, which picks one per call).
INLINE = tl.constexpr(0)  # one launch: a program whose outputs are not finite computes its tile again with SAFE
FLAG = tl.constexpr(1)  # first of two launches: plain tiles; each program stores whether its outputs are not finite
FIXUP = tl.constexpr(2)  # second launch: only the flagged programs run, with SAFE, and overwrite their outputs

# How the five-product dK/dV kernel stores its dS tiles: its `STORE_DS` constexpr (0: it stores none).
DS_BY_DESCRIPTOR = tl.constexpr(1)  # a device-side tensor descriptor: a bulk copy from shared memory
DS_BY_POINTER = tl.constexpr(2)  # plain stores: FIXUP launches, whose few tiles need no descriptor scratch at launch


@triton.jit
def program_ids(NUM_HEADS):
    """Split the flat 1-D grid into (head program, tile). Heads vary fastest, so the first wave of programs holds
    every head of the first tiles; the launchers order tiles longest-first for causal work."""
    i_p = tl.program_id(0)
    return i_p % NUM_HEADS, i_p // NUM_HEADS


@triton.jit
def sequence_bounds(i_b, i_t, T, cu_seqlens, chunk_indices, IS_VARLEN: tl.constexpr):
    """Map (batch, tile) to (sequence, tile index inside it, int64 first token, sequence length)."""
    i_n = i_b
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_t * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_t * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = (eos - bos).to(tl.int32)
    else:
        bos = i_b.to(tl.int64) * T
    return i_n, i_t, bos, T


@triton.jit
def query_tile(B, T, cu_seqlens, chunk_indices, HQ: tl.constexpr, G: tl.constexpr, BT: tl.constexpr,
               IS_VARLEN: tl.constexpr):
    """The forward and dQ programs' prologue: (query head, KV head, sequence, int64 sequence start, sequence length,
    first token of the tile, token positions, their mask). Causal tiles late in a sequence do the most work, so tiles
    are taken in reverse order: those programs start first."""
    i_bh, i_t = program_ids(B * HQ)
    i_t = tl.num_programs(0) // (B * HQ) - 1 - i_t
    i_b, i_hq = i_bh // HQ, i_bh % HQ
    i_n, i_t, bos, T = sequence_bounds(i_b, i_t, T, cu_seqlens, chunk_indices, IS_VARLEN=IS_VARLEN)
    o_t = i_t * BT + tl.arange(0, BT)
    return i_hq, i_hq // G, i_n, bos, T, i_t * BT, o_t, o_t < T


@triton.jit
def key_tile(B, T, cu_seqlens, chunk_indices, NH: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """The dK/dV programs' prologue, over NH head programs per batch: (head, sequence, int64 sequence start, sequence
    length, first key of the tile, key positions, their mask). Tiles keep their natural order: the first key tiles of a
    causal sequence see the most queries and so start first."""
    i_bh, i_tile = program_ids(B * NH)
    i_b, i_head = i_bh // NH, i_bh % NH
    i_n, i_t, bos, T = sequence_bounds(i_b, i_tile, T, cu_seqlens, chunk_indices, IS_VARLEN=IS_VARLEN)
    o_s = i_t * BT + tl.arange(0, BT)
    return i_head, i_n, bos, T, i_t * BT, o_s, o_s < T


@triton.jit
def key_ranges(t0, T, W, WR, BT: tl.constexpr, BS: tl.constexpr, CAUSAL: tl.constexpr):
    """Key blocks for the query tile [t0, t0 + BT), in three consecutive ranges: [lo, mid) need the mask, [mid, hi)
    are fully visible to every row, [hi, end) need the mask. Causal: query i sees keys [i - W + 1, i], and [hi, end)
    is the diagonal from hi = t0. Else keys [i - W + 1, i + WR] below T, and the unmasked range holds whole blocks
    below T only."""
    lo = tl.maximum(t0 - W + 1, 0) // BS * BS
    full = tl.cdiv(tl.maximum(t0 + BT - W, 0), BS) * BS
    if CAUSAL:
        mid = tl.maximum(lo, tl.minimum(full, t0))
        end = tl.minimum(t0 + BT, T)
        hi = t0
    else:
        top = tl.minimum((t0 + WR + 1) // BS * BS, T // BS * BS)  # blocks up to the first row's last key
        mid = tl.maximum(lo, tl.minimum(full, top))
        hi = tl.maximum(mid, top)
        end = tl.minimum(t0 + BT + WR, T)
    return lo, mid, hi, end


@triton.jit
def query_ranges(s0, T, W, WR, BT: tl.constexpr, BS: tl.constexpr, CAUSAL: tl.constexpr):
    """Query blocks for the key tile [s0, s0 + BT), in three consecutive ranges: [first, diag) need the mask,
    [diag, hi) see every key of the tile, [hi, end) need the mask. Causal: key j is seen by queries [j, j + W - 1],
    and [first, diag) is the diagonal from first = s0. Else by queries [j - WR, j + W - 1]."""
    if CAUSAL:  # in the order that the causal kernels' code has always had
        diag = tl.minimum(s0 + BT, T)
        end = tl.minimum(s0 + BT + W - 1, T)
        hi = tl.maximum(diag, tl.minimum((s0 + W) // BS * BS, end))
        first = s0
    else:
        end = tl.minimum(s0 + BT + W - 1, T)
        first = tl.maximum(s0 - WR, 0) // BS * BS
        top = tl.minimum((s0 + W) // BS * BS, end)  # blocks up to the last query that sees the tile's first key
        diag = tl.maximum(first, tl.minimum(tl.cdiv(tl.maximum(s0 + BT - 1 - WR, 0), BS) * BS, top))
        hi = tl.maximum(diag, top)
    return first, diag, hi, end


@triton.jit
def visible(o_a, o_b, W, WR, T, KEYS_FIRST: tl.constexpr, CAUSAL: tl.constexpr):
    """Sliding-window mask: [len(o_a), len(o_b)] with o_a the query positions and o_b the key positions, or with
    KEYS_FIRST the transposed layout (o_a keys, o_b queries). Causal: query i sees keys [i - W + 1, i]; else keys
    [i - W + 1, i + WR] below T (a key past the sequence's end would be seen by the rows before it)."""
    if KEYS_FIRST:
        d = o_b[None, :] - o_a[:, None]
    else:
        d = o_a[:, None] - o_b[None, :]
    m = (d >= 0) & (d < W)
    if not CAUSAL:
        if KEYS_FIRST:
            m = (d >= -WR) & (d < W) & (o_a[:, None] < T)
        else:
            m = (d >= -WR) & (d < W) & (o_b[None, :] < T)
    return m


@triton.jit
def tanh(x):
    """tanh in fp32 from one exp2: 1 - 2 / (e^(2x) + 1), within ~1e-7 of tanh; +-1 where e^(2x) overflows or
    vanishes, NaN for NaN."""
    return 1 - 2 / (tl.exp2(x * (2 * LOG2E)) + 1)


@triton.jit
def score_scales(scale, softcap, SOFTCAP: tl.constexpr):
    """(qk_scale, cap_in) for `scores`: (scale * log2 e, unused) or, with SOFTCAP, (softcap * log2 e,
    scale / softcap)."""
    qk_scale = scale * LOG2E
    cap_in = scale
    if SOFTCAP:
        qk_scale = softcap * LOG2E
        cap_in = scale / softcap
    return qk_scale, cap_in


@triton.jit
def scores(b_qk, qk_scale, cap_in, SOFTCAP: tl.constexpr):
    """(base-2 scores of the q.k products b_qk, t): qk_scale * b_qk; with SOFTCAP (`score_scales`) the capped
    log2(e) * softcap * tanh(scale * q.k / softcap), and t that tanh, whose derivative 1 - t^2 turns a score's
    gradient into its q.k product's (`capped`). Without SOFTCAP t is b_qk, unused."""
    b_t = b_qk
    if SOFTCAP:
        b_t = tanh(b_qk * cap_in)
        b_s = b_t * qk_scale
    else:
        b_s = b_qk * qk_scale
    return b_s, b_t


@triton.jit
def capped(b_ds, b_t, SOFTCAP: tl.constexpr):
    """dS of the q.k products from dS of the scores: times 1 - t^2 with SOFTCAP (`scores`), else b_ds."""
    if SOFTCAP:
        b_ds = b_ds * (1 - b_t * b_t)
    return b_ds


@triton.jit
def row_flags(b_x):
    """Per row of b_x: 0 if every element is finite, NaN otherwise. x * 0 is exactly 0 for every finite x, so this
    sums zeros and never overflows. In fp32: the CPU interpreter keeps bf16 as raw integer bit patterns, so a bf16
    x * 0 there is 0 even for NaN."""
    return tl.sum(b_x.to(tl.float32) * 0, 1)


@triton.jit
def finite_rows(b_x):
    """(b_x with its NaN/Inf elements replaced by 0, `row_flags(b_x)`), for a masked block's product
    (masked A) @ b_x: the masked zeros of A times a non-finite row of b_x would be NaN (0 * NaN = 0 * Inf = NaN) in
    rows that cannot see it, while 0 * 0 leaves them bitwise unchanged. The rows that do see it must still turn
    NaN: either their entries of A are already NaN, or the caller adds the flag to them."""
    return tl.where(b_x.to(tl.float32) * 0 == 0, b_x, 0), row_flags(b_x)


@triton.jit
def any_nonfinite(b_x):
    """Whether the 2-D block b_x holds a NaN or an Inf (a scalar).

    Every kernel computes its tile first without the NaN/Inf containment of the masked blocks (SAFE=False: the
    masked zeros of P and dS simply multiply their operands) and tests its outputs with this; only a tile with a
    non-finite output is computed again with SAFE=True, in the same program or in a second launch (the kernels'
    CONTAIN modes INLINE, FLAG and FIXUP; `host.add_contained` picks). This is exact: the plain pass can
    only add NaN (0 * NaN, 0 * Inf) to what the contained pass computes, never remove one, so finite outputs of the
    plain pass are the contained result. Containment inside every masked block instead slowed the loops: the
    zeroed operands left the shared-memory path of the matrix products and raised the spills."""
    return tl.sum(row_flags(b_x), 0) != 0


@triton.jit
def o_lo_encode(b_o, b_r):
    """o_lo, the forward's int8 record of o's rounding (for a gated five-product backward's delta): the fp32 bit
    patterns of b_o (fp32) minus those of b_r (b_o rounded to o's 16-bit dtype), in units of 2**SHIFT fp32 ulps,
    rounded to nearest: 1/128 of a 16-bit ulp (SHIFT 9 for bf16's 7 mantissa bits, 6 for fp16's 10). Rounding moves
    o at most half a 16-bit ulp, so |o_lo| <= 64; the clamp acts only below fp16's normal range (an error < 2**-25)."""
    b_d = b_o.to(tl.int32, bitcast=True) - b_r.to(tl.float32).to(tl.int32, bitcast=True)
    if b_r.dtype == tl.bfloat16:
        b_d = (b_d + 256) >> 9
    else:
        b_d = (b_d + 32) >> 6
    return tl.minimum(tl.maximum(b_d, -128), 127).to(tl.int8)


@triton.jit
def o_lo_decode(b_r, b_lo):
    """o in fp32 from b_r (o as stored, 16-bit) and its o_lo (`o_lo_encode`): to within 2**(SHIFT - 1) fp32 ulps,
    2**-16 (bf16) or 2**-19 (fp16) of |o|. Masked lanes loaded as 0 (both) decode to 0."""
    b_lo = b_lo.to(tl.int32)
    if b_r.dtype == tl.bfloat16:
        b_lo = b_lo << 9
    else:
        b_lo = b_lo << 6
    return (b_r.to(tl.float32).to(tl.int32, bitcast=True) + b_lo).to(tl.float32, bitcast=True)


@triton.jit
def key_gate(gk_base, i_s, T, BS: tl.constexpr, USE_G: tl.constexpr):
    """The gate's cumsum gc of keys [i_s, i_s + BS), or a scalar 0 without gates. Loaded one block ahead by the
    loops: Triton's pipeliner stages only the tile loads that feed dots, so a small vector load used in the same
    iteration stalls it on a global-memory round trip."""
    if USE_G:
        o_s = i_s + tl.arange(0, BS)
        return tl.load(gk_base + o_s, mask=o_s < T, other=0)
    else:
        return 0.0


@triton.jit
def _floor_sum(n, R: tl.constexpr):
    """sum of u // R for u in [0, n), n >= 0 (int64)."""
    m = n // R
    return R * m * (m - 1) // 2 + (n % R) * m


@triton.jit
def ds_tile_index(qi, kj, W, BQ: tl.constexpr, BT: tl.constexpr):
    """Index of the dS tile (query block qi of BQ rows, key tile kj of BT keys) in one head's band of stored tiles
    (`from_ds.ds_layout` is the same formula on the host, and says the layout). int64."""
    tl.static_assert(BT % BQ == 0, "query blocks must tile the key tile")
    R: tl.constexpr = BT // BQ
    qi = tl.cast(qi, tl.int64)
    # The tiles of the blocks before qi, minus the key tiles before the first one qi sees (lo(qi)).
    shifted = tl.maximum(qi - (W - 1 + BQ - 1) // BQ, 0)
    return qi + _floor_sum(qi, R) - _floor_sum(shifted, R) - tl.maximum(qi * BQ + 1 - W, 0) // BT + kj


@triton.jit
def band_of(ds_offsets, i_n):
    """(first tile, tiles a band) of packed sequence i_n's dS bands (`host.band_offsets`: by sequence, then band)."""
    tile0 = tl.load(ds_offsets + i_n)
    return tile0, (tl.load(ds_offsets + i_n + 1) - tile0).to(tl.int32)


@triton.jit
def load_rows(base, o_r, T, stride, N: tl.constexpr, BN: tl.constexpr, FULL: tl.constexpr, TRANS: tl.constexpr = False):
    """Rows o_r (those < T exist) of a row-major matrix with N columns and row stride `stride` at `base`, as a
    [len(o_r), BN] block, or with TRANS its [BN, len(o_r)] transpose; zero where a row or column does not exist.
    FULL: the caller knows every row of the block exists, so the load carries no per-row predicate (and no mask at
    all when N == BN). The loops load full blocks everywhere but at a sequence's end, see `*_ranges`."""
    o_c = tl.arange(0, BN)
    if TRANS:
        p = base + o_r[None, :].to(tl.int64) * stride + o_c[:, None]
        m_c = o_c[:, None] < N
        m_r = o_r[None, :] < T
    else:
        p = base + o_r[:, None].to(tl.int64) * stride + o_c[None, :]
        m_c = o_c[None, :] < N
        m_r = o_r[:, None] < T
    if FULL:
        if N == BN:
            b = tl.load(p)
        else:
            b = tl.load(p, mask=m_c, other=0)
    else:
        b = tl.load(p, mask=m_r & m_c, other=0)
    return b


@triton.jit
def fwd_block(
    b_q, b_o, b_m, b_l, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s, T, W, qk_scale, cap_in, WR,
    stride_k, stride_v,
    K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, MASK: tl.constexpr, FULL: tl.constexpr, DOT_PREC: tl.constexpr, SAFE: tl.constexpr,
    SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """One key block of the online softmax: fold keys [i_s, i_s + BS) into (b_o, b_m, b_l). With gates, b_gk is
    this block's key-side gc, loaded one block ahead (see `key_gate`); the next block's is returned. FULL: every key
    of the block exists (see `load_rows`). SAFE: keep non-finite inputs out of the rows that do not depend on them
    (see `any_nonfinite`)."""
    b_gk_next = key_gate(gk_base, i_s + BS, T, BS=BS, USE_G=USE_G)
    o_s = i_s + tl.arange(0, BS)
    # [BK, BS]
    b_kt = load_rows(k_base, o_s, T, stride_k, N=K, BN=BK, FULL=FULL, TRANS=True)
    # [BS, BV]
    b_v = load_rows(v_base, o_s, T, stride_v, N=V, BN=BV, FULL=FULL)
    # [BT, BS]
    b_s, _ = scores(tl.dot(b_q, b_kt, input_precision=DOT_PREC), qk_scale, cap_in, SOFTCAP=SOFTCAP)
    if USE_G:
        b_s += b_gq[:, None] - b_gk[None, :]
    if MASK:
        m_vis = visible(o_t, o_s, W, WR, T, KEYS_FIRST=False, CAUSAL=CAUSAL)
        b_s = tl.where(m_vis, b_s, float("-inf"))
    b_m_new = tl.maximum(b_m, tl.max(b_s, 1))
    # A row with nothing visible yet keeps m = -inf; subtracting 0 instead keeps exp2 at 0 rather than NaN.
    b_m_ref = tl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    b_p = tl.exp2(b_s - b_m_ref[:, None])
    b_alpha = tl.exp2(b_m - b_m_ref)
    b_l = b_l * b_alpha + tl.sum(b_p, 1)
    if MASK and SAFE:
        # A non-finite v row would turn the masked zeros of P into NaN (0 * NaN) in the rows that cannot see it:
        # zero it, and flag the visible entries of P that feed o, so the rows that see it still turn NaN. Only
        # after l: lse does not depend on v (dv depends on lse and must stay finite).
        b_zv = row_flags(b_v)
        if tl.sum(b_zv, 0) != 0:
            b_v = tl.where(b_zv[:, None] == 0, b_v, 0)
            b_p = tl.where(m_vis, b_p + b_zv[None, :], 0)
    b_o = b_o * b_alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=DOT_PREC)
    return b_o, b_m_new, b_l, b_gk_next


@triton.jit
def fwd_tile(
    b_q, b_gq, k_base, v_base, gk_base, o_t, t0, T, W, qk_scale, cap_in, WR, stride_k, stride_v,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, DOT_PREC: tl.constexpr, SAFE: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """The forward's key loop for the query tile [t0, t0 + BT) over the three `key_ranges`: (o unnormalised,
    running max m, running sum l). Its loads keep their row masks (FULL=False) even where the blocks are full: at
    these tiles the unmasked loads cut the loops' instructions but raised their spills."""
    # [BT, BV]
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_m = tl.full([BT], float("-inf"), dtype=tl.float32)
    b_l = tl.zeros([BT], dtype=tl.float32)
    lo, mid, hi, end = key_ranges(t0, T, W, WR, BT=BT, BS=BS, CAUSAL=CAUSAL)
    # The three ranges are consecutive BS-blocks from lo, so the one-ahead gate prefetch runs across them.
    b_gk = key_gate(gk_base, lo, T, BS=BS, USE_G=USE_G)
    for i_s in range(lo, mid, BS):
        b_o, b_m, b_l, b_gk = fwd_block(
            b_q, b_o, b_m, b_l, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s, T, W, qk_scale, cap_in, WR, stride_k,
            stride_v, K=K, V=V, BS=BS, BK=BK, BV=BV, USE_G=USE_G, MASK=True, FULL=False, DOT_PREC=DOT_PREC,
            SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    for i_s in range(mid, hi, BS):
        b_o, b_m, b_l, b_gk = fwd_block(
            b_q, b_o, b_m, b_l, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s, T, W, qk_scale, cap_in, WR, stride_k,
            stride_v, K=K, V=V, BS=BS, BK=BK, BV=BV, USE_G=USE_G, MASK=False, FULL=False, DOT_PREC=DOT_PREC,
            SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    for i_s in range(hi, end, BS):
        b_o, b_m, b_l, b_gk = fwd_block(
            b_q, b_o, b_m, b_l, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s, T, W, qk_scale, cap_in, WR, stride_k,
            stride_v, K=K, V=V, BS=BS, BK=BK, BV=BV, USE_G=USE_G, MASK=True, FULL=False, DOT_PREC=DOT_PREC,
            SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    return b_o, b_m, b_l


@triton.jit
def dq_block(
    b_q, b_do, b_dq, b_pdp, b_off_pdp, b_off_p, b_lse, b_delta, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s, T, W,
    qk_scale, cap_in, WR,
    stride_k, stride_v,
    K: tl.constexpr, V: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REFINE_DELTA: tl.constexpr, MASK: tl.constexpr, FULL: tl.constexpr, DOT_PREC: tl.constexpr,
    USE_G: tl.constexpr, COMPUTE_DQ: tl.constexpr, SAFE: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """dQ contribution of keys [i_s, i_s + BS): dq += dS @ K, dS = P * (dO @ V^T - delta). Unscaled.
    With REFINE_DELTA it also accumulates b_pdp += rowsum(P * dP), the fp32 delta (see the dQ kernel);
    dS = P * dP - P * delta shares that product, so the refinement costs one row sum. Without COMPUTE_DQ only
    b_pdp is accumulated (two of the three products). With REFINE_DELTA and gates it also accumulates, over the
    keys other than the query itself, b_off_pdp += rowsum(P * dP) and b_off_p += rowsum(P) (see `dkv_one_head`).
    b_gk as in `fwd_block`. SOFTCAP: the row sums are of the scores' dS, dq's product takes the q.k products'
    (`capped`)."""
    b_gk_next = key_gate(gk_base, i_s + BS, T, BS=BS, USE_G=USE_G)
    o_s = i_s + tl.arange(0, BS)
    # [BS, BK]
    b_k = load_rows(k_base, o_s, T, stride_k, N=K, BN=BK, FULL=FULL)
    # [BS, BV]
    b_v = load_rows(v_base, o_s, T, stride_v, N=V, BN=BV, FULL=FULL)
    # [BT, BS]
    b_s, b_t = scores(tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC), qk_scale, cap_in, SOFTCAP=SOFTCAP)
    if USE_G:
        b_s += b_gq[:, None] - b_gk[None, :]
    b_p = tl.exp2(b_s - b_lse[:, None])
    if MASK and not SAFE:
        b_p = tl.where(visible(o_t, o_s, W, WR, T, KEYS_FIRST=False, CAUSAL=CAUSAL), b_p, 0)
    b_dp = tl.dot(b_do, tl.trans(b_v), input_precision=DOT_PREC)
    if MASK and SAFE:
        # Mask after the arithmetic: a non-finite k or v row makes a whole column of s or dP NaN, and 0 * NaN would
        # carry it into the rows that cannot see that key. Those NaN stay in the visible entries, so the rows that
        # see the key still turn NaN; zeroing the bad k rows (already used by s) keeps them out of dS @ K.
        m_vis = visible(o_t, o_s, W, WR, T, KEYS_FIRST=False, CAUSAL=CAUSAL)
        b_p = tl.where(m_vis, b_p, 0)
        b_dp = tl.where(m_vis, b_dp, 0)
        b_k, _ = finite_rows(b_k)
        if SOFTCAP:  # t of a non-finite q or k is NaN: keep it out of the masked zeros
            b_t = tl.where(m_vis, b_t, 0)
    if REFINE_DELTA:
        b_pdp_tile = b_p * b_dp
        b_pdp_row = tl.sum(b_pdp_tile, 1)
        b_pdp += b_pdp_row
        if USE_G:
            if MASK:
                off = o_t[:, None] != o_s[None, :]
                b_off_pdp += tl.sum(tl.where(off, b_pdp_tile, 0), 1)
                b_off_p += tl.sum(tl.where(off, b_p, 0), 1)
            else:  # every key of an unmasked block precedes every query of the tile
                b_off_pdp += b_pdp_row
                b_off_p += tl.sum(b_p, 1)
        if COMPUTE_DQ:
            b_ds = capped(b_pdp_tile - b_p * b_delta[:, None], b_t, SOFTCAP=SOFTCAP)
            b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=DOT_PREC)
    else:
        b_ds = capped(b_p * (b_dp - b_delta[:, None]), b_t, SOFTCAP=SOFTCAP)
        b_dq += tl.dot(b_ds.to(b_k.dtype), b_k, input_precision=DOT_PREC)
    return b_dq, b_pdp, b_off_pdp, b_off_p, b_gk_next


@triton.jit
def dq_tile(
    b_q, b_do, b_lse, b_delta, b_gq, k_base, v_base, gk_base, o_t, t0, T, W, qk_scale, cap_in, WR, stride_k, stride_v,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    REFINE_DELTA: tl.constexpr, DOT_PREC: tl.constexpr, USE_G: tl.constexpr, COMPUTE_DQ: tl.constexpr,
    SAFE: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """dQ's key loop for the query tile [t0, t0 + BT), over the forward's key ranges: (dq unscaled, and the row
    sums of `dq_block`)."""
    # [BT, BK]
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_pdp = tl.zeros([BT], dtype=tl.float32)
    b_off_pdp = tl.zeros([BT], dtype=tl.float32)
    b_off_p = tl.zeros([BT], dtype=tl.float32)
    lo, mid, hi, end = key_ranges(t0, T, W, WR, BT=BT, BS=BS, CAUSAL=CAUSAL)
    b_gk = key_gate(gk_base, lo, T, BS=BS, USE_G=USE_G)
    for i_s in range(lo, mid, BS):
        b_dq, b_pdp, b_off_pdp, b_off_p, b_gk = dq_block(
            b_q, b_do, b_dq, b_pdp, b_off_pdp, b_off_p, b_lse, b_delta, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s,
            T, W, qk_scale, cap_in, WR, stride_k, stride_v,
            K=K, V=V, BS=BS, BK=BK, BV=BV, REFINE_DELTA=REFINE_DELTA, MASK=True, FULL=True, DOT_PREC=DOT_PREC,
            USE_G=USE_G, COMPUTE_DQ=COMPUTE_DQ, SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    for i_s in range(mid, hi, BS):
        b_dq, b_pdp, b_off_pdp, b_off_p, b_gk = dq_block(
            b_q, b_do, b_dq, b_pdp, b_off_pdp, b_off_p, b_lse, b_delta, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s,
            T, W, qk_scale, cap_in, WR, stride_k, stride_v,
            K=K, V=V, BS=BS, BK=BK, BV=BV, REFINE_DELTA=REFINE_DELTA, MASK=False, FULL=True, DOT_PREC=DOT_PREC,
            USE_G=USE_G, COMPUTE_DQ=COMPUTE_DQ, SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    for i_s in range(hi, end, BS):
        b_dq, b_pdp, b_off_pdp, b_off_p, b_gk = dq_block(
            b_q, b_do, b_dq, b_pdp, b_off_pdp, b_off_p, b_lse, b_delta, b_gq, b_gk, k_base, v_base, gk_base, o_t, i_s,
            T, W, qk_scale, cap_in, WR, stride_k, stride_v,
            K=K, V=V, BS=BS, BK=BK, BV=BV, REFINE_DELTA=REFINE_DELTA, MASK=True, FULL=False, DOT_PREC=DOT_PREC,
            USE_G=USE_G, COMPUTE_DQ=COMPUTE_DQ, SAFE=SAFE, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    return b_dq, b_pdp, b_off_pdp, b_off_p


@triton.jit
def query_rows(lse_base, delta_base, gq_base, i_t, T, BS: tl.constexpr, USE_G: tl.constexpr):
    """Per-query vectors of the query block [i_t, i_t + BS): lse (+inf past the sequence end, so P is exactly 0
    there without a mask), delta, and the gate's cumsum gc (0 without gates)."""
    o_t = i_t + tl.arange(0, BS)
    m_t = o_t < T
    b_lse = tl.load(lse_base + o_t, mask=m_t, other=float("inf"))
    b_delta = tl.load(delta_base + o_t, mask=m_t, other=0)
    b_gq = tl.zeros([BS], dtype=tl.float32)
    if USE_G:
        b_gq = tl.load(gq_base + o_t, mask=m_t, other=0)
    return b_lse, b_delta, b_gq


@triton.jit
def dkv_block(
    b_k, b_v, b_dk, b_dv, b_dgk, b_gk, b_lse, b_delta, b_gq, q_base, do_base, lse_base, delta_base, gq_base, ds,
    ds_tile0, o_s, i_t, T, W, qk_scale, cap_in, WR, stride_q, stride_do, sink2,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, MASK: tl.constexpr, FULL: tl.constexpr, DOT_PREC: tl.constexpr, SAFE: tl.constexpr,
    STORE_DS: tl.constexpr, SINK_SUM: tl.constexpr, DK_FROM_DS: tl.constexpr, SOFTCAP: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """dK/dV contribution of queries [i_t, i_t + BS) to the key tile o_s, in transposed ([keys, queries]) form.
    FULL: every query of the block exists (see `load_rows`). STORE_DS: also store the 16-bit dS^T tile that the dK
    product consumes (`from_ds.py`) at tile ds_tile0 + (this block's first tile) of the tiles' [tiles * BT, BS] view:
    through the tensor descriptor `ds` (DS_BY_DESCRIPTOR; its rows < 2**31, `from_ds.ds_chunk`) or into the buffer
    `ds` by plain stores (DS_BY_POINTER). SINK_SUM (with STORE_DS, whose b_dgk is otherwise unused): b_dgk += per
    key the fp32 sum of p_sink_i * dS_ij over the block's queries, p_sink_i = exp2(sink2 - lse_i) (`dkv_one_head`).
    DK_FROM_DS (with STORE_DS): no dK product (`from_ds.parallel_attn_bwd_kernel_dk_from_ds` reads the stored tiles);
    b_dk is then a [BT, BS] fp32 block that gathers dS^T * 0, which turns NaN where any stored dS is not finite:
    the containment flag that dK's own NaN would otherwise raise (`any_nonfinite`). SOFTCAP: dK and the stored tiles
    take the q.k products' dS (`capped`), the gate's and the sink's sums the scores'.

    (b_lse, b_delta, b_gq) are this block's `query_rows`, loaded one iteration ahead; the block returns the next
    block's. Triton's pipeliner stages only the tile loads that feed dots, so these small vector loads would
    otherwise stall every iteration on a global-memory round trip.
    """
    if not STORE_DS:
        b_lse_next, b_delta_next, b_gq_next = query_rows(lse_base, delta_base, gq_base, i_t + BS, T, BS=BS,
                                                         USE_G=USE_G)
    o_t = i_t + tl.arange(0, BS)
    # [BS, BK]
    b_q = load_rows(q_base, o_t, T, stride_q, N=K, BN=BK, FULL=FULL)
    # [BS, BV]
    b_do = load_rows(do_base, o_t, T, stride_do, N=V, BN=BV, FULL=FULL)
    # [BT, BS]
    b_st, b_tt = scores(tl.dot(b_k, tl.trans(b_q), input_precision=DOT_PREC), qk_scale, cap_in, SOFTCAP=SOFTCAP)
    if USE_G:
        b_st += b_gq[None, :] - b_gk[:, None]
    b_pt = tl.exp2(b_st - b_lse[None, :])
    if MASK and not SAFE:
        b_pt = tl.where(visible(o_s, o_t, W, WR, T, KEYS_FIRST=True, CAUSAL=CAUSAL), b_pt, 0)
    if MASK and SAFE:
        # Keep a non-finite query row (q, dO, or the lse/delta of a row that depends on one) out of the keys that
        # cannot see it, where 0 * NaN = NaN: zero the bad q and dO rows (q is already used by s^T) and mask P^T
        # and dS^T's factor dP^T - delta. A bad q row or lse already makes its visible P^T entries NaN; a bad dO
        # row does not (it is zeroed), so its flag is added to them. A NaN delta must reach dS^T but not P^T (dv
        # does not depend on it), hence the second mask; a bad v row only reaches its own key's dP^T row.
        b_q, _ = finite_rows(b_q)
        b_do, b_zdo = finite_rows(b_do)
        m_vis = visible(o_s, o_t, W, WR, T, KEYS_FIRST=True, CAUSAL=CAUSAL)
        b_pt = tl.where(m_vis, b_pt + b_zdo[None, :], 0)
    b_dv += tl.dot(b_pt.to(b_do.dtype), b_do, input_precision=DOT_PREC)
    b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=DOT_PREC)
    if MASK and SAFE:  # masks a factor, not the product: the dgk sums then fuse to fma as FLAG's do (bitwise FLAG)
        b_dst = b_pt * tl.where(m_vis, b_dpt - b_delta[None, :], 0)
    else:
        b_dst = b_pt * (b_dpt - b_delta[None, :])
    # [BT, BS] dS of the q.k products: what dK (here, or from the stored tiles) and dQ take
    b_dsc = capped(b_dst, b_tt, SOFTCAP=SOFTCAP)
    if SOFTCAP and MASK and SAFE:  # t of a non-finite q or k is NaN: keep it out of the masked zeros
        b_dsc = tl.where(m_vis, b_dsc, 0)
    if STORE_DS:
        row = (ds_tile0 + ds_tile_index(i_t // BS, 0, W, BQ=BS, BT=BT)) * BT  # int64
        if STORE_DS == DS_BY_DESCRIPTOR:
            ds.store([row.to(tl.int32), 0], b_dsc.to(b_q.dtype))
        else:
            o_r = row + tl.arange(0, BT)
            tl.store(ds + o_r[:, None] * BS + tl.arange(0, BS)[None, :], b_dsc.to(b_q.dtype))
        # The next block's rows only now: the store's shared-memory fences (MEMBAR.ALL.CTA) wait for every load
        # issued before them, which would make this prefetch a round trip per block.
        b_lse_next, b_delta_next, b_gq_next = query_rows(lse_base, delta_base, gq_base, i_t + BS, T, BS=BS,
                                                         USE_G=USE_G)
    if DK_FROM_DS:
        tl.static_assert(STORE_DS != 0, "dK from dS needs the dS tiles stored")
        b_dk += b_dsc * 0
    else:
        b_dk += tl.dot(b_dsc.to(b_q.dtype), b_q, input_precision=DOT_PREC)
    if SINK_SUM:
        tl.static_assert(STORE_DS != 0, "the sink's sums take b_dgk, which only the dS-storing kernel leaves free")
        b_dgk += tl.sum(b_dst * tl.exp2(sink2 - b_lse)[None, :], 1)
    if USE_G and not STORE_DS:  # with STORE_DS, dQ from dS sums both sides from the stored tiles (`from_ds.py`)
        if MASK:
            b_dgk += tl.sum(tl.where(o_s[:, None] != o_t[None, :], b_dst, 0), 1)
        else:
            b_dgk += tl.sum(b_dst, 1)
    return b_dk, b_dv, b_dgk, b_lse_next, b_delta_next, b_gq_next


@triton.jit
def dkv_one_head(
    b_k, b_v, b_dk, b_dv, b_gk, q_base, do_base, lse_base, delta_base, gq_base, dgk_base, ds, ds_tile0, s0,
    T, W, Q0, qk_scale, cap_in, WR, stride_q, stride_do, sink2,
    K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_G: tl.constexpr, DOT_PREC: tl.constexpr, SAFE: tl.constexpr, TAIL_Q: tl.constexpr, STORE_DS: tl.constexpr,
    SINK_SUM: tl.constexpr, DK_FROM_DS: tl.constexpr, SOFTCAP: tl.constexpr, CAUSAL: tl.constexpr,
):
    """Accumulate one query head's contribution to the key tile [s0, s0 + BT); with gates, complete that head's
    gradient dgc w.r.t. the gate's cumsum for the tile's tokens.

    dgc_j = sum_{i<j} dS_ji (j as a query) - sum_{i>j} dS_ij (j as a key). The pair (j, j) is left out of both:
    its score does not depend on gc (gc_j - gc_j), and its dS is a difference of two nearly equal numbers whenever j
    attends mostly to itself (very negative gates: true dg ~1e-7 against a rounding error of ~1e-6). The dQ kernel
    has already stored the query side, from fp32 row sums and the fp32 delta (see `dq_block`); this stores minus the
    key side into its own buffer (`dgk_base`; with STORE_DS neither: `from_ds.py` sums both from the stored tiles), and
    the reverse cumsum of dg adds the two (`gate_grad`): a plain store,
    so that a program that recomputes its tile (see `any_nonfinite`) overwrites what it wrote the first time.
    Not the closed form delta_j * p_sink_j of the full query-side sum: exact, but it keeps dS_jj.

    SINK_SUM (the dS-storing kernel, with a sink whose logit times log2 e is sink2): store at dgk_base the fp32 sum
    over the tile's pairs of p_sink_i * dS_ij, this head's share of the sink's gradient (`from_ds.sink_grad_kernel`).
    DK_FROM_DS: b_dk is the block of `dkv_block`'s DK_FROM_DS, not dK.

    TAIL_Q: only positions [Q0, T) are queries (Q0 a multiple of BS; `kernels._query_tile`): each range starts at
    Q0 at the earliest, so the ranges stay consecutive BS-blocks (from max(first, Q0)) and no row before Q0 is read.
    """
    tl.static_assert(CAUSAL or not (USE_G or STORE_DS), "gates and dS tiles are causal")
    o_s = s0 + tl.arange(0, BT)
    m_s = o_s < T
    if STORE_DS:
        ds_tile0 += s0 // BT  # this key tile in query block 0's row of tiles
    # [BT]
    b_dgk = tl.zeros([BT], dtype=tl.float32)
    first, diag, hi, end = query_ranges(s0, T, W, WR, BT=BT, BS=BS, CAUSAL=CAUSAL)
    # A partial last block (T not a multiple of BS) of the unmasked range goes to the masked one, whose mask it
    # passes whole: the unmasked loop then loads only full blocks, without per-row predicates (see `load_rows`).
    hi = tl.maximum(diag, tl.minimum(hi, T // BS * BS))
    t_diag, t_full, t_mask = first, diag, hi
    if TAIL_Q:
        t_diag, t_full, t_mask = tl.maximum(first, Q0), tl.maximum(diag, Q0), tl.maximum(hi, Q0)
    # The three ranges are consecutive BS-blocks from t_diag, so the one-ahead prefetch runs across them.
    b_lse, b_delta, b_gq = query_rows(lse_base, delta_base, gq_base, t_diag, T, BS=BS, USE_G=USE_G)
    for i_t in range(t_diag, diag, BS):
        b_dk, b_dv, b_dgk, b_lse, b_delta, b_gq = dkv_block(
            b_k, b_v, b_dk, b_dv, b_dgk, b_gk, b_lse, b_delta, b_gq, q_base, do_base, lse_base, delta_base, gq_base,
            ds, ds_tile0, o_s, i_t, T, W, qk_scale, cap_in, WR, stride_q, stride_do, sink2,
            K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, MASK=True, FULL=False, DOT_PREC=DOT_PREC, SAFE=SAFE,
            STORE_DS=STORE_DS, SINK_SUM=SINK_SUM, DK_FROM_DS=DK_FROM_DS, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    for i_t in range(t_full, hi, BS):
        b_dk, b_dv, b_dgk, b_lse, b_delta, b_gq = dkv_block(
            b_k, b_v, b_dk, b_dv, b_dgk, b_gk, b_lse, b_delta, b_gq, q_base, do_base, lse_base, delta_base, gq_base,
            ds, ds_tile0, o_s, i_t, T, W, qk_scale, cap_in, WR, stride_q, stride_do, sink2,
            K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, MASK=False, FULL=True, DOT_PREC=DOT_PREC, SAFE=SAFE,
            STORE_DS=STORE_DS, SINK_SUM=SINK_SUM, DK_FROM_DS=DK_FROM_DS, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    for i_t in range(t_mask, end, BS):
        b_dk, b_dv, b_dgk, b_lse, b_delta, b_gq = dkv_block(
            b_k, b_v, b_dk, b_dv, b_dgk, b_gk, b_lse, b_delta, b_gq, q_base, do_base, lse_base, delta_base, gq_base,
            ds, ds_tile0, o_s, i_t, T, W, qk_scale, cap_in, WR, stride_q, stride_do, sink2,
            K=K, V=V, BT=BT, BS=BS, BK=BK, BV=BV, USE_G=USE_G, MASK=True, FULL=False, DOT_PREC=DOT_PREC, SAFE=SAFE,
            STORE_DS=STORE_DS, SINK_SUM=SINK_SUM, DK_FROM_DS=DK_FROM_DS, SOFTCAP=SOFTCAP, CAUSAL=CAUSAL)
    if USE_G and not STORE_DS:
        tl.store(dgk_base + o_s, -b_dgk, mask=m_s)
    if SINK_SUM:
        tl.store(dgk_base, tl.sum(b_dgk, 0))
    return b_dk, b_dv
