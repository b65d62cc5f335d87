# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Issue 18 A/B (experiment, not committed): backward of the five- or seven-product path with the dK/dV tile config
overridden, in this process's fla_bwd (PYTHONPATH picks the tree). Prints one JSON line per (row, variant)."""
import argparse, hashlib, json, os, statistics, sys
import torch, triton
from fla_bwd.ops.attn import config, dq_path, host, naive_parallel_attn, parallel_attn

ROWS = {"mha-long": (2, 2048, 32, 32), "gqa4-long": (2, 2048, 32, 8), "g8-T8192": (1, 8192, 32, 4),
        "g2-T2048-D128": (2, 2048, 32, 16), "g8-T4096": (1, 4096, 32, 4)}

def kernel_times(fn, iters=5):
    fn(); torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    return {e.key[:40]: round(e.device_time_total / iters, 1) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA and e.count >= iters}

def ratio(ref, x):
    return ((x.float() - ref.float()).pow(2).mean().sqrt() / ref.float().pow(2).mean().sqrt()).item()

def run(row, path, tiles, tag):
    B, T, HQ, H = ROWS[row]
    D = 128
    over = dict(x.split("=") for x in tiles.split(",")) if tiles else {}
    cfg = config.TILE_CONFIGS[(True, False)]
    saved = dict(cfg["dkv"])
    cfg["dkv"] = dict(saved, **{k: int(v) for k, v in over.items()})
    host.clear_plans(); config.gqa_split.cache_clear(); config.group_fills_gpu.cache_clear()
    from fla_bwd.ops.attn import from_ds; from_ds.ds_chunk.cache_clear()
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        k = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        v = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        do = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        with dq_path(path):
            o = parallel_attn(q, k, v)
            bwd = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            grads = bwd()
            again = bwd()
            det = all(torch.equal(a, b) for a, b in zip(grads, again))
            us = [triton.testing.do_bench(bwd, warmup=20, rep=150, return_mode="median") * 1e3 for _ in range(3)]
            kt = kernel_times(bwd)
            h = hashlib.sha256(b"".join(x.view(torch.int16).cpu().numpy().tobytes() for x in grads)).hexdigest()[:12]
            Tc = 1024
            qc, kc, vc, doc = [x[:, :Tc].detach().clone().requires_grad_() for x in (q, k, v)] + [do[:, :Tc]]
            oc = parallel_attn(qc, kc, vc)
            gc = torch.autograd.grad(oc, (qc, kc, vc), doc)
        ref = naive_parallel_attn(qc, kc, vc)
        rg = torch.autograd.grad(ref, (qc, kc, vc), doc.float())
        orc = [f"{ratio(r, x):.2e}" for r, x in zip(rg, gc)]
        print(json.dumps(dict(row=row, tag=tag, path=path, tiles=tiles, bwd_us=[round(u, 1) for u in us],
                              med=round(statistics.median(us), 1), kernels=kt, det=det, hash=h, oracle=orc)), flush=True)
    finally:
        cfg["dkv"] = saved
        host.clear_plans()

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows"); ap.add_argument("--variants"); ap.add_argument("--tag")
    a = ap.parse_args()
    for row in a.rows.split(","):
        for var in a.variants.split(";"):
            path, _, tiles = var.partition(":")
            try:
                run(row, path, tiles, a.tag)
            except Exception as e:
                print(json.dumps(dict(row=row, tag=a.tag, var=var, error=f"{type(e).__name__}: {str(e)[:400]}")), flush=True)
