# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Probe: Triton 3.6's Hopper automatic warp specialization (tl.range(..., warp_specialize=True)) on the dK/dV
bulk loop (non-causal MHA, 64 keys a program, D128, 4 products a pair), against the same loop without it.
Variants: base (pointer loads), desc (q/dO through on-device tensor descriptors), ws (desc + warp_specialize),
at num_warps 4 / 8 and key tiles of 64 / 128. Also STORE: the five-product store of dS^T through a descriptor.

    python benchmarks/tools/ws_probe.py --compile-only   # sm_90 build: registers, spills, loops, partitions
    python benchmarks/tools/ws_probe.py                  # on a GPU: check against torch, then time
"""
import argparse
import math
import os
import re
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.getcwd())

D = 128
LOG2E = math.log2(math.e)


@triton.jit
def probe_kernel(q, k, v, do, lse, delta, dk, dv, ds, T, qk_scale, scale, HQ: tl.constexpr, BS: tl.constexpr,
                 DESC: tl.constexpr, WS: tl.constexpr, STORE: tl.constexpr):
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    stride = HQ * 128
    o_s = i_s * BS + tl.arange(0, BS)
    o_d = tl.arange(0, 128)
    p_kv = o_s.to(tl.int64)[:, None] * stride + i_h * 128 + o_d[None, :]
    if DESC:
        d_k = tl.make_tensor_descriptor(k, shape=[T, stride], strides=[stride, 1], block_shape=[BS, 128])
        d_v = tl.make_tensor_descriptor(v, shape=[T, stride], strides=[stride, 1], block_shape=[BS, 128])
        b_k = d_k.load([i_s * BS, i_h * 128])
        b_v = d_v.load([i_s * BS, i_h * 128])
    else:
        b_k = tl.load(k + p_kv)
        b_v = tl.load(v + p_kv)
    b_dk = tl.zeros([BS, 128], tl.float32)
    b_dv = tl.zeros([BS, 128], tl.float32)
    row = i_h.to(tl.int64) * T
    if DESC:
        d_q = tl.make_tensor_descriptor(q, shape=[T, stride], strides=[stride, 1], block_shape=[64, 128])
        d_do = tl.make_tensor_descriptor(do, shape=[T, stride], strides=[stride, 1], block_shape=[64, 128])
    if DESC == 2:
        d_lse = tl.make_tensor_descriptor(lse, shape=[HQ, T], strides=[T, 1], block_shape=[1, 64])
        d_delta = tl.make_tensor_descriptor(delta, shape=[HQ, T], strides=[T, 1], block_shape=[1, 64])
    if STORE:
        # dS^T tiles of this (head, key tile): [T/64 tiles of BS x 64] rows
        d_ds = tl.make_tensor_descriptor(ds, shape=[HQ * (T // BS) * T, 64], strides=[64, 1], block_shape=[BS, 64])
        ds_row0 = ((i_h * (T // BS) + i_s) * T).to(tl.int32)
    for i_t in tl.range(0, T, 64, warp_specialize=WS):
        o_t = i_t + tl.arange(0, 64)
        if DESC:
            b_q = d_q.load([i_t, i_h * 128])
            b_do = d_do.load([i_t, i_h * 128])
        else:
            p_q = o_t.to(tl.int64)[:, None] * stride + i_h * 128 + o_d[None, :]
            b_q = tl.load(q + p_q)
            b_do = tl.load(do + p_q)
        if DESC == 2:
            b_lse = d_lse.load([i_h, i_t]).reshape(64)
            b_delta = d_delta.load([i_h, i_t]).reshape(64)
        else:
            b_lse = tl.load(lse + row + o_t)
            b_delta = tl.load(delta + row + o_t)
        b_st = tl.dot(b_k, tl.trans(b_q)) * qk_scale
        b_pt = tl.exp2(b_st - b_lse[None, :])
        b_dv += tl.dot(b_pt.to(b_do.dtype), b_do)
        b_dpt = tl.dot(b_v, tl.trans(b_do))
        b_dst = b_pt * (b_dpt - b_delta[None, :])
        if STORE:
            d_ds.store([ds_row0 + (i_t // 64) * BS, 0], b_dst.to(b_q.dtype))
        b_dk += tl.dot(b_dst.to(b_q.dtype), b_q)
    tl.store(dk + p_kv, (b_dk * scale).to(dk.dtype.element_ty))
    tl.store(dv + p_kv, b_dv.to(dv.dtype.element_ty))


# name: (BS, DESC, WS, STORE, num_warps, num_stages)
VARIANTS = {
    "base": (64, 0, 0, 0, 4, 2),
    "desc": (64, 1, 0, 0, 4, 2),
    "ws-w4": (64, 1, 1, 0, 4, 2),
    "ws-w4-s3": (64, 1, 1, 0, 4, 3),
    "desc2": (64, 2, 0, 0, 4, 2),
    "ws2-w4": (64, 2, 1, 0, 4, 2),
    "ws2-w4-s3": (64, 2, 1, 0, 4, 3),
    "ws2-w8-bs128": (128, 2, 1, 0, 8, 2),
    "store2-ws-w4": (64, 2, 1, 1, 4, 2),
    "ws-w8-bs128": (128, 1, 1, 0, 8, 2),
    "base-w8-bs128": (128, 0, 0, 0, 8, 2),
    "store": (64, 1, 0, 1, 4, 2),
    "store-ws-w4": (64, 1, 1, 1, 4, 2),
    "store-ws-w8-bs128": (128, 1, 1, 1, 8, 2),
}


def compile_only(names):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from scripts.compile_sm90 import cuobjdump, loop_report
    for name in names:
        bs, desc, ws, store, warps, stages = VARIANTS[name]
        sig = {n: "*bf16" for n in ("q", "k", "v", "do", "dk", "dv", "ds")}
        sig.update(lse="*fp32", delta="*fp32", T="i32", qk_scale="fp32", scale="fp32", HQ="constexpr",
                   BS="constexpr", DESC="constexpr", WS="constexpr", STORE="constexpr")
        aligned = {(i,): [["tt.divisibility", 16]] for i in range(9)}
        aligned[(9,)] = [["tt.divisibility", 16]]
        cx = {(12,): 32, (13,): bs, (14,): desc, (15,): ws, (16,): store}
        try:
            c = triton.compile(ASTSource(probe_kernel, sig, constexprs=cx, attrs=aligned),
                               target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name:18s} COMPILE FAILED: {str(e).splitlines()[0][:300]}")
            continue
        res = cuobjdump(c, "--dump-resource-usage")
        sass = cuobjdump(c, "-sass")
        ttgir = c.asm["ttgir"]
        regs, stack = re.search(r"REG:(\d+)", res).group(0), re.search(r"STACK:(\d+)", res).group(0)
        print(f"{name:18s} {regs} {stack} smem {c.metadata.shared} warps {c.metadata.num_warps} "
              f"ws-ops {ttgir.count('ttg.warp_specialize')} partitions {ttgir.count('partition')} "
              f"setmaxnreg {sass.count('SETMAXREG')} HGMMA {sass.count('HGMMA')} "
              f"waits {' '.join(re.findall(r'WARPGROUP.DEPBAR.LE gsb0, (0x[0-9a-f]+)', sass)[:12])}")
        print("   " + "\n   ".join(loop_report(c)))


def inputs(T, HQ, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(T, HQ, D, device="cuda", generator=g).bfloat16() for _ in range(4))
    scale = D ** -0.5
    s = torch.einsum("thd,shd->hts", q.float(), k.float()) * scale
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v.float())
    delta = (o * do.float()).sum(-1).transpose(0, 1).contiguous()
    return q, k, v, do, (lse * LOG2E).contiguous(), delta, scale


def reference(q, k, v, do, scale):
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    s = torch.einsum("thd,shd->hts", qf, kf) * scale
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), vf)
    return torch.autograd.grad(o, (qf, kf, vf), do.float())


def run(name, q, k, v, do, lse, delta, scale, ds):
    bs, desc, ws, store, warps, stages = VARIANTS[name]
    T, HQ, _ = q.shape
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    probe_kernel[(T // bs, HQ)](q, k, v, do, lse, delta, dk, dv, ds, T, scale * LOG2E, scale, HQ=HQ, BS=bs,
                                DESC=desc, WS=ws, STORE=store, num_warps=warps, num_stages=stages)
    return dk, dv


def on_gpu(names):
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    q, k, v, do, lse, delta, scale = inputs(512, 4)
    refs = reference(q, k, v, do, scale)
    ds = torch.empty(4 * 512 * 512, dtype=torch.bfloat16, device="cuda")
    ok = []
    for name in names:
        try:
            dk, dv = run(name, q, k, v, do, lse, delta, scale, ds)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"check {name:18s} FAILED TO RUN: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        err = [((r - x.float()).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()
               for r, x in zip(refs[1:], (dk, dv))]
        bad = not max(err) < 0.01
        print(f"check {name:18s} dk {err[0]:.2e} dv {err[1]:.2e}" + ("  FAIL" if bad else ""), flush=True)
        if not bad:
            ok.append(name)
    T, HQ = 4096, 32
    q, k, v, do, lse, delta, scale = inputs(T, HQ)
    ds = torch.empty(HQ * T * T, dtype=torch.bfloat16, device="cuda")
    flops = 4 * 2 * T * T * HQ * D
    for r in range(2):
        for name in ok if r == 0 else ok[::-1]:
            us = 1e3 * triton.testing.do_bench(lambda n=name: run(n, q, k, v, do, lse, delta, scale, ds), rep=200)
            print(f"time  {name:18s} T{T} HQ{HQ}: {us:8.1f} us  {flops / us / 1e6:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("names", nargs="*", default=list(VARIANTS))
    a = ap.parse_args()
    (compile_only if a.compile_only else on_gpu)(a.names or list(VARIANTS))
