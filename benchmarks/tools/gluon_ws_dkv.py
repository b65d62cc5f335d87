# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Probe (PERF.md #42v): the dK/dV loop in Gluon with FA3's structure: a producer warp issues TMA copies of K/V
(double-buffered across items) and of q/dO (a STAGES-deep ring) ahead of the consumer warpgroups (WS_BT=64: one,
64 keys an item; WS_BT=128: two sharing each q/dO stage, 64 keys each, FA3's split), in a persistent grid, so that
the next item's loads run under this item's last products (the per-item cost of #42u). Non-causal MHA, 64 queries
a block, D128, 4 products a pair; against the Triton loop of `persist_probe.py` (grid).

    python benchmarks/tools/gluon_ws_dkv.py --compile-only
    python benchmarks/tools/gluon_ws_dkv.py                  # WS_BT=128 for two consumer warpgroups
    for bt in 64 128; do for row in 0 1; do WS_BT=$bt WS_ROW=$row python benchmarks/tools/gluon_ws_dkv.py; done; done
WS_ROW=1: the producer also copies each block's lse and delta (TMA, 256 B each) into the stage; the consumer reads
them from shared memory instead of holding the next block's in registers (what spilled at WS_ROW=0).
"""
import argparse
import math
import os
import re
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

D = 128
LOG2E = math.log2(math.e)
BT = int(os.environ.get("WS_BT", "64"))  # keys an item: 64 (one consumer warpgroup) or 128 (two)
CW = BT // 16  # consumer warps
MMA_S = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CW, 1], instr_shape=[16, 64, 16]))
MMA_D = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CW, 1], instr_shape=[16, 128, 16]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA_D.value, k_width=2))
SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16))
KV_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([BT, 128], gl.bfloat16))
TILE_BYTES = gl.constexpr(64 * 128 * 2)
KV_BYTES = gl.constexpr(BT * 128 * 2)
BT_C = gl.constexpr(BT)
ROW_SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([64], gl.float32))
ROW_BYTES = gl.constexpr(64 * 4)
# WS_ROW=1: lse/delta by TMA with each block (constexprs passed into warp_specialize partitions arrive as values)
LSE_TMA = gl.constexpr(int(os.environ.get("WS_ROW", "0")))


@gluon.jit
def _producer(q_desc, k_desc, v_desc, do_desc, lse, delta, dk, dv, T, NQ, qk_scale, scale,
              q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ready, empty, kv_ready, kv_empty,
              STAGES: gl.constexpr):
    n_s = T // BT_C
    n_items = n_s * (q_desc.shape[1] // 128)
    i = 0
    j = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        i_s = item % n_s
        i_h = item // n_s
        kb = j % 2
        mbarrier.wait(kv_empty.index(kb), (j // 2) & 1)
        mbarrier.expect(kv_ready.index(kb), 2 * KV_BYTES)
        tma.async_copy_global_to_shared(k_desc, [i_s * BT_C, i_h * 128], kv_ready.index(kb), k_smem.index(kb))
        tma.async_copy_global_to_shared(v_desc, [i_s * BT_C, i_h * 128], kv_ready.index(kb), v_smem.index(kb))
        for i_t in range(0, NQ, 64):
            s = i % STAGES
            mbarrier.wait(empty.index(s), (i // STAGES) & 1)
            if LSE_TMA:  # lse and delta of the block with it: the consumer reads them from shared memory
                mbarrier.expect(ready.index(s), 2 * TILE_BYTES + 2 * ROW_BYTES)
                tma.async_copy_global_to_shared(lse, [i_h * T + i_t], ready.index(s), lse_smem.index(s))
                tma.async_copy_global_to_shared(delta, [i_h * T + i_t], ready.index(s), delta_smem.index(s))
            else:
                mbarrier.expect(ready.index(s), 2 * TILE_BYTES)
            tma.async_copy_global_to_shared(q_desc, [i_t, i_h * 128], ready.index(s), q_smem.index(s))
            tma.async_copy_global_to_shared(do_desc, [i_t, i_h * 128], ready.index(s), do_smem.index(s))
            i += 1
        j += 1


@gluon.jit
def _consumer(q_desc, k_desc, v_desc, do_desc, lse, delta, dk, dv, T, NQ, qk_scale, scale,
              q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ready, empty, kv_ready, kv_empty,
              STAGES: gl.constexpr):
    n_s = T // BT_C
    HQ = q_desc.shape[1] // 128
    n_items = n_s * HQ
    stride = HQ * 128
    o_q = gl.arange(0, 64, layout=gl.SliceLayout(0, MMA_S))
    o_r = gl.arange(0, BT_C, layout=gl.SliceLayout(1, MMA_D))
    o_c = gl.arange(0, 128, layout=gl.SliceLayout(0, MMA_D))
    zero_s = gl.zeros([BT_C, 64], gl.float32, MMA_S)
    i = 0
    j = 0
    for item in range(gl.program_id(0), n_items, gl.num_programs(0)):
        i_s = item % n_s
        i_h = item // n_s
        kb = j % 2
        row = i_h.to(gl.int64) * T
        if not LSE_TMA:
            b_lse = gl.load(lse + row + o_q)
            b_delta = gl.load(delta + row + o_q)
        acc_dk = gl.zeros([BT_C, 128], gl.float32, MMA_D)
        acc_dv = gl.zeros([BT_C, 128], gl.float32, MMA_D)
        mbarrier.wait(kv_ready.index(kb), (j // 2) & 1)
        b_k = k_smem.index(kb)
        b_v = v_smem.index(kb)
        for i_t in range(0, NQ, 64):
            s = i % STAGES
            if not LSE_TMA:  # one block ahead in registers
                nxt = gl.minimum(i_t + 64, NQ - 64)
                lse_next = gl.load(lse + row + nxt + o_q)
                delta_next = gl.load(delta + row + nxt + o_q)
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            if LSE_TMA:
                b_lse = lse_smem.index(s).load(gl.SliceLayout(0, MMA_S))
                b_delta = delta_smem.index(s).load(gl.SliceLayout(0, MMA_S))
            b_q = q_smem.index(s)
            b_do = do_smem.index(s)
            # [BT, BS]: S^T = K Q^T
            tok = warpgroup_mma(b_k, b_q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            b_st = warpgroup_mma_wait(num_outstanding=0, deps=(tok,))
            b_pt = gl.exp2(b_st * qk_scale - b_lse[None, :])
            acc_dv = warpgroup_mma(gl.convert_layout(b_pt.to(gl.bfloat16), OPERAND_A), b_do, acc_dv, is_async=True)
            tok = warpgroup_mma(b_v, b_do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            acc_dv, b_dpt = warpgroup_mma_wait(num_outstanding=0, deps=(acc_dv, tok))
            b_dst = b_pt * (b_dpt - b_delta[None, :])
            acc_dk = warpgroup_mma(gl.convert_layout(b_dst.to(gl.bfloat16), OPERAND_A), b_q, acc_dk, is_async=True)
            acc_dk = warpgroup_mma_wait(num_outstanding=0, deps=(acc_dk,))
            mbarrier.arrive(empty.index(s), count=1)  # this stage's q/dO are read
            if not LSE_TMA:
                b_lse, b_delta = lse_next, delta_next
            i += 1
        mbarrier.arrive(kv_empty.index(kb), count=1)  # K/V buffer free for the item after next
        p_out = (i_s * BT_C + o_r).to(gl.int64)[:, None] * stride + i_h * 128 + o_c[None, :]
        gl.store(dk + p_out, (acc_dk * scale).to(gl.bfloat16))
        gl.store(dv + p_out, acc_dv.to(gl.bfloat16))
        j += 1


@gluon.jit
def gluon_ws_dkv_kernel(q_desc, k_desc, v_desc, do_desc, lse, delta, dk, dv, T, NQ, qk_scale, scale,
                        STAGES: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 64, 128], SMEM)
    do_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 64, 128], SMEM)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BT_C, 128], KV_SMEM)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BT_C, 128], KV_SMEM)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 64], ROW_SMEM)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 64], ROW_SMEM)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    kv_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
        mbarrier.arrive(empty.index(s), count=1)  # every stage starts free
    for s in gl.static_range(2):
        mbarrier.init(kv_ready.index(s), count=1)
        mbarrier.init(kv_empty.index(s), count=1)
        mbarrier.arrive(kv_empty.index(s), count=1)
    args = (q_desc, k_desc, v_desc, do_desc, lse, delta, dk, dv, T, NQ, qk_scale, scale,
            q_smem, do_smem, k_smem, v_smem, lse_smem, delta_smem, ready, empty, kv_ready, kv_empty, STAGES)
    gl.warp_specialize([(_consumer, args), (_producer, args)], [1], [PRODUCER_REGS])


def descriptors(q, k, v, do):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    def desc(x, rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, 128], gl.bfloat16)
        return TensorDescriptor.from_tensor(x.view(x.shape[0], -1), [rows, 128], layout)
    return desc(q, 64), desc(k, BT), desc(v, BT), desc(do, 64)


def run_gluon(q, k, v, do, lse, delta, scale, sms, nq=None, stages=2, per_sm=1, regs=24):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    T = q.shape[0]
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    qd, kd, vd, dod = descriptors(q, k, v, do)
    if LSE_TMA:
        row = gl.NVMMASharedLayout.get_default_for([64], gl.float32)
        lse, delta = (TensorDescriptor.from_tensor(x.view(-1), [64], row) for x in (lse, delta))
    gluon_ws_dkv_kernel[(sms * per_sm,)](qd, kd, vd, dod, lse, delta, dk, dv, T, nq or T, scale * LOG2E, scale,
                                         STAGES=stages, PRODUCER_REGS=regs, num_warps=CW)
    return dk, dv


VARIANTS = {"ws-s2": dict(stages=2), "ws-s3": dict(stages=3)}  # 128-key items: 4 stages exceed shared memory
if BT == 64:
    VARIANTS["ws-s4"] = dict(stages=4)


def on_gpu():
    import persist_probe as P
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v, do, lse, delta, scale = P.inputs(512, 4, exact=True)
    refs = P.reference(q, k, v, do, scale)
    ok = []
    for name, kw in VARIANTS.items():
        try:
            dk, dv = run_gluon(q, k, v, do, lse, delta, scale, sms, **kw)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"check {name:10s} FAILED TO RUN: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        err = [((r - x.float()).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()
               for r, x in zip(refs[1:], (dk, dv))]
        bad = not max(err) < 0.01
        print(f"check {name:10s} dk {err[0]:.2e} dv {err[1]:.2e}" + ("  FAIL" if bad else ""), flush=True)
        if not bad:
            ok.append(name)
    args = P.inputs(4096, 32)
    for nq in (4096, 512):
        flops = 4 * 2 * 4096 * nq * 32 * D
        fns = {"triton-grid": lambda n=nq: P.run("grid", *args, sms, nq=n)}
        fns.update({name: (lambda n=nq, kw=VARIANTS[name]: run_gluon(*args, sms, nq=n, **kw)) for name in ok})
        for r in range(2):
            for name in (list(fns) if r == 0 else list(fns)[::-1]):
                us = 1e3 * triton.testing.do_bench(fns[name], rep=150)
                print(f"time  T4096 HQ32 blocks {nq // 64:3d} {name:11s} {us:8.1f} us {flops / us / 1e6:6.1f} TFLOP/s",
                      flush=True)


def compile_only():
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from scripts.compile_sm90 import cuobjdump, loop_report
    lse_tma = LSE_TMA.value
    for stages in (2, 3):
        td = f"tensordesc<bf16[64, 128],{SMEM.value!r}>"
        tk = f"tensordesc<bf16[{BT}, 128],{KV_SMEM.value!r}>"
        sig = dict(q_desc=td, k_desc=tk, v_desc=tk, do_desc=td)
        row = f"tensordesc<fp32[64],{ROW_SMEM.value!r}>" if lse_tma else "*fp32"
        sig.update(lse=row, delta=row, dk="*bf16", dv="*bf16", T="i32", NQ="i32", qk_scale="fp32",
                   scale="fp32", STAGES="constexpr", PRODUCER_REGS="constexpr",
)
        sig = {n: sig[n] for n in gluon_ws_dkv_kernel.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i in (4, 5, 6, 7, 8, 9)}
        src = GluonASTSource(gluon_ws_dkv_kernel, sig, constexprs={(12,): stages, (13,): 24},
                              attrs=attrs)
        try:
            c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=CW))
        except Exception as e:  # noqa: BLE001
            print(f"stages {stages} lse_tma {lse_tma}: COMPILE FAILED: {type(e).__name__} {e.__cause__!r}"[:1500])
            continue
        res = cuobjdump(c, "--dump-resource-usage")
        regs, stack = re.search(r"REG:\d+", res).group(0), re.search(r"STACK:\d+", res).group(0)
        print(f"stages {stages} lse_tma {lse_tma}: {regs} {stack} smem {c.metadata.shared} "
              f"warps {c.metadata.num_warps}")
        print("   " + "\n   ".join(loop_report(c)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    (compile_only if ap.parse_args().compile_only else on_gpu)()
