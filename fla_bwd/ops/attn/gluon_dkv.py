# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The five-product backward's dK/dV kernel for Hopper, written in Gluon (issue 18).

Same outputs as the Triton dS-storing kernel (`kernels.parallel_attn_bwd_kernel_dkv_ds_per_kv_head`, `from_ds.py`'s
tile layout), in FlashAttention-3's structure, which Triton 3.6 does not build from the Triton kernel: a persistent
grid, a producer partition that copies K/V and each (query head, query block)'s q, dO,
lse and delta by TMA into a ring of shared-memory stages behind mbarriers, and two consumer warpgroups that run the
four products of a [128 keys, 64 queries] tile (64 keys each, sharing every q/dO stage) and store the 16-bit dS^T
by TMA, each from its own double-buffered shared-memory tile. Each consumer warpgroup is a partition of its own:
in one 8-warp partition every TMA store and barrier arrival synchronised both. Work items are
(128-key tile, batch, KV head, share of the group), dealt to the programs longest first (`schedule`: static, so
the result is deterministic).

It is the FLAG launch of the two-launch containment (`host.add_contained`): every 64-key tile's flag says whether
its dK/dV is not finite, and the Triton kernel's FIXUP launch recomputes those tiles with containment.

Scope (`dispatch.hopper_why_not`): sm_90, 16-bit q/k/v, head dims K = V = 128, full causal, dense with T a multiple
of 128 or packed (`cu_seqlens`, sequences of any length: items of each sequence's 128-key tiles, masked at its end,
lse and delta by cp.async), gated or not, with a sink or not, softcap or not (not with a gate: `dispatch._five`), one
launch per chunk of heads; "auto" for dense calls from `config.HOPPER_DKV_MIN_T` on (`dispatch._hopper`), its shares
of each group by `dispatch.hopper_split`; packed calls only where forced (FLA_BWD_DQ_PATH=from-ds and
FLA_BWD_DS_KERNEL=hopper: not yet run on a GPU). Gluon has no CPU interpreter: the tests compile it for sm_90 on the
CPU and run it on the GPU.
"""

import functools
import heapq
import math

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fla_bwd.ops.attn import config
from fla_bwd.ops.attn.gluon_hopper import (
    cp_async_arrive,
    cp_async_load,
    fence_async_shared,
    mbarrier,
    tanh,
    tma,
    tma_load,
    tma_store,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from fla_bwd.ops.utils.descriptor_launch import DescriptorLaunch
from fla_bwd.ops.utils.launch import Ref

LOG2E = math.log2(math.e)
BT = 128  # keys an item: two consumer warpgroups of 64 (the Triton kernel's key tile, so flags and dS tiles match)
BH = 64  # keys of one consumer warpgroup
BQ = 64  # queries a block (the Triton kernel's BS)
D = 128
NUM_WARPS = 4  # the default partition, the producer; each consumer warpgroup is a worker partition of 4 warps
CONSUMER_REGS = gl.constexpr(240)  # the producer keeps the rest of the 168 a thread at launch: 24
MMA_S = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BQ, 16]))
MMA_D = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA_D.value, k_width=2))
# 16-bit layouts: fp16 and bf16 share them (the swizzle depends on the element width only).
Q_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BQ, D], gl.bfloat16))
KV_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BH, D], gl.bfloat16))
DS_TILE = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BQ, BH], gl.bfloat16))
ROW_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BQ], gl.float32))
# Packed: lse, delta and the gate cumsum of a query block by cp.async (a 1-D TMA copy needs a 16-byte aligned start,
# which a sequence's rows do not have), a query a thread of the producer.
ROW_SMEM_CP = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [0]))
ROW_LOAD = gl.constexpr(gl.BlockedLayout([1], [32], [NUM_WARPS], [0]))
PRODUCER_THREADS = gl.constexpr(NUM_WARPS * 32)
STAGE_BYTES = gl.constexpr(2 * BQ * D * 2 + 2 * BQ * 4)  # q, dO, lse, delta of one block
KV_BYTES = gl.constexpr(2 * BT * D * 2)
BT_C = gl.constexpr(BT)
BH_C = gl.constexpr(BH)
BQ_C = gl.constexpr(BQ)
D_C = gl.constexpr(D)
LOG2E_C = gl.constexpr(LOG2E)  # lse is base 2
STAGES = 3  # q/dO stages: 3 beat 2 by 1-3% at one K/V buffer; 198 KB of shared memory
STAGES_C = gl.constexpr(STAGES)  # partitions get their arguments as values: the ring's size stays a constant here
MAX_IMBALANCE = 1.05  # `dispatch.hopper_split`: the longest program's work over the mean


# ----------------------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------------------

@gluon.jit
def _item(sched, t, L, B, H, SPLIT):
    """(128-key tile m, batch, KV head, share) of this program's t-th item (`schedule`)."""
    item = gl.load(sched + gl.program_id(0) * (1 + L) + 1 + t)
    bh = item // SPLIT % (B * H)
    return item // (SPLIT * B * H), bh // H, bh % H, item % SPLIT


@gluon.jit
def _table(sched, L, cu_seqlens):
    """The schedule and its row length L: packed, L is the table's first entry (the lengths set it, and a plan
    serves every batch of the same tile counts), the rows after it."""
    if cu_seqlens is not None:
        return sched + 1, gl.load(sched)
    return sched, L


@gluon.jit
def _bounds(m, i_b, T, cu_seqlens, chunks):
    """(the item's 128-key tile within its sequence, the sequence's first row, its length, its index, its query
    blocks): dense, tile m of batch i_b; packed, tile m of `chunks` (`chunk_indices(128)`: sequence, tile)."""
    if cu_seqlens is not None:
        i_n = gl.load(chunks + 2 * m)
        bos = gl.load(cu_seqlens + i_n)
        n = gl.load(cu_seqlens + i_n + 1) - bos
        return gl.load(chunks + 2 * m + 1), bos, n, i_n, gl.cdiv(n, BQ_C)
    return m, i_b * T, T, 0, T // BQ_C


@gluon.jit
def _producer(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, ds_desc, gc_desc, gc, sink_bias, sink_part, dk,
              dv, dk_in, dv_in, nonfinite, sched, L, B, T, NTILE, G0, qk_scale, dk_scale, cap_in,
              cu_seqlens, chunks, ds_offsets, k64_offsets, NT64, lse, delta,
              q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, gq_smem, ds_smem, ready, empty, kv_ready,
              kv_empty, H, G, SPLIT, CHUNK, ACC_IN):
    """Copies each item's K/V (a [64, D] box a consumer warpgroup), then q, dO, lse, delta (and, gated, the
    queries' gate cumsum) of every (head of the chunk, query block from the diagonal) into the next free stage.
    Packed: rows from the sequence's start (TMA boxes past the packed rows read zeros, those of the next sequence
    reach only masked pairs), lse, delta and the gate cumsum by cp.async, zero past the sequence's end."""
    USE_G: gl.constexpr = gc is not None  # None survives a partition's argument tuple, a constexpr flag does not
    sched, L = _table(sched, L, cu_seqlens)
    i = 0
    for t in range(gl.load(sched + gl.program_id(0) * (1 + L))):
        m, i_b, i_h, i_p = _item(sched, t, L, B, H, SPLIT)
        m, bos, n, i_n, n_qb = _bounds(m, i_b, T, cu_seqlens, chunks)
        mbarrier.wait(kv_empty.index(0), t & 1)
        mbarrier.expect(kv_ready.index(0), KV_BYTES)
        for i_wg in gl.static_range(2):
            key0 = bos + m * BT_C + i_wg * BH_C
            tma_load(k_desc, [key0, i_h * D_C], kv_ready.index(0), k_smem.index(i_wg))
            tma_load(v_desc, [key0, i_h * D_C], kv_ready.index(0), v_smem.index(i_wg))
        for c in range(CHUNK):
            i_hq = i_h * G + i_p * (G // SPLIT) + G0 + c
            row = i_hq * (B * T) + bos  # lse, delta: [HQ, B * T]
            for qi in range(2 * m, n_qb):
                s = i % STAGES_C
                mbarrier.wait(empty.index(s), (i // STAGES_C) & 1)
                if cu_seqlens is not None:  # each thread's copies arrive on the stage's barrier
                    o_t = qi * BQ_C + gl.arange(0, BQ_C, layout=ROW_LOAD)
                    cp_async_load(lse_smem.index(s), lse + row + o_t, mask=o_t < n)
                    cp_async_load(delta_smem.index(s), delta + row + o_t, mask=o_t < n)
                    if USE_G:
                        cp_async_load(gq_smem.index(s), gc + row + o_t, mask=o_t < n)
                    cp_async_arrive(ready.index(s), increment_count=False)
                    mbarrier.expect(ready.index(s), 2 * BQ_C * D_C * 2)
                else:
                    mbarrier.expect(ready.index(s), STAGE_BYTES + (BQ_C * 4 if USE_G else 0))
                    tma_load(lse_desc, [row + qi * BQ_C], ready.index(s), lse_smem.index(s))
                    tma_load(delta_desc, [row + qi * BQ_C], ready.index(s), delta_smem.index(s))
                    if USE_G:
                        tma_load(gc_desc, [row + qi * BQ_C], ready.index(s), gq_smem.index(s))
                tma_load(q_desc, [bos + qi * BQ_C, i_hq * D_C], ready.index(s), q_smem.index(s))
                tma_load(do_desc, [bos + qi * BQ_C, i_hq * D_C], ready.index(s), do_smem.index(s))
                i += 1


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, ds_desc, gc_desc, gc, sink_bias, sink_part, dk,
              dv, dk_in, dv_in, nonfinite, sched, L, B, T, NTILE, G0, qk_scale, dk_scale, cap_in,
              cu_seqlens, chunks, ds_offsets, k64_offsets, NT64, lse, delta,
              q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, gq_smem, ds_smem, ready, empty, kv_ready,
              kv_empty, H, G, SPLIT, CHUNK, ACC_IN, i_wg):
    """Consumer warpgroup i_wg: keys [64 i_wg, 64 i_wg + 64) of every item, the four products of each of its
    blocks, its dS^T stores and its item's dK/dV and flags. Its own partition, shared-memory tiles and barrier
    arrivals: the two warpgroups never wait for each other (as one 8-warp partition they met at four barriers an
    iteration). Gated: scores get gc_query - gc_key; the gate's gradient comes from the stored tiles
    (`from_ds.py`: here its key side cost 50 of 329 us at gqa4-long-gated)."""
    USE_G: gl.constexpr = gc is not None
    USE_SINK: gl.constexpr = sink_bias is not None
    SOFTCAP: gl.constexpr = cap_in is not None
    dtype: gl.constexpr = q_desc.dtype
    o_q = gl.arange(0, BQ_C, layout=gl.SliceLayout(0, MMA_S))
    o_key = gl.arange(0, BH_C, layout=gl.SliceLayout(1, MMA_S))
    o_r = gl.arange(0, BH_C, layout=gl.SliceLayout(1, MMA_D))
    o_c = gl.arange(0, D_C, layout=gl.SliceLayout(0, MMA_D))
    zero_s = gl.zeros([BH_C, BQ_C], gl.float32, MMA_S)
    # [BH, D]
    b_k = k_smem.index(i_wg)
    b_v = v_smem.index(i_wg)
    PACKED: gl.constexpr = cu_seqlens is not None
    sched, L = _table(sched, L, cu_seqlens)
    i = 0
    n_st = 0  # dS^T stores issued; buffer n_st % 2 is free once at most the last one is pending
    for t in range(gl.load(sched + gl.program_id(0) * (1 + L))):
        m, i_b, i_h, i_p = _item(sched, t, L, B, H, SPLIT)
        m, bos, n, i_n, n_qb = _bounds(m, i_b, T, cu_seqlens, chunks)
        i_head = i_h * SPLIT + i_p
        key0 = m * BT_C + i_wg * BH_C
        # [BH, D]: rows of `[B, T, H * SPLIT, D]`
        p_out = ((bos + key0 + o_r).to(gl.int64) * (H * SPLIT) + i_head)[:, None] * D_C + o_c[None, :]
        m_out = (key0 + o_r < n)[:, None]  # packed: the keys of the sequence
        acc_dk = gl.zeros([BH_C, D_C], gl.float32, MMA_D)
        acc_dv = gl.zeros([BH_C, D_C], gl.float32, MMA_D)
        if ACC_IN:  # a runtime flag, like every argument of a partition
            if PACKED:
                acc_dk = gl.load(dk_in + p_out, mask=m_out, other=0.0).to(gl.float32)
                acc_dv = gl.load(dv_in + p_out, mask=m_out, other=0.0).to(gl.float32)
            else:
                acc_dk = gl.load(dk_in + p_out).to(gl.float32)
                acc_dv = gl.load(dv_in + p_out).to(gl.float32)
        mbarrier.wait(kv_ready.index(0), t & 1)
        for c in range(CHUNK):
            if PACKED:  # sequence i_n's bands (`host.band_offsets`), of its own length's tiles
                tile0 = gl.load(ds_offsets + i_n)
                ntile = gl.load(ds_offsets + i_n + 1) - tile0
                row = ((tile0 * (H * SPLIT * CHUNK) + (i_head * CHUNK + c) * ntile) * BQ_C).to(gl.int32)
            else:
                band = ((i_b * H + i_h) * SPLIT + i_p) * CHUNK + c  # `host.add_five_product`'s band order
                row = band * NTILE * BQ_C
            i_hq = i_h * G + i_p * (G // SPLIT) + G0 + c
            if USE_G:
                g_row = i_hq.to(gl.int64) * (B * T) + bos + key0
                if PACKED:
                    b_gk = gl.load(gc + g_row + o_key, mask=key0 + o_key < n, other=0.0)
                else:
                    b_gk = gl.load(gc + g_row + o_key)
            if USE_SINK:  # this head's sum of p_sink * dS over the item's pairs (`from_ds.sink_grad_kernel`)
                b_sink = gl.load(sink_bias + i_hq).to(gl.float32) * LOG2E_C
                acc_sk = gl.zeros([BH_C], gl.float32, gl.SliceLayout(1, MMA_S))
            for qi in range(2 * m, n_qb):
                s = i % STAGES_C
                mbarrier.wait(ready.index(s), (i // STAGES_C) & 1)
                b_q = q_smem.index(s)
                b_do = do_smem.index(s)
                # [BH, BQ]: S^T = K Q^T, and dP^T = V dO^T right behind it (it runs under the exponentials)
                tok = warpgroup_mma(b_k, b_q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                tok_dp = warpgroup_mma(b_v, b_do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
                b_st = warpgroup_mma_wait(num_outstanding=1, deps=(tok,))
                # lse and delta read where they are used: held across the iteration they spilled
                b_lse = lse_smem.index(s).load(gl.SliceLayout(0, MMA_S))
                if SOFTCAP:  # the capped scores softcap * tanh(scale * q.k / softcap) (qk_scale: softcap * log2 e)
                    b_tt = tanh(b_st * cap_in)
                    b_st = b_tt
                if USE_G:
                    b_gq = gq_smem.index(s).load(gl.SliceLayout(0, MMA_S))
                    b_st = b_st * qk_scale + (b_gq[None, :] - b_gk[:, None])  # the Triton kernel's order
                    b_pt = gl.exp2(b_st - b_lse[None, :])
                else:
                    b_pt = gl.exp2(b_st * qk_scale - b_lse[None, :])
                if PACKED:  # the diagonal blocks and the sequence's last: key <= query < n
                    if (qi < 2 * m + 2) | (qi * BQ_C + BQ_C > n):
                        b_pt = gl.where(((key0 + o_key)[:, None] <= (qi * BQ_C + o_q)[None, :])
                                        & (qi * BQ_C + o_q < n)[None, :], b_pt, 0.0)
                elif qi < 2 * m + 2:  # the diagonal blocks: key <= query
                    b_pt = gl.where((key0 + o_key)[:, None] <= (qi * BQ_C + o_q)[None, :], b_pt, 0.0)
                acc_dv = warpgroup_mma(gl.convert_layout(b_pt.to(dtype), OPERAND_A), b_do, acc_dv, is_async=True)
                if SOFTCAP and not USE_SINK:  # P times the cap's derivative: t dies before the wait (held, it spilled)
                    b_pt = b_pt * (1 - b_tt * b_tt)
                b_dpt = warpgroup_mma_wait(num_outstanding=1, deps=(tok_dp,))  # dV stays in flight
                if (CHUNK > 1) & (c == CHUNK - 1) & (qi == n_qb - 1):  # the item's K/V are read for the
                    mbarrier.arrive(kv_empty.index(0), count=1)  # last time: the next item's copies run under its end
                b_delta = delta_smem.index(s).load(gl.SliceLayout(0, MMA_S))
                b_dsf = b_pt * (b_dpt - b_delta[None, :])
                if PACKED:  # queries past the sequence: zero in the stored tiles (the gate's key sums read them)
                    if qi * BQ_C + BQ_C > n:
                        b_dsf = gl.where((qi * BQ_C + o_q < n)[None, :], b_dsf, 0.0)
                if USE_SINK:  # fp32, before dS is rounded; summed over queries, within each warp
                    b_w = gl.exp2(b_sink - lse_smem.index(s).load(gl.SliceLayout(0, MMA_S)))
                    acc_sk += gl.sum(b_dsf * b_w[None, :], 1)
                if SOFTCAP and USE_SINK:  # dS of the q.k products, which dK and the stored tiles take
                    b_dsf = b_dsf * (1 - b_tt * b_tt)
                b_ds = b_dsf.to(dtype)
                if (i_wg == 0) | (qi > 2 * m):  # tile (qi, 2m + i_wg) is in the band (`from_ds.ds_layout`, causal)
                    buf = ds_smem.index(2 * i_wg + n_st % 2)
                    tma.store_wait(pendings=1)  # the store that last read buf has finished
                    buf.store(b_ds)
                    fence_async_shared()
                    tma_store(ds_desc, [row + (qi * (qi + 1) // 2 + 2 * m + i_wg) * BQ_C, 0], buf)
                    n_st += 1
                acc_dk = warpgroup_mma(gl.convert_layout(b_ds, OPERAND_A), b_q, acc_dk, is_async=True)
                acc_dv, acc_dk = warpgroup_mma_wait(num_outstanding=0, deps=(acc_dv, acc_dk))
                mbarrier.arrive(empty.index(s), count=1)
                i += 1
            if USE_SINK:  # at (head, batch, 64-key tile): the Triton kernel's key tile and slot
                if PACKED:  # (head, packed 64-key tile), for keys of the sequence
                    if key0 < n:
                        gl.store(sink_part + i_hq.to(gl.int64) * NT64 + gl.load(k64_offsets + i_n) + 2 * m + i_wg,
                                 gl.sum(acc_sk, 0))
                else:
                    NT = T // BH_C
                    gl.store(sink_part + i_hq.to(gl.int64) * (B * NT) + i_b * NT + 2 * m + i_wg, gl.sum(acc_sk, 0))
        if CHUNK == 1:  # one-head items released early lost: mha-long +2.3%
            mbarrier.arrive(kv_empty.index(0), count=1)
        # The FLAG launch's flag of this 64-key tile (the Triton kernel's program index): dK or dV not finite.
        bad = gl.max((((acc_dk - acc_dk) != 0) | ((acc_dv - acc_dv) != 0)).to(gl.int32), 1)
        if PACKED:  # the program of packed 64-key tile k64_offsets[i_n] + 2m + i_wg, where it has keys
            if key0 < n:
                e64 = gl.load(k64_offsets + i_n) + 2 * m + i_wg
                gl.store(nonfinite + i_head + e64 * (H * SPLIT), gl.max(bad, 0).to(gl.int8))
            gl.store(dk + p_out, (acc_dk * dk_scale).to(dk.dtype.element_ty), mask=m_out)
            gl.store(dv + p_out, acc_dv.to(dv.dtype.element_ty), mask=m_out)
        else:
            gl.store(nonfinite + i_b * (H * SPLIT) + i_head + (2 * m + i_wg) * (B * H * SPLIT),
                     gl.max(bad, 0).to(gl.int8))
            gl.store(dk + p_out, (acc_dk * dk_scale).to(dk.dtype.element_ty))
            gl.store(dv + p_out, acc_dv.to(dv.dtype.element_ty))
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=["L", "B", "T", "NTILE", "G0", "NT64"])
def parallel_attn_bwd_kernel_dkv_ds_hopper(
    q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, ds_desc, gc_desc, gc, sink_bias, sink_part, dk, dv, dk_in,
    dv_in, nonfinite, sched, L, B, T, NTILE, G0, qk_scale, dk_scale, cap_in, cu_seqlens, chunks, ds_offsets,
    k64_offsets, NT64, lse, delta, ACC_IN, H: gl.constexpr, G: gl.constexpr, SPLIT: gl.constexpr, CHUNK: gl.constexpr,
):
    """dK/dV of heads [G0, G0 + CHUNK) of each share of G / SPLIT query heads, their dS^T tiles (`from_ds.py`'s
    layout, bands of NTILE tiles) and the FLAG launch's flags; dk, dv `[B, T, H * SPLIT, D]`, dk times dk_scale
    (the softmax scale, or 1 for the unscaled fp32 sums a next chunk continues), started from dk_in, dv_in where
    ACC_IN (a runtime 0/1: else they are not read), as the Triton kernel's ACC_IN / ACC_OUT. Gated: gc
    `[HQ, B * T]` (fp32, base 2; gc_desc its TMA view); ungated: both None. With a sink (sink_bias `[HQ]`, else
    None): each head's fp32 sum of p_sink * dS over an item's 64 keys of a consumer warpgroup into sink_part
    `[HQ, B * T / 64]`, as the Triton kernel's. cap_in: scale / softcap where the logits are capped (qk_scale is then
    softcap * log2 e; dK and the stored tiles take the q.k products' dS, the sink's sums the scores'), else None.
    Packed (cu_seqlens `[N + 1]`, else None and so are the next five): B = 1, items of `chunks` (`chunk_indices(128)`)
    in a table whose first entry is its row length (`packed_schedule`, L unused), each sequence's bands from tile
    ds_offsets[n] * H * SPLIT * CHUNK (`host.band_offsets`), flags and sink sums at packed 64-key tiles
    (k64_offsets `[N + 1]`, NT64 of them), lse and delta `[HQ, T]` read by pointer (lse_desc, delta_desc None)."""
    gl.static_assert(G % SPLIT == 0, "SPLIT must divide the group")
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [STAGES_C, BQ_C, D_C], Q_SMEM)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES_C, BQ_C, D_C], Q_SMEM)
    k_smem = gl.allocate_shared_memory(dtype, [2, BH_C, D_C], KV_SMEM)  # [consumer warpgroup, key, d]
    v_smem = gl.allocate_shared_memory(dtype, [2, BH_C, D_C], KV_SMEM)
    if cu_seqlens is not None:  # by cp.async
        ROW: gl.constexpr = ROW_SMEM_CP
        READY_COUNT: gl.constexpr = 1 + PRODUCER_THREADS
    else:
        ROW: gl.constexpr = ROW_SMEM
        READY_COUNT: gl.constexpr = 1
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES_C, BQ_C], ROW)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES_C, BQ_C], ROW)
    gq_smem = lse_smem  # not read without a gate
    if gc is not None:
        gq_smem = gl.allocate_shared_memory(gl.float32, [STAGES_C, BQ_C], ROW)
    ds_smem = gl.allocate_shared_memory(dtype, [4, BH_C, BQ_C], DS_TILE)  # two buffers a consumer warpgroup
    ready = gl.allocate_shared_memory(gl.int64, [STAGES_C, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES_C, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES_C):
        mbarrier.init(ready.index(s), count=READY_COUNT)
        mbarrier.init(empty.index(s), count=2)  # one arrival a consumer warpgroup
        mbarrier.arrive(empty.index(s), count=2)  # every stage starts free
    mbarrier.init(kv_ready.index(0), count=1)
    mbarrier.init(kv_empty.index(0), count=2)
    mbarrier.arrive(kv_empty.index(0), count=2)
    # Partitions take flat tuples (no concatenation or unpacking in Gluon): the same arguments, then i_wg.
    wg0 = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, ds_desc, gc_desc, gc, sink_bias, sink_part, dk, dv,
           dk_in, dv_in, nonfinite, sched, L, B, T, NTILE, G0, qk_scale, dk_scale, cap_in,
           cu_seqlens, chunks, ds_offsets, k64_offsets, NT64, lse, delta,
           q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, gq_smem, ds_smem, ready, empty, kv_ready, kv_empty,
           H, G, SPLIT, CHUNK, ACC_IN, 0)
    wg1 = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, ds_desc, gc_desc, gc, sink_bias, sink_part, dk, dv,
           dk_in, dv_in, nonfinite, sched, L, B, T, NTILE, G0, qk_scale, dk_scale, cap_in,
           cu_seqlens, chunks, ds_offsets, k64_offsets, NT64, lse, delta,
           q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, gq_smem, ds_smem, ready, empty, kv_ready, kv_empty,
           H, G, SPLIT, CHUNK, ACC_IN, 1)
    producer = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, ds_desc, gc_desc, gc, sink_bias, sink_part, dk,
                dv, dk_in, dv_in, nonfinite, sched, L, B, T, NTILE, G0, qk_scale, dk_scale, cap_in,
                cu_seqlens, chunks, ds_offsets, k64_offsets, NT64, lse, delta,
                q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, gq_smem, ds_smem, ready, empty, kv_ready,
                kv_empty, H, G, SPLIT, CHUNK, ACC_IN)
    gl.warp_specialize([(_producer, producer), (_consumer, wg0), (_consumer, wg1)], [4, 4],
                       [CONSUMER_REGS, CONSUMER_REGS])


# ----------------------------------------------------------------------------------------------------------------
# Schedule, scope, launch
# ----------------------------------------------------------------------------------------------------------------

def _item_blocks(B: int, T: int, H: int, split: int):
    """Every item ((m * B + b) * H + h) * split + share and its query blocks per head (T / 64 - 2m, causal)."""
    return [(((m * B + b) * H + h) * split + p, T // BQ - 2 * m)
            for m in range(T // BT) for b in range(B) for h in range(H) for p in range(split)]


def _deal(item_blocks: list, programs: int):
    """(items per program, max over mean load) of (item, query blocks) pairs: longest first, each to the least
    loaded program."""
    heap = [(0, p) for p in range(programs)]
    lists = [[] for _ in range(programs)]
    for item, blocks in sorted(item_blocks, key=lambda x: -x[1]):
        load, p = heapq.heappop(heap)
        lists[p].append(item)
        heapq.heappush(heap, (load + blocks, p))
    loads = [load for load, _ in heap]
    return tuple(tuple(li) for li in lists), max(loads) * programs / max(1, sum(loads))


@functools.lru_cache(maxsize=256)
def _lpt(B: int, T: int, H: int, split: int, programs: int):
    return _deal(_item_blocks(B, T, H, split), programs)


def imbalance(B: int, T: int, H: int, split: int, programs: int) -> float:
    """The longest program's query blocks over the mean, for items of `split` shares on `programs` programs."""
    return _lpt(B, T, H, split, programs)[1]


def _rows(lists) -> tuple:
    """([programs, 1 + L] int32 on the CPU: per program its item count then its items, L)."""
    L = max(len(li) for li in lists)
    tab = torch.zeros(len(lists), 1 + L, dtype=torch.int32)
    for p, li in enumerate(lists):
        tab[p, 0] = len(li)
        tab[p, 1:1 + len(li)] = torch.tensor(li, dtype=torch.int32)
    return tab, L


@functools.lru_cache(maxsize=256)
def schedule(B: int, T: int, H: int, split: int, programs: int, device: torch.device):
    """([programs, 1 + L] int32 on `device`: per program its item count then its items, L)."""
    tab, L = _rows(_lpt(B, T, H, split, programs)[0])
    return tab.to(device), L


def packed_items(lengths: tuple, H: int, split: int) -> list:
    """A packed call's items (e * H + h) * split + share, e its 128-key tile in `chunk_indices(128)`'s order, and
    each one's query blocks (cdiv(n, 64) - 2m for tile m of a sequence of n tokens, causal)."""
    tiles = [(n, m) for n in lengths for m in range(-(-n // BT))]
    return [((e * H + h) * split + p, -(-n // BQ) - 2 * m) for e, (n, m) in enumerate(tiles)
            for h in range(H) for p in range(split)]


def packed_schedule(tiles, H: int, split: int, programs: int) -> torch.Tensor:
    """The packed kernel's table on the device, made once per offsets value (`VarlenTiles.memo`): L, then
    `schedule`'s rows for `packed_items`."""
    def make():
        tab, L = _rows(_deal(packed_items(tiles.lengths, H, split), programs)[0])
        return torch.cat([torch.tensor([L], dtype=torch.int32), tab.flatten()]).to(tiles.device)
    return tiles.memo(("hopper-dkv", H, split, programs), make)


def programs_for(B: int, T: int, H: int, split: int, sms: int, tiles=None) -> int:
    """One program an SM (198 KB of shared memory each), no more than there are items (packed: of `tiles`'
    128-key tiles)."""
    key_tiles = tiles.num_tiles(BT) if tiles is not None else B * (T // BT)
    return max(1, min(sms, H * split * key_tiles))


class HopperDkvLaunch(DescriptorLaunch):
    """Plan step (`launch.Plan.add`): one launch of `parallel_attn_bwd_kernel_dkv_ds_hopper`
    (`descriptor_launch.DescriptorLaunch`: every chunk's launch of a call shares the call's descriptors)."""

    def __init__(self, s, split: int, chunk: int, G0: int, ntile: int, args: dict, tiles=None):
        """`tiles`: a packed call's `VarlenTiles` (B = 1), whose schedule, 128-key tile list and 64-key tile
        offsets the plan binds per call as "hopper_sched", "chunks128" and "k64_offsets" (`host._run`)."""
        programs = programs_for(s.B, s.T, s.H, split, config.sm_count(s.device), tiles)
        acc_in = args["dk_in"] is not None
        gated = args["gc"] is not None
        rows, q_cols, kv_cols = s.B * s.T, s.HQ * D, s.H * D
        # (input, its 2-D or 1-D view, block, shared-memory layout) of each TMA descriptor the kernel takes
        table = (("q", (rows, q_cols), [BQ, D], Q_SMEM), ("do", (rows, q_cols), [BQ, D], Q_SMEM),
                 ("k", (rows, kv_cols), [BH, D], KV_SMEM), ("v", (rows, kv_cols), [BH, D], KV_SMEM))
        ds_view = (("ds", (-1, BQ), [BQ, BQ], DS_TILE),)
        if tiles is None:
            sched, L = schedule(s.B, s.T, s.H, split, programs, s.device)
            table += (("lse", (-1,), [BQ], ROW_SMEM), ("delta", (-1,), [BQ], ROW_SMEM)) + ds_view
            table += (("gc", (-1,), [BQ], ROW_SMEM),) if gated else ()
            packed = dict(cu_seqlens=None, chunks=None, ds_offsets=None, k64_offsets=None, NT64=None, lse=None,
                          delta=None, **({} if gated else {"gc_desc": None}))
        else:  # lse, delta and the gate cumsum by pointer (cp.async)
            table += ds_view
            sched, L = Ref("hopper_sched"), 0
            packed = dict(cu_seqlens=Ref("cu_seqlens"), chunks=Ref(f"chunks{BT}"), ds_offsets=args["ds_offsets"],
                          k64_offsets=Ref("k64_offsets"), NT64=tiles.num_tiles(BH), lse=args["lse"],
                          delta=args["delta"], lse_desc=None, delta_desc=None, gc_desc=None)
        self.programs = programs
        super().__init__(parallel_attn_bwd_kernel_dkv_ds_hopper, (programs,), dict(
            gc=args["gc"], sink_bias=args.get("sink_bias"), sink_part=args.get("sink_part"), dk=args["dk"],
            dv=args["dv"], dk_in=args["dk_in"] if acc_in else args["dk"], dv_in=args["dv_in"] if acc_in else args["dv"],
            nonfinite=args["nonfinite"], sched=sched, L=L, B=s.B, T=s.T, NTILE=ntile, G0=G0,
            qk_scale=(s.softcap or s.scale) * LOG2E, dk_scale=1.0 if args["acc_out"] else s.scale,
            cap_in=s.scale / s.softcap if s.softcap else None, ACC_IN=int(acc_in), H=s.H,
            G=s.HQ // s.H, SPLIT=split, CHUNK=chunk, **packed,
            num_warps=NUM_WARPS), tuple((name, args[name].name, view, block, layout.value)
                                        for name, view, block, layout in table), _DESC)


_DESC = "_hopper_desc_"  # env names of the call's TMA descriptors
