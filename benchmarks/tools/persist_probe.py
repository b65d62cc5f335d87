# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Probe (PERF.md #42u): the fixed cost of a dK/dV program (prologue: K/V loads, first blocks; epilogue: dK/dV
stores) against its query blocks, and whether a persistent grid (programs looping over the (key tile, head) items)
removes it. NQ_ONLY=1: the control with the same inputs, each item reading only its first query blocks.
Non-causal MHA, 64 keys x 64 queries, D128, 4 products a pair (the #26 probe's loop), the same total work in every
row: T x T x HQ = 4096^2 x 32 pairs; blocks per program = T / 64.

    python benchmarks/tools/persist_probe.py --compile-only
    python benchmarks/tools/persist_probe.py
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
def kv_offsets(i_s, i_h, HQ: tl.constexpr):
    o_s = i_s * 64 + tl.arange(0, 64)
    return o_s.to(tl.int64)[:, None] * (HQ * 128) + i_h * 128 + tl.arange(0, 128)[None, :]


@triton.jit
def item_dkv(q, k, v, do, lse, delta, dk, dv, i_s, i_h, T, NQ, qk_scale, scale, HQ: tl.constexpr):
    p_kv = kv_offsets(i_s, i_h, HQ=HQ)
    b_k = tl.load(k + p_kv)
    b_v = tl.load(v + p_kv)
    b_dk, b_dv = item_loop(q, do, lse, delta, dk, dv, b_k, b_v, p_kv, i_h, T, NQ, qk_scale, scale, HQ=HQ)
    item_store(dk, dv, b_dk, b_dv, p_kv, scale)


@triton.jit
def item_loop(q, do, lse, delta, dk, dv, b_k, b_v, p_kv, i_h, T, NQ, qk_scale, scale, HQ: tl.constexpr):
    stride = HQ * 128
    o_d = tl.arange(0, 128)
    b_dk = tl.zeros([64, 128], tl.float32)
    b_dv = tl.zeros([64, 128], tl.float32)
    row = i_h.to(tl.int64) * T
    for i_t in range(0, NQ, 64):
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
    return b_dk, b_dv


@triton.jit
def item_store(dk, dv, b_dk, b_dv, p_kv, scale):
    tl.store(dk + p_kv, (b_dk * scale).to(dk.dtype.element_ty))
    tl.store(dv + p_kv, b_dv.to(dv.dtype.element_ty))


@triton.jit
def probe_kernel(q, k, v, do, lse, delta, dk, dv, T, NQ, qk_scale, scale, HQ: tl.constexpr, PERSIST: tl.constexpr,
                 PREFETCH: tl.constexpr):
    if PERSIST:
        n_s = T // 64
        for item in tl.range(tl.program_id(0), n_s * HQ, tl.num_programs(0), flatten=PERSIST == 2):
            item_dkv(q, k, v, do, lse, delta, dk, dv, item % n_s, item // n_s, T, NQ, qk_scale, scale, HQ=HQ)
    elif PREFETCH:
        n_s = T // 64
        n = n_s * HQ
        item = tl.program_id(0)
        p_kv = kv_offsets(item % n_s, item // n_s, HQ=HQ)
        b_k = tl.load(k + p_kv)
        b_v = tl.load(v + p_kv)
        for _ in range(tl.program_id(0), n, tl.num_programs(0)):
            b_dk, b_dv = item_loop(q, do, lse, delta, dk, dv, b_k, b_v, p_kv, item // n_s, T, NQ,
                                   qk_scale, scale, HQ=HQ)
            # the next item's K/V before this item's epilogue: their latency runs under the stores
            nxt = tl.minimum(item + tl.num_programs(0), n - 1)
            p_next = kv_offsets(nxt % n_s, nxt // n_s, HQ=HQ)
            b_k = tl.load(k + p_next)
            b_v = tl.load(v + p_next)
            item_store(dk, dv, b_dk, b_dv, p_kv, scale)
            item, p_kv = nxt, p_next
    else:
        item_dkv(q, k, v, do, lse, delta, dk, dv, tl.program_id(0), tl.program_id(1), T, NQ, qk_scale, scale,
                 HQ=HQ)


ROWS = [(4096, 32), (2048, 128), (1024, 512), (512, 2048)]  # (T, HQ): the same pairs, 64 / 32 / 16 / 8 blocks
# persist-Nx / pre-Nx: a grid of N x SMs programs (2 fit an SM)
MODES = {"grid": 0, "persist-2x": 2, "persist-4x": 4, "flat-2x": 2, "pre-2x": 2, "pre-4x": 4}


def run(mode, q, k, v, do, lse, delta, scale, sms, nq=None):
    T, HQ, _ = q.shape
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    persist = MODES[mode]
    grid = (sms * persist,) if persist else (T // 64, HQ)
    probe_kernel[grid](q, k, v, do, lse, delta, dk, dv, T, nq or T, scale * LOG2E, scale, HQ=HQ,
                       PERSIST=0 if not persist or mode.startswith("pre") else 2 if mode.startswith("flat") else 1,
                       PREFETCH=mode.startswith("pre"),
                       num_warps=4, num_stages=2)
    return dk, dv


def inputs(T, HQ, seed=0, exact=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(T, HQ, D, device="cuda", generator=g).bfloat16() for _ in range(4))
    scale = D ** -0.5
    if exact:
        s = torch.einsum("thd,shd->hts", q.float(), k.float()) * scale
        lse = torch.logsumexp(s, -1)
        o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v.float())
        delta = (o * do.float()).sum(-1).transpose(0, 1).contiguous()
    else:  # timing only: plausible magnitudes, no T x T scores
        lse = torch.full((HQ, T), math.log(T), device="cuda")
        delta = torch.randn(HQ, T, device="cuda") * 0.1
    return q, k, v, do, (lse * LOG2E).contiguous(), delta, scale


def reference(q, k, v, do, scale):
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    s = torch.einsum("thd,shd->hts", qf, kf) * scale
    o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), vf)
    return torch.autograd.grad(o, (qf, kf, vf), do.float())


def on_gpu():
    if os.environ.get('NQ_ONLY'):
        return nq_rows()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    q, k, v, do, lse, delta, scale = inputs(512, 4, exact=True)
    refs = reference(q, k, v, do, scale)
    for mode in MODES:
        dk, dv = run(mode, q, k, v, do, lse, delta, scale, sms)
        err = [((r - x.float()).pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()
               for r, x in zip(refs[1:], (dk, dv))]
        print(f"check {mode:11s} dk {err[0]:.2e} dv {err[1]:.2e}" + ("" if max(err) < 0.01 else "  FAIL"), flush=True)
    for T, HQ in ROWS:
        args = inputs(T, HQ)
        flops = 4 * 2 * T * T * HQ * D
        for r in range(2):
            for mode in (list(MODES) if r == 0 else list(MODES)[::-1]):
                us = 1e3 * triton.testing.do_bench(lambda m=mode, a=args: run(m, *a, sms), rep=150)
                print(f"time  T{T:5d} HQ{HQ:5d} blocks {T // 64:3d} {mode:11s} {us:8.1f} us "
                      f"{flops / us / 1e6:6.1f} TFLOP/s", flush=True)
        del args
        torch.cuda.empty_cache()


def nq_rows():
    """T4096 HQ32 fixed (the same input bytes), each item reading only its first NQ query rows."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    args = inputs(4096, 32)
    for nq in (4096, 2048, 1024, 512):
        flops = 4 * 2 * 4096 * nq * 32 * D
        for r in range(2):
            for mode in ("grid", "pre-2x") if r == 0 else ("pre-2x", "grid"):
                us = 1e3 * triton.testing.do_bench(lambda m=mode, a=args, n=nq: run(m, *a, sms, nq=n), rep=150)
                print(f"nq    T4096 HQ32 blocks {nq // 64:3d} {mode:11s} {us:8.1f} us "
                      f"{flops / us / 1e6:6.1f} TFLOP/s  per block-iteration-slot "
                      f"{us / (2048 * nq / 64 / (2 * sms)):.3f} us",
                      flush=True)


def compile_only():
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from scripts.compile_sm90 import cuobjdump, loop_report
    for persist, pre in ((0, 0), (1, 0), (2, 0), (0, 1)):
        types = dict(lse="*fp32", delta="*fp32", T="i32", NQ="i32", qk_scale="fp32", scale="fp32", HQ="constexpr",
                     PERSIST="constexpr", PREFETCH="constexpr")
        sig = {n: types.get(n, "*bf16") for n in probe_kernel.arg_names}  # in argument order
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(10)}
        cx = {(12,): 32, (13,): persist, (14,): pre}
        c = triton.compile(ASTSource(probe_kernel, sig, constexprs=cx, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))
        res = cuobjdump(c, "--dump-resource-usage")
        regs, stack = re.search(r"REG:\d+", res).group(0), re.search(r"STACK:\d+", res).group(0)
        print(f"persist={persist} prefetch={pre} {regs} {stack} smem {c.metadata.shared}")
        print("   " + "\n   ".join(loop_report(c)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    (compile_only if ap.parse_args().compile_only else on_gpu)()
