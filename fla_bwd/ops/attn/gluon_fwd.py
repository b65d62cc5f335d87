# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The forward for Hopper, written in Gluon (issue 61): o and the base-2 log-sum-exp of a 128-query tile of one
query head, as `kernels.parallel_attn_fwd_kernel` computes them, in FlashAttention-3's structure.

A producer partition copies the tile's q once and each 128-key tile's K and V by TMA into a ring of shared-memory
stages behind mbarriers (K and V of a stage on barriers of their own: the scores' product waits for K alone). Two
consumer warpgroups own 64 queries each and share every K/V stage. Each overlaps its products within the iteration:
it issues S_j = Q K_j^T, then O += P_{j-1} V_{j-1}, waits for S_j alone and runs the online softmax of S_j while the
P V product is in flight, then waits for that product and rescales O (FA3's intra-warpgroup pipelining). FA3's
ping-pong of the two warpgroups (each issuing its products in turn, behind a pair of mbarriers) measured no faster
here (g8-T8192 891 against 878 us, H100).

It is the FLAG launch of the two-launch containment (`host.add_contained`): each program's flag says whether its
unnormalised o is not finite, and the Triton forward's FIXUP launch recomputes those tiles with containment. The grid
and the program-to-tile map are the Triton forward's (`inner.query_tile`: heads fastest, tiles longest first), so
the flags index the same tiles.

Scope (`dispatch.hopper_fwd_why_not`): sm_90, 16-bit q/k/v, head dims K = V = 128, dense (no tail queries), T a
multiple of 128, causal with any window or non-causal without one, gated or not, with a sink or not, o_lo and the
user's lse where asked; no softcap. Gluon has no CPU interpreter: the tests compile it for sm_90 on the CPU and run it
on the GPU.
"""

import math

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fla_bwd.ops.attn.gluon_hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    tma_load,
    tma_store,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from fla_bwd.ops.utils.descriptor_launch import DescriptorLaunch

LOG2E = math.log2(math.e)
BM = 128  # queries a program: two consumer warpgroups of 64 (the Triton forward's BT, so flags match)
BH = 64  # queries of one consumer warpgroup
BN = 128  # keys a stage
D = 128
STAGES = 3  # K/V stages of 64 KB beside q's 32 KB: g8-T8192 878 against 1065 us at 2 (H100)
NUM_WARPS = 4  # the default partition, the producer; each consumer warpgroup is a worker partition of 4 warps
CONSUMER_REGS = gl.constexpr(240)
MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA.value, k_width=2))
Q_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BH, D], gl.bfloat16))
KV_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BN, D], gl.bfloat16))
ROW_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BN], gl.float32))
BM_C = gl.constexpr(BM)
BH_C = gl.constexpr(BH)
BN_C = gl.constexpr(BN)
D_C = gl.constexpr(D)
STAGES_C = gl.constexpr(STAGES)
LOG2E_C = gl.constexpr(LOG2E)
LN2_C = gl.constexpr(math.log(2.0))


# ----------------------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------------------

@gluon.jit
def _tile(B, T, HQ, G):
    """(batch, query head, KV head, first query) of this program: `inner.query_tile`'s map."""
    NT = T // BM_C
    pid = gl.program_id(0)
    i_bh = pid % (B * HQ)
    i_t = NT - 1 - pid // (B * HQ)
    i_hq = i_bh % HQ
    return i_bh // HQ, i_hq, i_hq // G, i_t * BM_C


@gluon.jit
def _key_tiles(t0, T, W):
    """The key tiles [lo, hi) that the query tile [t0, t0 + BM) sees: causal (W not None), keys [i - W + 1, i];
    else all."""
    if W is not None:
        return gl.maximum(t0 - W + 1, 0) // BN_C, t0 // BN_C + 1
    return 0, T // BN_C


@gluon.jit
def _producer(q_desc, k_desc, v_desc, o_desc, gc_desc, o_lo, lse, lse_out, nonfinite, gc, sink_bias, B, T, W, HQ,
              qk_scale, q_smem, k_smem, v_smem, gk_smem, q_ready, k_ready, v_ready, kv_empty, flag_bar,
              G):
    """Copies the program's q (a [64, D] box a consumer warpgroup), then K and V of each key tile it sees (gated:
    and the keys' gate cumsum) into the next free stage."""
    i_b, i_hq, i_h, t0 = _tile(B, T, HQ, G)
    mbarrier.expect(q_ready.index(0), 2 * BH_C * D_C * 2)
    for i_wg in gl.static_range(2):
        tma_load(q_desc, [i_b * T + t0 + i_wg * BH_C, i_hq * D_C], q_ready.index(0), q_smem.index(i_wg))
    lo, hi = _key_tiles(t0, T, W)
    for j in range(lo, hi):
        i = j - lo
        s = i % STAGES_C
        mbarrier.wait(kv_empty.index(s), (i // STAGES_C) & 1)
        mbarrier.expect(k_ready.index(s), BN_C * D_C * 2 + (BN_C * 4 if gc is not None else 0))
        tma_load(k_desc, [i_b * T + j * BN_C, i_h * D_C], k_ready.index(s), k_smem.index(s))
        if gc is not None:  # the keys' gate cumsum, with K
            tma_load(gc_desc, [i_hq * (B * T) + i_b * T + j * BN_C], k_ready.index(s), gk_smem.index(s))
        mbarrier.expect(v_ready.index(s), BN_C * D_C * 2)
        tma_load(v_desc, [i_b * T + j * BN_C, i_h * D_C], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, MASK: gl.constexpr):
    """The online softmax of key tile j's q.k products b_qk [BH, BN] for queries t0r + o_r: (P, the factor that
    rescales O, m, l), rounded as the Triton forward's (`inner.fwd_block`), so that the Triton FIXUP launch of a
    flagged tile gives its finite rows bitwise these values. Gated: scores are one fma with gq - gk (gk from stage
    s). MASK: a tile the Triton forward masks (`_masked`); unmasked ungated tiles take exp2 of one fma. Both fmas are
    the ones LLVM contracts the Triton forward's code into, made explicit here, where it contracted neither. A row
    that sees nothing yet keeps m = -inf and subtracts 0."""
    if gc is not None:
        b_gk = gk_smem.index(s).load(gl.SliceLayout(0, MMA))
        b_s = gl.fma(b_qk, qk_scale, b_gq[:, None] - b_gk[None, :])
    else:
        b_s = b_qk * qk_scale
    if MASK:
        o_q = (t0r + o_r)[:, None]
        o_k = (j * BN_C + gl.arange(0, BN_C, layout=gl.SliceLayout(0, MMA)))[None, :]
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
def _masked(j, t0, W):
    """Whether the Triton forward masks key tile j of the query tile [t0, t0 + BM) (`inner.key_ranges`, BT = BS =
    128, causal: W not None): the window's edge [lo, mid) and the diagonal."""
    lo = gl.maximum(t0 - W + 1, 0) // BN_C * BN_C
    mid = gl.maximum(lo, gl.minimum(gl.cdiv(gl.maximum(t0 + BM_C - W, 0), BN_C) * BN_C, t0))
    return (j * BN_C < mid) | (j * BN_C >= t0)


@gluon.jit
def _softmax_of_tile(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0, t0r, W, qk_scale):
    """`_softmax` of key tile j, masked where the Triton forward masks it (never without causality, W None)."""
    if W is None:
        b_p, b_alpha, b_m, b_l = _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, False)
    elif _masked(j, t0, W):
        b_p, b_alpha, b_m, b_l = _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, True)
    else:
        b_p, b_alpha, b_m, b_l = _softmax(b_qk, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0r, W, qk_scale, False)
    return b_p, b_alpha, b_m, b_l


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, o_desc, gc_desc, o_lo, lse, lse_out, nonfinite, gc, sink_bias, B, T, W, HQ,
              qk_scale, q_smem, k_smem, v_smem, gk_smem, q_ready, k_ready, v_ready, kv_empty, flag_bar,
              G, i_wg):
    """Consumer warpgroup i_wg: queries [64 i_wg, 64 i_wg + 64) of the tile, over every key tile it sees, then its
    o (through its q buffer and TMA), lse, o_lo, the user's lse and its part of the program's flag."""
    dtype: gl.constexpr = q_desc.dtype
    i_b, i_hq, i_h, t0 = _tile(B, T, HQ, G)
    t0r = t0 + i_wg * BH_C
    o_r = gl.arange(0, BH_C, layout=gl.SliceLayout(1, MMA))
    zero = gl.zeros([BH_C, BN_C], gl.float32, MMA)
    b_m = gl.full([BH_C], float("-inf"), gl.float32, gl.SliceLayout(1, MMA))
    b_l = gl.zeros([BH_C], gl.float32, gl.SliceLayout(1, MMA))
    b_gq = b_l
    if gc is not None:  # [HQ, B * T] fp32, base 2
        b_gq = gl.load(gc + i_hq.to(gl.int64) * (B * T) + i_b * T + t0r + o_r)
    b_q = q_smem.index(i_wg)
    mbarrier.wait(q_ready.index(0), 0)
    lo, hi = _key_tiles(t0, T, W)
    # The first tile: S_lo and its softmax; O starts at P_lo V_lo below.
    mbarrier.wait(k_ready.index(0), 0)
    tok = warpgroup_mma(b_q, k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    b_s = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
    b_p, _, b_m, b_l = _softmax_of_tile(b_s, b_m, b_l, b_gq, gc, gk_smem, 0, o_r, lo, t0, t0r, W, qk_scale)
    acc = zero
    for j in range(lo + 1, hi):
        i = j - lo
        s = i % STAGES_C
        sp = (i - 1) % STAGES_C
        b_pa = gl.convert_layout(b_p.to(dtype), OPERAND_A)
        mbarrier.wait(k_ready.index(s), (i // STAGES_C) & 1)
        mbarrier.wait(v_ready.index(sp), ((i - 1) // STAGES_C) & 1)
        tok = warpgroup_mma(b_q, k_smem.index(s).permute((1, 0)), zero, use_acc=False, is_async=True)
        acc = warpgroup_mma(b_pa, v_smem.index(sp), acc, is_async=True)
        b_s = warpgroup_mma_wait(num_outstanding=1, deps=(tok,))  # S_j; P V of tile j - 1 stays in flight
        b_p, b_alpha, b_m, b_l = _softmax_of_tile(b_s, b_m, b_l, b_gq, gc, gk_smem, s, o_r, j, t0, t0r, W,
                                                  qk_scale)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(kv_empty.index(sp), count=1)
        acc = acc * b_alpha[:, None]
    i = hi - 1 - lo
    s = i % STAGES_C
    b_pa = gl.convert_layout(b_p.to(dtype), OPERAND_A)
    mbarrier.wait(v_ready.index(s), (i // STAGES_C) & 1)
    acc = warpgroup_mma(b_pa, v_smem.index(s), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    # The FLAG launch's flag of this program: its unnormalised o not finite. Warpgroup 0 stores it, then warpgroup 1
    # sets it where its own rows are not finite (ordered by flag_bar: both store to the same byte).
    bad = gl.max(gl.max(((acc - acc) != 0).to(gl.int32), 1), 0)
    if i_wg == 0:
        gl.store(nonfinite + gl.program_id(0), bad.to(gl.int8))
        mbarrier.arrive(flag_bar.index(0), count=1)
    else:
        mbarrier.wait(flag_bar.index(0), 0)
        if bad != 0:
            gl.store(nonfinite + gl.program_id(0), bad.to(gl.int8))
    if sink_bias is not None:  # one more logit in the denominator, folded at a common maximum
        b_sink = gl.load(sink_bias + i_hq).to(gl.float32) * LOG2E_C
        b_m_new = gl.maximum(b_m, b_sink)
        b_alpha = gl.exp2(b_m - b_m_new)
        b_l = b_l * b_alpha + gl.exp2(b_sink - b_m_new)
        acc = acc * b_alpha[:, None]
        b_m = b_m_new
    acc = acc / b_l[:, None]
    b_or = acc.to(dtype)
    b_q.store(b_or)  # q's buffer is free: its last product has been waited for
    fence_async_shared()
    tma_store(o_desc, [i_b * T + t0r, i_hq * D_C], b_q)
    rows = i_b * T + t0r + o_r
    if o_lo is not None:  # `inner.o_lo_encode`
        o_c = gl.arange(0, D_C, layout=gl.SliceLayout(0, MMA))
        b_d = acc.to(gl.int32, bitcast=True) - b_or.to(gl.float32).to(gl.int32, bitcast=True)
        if dtype == gl.bfloat16:
            b_d = (b_d + 256) >> 9
        else:
            b_d = (b_d + 32) >> 6
        b_lo = gl.minimum(gl.maximum(b_d, -128), 127).to(gl.int8)
        gl.store(o_lo + (rows.to(gl.int64) * HQ + i_hq)[:, None] * D_C + o_c[None, :], b_lo)
    b_lse = b_m + gl.log2(b_l)
    gl.store(lse + i_hq.to(gl.int64) * (B * T) + rows, b_lse)
    if lse_out is not None:
        gl.store(lse_out + rows.to(gl.int64) * HQ + i_hq, b_lse * LN2_C)
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["B", "T", "W"])
def parallel_attn_fwd_kernel_hopper(
    q_desc, k_desc, v_desc, o_desc, gc_desc, o_lo, lse, lse_out, nonfinite, gc, sink_bias, B, T, W, scale,
    HQ: gl.constexpr, G: gl.constexpr,
):
    """o (`[B, T, HQ, D]`, through o_desc) and lse `[HQ, B * T]` (base 2, the sink included) of one 128-query tile
    of one query head, and the FLAG launch's flag of the program; q, k, v through their TMA descriptors (`[B * T,
    heads * D]` views). W: keys [i - W + 1, i] (causal); None: every key (a partition sees a None as such, where a
    constexpr flag would reach it as a value). Gated: gc `[HQ, B * T]` (fp32, base 2; gc_desc its TMA view, else
    None); with a sink: sink_bias `[HQ]`;
    o_lo (int8, o's shape) and lse_out (`[B * T, HQ]`, natural log) where not None."""
    dtype: gl.constexpr = q_desc.dtype
    qk_scale = scale * LOG2E_C  # in fp32 here, as the Triton forward's `inner.score_scales`
    q_smem = gl.allocate_shared_memory(dtype, [2, BH_C, D_C], Q_SMEM)  # [consumer warpgroup, query, d]
    k_smem = gl.allocate_shared_memory(dtype, [STAGES_C, BN_C, D_C], KV_SMEM)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES_C, BN_C, D_C], KV_SMEM)
    gk_smem = q_smem  # not read without a gate
    if gc is not None:
        gk_smem = gl.allocate_shared_memory(gl.float32, [STAGES_C, BN_C], ROW_SMEM)
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    flag_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES_C, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES_C, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [STAGES_C, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_ready.index(0), count=1)
    mbarrier.init(flag_bar.index(0), count=1)
    for s in gl.static_range(STAGES_C):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=2)  # one arrival a consumer warpgroup
        mbarrier.arrive(kv_empty.index(s), count=2)  # every stage starts free
    # Partitions take flat tuples (no concatenation or unpacking in Gluon): the same arguments, then i_wg.
    producer = (q_desc, k_desc, v_desc, o_desc, gc_desc, o_lo, lse, lse_out, nonfinite, gc, sink_bias, B, T, W, HQ,
                qk_scale, q_smem, k_smem, v_smem, gk_smem, q_ready, k_ready, v_ready, kv_empty, flag_bar,
                G)
    wg0 = (q_desc, k_desc, v_desc, o_desc, gc_desc, o_lo, lse, lse_out, nonfinite, gc, sink_bias, B, T, W, HQ,
           qk_scale, q_smem, k_smem, v_smem, gk_smem, q_ready, k_ready, v_ready, kv_empty, flag_bar,
           G, 0)
    wg1 = (q_desc, k_desc, v_desc, o_desc, gc_desc, o_lo, lse, lse_out, nonfinite, gc, sink_bias, B, T, W, HQ,
           qk_scale, q_smem, k_smem, v_smem, gk_smem, q_ready, k_ready, v_ready, kv_empty, flag_bar,
           G, 1)
    gl.warp_specialize([(_producer, producer), (_consumer, wg0), (_consumer, wg1)], [4, 4],
                       [CONSUMER_REGS, CONSUMER_REGS])


# ----------------------------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------------------------

class HopperFwdLaunch(DescriptorLaunch):
    """Plan step (`launch.Plan.add`): the FLAG launch of a forward on `parallel_attn_fwd_kernel_hopper`
    (`descriptor_launch.DescriptorLaunch`), over the Triton forward's grid; `args` as `host.add_fwd` gives them."""

    def __init__(self, s, args: dict):
        rows = s.B * s.T
        table = (("q", "q", (rows, s.HQ * D), [BH, D], Q_SMEM.value),
                 ("k", "k", (rows, s.H * D), [BN, D], KV_SMEM.value),
                 ("v", "v", (rows, s.H * D), [BN, D], KV_SMEM.value),
                 ("o", args["o"].name, (rows, s.HQ * D), [BH, D], Q_SMEM.value))
        gated = args["g_cumsum"] is not None
        if gated:
            table += (("gc", args["g_cumsum"].name, (-1,), [BN], ROW_SMEM.value),)
        super().__init__(parallel_attn_fwd_kernel_hopper, (s.T // BM * s.B * s.HQ,), dict(
            o_lo=args["o_lo"], lse=args["lse"], lse_out=args["lse_out"], nonfinite=args["nonfinite"],
            gc=args["g_cumsum"], sink_bias=args["sink_bias"], B=s.B, T=s.T, W=s.W if s.WR is None else None,
            scale=s.scale, HQ=s.HQ, G=s.HQ // s.H, num_warps=NUM_WARPS,
            **({} if gated else {"gc_desc": None})), table, "_hopper_fwd_desc_")
