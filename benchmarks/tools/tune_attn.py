#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""GPU tuning harness for the attention kernels: correctness spot checks, then per-kernel and end-to-end timings of
tile-config variants and of both dK/dV paths, in one process. Not a benchmark of record (that is
`benchmarks/ops/run.py`); it answers "which variant, and where does the time go". Times with the runner's method
(`benchmarks.ops.timing.median_us`: warm-up, then CUDA events with an L2 flush before every call, median).

    python benchmarks/tools/tune_attn.py --shapes g8-T8192,gqa4-long --variants base,dkv128s64w8 --json $OUT/tune.json
"""

import argparse
import contextlib
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

# The repository root (for `benchmarks`), after PYTHONPATH's entries: ab_trees.sh picks the fla_bwd under test with
# PYTHONPATH, which a root inserted first would override (B would import A's package).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PYTHONPATH = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
_AFTER_PYTHONPATH = max((i + 1 for i, p in enumerate(sys.path) if p and os.path.abspath(p) in _PYTHONPATH), default=1)
sys.path.insert(_AFTER_PYTHONPATH, _ROOT)
from benchmarks.ops import registry  # noqa: E402
from benchmarks.ops.timing import Timer, median_us  # noqa: E402
from fla_bwd.ops.attn import config, dkv_path, host, naive_parallel_attn, parallel_attn  # noqa: E402

# The registry's dense shapes with K == V in bf16 (the harness makes bf16 inputs) and no sink (this tool passes none):
# name -> (B, T, HQ, H, D, W, gated).
SHAPES = {s.name: (s.B, s.T, s.HQ, s.H, s.K, s.W, s.gated)
          for s in registry.SHAPES if not s.varlen and not s.sink and s.K == s.V and s.dtype == "bf16"}

# Tile-config variants: {kernel: overrides}, applied to every entry of `config.TILE_CONFIGS` (the GPU's tiles; under
# the interpreter `config.tile_config` returns INTERPRETER_CONFIG, so variants change nothing there). "base" is the
# table as it is.
VARIANTS = {
    "base": {},
    "dkv128s64w8": {"dkv": dict(BT=128, BS=64, num_warps=8, num_stages=2)},
    "dkv128s32w8": {"dkv": dict(BT=128, BS=32, num_warps=8, num_stages=2)},
    "dkv64s64w8": {"dkv": dict(BT=64, BS=64, num_warps=8, num_stages=2)},
    "dkv64s32w4": {"dkv": dict(BT=64, BS=32, num_warps=4, num_stages=2)},
    "dkv64s64st3": {"dkv": dict(BT=64, BS=64, num_warps=4, num_stages=3)},
    "dkv64s32st3": {"dkv": dict(BT=64, BS=32, num_warps=4, num_stages=3)},
    "dkv64s32st4": {"dkv": dict(BT=64, BS=32, num_warps=4, num_stages=4)},
    "dkv32s32w4": {"dkv": dict(BT=32, BS=32, num_warps=4, num_stages=2)},
    "dkv32s32w2": {"dkv": dict(BT=32, BS=32, num_warps=2, num_stages=2)},
    "dkv32s16w2": {"dkv": dict(BT=32, BS=16, num_warps=2, num_stages=2)},
    "dq128s64w8": {"dq": dict(BT=128, BS=64, num_warps=8, num_stages=2)},
    "dq128s32w8": {"dq": dict(BT=128, BS=32, num_warps=8, num_stages=2)},
    "dq64s64w8": {"dq": dict(BT=64, BS=64, num_warps=8, num_stages=2)},
    "dq64s64st3": {"dq": dict(BT=64, BS=64, num_warps=4, num_stages=3)},
    "fwd128s64w4": {"fwd": dict(BT=128, BS=64, num_warps=4, num_stages=2)},
    "fwd128s64st3": {"fwd": dict(BT=128, BS=64, num_warps=8, num_stages=3)},
    "fwd128s128w8": {"fwd": dict(BT=128, BS=128, num_warps=8, num_stages=2)},
    "fwd128s64w8": {"fwd": dict(BT=128, BS=64, num_warps=8, num_stages=2)},
    "norefine": {},
}


@contextlib.contextmanager
def variant(name):
    """Run the block with variant `name`'s entries in the public tables `config.TILE_CONFIGS` and
    `config.DELTA_MODES`, both restored exactly (the same objects) on exit; the launch plans built from them are
    dropped on the way in and out (`host.clear_plans`)."""
    over = VARIANTS[name]
    tiles = {key: dict(kernels) for key, kernels in config.TILE_CONFIGS.items()}
    passes = dict(config.DELTA_MODES)
    try:
        for kernels in config.TILE_CONFIGS.values():
            for kernel, cfg in over.items():
                kernels[kernel] = dict(kernels[kernel], **cfg)
        if name == "norefine":
            # what the fp32 delta refinement costs the gated dQ kernel: every delta mode runs the single rounded
            # pass. Timing only: dK/dV lose accuracy, and a gated call's dg is wrong (the query side of its
            # gradient is stored by the refinement), so --check runs outside the variants.
            for mode in config.DELTA_MODES:
                config.DELTA_MODES[mode] = config.DELTA_MODES["rounded"]
        config.gqa_split.cache_clear()  # it caches decisions made from the dK/dV tile
        host.clear_plans()
        yield
    finally:
        for key, kernels in tiles.items():
            config.TILE_CONFIGS[key].clear()
            config.TILE_CONFIGS[key].update(kernels)
        config.DELTA_MODES.clear()
        config.DELTA_MODES.update(passes)
        config.gqa_split.cache_clear()
        host.clear_plans()


def make_inputs(B, T, HQ, H, D, gated, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k = torch.randn(B, T, H, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    v = torch.randn(B, T, H, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    gate = F.logsigmoid(torch.randn(B, T, HQ, device="cuda", generator=g)).requires_grad_() if gated else None
    return q, k, v, gate


def ratio(ref, out):
    ref, out = ref.double(), out.double()
    return ((ref - out).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def check(shape, path):
    """Correctness on the first 1024 tokens of a shape (the oracle is O(T^2) memory)."""
    B, T, HQ, H, D, W, gated = SHAPES[shape]
    T = min(T, 1024)
    q, k, v, g = make_inputs(B, T, HQ, H, D, gated, seed=1)
    do = torch.randn(B, T, HQ, D, device="cuda", dtype=q.dtype)
    ins = [x for x in (q, k, v, g) if x is not None]
    with dkv_path(path):
        o = parallel_attn(q, k, v, g=g, window_size=W)
        grads = torch.autograd.grad(o, ins, do)
    ref = naive_parallel_attn(q, k, v, window_size=W, g=g)
    rgrads = torch.autograd.grad(ref, ins, do.float())
    return {n: ratio(r, x) for n, r, x in zip(["o", "dq", "dk", "dv", "dg"], [ref, *rgrads], [o, *grads])}


def kernel_times(fn, iters=10):
    """Median-free per-kernel mean times (us) from the torch profiler over `iters` calls."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.count >= iters:
            out[e.key[:60]] = round(e.device_time_total / iters, 1)
    return out


def time_shape(shape, path, iters, timer):
    B, T, HQ, H, D, W, gated = SHAPES[shape]
    q, k, v, g = make_inputs(B, T, HQ, H, D, gated)
    do = torch.randn(B, T, HQ, D, device="cuda", dtype=q.dtype)
    ins = [x for x in (q, k, v, g) if x is not None]
    res = {}
    with dkv_path(path):
        fwd = lambda: parallel_attn(q, k, v, g=g, window_size=W)
        o = fwd()
        bwd = lambda: torch.autograd.grad(o, ins, do, retain_graph=True)
        bwd()
        res["fwd_us"] = [median_us(fwd, "cuda", iters, timer) for _ in range(2)]
        res["bwd_us"] = [median_us(bwd, "cuda", iters, timer) for _ in range(2)]
        res["kernels"] = kernel_times(bwd)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        bwd()
        torch.cuda.synchronize()
        res["bwd_peak_MiB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    pairs = visible_pairs(T, W) * B
    res["bwd_tflops"] = 2.5 * 4 * HQ * D * pairs / (min(res["bwd_us"]) * 1e-6) / 1e12
    return res


def visible_pairs(T, W):
    if W is None or W >= T:
        return T * (T + 1) // 2
    return W * (W + 1) // 2 + (T - W) * W


def sdpa_peer(shape, backend, iters, timer):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, T, HQ, H, D, W, gated = SHAPES[shape]
    if W is not None or gated:
        return None
    q, k, v, _ = make_inputs(B, T, HQ, H, D, False)
    qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[backend]
    try:
        with sdpa_kernel(be):
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=HQ != H)
            do = torch.randn_like(o)
            bwd = lambda: torch.autograd.grad(o, (qt, kt, vt), do, retain_graph=True)
            bwd()
            return median_us(bwd, "cuda", iters, timer)
    except Exception as e:  # a backend may refuse a shape
        return f"failed: {type(e).__name__}: {str(e)[:80]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="gqa4-long,g8-T8192")
    ap.add_argument("--variants", default="base")
    ap.add_argument("--paths", default="gqa,per-query-head",
                    help="dK/dV paths (fla_bwd.settings.DKV_PATHS), default gqa,per-query-head")
    ap.add_argument("--check", action="store_true", help="correctness spot check per shape and path first")
    ap.add_argument("--peers", action="store_true", help="time SDPA cuDNN and FA2 on the same shapes")
    ap.add_argument("--iters", "--reps", dest="iters", type=int, default=50,
                    help="timed calls per measurement (after the warm-up), default 50; the benchmark runner's "
                         "method: benchmarks/ops/timing.py, CUDA events, an L2 flush before every call")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    for flag, given, known in (("--shapes", args.shapes, SHAPES), ("--variants", args.variants, VARIANTS)):
        unknown = [x for x in given.split(",") if x not in known]
        if unknown:
            ap.error(f"{flag}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    if not torch.cuda.is_available():
        sys.exit("tune_attn.py needs a CUDA GPU")
    shapes = args.shapes.split(",")
    timer = Timer(torch.device("cuda"))
    results = []
    for shape in shapes:
        if args.check:
            for path in args.paths.split(","):
                try:
                    r = check(shape, path)
                except ValueError as e:  # a path that cannot take the shape (e.g. gqa-split4 at G = 2)
                    print(f"check {shape:16s} {path:14s} ERROR {e}", flush=True)
                    continue
                bad = [n for n, x in r.items() if not (x < 0.005)]
                print(f"check {shape:16s} {path:14s} " + " ".join(f"{n}={x:.2e}" for n, x in r.items())
                      + ("  FAIL " + ",".join(bad) if bad else ""), flush=True)
        peers = {}
        if args.peers:
            for be in ("cudnn", "fa2"):
                peers[be] = sdpa_peer(shape, be, args.iters, timer)
        for name in args.variants.split(","):
            for path in args.paths.split(","):
                try:
                    with variant(name):
                        r = time_shape(shape, path, args.iters, timer)
                except Exception as e:
                    r = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                r.update(shape=shape, variant=name, path=path, peers=peers)
                results.append(r)
                if "error" in r:
                    print(f"{shape:16s} {name:10s} {path:14s} ERROR {r['error']}", flush=True)
                    continue
                print(f"{shape:16s} {name:10s} {path:14s} fwd {statistics.median(r['fwd_us']):8.1f} us  "
                      f"bwd {min(r['bwd_us']):8.1f} us ({r['bwd_tflops']:5.1f} TF/s) peak {r['bwd_peak_MiB']:7.1f} MiB "
                      f"| " + " ".join(f"{k.split('(')[0][-28:]}={v}" for k, v in r["kernels"].items()), flush=True)
        if peers:
            print(f"{shape:16s} peers: " + " ".join(f"{k}={v if isinstance(v, str) else round(v, 1)}"
                                                 for k, v in peers.items() if v is not None), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "triton": triton.__version__,
                       "gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
