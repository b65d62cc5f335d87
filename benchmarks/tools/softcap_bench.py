#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Issue 63's softcap bar on one GPU: the forward and the backward with softcap=30 against the same call without it,
on three routes: "plain" (no softcap), "cap" (softcap on the route "auto" takes, or on the Hopper kernels with
--hopper) and "cap-old" (softcap on the Triton forward and the seven-product backward). Kernel time: each candidate
captured in CUDA graphs (the forward alone under no_grad; the whole step), replays timed with the runner's method
(CUDA events after an L2 flush, interleaved rounds, medians); the backward is the step less the forward. Eager
medians beside (host time included). Not a benchmark of record.

    python benchmarks/tools/softcap_bench.py --hopper --rows mha-long,g8-T8192 --json $OUT/softcap.json
    python benchmarks/tools/softcap_bench.py --hopper --approx   # the experiment below

--approx (an experiment; the package does not ship it): the Gluon kernels' tanh as one MUFU operation,
tanh.approx.f32 (max relative error ~2^-11), instead of `gluon_hopper.tanh`'s exp2 and division (two), patched in
before the first compile; the Gluon forward then no longer rounds as the Triton FIXUP launch does.
"""

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys

import torch

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.ops.timing import Timer, interleaved  # noqa: E402
from fla_bwd.ops.attn import select_backward, select_forward  # noqa: E402
from fla_bwd.ops.attn.parallel import parallel_attn  # noqa: E402
from fla_bwd.settings import dq_path, ds_kernel, fwd_kernel  # noqa: E402

ROWS = {"mha-long": (2, 2048, 32, 32, 128), "gqa4-long": (2, 2048, 32, 8, 128), "g8-T8192": (1, 8192, 32, 4, 128),
        "g4-T2048-D64": (2, 2048, 32, 8, 64)}  # (B, T, HQ, H, D), the registry's rows of these names


def patch_approx_tanh() -> None:
    """--approx: `gluon_fwd.tanh` and `gluon_dkv.tanh` become tanh.approx.f32 (before any compile)."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    import fla_bwd.ops.attn.gluon_dkv as gluon_dkv
    import fla_bwd.ops.attn.gluon_fwd as gluon_fwd

    @gluon.jit
    def tanh_approx(x):
        return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=gl.float32, is_pure=True,
                                         pack=1)

    gluon_fwd.tanh = tanh_approx
    gluon_dkv.tanh = tanh_approx


@contextlib.contextmanager
def route(name: str, hopper: bool, D: int):
    """The settings of route `name`: "cap-old" the Triton forward and seven products; else "auto", or with `hopper`
    the Hopper kernels forced where head dim D has them (the dK/dV kernel's: 128)."""
    with contextlib.ExitStack() as stack:
        if name == "cap-old":
            stack.enter_context(fwd_kernel("triton"))
            stack.enter_context(dq_path("recompute"))
        elif hopper:
            stack.enter_context(fwd_kernel("hopper"))
            if D == 128:
                stack.enter_context(ds_kernel("hopper"))
        yield


def capture(q, k, v, do, cap, settings):
    """(forward graph, step graph, the step's eager gradients, eager forward, eager step)."""
    def fwd():
        with settings(), torch.no_grad():
            return parallel_attn(q, k, v, softcap=cap)

    def step():
        with settings():
            o = parallel_attn(q, k, v, softcap=cap)
            return torch.autograd.grad(o, (q, k, v), do)

    grads = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fwd()
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph_fwd, graph_step = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph_fwd):
        fwd()
    with torch.cuda.graph(graph_step):
        step()
    return graph_fwd, graph_step, grads, fwd, step


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="mha-long,gqa4-long,g8-T8192")
    ap.add_argument("--cap", type=float, default=30.0)
    ap.add_argument("--hopper", action="store_true", help="force the Hopper kernels on the plain and cap routes")
    ap.add_argument("--approx", action="store_true", help="the experiment above (implies nothing else)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.approx:
        patch_approx_tanh()
    dev = torch.device("cuda")
    timer = Timer(dev)
    record = {"device": torch.cuda.get_device_name(), "approx": args.approx, "hopper": args.hopper, "rows": {}}
    for name in args.rows.split(","):
        B, T, HQ, H, D = ROWS[name]
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, T, n, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for n in (HQ, H, H))
        do = torch.randn(B, T, HQ, D, device=dev, dtype=torch.bfloat16)
        routes = {"plain": None, "cap": args.cap, "cap-old": args.cap}
        graphs, eager, grads, why = {}, {}, {}, {}
        for r, cap in routes.items():
            settings = functools.partial(route, r, args.hopper, D)
            with settings():
                why[r] = (select_forward(q, k, v, softcap=cap).explain(),
                          select_backward(q, k, v, softcap=cap).explain().splitlines()[:2])
            graph_fwd, graph_step, grads[r], fwd, step = capture(q, k, v, do, cap, settings)
            graphs[f"{r}/fwd"], graphs[f"{r}/step"] = graph_fwd.replay, graph_step.replay
            eager[f"{r}/fwd"], eager[f"{r}/step"] = fwd, step
        for fn in list(graphs.values()) + list(eager.values()):
            timer.warmup(fn)
        med = {}
        for kind, cands, rounds, iters in (("graph", graphs, args.rounds, args.iters),
                                            ("eager", eager, max(1, args.rounds - 1), args.iters)):
            got = interleaved(timer, cands, rounds=rounds, iters=iters)
            med[kind] = {n: statistics.median([x for rr in xs for x in rr]) for n, xs in got.items()}
        rel = {r: [rel_rms(a, b) for a, b in zip(grads["cap"], grads[r])] for r in ("cap-old",)}
        record["rows"][name] = {"medians_us": med, "routes": why, "cap_vs_cap_old_rel_rms_dq_dk_dv": rel["cap-old"]}
        print(f"== {name} (B{B} T{T} HQ{HQ} H{H} D{D}); cap against cap-old, rel RMS dq dk dv: "
              + " ".join(f"{x:.1e}" for x in rel["cap-old"]))
        for kind in ("graph", "eager"):
            m = med[kind]
            t = {r: (m[f"{r}/fwd"], m[f"{r}/step"] - m[f"{r}/fwd"], m[f"{r}/step"]) for r in routes}
            for r in routes:
                ratio = "" if r == "plain" else "  / plain: " + " ".join(
                    f"{a / b:.3f}" for a, b in zip(t[r], t["plain"]))
                print(f"  {kind:5s} {r:8s} fwd {t[r][0]:8.1f}  bwd {t[r][1]:8.1f}  step {t[r][2]:8.1f} us{ratio}")
        for r in routes:
            print(f"  {r}: {why[r][0]} | {' | '.join(why[r][1])}")
        sys.stdout.flush()
        del graphs, eager, grads
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
