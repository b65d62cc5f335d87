# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The forward for Hopper, written in Gluon (issue 61): o and the base-2 log-sum-exp of 128-query tiles of one query
head, as `kernels.parallel_attn_fwd_kernel` computes them, in FlashAttention-3's structure.

Persistent (`programs`): one program an SM walks the tiles of the Triton forward's grid (`inner.query_tile`'s order:
heads fastest, tiles longest first), a tile a round, the rounds snaking over the programs (`_tile_of_round`). A producer
partition copies each tile's q and then each 128-key tile's K and V by TMA into a ring of shared-memory stages
behind mbarriers (K and V of a stage on barriers of their own: the scores' product waits for K alone; the ring's
count runs on across tiles). Two consumer warpgroups own 64 queries each and share every K/V stage. Each overlaps
its products within the iteration: it issues S_j = Q K_j^T, then O += P_{j-1} V_{j-1}, waits for S_j alone and runs
the online softmax of S_j while the P V product is in flight, then waits for that product and rescales O (FA3's
intra-warpgroup pipelining). q is released after a tile's last S product, so the next tile's q and first K/V stages
load under this tile's last P V product and epilogue; o is stored from registers (three K/V stages leave no shared
memory for a staging tile). FA3's ping-pong of the two warpgroups measured no faster here (g8-T8192 891 against 878
us, H100, before the grid was persistent).

It is the FLAG launch of the two-launch containment (`host.add_contained`): each tile's flag says whether its
unnormalised o is not finite, and the Triton forward's FIXUP launch recomputes those tiles with containment. Tiles
are indexed as the Triton forward's programs, so the flags index the same tiles.

Scope (`dispatch.hopper_fwd_why_not`): sm_90, 16-bit q/k/v, head dims K = V in `HEAD_DIMS` (the kernel reads D from
its descriptors' blocks), every query (no tail queries),
causal with any window or non-causal without one, gated or not, with a sink or not, softcap or not, o_lo and the
user's lse where asked. Dense: T a multiple of 128. Packed (cu_seqlens, causal): sequences of any length, each
tile's keys counted from its sequence's first token; a tile's rows past its sequence run on the next sequence's q
(or TMA's zeros past the tensor) and are not stored (their flag can only send the tile to the FIXUP launch once more
than needed).
Gluon has no CPU interpreter: the tests compile it for sm_90 on the CPU and run it on the GPU.
"""

import math

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fla_bwd.ops.attn.config import sm_count
from fla_bwd.ops.attn.gluon_hopper import (
    cp_async_arrive,
    cp_async_load,
    mbarrier,
    tanh,
    tma_load,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from fla_bwd.ops.utils.descriptor_launch import DescriptorLaunch

LOG2E = math.log2(math.e)
BM = 128  # queries a program: two consumer warpgroups of 64 (the Triton forward's BT, so flags match)
BH = 64  # queries of one consumer warpgroup
KEYS = {64: 128, 128: 128, 256: 64}  # keys a stage by D (the Triton forward's BS; 256: two 64 KB stages fit)
HEAD_DIMS = tuple(KEYS)  # K = V; the kernel's layouts and stages follow D from its descriptors' blocks
NUM_WARPS = 4  # the default partition, the producer; each consumer warpgroup is a worker partition of 4 warps
CONSUMER_REGS = gl.constexpr(240)
ROW_SMEM = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))  # the keys' gate cumsum, by cp.async
PRODUCER_THREADS = gl.constexpr(32 * NUM_WARPS)
GK_LOAD = gl.constexpr(gl.BlockedLayout([1], [32], [NUM_WARPS], [0]))  # of the keys' gate cumsum: a key a thread
BM_C = gl.constexpr(BM)
BH_C = gl.constexpr(BH)
LOG2E_C = gl.constexpr(LOG2E)
LN2_C = gl.constexpr(math.log(2.0))


# ----------------------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------------------

@gluon.constexpr_function
def _stages(D):
    """The K/V ring's stages at head dim D (literals here, so that Triton's cache key sees them)."""
    if D == 128:
        return 3  # 64 KB a stage beside q's 32 KB: g8-T8192 878 against 1065 us at 2 (H100)
    if D == 256:
        return 2  # 64 KB a stage of 64 keys beside q's 64 KB: a third does not fit
    return 5  # D = 64, 32 KB a stage: g4-T2048-D64 147 against 165 us at 3 (H100)


@gluon.constexpr_function
def _mma(N):
    """The layout of a consumer warpgroup's [BH, N] accumulator (the scores' at N = BN, o's at N = D): the same rows
    a thread for every N."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])


@gluon.jit
def _tile(idx, B, T, NT, HQ, G, cu_seqlens, chunk_indices):
    """(first token of the sequence, its length, query head, KV head, first query of the tile) of tile idx: the map of
    the Triton forward's program idx (`inner.query_tile`: heads fastest, then the NT tiles a head, last first; packed:
    chunk_indices's (sequence, tile) pairs)."""
    i_bh = idx % (B * HQ)
    i_t = NT - 1 - idx // (B * HQ)
    i_hq = i_bh % HQ
    if chunk_indices is not None:
        i_n = gl.load(chunk_indices + i_t * 2)
        i_t = gl.load(chunk_indices + i_t * 2 + 1)
        bos = gl.load(cu_seqlens + i_n).to(gl.int32)
        length = gl.load(cu_seqlens + i_n + 1).to(gl.int32) - bos
    else:
        bos = (i_bh // HQ) * T
        length = T
    return bos, length, i_hq, i_hq // G, i_t * BM_C


@gluon.jit
def _rounds(total):
    """How many of the `total` tiles this program runs (`_tile_of_round`): one a round, the last round partial."""
    P = gl.num_programs(0)
    p = gl.program_id(0)
    rounds = gl.cdiv(total, P)
    last = (rounds - 1) * P + p + ((rounds - 1) % 2) * (P - 1 - 2 * p)
    return rounds - 1 + (last < total).to(gl.int32)


@gluon.jit
def _tile_of_round(r):
    """The tile this program runs in round r: the rounds snake over the programs (program p takes tile p of an even
    round, P - 1 - p of an odd one), so that over the longest-first tiles each program's work evens out."""
    P = gl.num_programs(0)
    p = gl.program_id(0)
    return r * P + p + (r % 2) * (P - 1 - 2 * p)


@gluon.jit
def _key_tiles(t0, T, W, BN: gl.constexpr):
    """The key tiles [lo, hi) of BN keys that the query tile [t0, t0 + BM) of a sequence of T tokens sees: causal (W
    not None), keys [i - W + 1, i]; else all."""
    if W is not None:
        if BN == BM_C:  # the diagonal is one key tile
            return gl.maximum(t0 - W + 1, 0) // BN, t0 // BN + 1
        return gl.maximum(t0 - W + 1, 0) // BN, gl.cdiv(gl.minimum(t0 + BM_C, T), BN)
    return 0, T // BN


@gluon.jit
def _producer(q_desc, k_desc, v_desc, o, o_lo, lse, lse_out, nonfinite, gc, sink_bias, cu_seqlens,
              chunk_indices, B, T, NT, W, HQ, qk_scale, cap_in, softcap, q_smem, k_smem, v_smem, gk_smem, q_ready,
              q_empty, k_ready, v_ready, kv_empty, flag_bar, G):
    """For each of this program's tiles (`_tile_of_round`), copies q once both
    consumer warpgroups have released the last tile's (q_empty), then K and V of each key tile into the ring, whose
    count runs on across tiles."""
    D: gl.constexpr = q_desc.block_shape[1]
    BN: gl.constexpr = k_desc.block_shape[0]
    NS: gl.constexpr = k_smem.shape[0]  # the ring's stages
    i = 0
    c = 0
    for r in range(0, _rounds(NT * B * HQ)):
        idx = _tile_of_round(r)
        bos, length, i_hq, i_h, t0 = _tile(idx, B, T, NT, HQ, G, cu_seqlens, chunk_indices)
        mbarrier.wait(q_empty.index(0), c & 1)
        mbarrier.expect(q_ready.index(0), 2 * BH_C * D * 2)
        for i_wg in gl.static_range(2):
            tma_load(q_desc, [bos + t0 + i_wg * BH_C, i_hq * D], q_ready.index(0), q_smem.index(i_wg))
        lo, hi = _key_tiles(t0, length, W, BN)
        for j in range(lo, hi):
            s = i % NS
            mbarrier.wait(kv_empty.index(s), (i // NS) & 1)
            if gc is not None:  # the keys' gate cumsum: each thread's copy arrives on K's barrier (a TMA copy
                # would need 16-byte aligned starts, which packed sequences do not have)
                t_k = bos + j * BN + gl.arange(0, BN, layout=GK_LOAD)
                cp_async_load(gk_smem.index(s), gc + i_hq.to(gl.int64) * (B * T) + t_k, mask=t_k < B * T)
                cp_async_arrive(k_ready.index(s), increment_count=False)
            mbarrier.expect(k_ready.index(s), BN * D * 2)
            tma_load(k_desc, [bos + j * BN, i_h * D], k_ready.index(s), k_smem.index(s))
            mbarrier.expect(v_ready.index(s), BN * D * 2)
            tma_load(v_desc, [bos + j * BN, i_h * D], v_ready.index(s), v_smem.index(s))
            i += 1
        c += 1


@gluon.jit
def _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, cap_in, softcap, MASK: gl.constexpr):
    """The online softmax of key tile j's q.k products b_qk [BH, BN] for queries t0r + o_r: (P, the factor that
    rescales O, m, l), rounded as the Triton forward's (`inner.fwd_block`), so that the Triton FIXUP launch of a
    flagged tile gives its finite rows bitwise these values. Gated: scores are one fma with gq - gk (gk from stage
    s). MASK: a tile the Triton forward masks (`_masked`); unmasked ungated tiles take exp2 of one fma. Both fmas are
    the ones LLVM contracts the Triton forward's code into, made explicit here, where it contracted neither. A row
    that sees nothing yet keeps m = -inf and subtracts 0. softcap (else None): the products become tanh(cap_in * q.k)
    first (cap_in = scale / softcap), and qk_scale is softcap * log2 e (`inner.scores`)."""
    MMA: gl.constexpr = b_qk.type.layout
    BN: gl.constexpr = b_qk.shape[1]
    if softcap is not None:
        b_qk = tanh(b_qk * cap_in)
    if gc is not None:
        b_gk = gk_smem.index(s).load(gl.SliceLayout(0, MMA))
        b_s = gl.fma(b_qk, qk_scale, b_gq[:, None] - b_gk[None, :])
    else:
        b_s = b_qk * qk_scale
    if MASK:
        o_q = (t0r + o_r)[:, None]
        o_k = (j * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, MMA)))[None, :]
        b_s = gl.where((o_k <= o_q) & (o_k > o_q - W), b_s, float("-inf"))
    b_m_new = gl.maximum(b_m, gl.max(b_s, 1))
    b_m_ref = gl.where(b_m_new == float("-inf"), 0.0, b_m_new)
    if MASK or gc is not None:
        b_p = gl.exp2(b_s - b_m_ref[:, None])
    else:
        b_p = gl.exp2(gl.fma(b_qk, qk_scale, -b_m_ref[:, None]))
    b_alpha = gl.exp2(b_m - b_m_ref)
    return b_p, b_alpha, b_m_new, b_l * b_alpha + gl.sum(b_p, 1)


@gluon.jit
def _masked(j, t0, W, BN: gl.constexpr):
    """Whether the Triton forward masks key tile j of the query tile [t0, t0 + BM) (`inner.key_ranges`, BT = 128, BS =
    BN, causal: W not None): the window's edge [lo, mid) and the diagonal."""
    lo = gl.maximum(t0 - W + 1, 0) // BN * BN
    mid = gl.maximum(lo, gl.minimum(gl.cdiv(gl.maximum(t0 + BM_C - W, 0), BN) * BN, t0))
    return (j * BN < mid) | (j * BN >= t0)


@gluon.jit
def _softmax_of_tile(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0, t0r, W, qk_scale, cap_in, softcap):
    """`_softmax` of key tile j, masked where the Triton forward masks it (never without causality, W None)."""
    if W is None:
        b_p, b_alpha, b_m, b_l = _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, cap_in,
                                          softcap, False)
    elif _masked(j, t0, W, b_qk.shape[1]):
        b_p, b_alpha, b_m, b_l = _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, cap_in,
                                          softcap, True)
    else:
        b_p, b_alpha, b_m, b_l = _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, cap_in,
                                          softcap, False)
    return b_p, b_alpha, b_m, b_l


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, o, o_lo, lse, lse_out, nonfinite, gc, sink_bias, cu_seqlens,
              chunk_indices, B, T, NT, W, HQ, qk_scale, cap_in, softcap, q_smem, k_smem, v_smem, gk_smem, q_ready,
              q_empty, k_ready, v_ready, kv_empty, flag_bar, G, i_wg):
    """Consumer warpgroup i_wg: queries [64 i_wg, 64 i_wg + 64) of each of this program's tiles, over every key tile
    each sees; then the tile's o, lse, o_lo, the user's lse and its part of the tile's flag. q is released after the
    tile's last S product, so the producer loads the next tile's under this one's last P V product and epilogue."""
    dtype: gl.constexpr = q_desc.dtype
    D: gl.constexpr = q_desc.block_shape[1]
    BN: gl.constexpr = k_desc.block_shape[0]
    MMA: gl.constexpr = _mma(BN)
    MMA_O: gl.constexpr = _mma(D)
    OPERAND_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA_O, k_width=2)
    ROW_O: gl.constexpr = gl.SliceLayout(1, MMA_O)
    NS: gl.constexpr = k_smem.shape[0]  # the ring's stages
    o_r = gl.arange(0, BH_C, layout=gl.SliceLayout(1, MMA))
    zero = gl.zeros([BH_C, BN], gl.float32, MMA)
    zero_o = gl.zeros([BH_C, D], gl.float32, MMA_O)
    b_q = q_smem.index(i_wg)
    i0 = 0
    c = 0
    for r in range(0, _rounds(NT * B * HQ)):
        idx = _tile_of_round(r)
        bos, length, i_hq, i_h, t0 = _tile(idx, B, T, NT, HQ, G, cu_seqlens, chunk_indices)
        t0r = t0 + i_wg * BH_C
        m_r = t0r + o_r < length  # packed: the tile's rows in its sequence
        b_m = gl.full([BH_C], float("-inf"), gl.float32, gl.SliceLayout(1, MMA))
        b_l = gl.zeros([BH_C], gl.float32, gl.SliceLayout(1, MMA))
        b_gq = b_l
        if gc is not None:  # [HQ, B * T] fp32, base 2
            b_gq = gl.load(gc + i_hq.to(gl.int64) * (B * T) + bos + t0r + o_r, mask=m_r, other=0.0)
        mbarrier.wait(q_ready.index(0), c & 1)
        lo, hi = _key_tiles(t0, length, W, BN)
        s = i0 % NS
        mbarrier.wait(k_ready.index(s), (i0 // NS) & 1)
        tok = warpgroup_mma(b_q, k_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
        b_p, _, b_m, b_l = _softmax_of_tile(b_s, b_m, b_l, b_gq, gc, gk_smem, s, o_r, lo, t0, t0r, W, qk_scale,
                                            cap_in, softcap)
        acc = zero_o
        for j in range(lo + 1, hi):
            i = i0 + j - lo
            s = i % NS
            sp = (i - 1) % NS
            b_pa = gl.convert_layout(b_p.to(dtype), OPERAND_A)
            mbarrier.wait(k_ready.index(s), (i // NS) & 1)
            mbarrier.wait(v_ready.index(sp), ((i - 1) // NS) & 1)
            tok = warpgroup_mma(b_q, k_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(b_pa, v_smem.index(sp), acc, is_async=True)
            b_s = warpgroup_mma_wait(num_outstanding=1, deps=(tok,))  # S_j; P V of tile j - 1 stays in flight
            b_p, b_alpha, b_m, b_l = _softmax_of_tile(b_s, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0, t0r, W,
                                                      qk_scale, cap_in, softcap)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(kv_empty.index(sp), count=1)
            acc = acc * gl.convert_layout(b_alpha, ROW_O)[:, None]
        mbarrier.arrive(q_empty.index(0), count=1)  # every product with q has been waited for
        i = i0 + hi - 1 - lo
        s = i % NS
        b_pa = gl.convert_layout(b_p.to(dtype), OPERAND_A)
        mbarrier.wait(v_ready.index(s), (i // NS) & 1)
        acc = warpgroup_mma(b_pa, v_smem.index(s), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_empty.index(s), count=1)  # the tile's last stage, for the next tile's copies
        i0 += hi - lo
        # The tile's flag: warpgroup 0 stores it, then warpgroup 1 sets it where its own rows are not finite, after
        # flag_bar of the tile's parity (warpgroup 0 runs at most one tile ahead at this wait: it needs q of the tile
        # after next, which waits for warpgroup 1's release of the next tile's).
        bad = gl.max(gl.max(((acc - acc) != 0).to(gl.int32), 1), 0)
        if i_wg == 0:
            gl.store(nonfinite + idx, bad.to(gl.int8))
            mbarrier.arrive(flag_bar.index(c % 2), count=1)
        else:
            mbarrier.wait(flag_bar.index(c % 2), (c // 2) & 1)
            if bad != 0:
                gl.store(nonfinite + idx, bad.to(gl.int8))
        if sink_bias is not None:  # one more logit in the denominator, folded at a common maximum
            b_sink = gl.load(sink_bias + i_hq).to(gl.float32) * LOG2E_C
            b_m_new = gl.maximum(b_m, b_sink)
            b_alpha = gl.exp2(b_m - b_m_new)
            b_l = b_l * b_alpha + gl.exp2(b_sink - b_m_new)
            acc = acc * gl.convert_layout(b_alpha, ROW_O)[:, None]
            b_m = b_m_new
        acc = acc / gl.convert_layout(b_l, ROW_O)[:, None]
        b_or = acc.to(dtype)
        rows = bos + t0r + o_r
        rows_o = gl.convert_layout(rows, ROW_O)
        o_c = gl.arange(0, D, layout=gl.SliceLayout(0, MMA_O))
        p_o = (rows_o.to(gl.int64) * HQ + i_hq)[:, None] * D + o_c[None, :]
        gl.store(o + p_o, b_or, mask=gl.convert_layout(m_r, ROW_O)[:, None])
        if o_lo is not None:  # `inner.o_lo_encode`
            b_d = acc.to(gl.int32, bitcast=True) - b_or.to(gl.float32).to(gl.int32, bitcast=True)
            if dtype == gl.bfloat16:
                b_d = (b_d + 256) >> 9
            else:
                b_d = (b_d + 32) >> 6
            gl.store(o_lo + p_o, gl.minimum(gl.maximum(b_d, -128), 127).to(gl.int8),
                     mask=gl.convert_layout(m_r, ROW_O)[:, None])
        b_lse = b_m + gl.log2(b_l)
        gl.store(lse + i_hq.to(gl.int64) * (B * T) + rows, b_lse, mask=m_r)
        if lse_out is not None:
            gl.store(lse_out + rows.to(gl.int64) * HQ + i_hq, b_lse * LN2_C, mask=m_r)
        c += 1


@gluon.jit(do_not_specialize=["B", "T", "NT", "W"])
def parallel_attn_fwd_kernel_hopper(
    q_desc, k_desc, v_desc, o, o_lo, lse, lse_out, nonfinite, gc, sink_bias, cu_seqlens, chunk_indices, B, T,
    NT, W, scale, softcap, HQ: gl.constexpr, G: gl.constexpr,
):
    """o `[B, T, HQ, D]` and lse `[HQ, B * T]` (base 2, the sink included) of the 128-query tiles of this program
    (`_tile_of_round` of the NT * B * HQ), and the FLAG launch's flag of
    each; q, k, v through their TMA descriptors (`[B * T, heads * D]` views). Packed (B = 1): cu_seqlens and
    chunk_indices (`index.chunk_indices`: NT (sequence, tile) pairs), else None. W: keys [i - W + 1, i] (causal);
    None: every key (a partition sees a None as such, where a constexpr flag would reach it as a value). Gated: gc
    `[HQ, B * T]` (fp32, base 2, copied by cp.async, else None); with a sink: sink_bias `[HQ]`; o_lo (int8, o's
    shape) and lse_out (`[B * T, HQ]`, natural log) where not None. softcap: logits softcap * tanh(scale * q.k /
    softcap), or None."""
    dtype: gl.constexpr = q_desc.dtype
    D: gl.constexpr = q_desc.block_shape[1]
    gl.static_assert(k_desc.block_shape[1] == D and v_desc.block_shape[1] == D)
    NS: gl.constexpr = _stages(D)
    qk_scale = scale * LOG2E_C  # in fp32 here, as the Triton forward's `inner.score_scales`
    cap_in = scale  # unused without a softcap (a partition's tuple takes no None made here)
    if softcap is not None:
        qk_scale = softcap * LOG2E_C
        cap_in = scale / softcap
    q_smem = gl.allocate_shared_memory(dtype, [2, BH_C, D], q_desc.layout)  # [consumer warpgroup, query, d]
    BN: gl.constexpr = k_desc.block_shape[0]
    k_smem = gl.allocate_shared_memory(dtype, [NS, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NS, BN, D], v_desc.layout)
    gk_smem = q_smem  # not read without a gate
    if gc is not None:
        gk_smem = gl.allocate_shared_memory(gl.float32, [NS, BN], ROW_SMEM)
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    flag_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready.index(0), count=1)
    mbarrier.init(q_empty.index(0), count=2)  # one arrival a consumer warpgroup
    mbarrier.arrive(q_empty.index(0), count=2)  # free for the first tile
    for b in gl.static_range(2):
        mbarrier.init(flag_bar.index(b), count=1)
    for s in gl.static_range(NS):
        mbarrier.init(k_ready.index(s), count=1 + (PRODUCER_THREADS if gc is not None else 0))
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=2)  # one arrival a consumer warpgroup
        mbarrier.arrive(kv_empty.index(s), count=2)  # every stage starts free
    # Partitions take flat tuples (no concatenation or unpacking in Gluon): the same arguments, then i_wg.
    producer = (q_desc, k_desc, v_desc, o, o_lo, lse, lse_out, nonfinite, gc, sink_bias, cu_seqlens,
                chunk_indices, B, T, NT, W, HQ, qk_scale, cap_in, softcap, q_smem, k_smem, v_smem, gk_smem, q_ready,
                q_empty, k_ready, v_ready, kv_empty, flag_bar, G)
    wg0 = (q_desc, k_desc, v_desc, o, o_lo, lse, lse_out, nonfinite, gc, sink_bias, cu_seqlens,
           chunk_indices, B, T, NT, W, HQ, qk_scale, cap_in, softcap, q_smem, k_smem, v_smem, gk_smem, q_ready,
           q_empty, k_ready, v_ready, kv_empty, flag_bar, G, 0)
    wg1 = (q_desc, k_desc, v_desc, o, o_lo, lse, lse_out, nonfinite, gc, sink_bias, cu_seqlens,
           chunk_indices, B, T, NT, W, HQ, qk_scale, cap_in, softcap, q_smem, k_smem, v_smem, gk_smem, q_ready,
           q_empty, k_ready, v_ready, kv_empty, flag_bar, G, 1)
    gl.warp_specialize([(_producer, producer), (_consumer, wg0), (_consumer, wg1)], [4, 4],
                       [CONSUMER_REGS, CONSUMER_REGS])


# ----------------------------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------------------------

def smem_layout(block: list):
    """The shared-memory layout of a 16-bit TMA block (q's, K's, V's): its descriptor carries it into the kernel."""
    return gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)


def programs(s, tiles: int) -> int:
    """The programs of a launch over `tiles` query tiles of a call of Shape s: one an SM (persistent: the next tile's q
    and K/V load under this tile's epilogue)."""
    # The snake over the programs left the busiest SM 0.1% over the mean at g8-T8192 where a stride left it 6%, and
    # beat one program a tile on every row (H100: mha-long 196 against 211-223 us, g8-T8192 884 against 945-994).
    return min(tiles, sm_count(s.device))


class HopperFwdLaunch(DescriptorLaunch):
    """Plan step (`launch.Plan.add`): the FLAG launch of a forward on `parallel_attn_fwd_kernel_hopper`
    (`descriptor_launch.DescriptorLaunch`) over the Triton forward's tiles with `programs`' programs; `args` as
    `host.add_fwd` gives them."""

    def __init__(self, s, args: dict):
        rows, D = s.B * s.T, s.K
        BN = KEYS[D]
        table = (("q", "q", (rows, s.HQ * D), [BH, D], smem_layout([BH, D])),
                 ("k", "k", (rows, s.H * D), [BN, D], smem_layout([BN, D])),
                 ("v", "v", (rows, s.H * D), [BN, D], smem_layout([BN, D])))
        grid = (programs(s, args["NT"] * s.B * s.HQ),)
        super().__init__(parallel_attn_fwd_kernel_hopper, grid, dict(
            o=args["o"], o_lo=args["o_lo"], lse=args["lse"], lse_out=args["lse_out"], nonfinite=args["nonfinite"],
            gc=args["g_cumsum"], sink_bias=args["sink_bias"], cu_seqlens=args["cu_seqlens"],
            chunk_indices=args["chunk_indices"], B=s.B, T=s.T, NT=args["NT"], W=s.W if s.WR is None else None,
            scale=s.scale, softcap=s.softcap or None, HQ=s.HQ, G=s.HQ // s.H, num_warps=NUM_WARPS,
            ), table, "_hopper_fwd_desc_")
