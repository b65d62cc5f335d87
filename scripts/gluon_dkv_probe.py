#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Probe for PERF.md #25/#26: does overlapping the products of the dK/dV inner loop with its elementwise work pay?

Triton 3.6 waits for every wgmma right after issuing it in our bulk loops (#25). This script times the same inner
loop three ways, on the loop alone (no causal mask, no window, gate or sink: every query block is visible to every
key tile, the shape of the unmasked range), MHA, one program per (key tile, head), 64 keys x 64 queries, D = 128:
- "triton": plain Triton, the body of `dkv_block` (FULL, unmasked), as the product compiles it;
- "gluon-serial": the same loop in Gluon (explicit layouts, cp.async double buffer), every product waited at once;
- "gluon-overlap": the same, with the waits deferred: dP^T is issued with S^T and runs under the exponentials,
  P^T dO runs under dS^T, dS^T Q under the next block's wait for its loads.
Not product code: it proves or refutes the lever before the kernels are ported.

    python scripts/gluon_dkv_probe.py                 # on a GPU: check against torch, then time (us)
    python scripts/gluon_dkv_probe.py --compile-only  # anywhere: compile for sm_90, registers and the waits in SASS
"""

import argparse
import math
import os
import re
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

D = 128
LOG2E = math.log2(math.e)

# Layouts: loads of [64, 128] bf16 tiles (16 B a thread), the [64, 64] score products, the [64, 128] accumulators.
LOAD = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                     order=[1, 0]))
MMA_S = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]))
MMA_D = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16]))
OPERAND_A = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA_D.value, k_width=2))
SMEM = gl.constexpr(gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16))


@gluon.jit
def _issue_rows(buf, base, row0, stride, R: gl.constexpr, C: gl.constexpr):
    """cp.async of rows [row0, row0 + R) of a [*, stride] bf16 matrix at `base` into the smem buffer `buf`."""
    o_r = row0 + gl.arange(0, R, layout=gl.SliceLayout(1, LOAD))
    o_c = gl.arange(0, C, layout=gl.SliceLayout(0, LOAD))
    async_copy.async_copy_global_to_shared(buf, base + o_r.to(gl.int64)[:, None] * stride + o_c[None, :])


@gluon.jit
def gluon_dkv_kernel(q, k, v, do, lse, delta, dk, dv, T, qk_scale, scale, HQ: gl.constexpr,
                     OVERLAP: gl.constexpr):
    """OVERLAP 0: every product waited at once (what Triton does); 1: S^T and dP^T issued together, one wait;
    2: waits deferred (dP^T under the exponentials, P^T dO under dS^T, dS^T Q under the next block's loads)."""
    i_s, i_h = gl.program_id(0), gl.program_id(1)
    stride = HQ * 128
    s0 = i_s * 64
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 128], SMEM)
    v_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 128], SMEM)
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 128], SMEM)
    do_smem = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 128], SMEM)
    _issue_rows(k_smem, k + i_h * 128, s0, stride, 64, 128)
    _issue_rows(v_smem, v + i_h * 128, s0, stride, 64, 128)
    _issue_rows(q_smem.index(0), q + i_h * 128, 0, stride, 64, 128)
    _issue_rows(do_smem.index(0), do + i_h * 128, 0, stride, 64, 128)
    async_copy.commit_group()
    o_q = gl.arange(0, 64, layout=gl.SliceLayout(0, MMA_S))
    row = i_h.to(gl.int64) * T
    b_lse = gl.load(lse + row + o_q)
    b_delta = gl.load(delta + row + o_q)
    acc_dk = gl.zeros([64, 128], gl.float32, MMA_D)
    acc_dv = gl.zeros([64, 128], gl.float32, MMA_D)
    if OVERLAP == 2:  # loop-carried as tokens of in-flight products
        acc_dk = warpgroup_mma_init(acc_dk)
        acc_dv = warpgroup_mma_init(acc_dv)
    zero_s = gl.zeros([64, 64], gl.float32, MMA_S)
    n = T // 64
    for it in range(n):
        stage = it % 2
        # the next block's lse/delta, one block ahead (as `dkv_block` does)
        nxt = gl.minimum(it + 1, n - 1) * 64
        lse_next = gl.load(lse + row + nxt + o_q)
        delta_next = gl.load(delta + row + nxt + o_q)
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        b_q = q_smem.index(stage)
        b_do = do_smem.index(stage)
        # [BT, BS]: S^T = K Q^T and dP^T = V dO^T
        s_tok = warpgroup_mma(k_smem, b_q.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if OVERLAP == 2:
            dp_tok = warpgroup_mma(v_smem, b_do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            # S^T, and the previous block's dK/dV products (issued before it), done; dP^T may still run
            b_st, acc_dk, acc_dv = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, acc_dk, acc_dv))
        elif OVERLAP == 1:
            # S^T and dP^T back to back on the tensor cores, one wait for both
            dp_tok = warpgroup_mma(v_smem, b_do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            b_st, b_dpt = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, dp_tok))
        else:
            b_st, acc_dk, acc_dv = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, acc_dk, acc_dv))
        # the other stage is free now (its last readers were the previous dK/dV products): load the next block
        if it + 1 < n:
            _issue_rows(q_smem.index(1 - stage), q + i_h * 128, (it + 1) * 64, stride, 64, 128)
            _issue_rows(do_smem.index(1 - stage), do + i_h * 128, (it + 1) * 64, stride, 64, 128)
        async_copy.commit_group()
        b_pt = gl.exp2(b_st * qk_scale - b_lse[None, :])
        acc_dv = warpgroup_mma(gl.convert_layout(b_pt.to(gl.bfloat16), OPERAND_A), b_do, acc_dv, is_async=True)
        if OVERLAP == 2:
            b_dpt = warpgroup_mma_wait(num_outstanding=1, deps=(dp_tok,))
        elif OVERLAP == 1:
            acc_dv = warpgroup_mma_wait(num_outstanding=0, deps=(acc_dv,))
        else:
            acc_dv = warpgroup_mma_wait(num_outstanding=0, deps=(acc_dv,))
            dp_tok = warpgroup_mma(v_smem, b_do.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            b_dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))
        b_dst = b_pt * (b_dpt - b_delta[None, :])
        acc_dk = warpgroup_mma(gl.convert_layout(b_dst.to(gl.bfloat16), OPERAND_A), b_q, acc_dk, is_async=True)
        if OVERLAP != 2:
            acc_dk = warpgroup_mma_wait(num_outstanding=0, deps=(acc_dk,))
        b_lse, b_delta = lse_next, delta_next
    b_dk, b_dv = warpgroup_mma_wait(num_outstanding=0, deps=(acc_dk, acc_dv))
    async_copy.wait_group(0)
    o_r = s0 + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA_D))
    o_c = gl.arange(0, 128, layout=gl.SliceLayout(0, MMA_D))
    p_out = o_r.to(gl.int64)[:, None] * stride + i_h * 128 + o_c[None, :]
    gl.store(dk + p_out, (b_dk * scale).to(gl.bfloat16))
    gl.store(dv + p_out, b_dv.to(gl.bfloat16))


@triton.jit
def triton_dkv_kernel(q, k, v, do, lse, delta, dk, dv, T, qk_scale, scale, HQ: tl.constexpr, dq=None,
                      ATOMIC_DQ: tl.constexpr = 0, BS: tl.constexpr = 64):
    """ATOMIC_DQ: also dQ (fp32, times `scale`) from each block's dS K, the fifth product, added as a
    non-deterministic fused backward would: 1 by `tl.atomic_add` of pointers (REDG), 2 by a TMA reduce-add of the
    whole [64, 128] tile through a host tensor descriptor (cp.reduce.async.bulk, FA3's way). BS: keys a program."""
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    stride = HQ * 128
    o_s = i_s * BS + tl.arange(0, BS)
    o_d = tl.arange(0, 128)
    p_kv = o_s.to(tl.int64)[:, None] * stride + i_h * 128 + o_d[None, :]
    b_k = tl.load(k + p_kv)
    b_v = tl.load(v + p_kv)
    b_dk = tl.zeros([BS, 128], tl.float32)
    b_dv = tl.zeros([BS, 128], tl.float32)
    row = i_h.to(tl.int64) * T
    for i_t in range(0, T, 64):
        o_t = i_t + tl.arange(0, 64)
        p_q = o_t.to(tl.int64)[:, None] * stride + i_h * 128 + o_d[None, :]
        b_q = tl.load(q + p_q)
        b_do = tl.load(do + p_q)
        b_lse = tl.load(lse + row + o_t)
        b_delta = tl.load(delta + row + o_t)
        b_st = tl.dot(b_k, tl.trans(b_q)) * qk_scale
        b_pt = tl.exp2(b_st - b_lse[None, :])
        b_dv += tl.dot(b_pt.to(b_do.dtype), b_do)
        b_dpt = tl.dot(b_v, tl.trans(b_do))
        b_dst = b_pt * (b_dpt - b_delta[None, :])
        b_dk += tl.dot(b_dst.to(b_q.dtype), b_q)
        if ATOMIC_DQ > 0:
            # [64, D]
            b_dq = tl.dot(tl.trans(b_dst.to(b_k.dtype)), b_k) * scale
            if ATOMIC_DQ == 1:
                tl.atomic_add(dq + o_t.to(tl.int64)[:, None] * stride + i_h * 128 + o_d[None, :], b_dq,
                              sem="relaxed")
            else:
                dq.atomic_add([i_t, i_h * 128], b_dq)
    tl.store(dk + p_kv, (b_dk * scale).to(dk.dtype.element_ty))
    tl.store(dv + p_kv, b_dv.to(dv.dtype.element_ty))


def inputs(T, HQ, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(T, HQ, D, device="cuda", generator=g).bfloat16() for _ in range(4))
    scale = D ** -0.5
    s = torch.einsum("thd,shd->hts", q.float(), k.float()) * scale  # non-causal
    lse = torch.logsumexp(s, -1)  # [HQ, T], natural units
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v.float())
    delta = (o * do.float()).sum(-1).transpose(0, 1).contiguous()  # [HQ, T]
    return q, k, v, do, (lse * LOG2E).contiguous(), delta, scale


def reference(q, k, v, do, scale):
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    s = torch.einsum("thd,shd->hts", qf, kf) * scale
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), vf)
    return torch.autograd.grad(o, (qf, kf, vf), do.float())


def run(variant, q, k, v, do, lse, delta, scale):
    T, HQ, _ = q.shape
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    args = dict(q=q, k=k, v=v, do=do, lse=lse, delta=delta, dk=dk, dv=dv, T=T, qk_scale=scale * LOG2E,
                scale=scale, HQ=HQ)
    if variant.startswith("triton"):
        atomic = 2 if "tma-dq" in variant else 1 if "atomic-dq" in variant else 0
        bs = 128 if variant.endswith("-bs128") else 64
        dq = torch.zeros(T, HQ, D, device=q.device, dtype=torch.float32) if atomic else None
        arg = dq
        if atomic == 2:
            from triton.tools.tensor_descriptor import TensorDescriptor
            arg = TensorDescriptor.from_tensor(dq.view(T, HQ * D), block_shape=[64, D])
        triton_dkv_kernel[(T // bs, HQ)](**args, dq=arg, ATOMIC_DQ=atomic, BS=bs, num_warps=4 if bs == 64 else 8,
                                         num_stages=2)
        return (dk, dv) if dq is None else (dk, dv, dq)
    else:
        gluon_dkv_kernel[(T // 64, HQ)](**args, OVERLAP=VARIANTS.index(variant) - 1, num_warps=4)
    return dk, dv


VARIANTS = ("triton", "gluon-serial", "gluon-pair", "gluon-overlap", "triton-atomic-dq", "triton-tma-dq",
            "triton-bs128", "triton-tma-dq-bs128")  # gluon: OVERLAP = index - 1


def on_gpu():
    q, k, v, do, lse, delta, scale = inputs(512, 4)
    refs = reference(q, k, v, do, scale)
    for variant in VARIANTS:
        out = run(variant, q, k, v, do, lse, delta, scale)
        pairs = list(zip(("dk", "dv", "dq"), refs[1:] + refs[:1], out))
        err = {n: ((r - x.float()).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item() for n, r, x in pairs}
        print(f"check {variant:16s} " + " ".join(f"{n} {e:.2e}" for n, e in err.items())
              + ("  FAIL" if not max(err.values()) < 0.01 else ""), flush=True)
    T, HQ = 4096, 32
    q, k, v, do, lse, delta, scale = inputs(T, HQ)
    flops = 4 * 2 * T * T * HQ * D  # four products per (key, query) pair and head
    for _ in range(2):
        for variant in ("triton", "triton-atomic-dq", "triton-tma-dq", "triton-bs128", "triton-tma-dq-bs128"):
            us = 1e3 * triton.testing.do_bench(lambda v_=variant: run(v_, q, k, v, do, lse, delta, scale), rep=200)
            f = flops * (5 if "dq" in variant else 4) // 4
            print(f"time  {variant:16s} T{T} HQ{HQ}: {us:8.1f} us  {f / us / 1e6:6.1f} TFLOP/s", flush=True)


def compile_only():
    sys.path.insert(0, os.path.dirname(__file__))
    from compile_sm90 import cuobjdump, loop_report
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {n: "*bf16" for n in ("q", "k", "v", "do", "dk", "dv")}
    sig.update(lse="*fp32", delta="*fp32", T="i32", qk_scale="fp32", scale="fp32", HQ="constexpr")
    target = GPUTarget("cuda", 90, 32)
    aligned = {(i,): [["tt.divisibility", 16]] for i in range(8)}  # what the launcher specialises on a GPU
    plain = dict(sig, dq="constexpr", ATOMIC_DQ="constexpr", BS="constexpr")
    atomic = dict(plain, dq="*fp32")
    tma = dict(plain, dq="tensordesc<fp32[64, 128]>")
    builds = [("triton", ASTSource(triton_dkv_kernel, plain, constexprs={(11,): 32, (12,): None, (13,): 0,
                                                                        (14,): 64}, attrs=aligned), 2),
              ("triton-atomic-dq", ASTSource(triton_dkv_kernel, atomic, constexprs={(11,): 32, (13,): 1, (14,): 64},
                                             attrs={**aligned, (12,): [["tt.divisibility", 16]]}), 2),
              ("triton-tma-dq", ASTSource(triton_dkv_kernel, tma, constexprs={(11,): 32, (13,): 2, (14,): 64},
                                          attrs=aligned), 2)]
    for overlap in (0, 1, 2):
        s = dict(sig, OVERLAP="constexpr")
        builds.append((VARIANTS[overlap + 1],
                       GluonASTSource(gluon_dkv_kernel, s, constexprs={(11,): 32, (12,): overlap}, attrs=aligned), 1))
    for name, src, stages in builds:
        c = triton.compile(src, target=target, options=dict(num_warps=4, num_stages=stages))
        res = cuobjdump(c, "--dump-resource-usage")
        sass = cuobjdump(c, "-sass")
        waits = re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", sass)
        regs, stack = re.search(r"REG:(\d+)", res).group(0), re.search(r"STACK:(\d+)", res).group(0)
        reds = sorted(set(re.findall(r"\bRED\S*", sass)))
        print(f"{name:16s} {regs} {stack} HGMMA {sass.count('HGMMA')} waits {' '.join(waits)} "
              f"atomics {sass.count('RED.')} {' '.join(reds)}")
        print("\n".join(loop_report(c)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true")
    if ap.parse_args().compile_only:
        compile_only()
    else:
        on_gpu()
