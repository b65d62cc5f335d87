#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Routes of one kind of call timed against each other on one GPU, forward and backward: kernel time from CUDA
graphs (the forward alone under no_grad; the whole step), replays timed with the runner's method (CUDA events after
an L2 flush, interleaved rounds, medians; the backward is the step less the forward), eager medians beside (host
time included). Not a benchmark of record. Two studies (`--study`):

- softcap (issue 63's bar): softcap=30 against the same call without it, on three routes: "plain" (no softcap),
  "cap" (softcap on the route "auto" takes, or on the Hopper kernels with --hopper) and "cap-old" (softcap on the
  Triton forward and the seven-product backward). --approx (an experiment; the package does not ship it): the
  Gluon kernels' tanh as one MUFU operation, tanh.approx.f32 (max relative error ~2^-11), instead of
  `gluon_hopper.tanh`'s exp2 and division (two), patched in before the first compile; the Gluon forward then no
  longer rounds as the Triton FIXUP launch does.
- packed (issue 60's bar): a packed batch (`PACKED`: mixed lengths) on "seven" products and on "five" (forced,
  FLA_BWD_DQ_PATH=from-ds), against "dense", the dense twin of the same tokens ([N, L] of one length), each
  with its visible pairs in the output, to price a packed call per pair.

    python benchmarks/tools/route_bench.py --study softcap --hopper --json $OUT/softcap.json
    python benchmarks/tools/route_bench.py --study packed --rows packed-4x2048-g4 --json $OUT/packed.json
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
# packed rows: (sequence lengths, HQ, H, D, the dense twin's (B, T) of as many tokens); issue 60's mixes
PACKED = {"packed-mix-g4": ((1000, 2048, 1952, 3192), 32, 8, 128, (4, 2048)),
          "packed-mix-g8": ((1, 0, 299, 4100, 3792), 32, 4, 128, (1, 8192))}


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
    """The settings of route `name`: "cap-old" the Triton forward and seven products, "seven" seven products, "five"
    five (forced); else "auto", or with `hopper` the Hopper kernels forced where head dim D has them (the dK/dV
    kernel's: 128)."""
    with contextlib.ExitStack() as stack:
        if name in ("cap-old", "seven"):
            stack.enter_context(dq_path("recompute"))
            if name == "cap-old":
                stack.enter_context(fwd_kernel("triton"))
        elif name == "five":
            stack.enter_context(dq_path("from-ds"))
        elif hopper:
            stack.enter_context(fwd_kernel("hopper"))
            if D == 128:
                stack.enter_context(ds_kernel("hopper"))
        yield


def capture(q, k, v, do, kwargs, settings):
    """(forward graph, step graph, the step's eager gradients, eager forward, eager step) of parallel_attn(q, k, v,
    **kwargs) under `settings`."""
    def fwd():
        with settings(), torch.no_grad():
            return parallel_attn(q, k, v, **kwargs)

    def step():
        with settings():
            o = parallel_attn(q, k, v, **kwargs)
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


def inputs(B: int, T: int, HQ: int, H: int, D: int, dev):
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, n, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for n in (HQ, H, H))
    return q, k, v, torch.randn(B, T, HQ, D, device=dev, dtype=torch.bfloat16)


def candidates(study: str, name: str, args, dev) -> dict:
    """{route: (q, k, v, dO, parallel_attn's keyword arguments, settings, visible pairs a head)} of a row."""
    if study == "softcap":
        B, T, HQ, H, D = ROWS[name]
        x = inputs(B, T, HQ, H, D, dev)
        pairs = B * T * (T + 1) // 2
        return {r: (*x, dict(softcap=cap), functools.partial(route, r, args.hopper, D), pairs)
                for r, cap in (("plain", None), ("cap", args.cap), ("cap-old", args.cap))}
    lengths, HQ, H, D, (B, T) = PACKED[name]
    x = inputs(B, T, HQ, H, D, dev)
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    assert offsets[-1] == B * T, name
    packed = tuple(t.detach().reshape(1, B * T, *t.shape[2:]).requires_grad_(t.requires_grad) for t in x)
    kw = dict(cu_seqlens=torch.tensor(offsets, device=dev, dtype=torch.int32))
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    return {"dense": (*x, {}, functools.partial(route, "auto", False, D), B * T * (T + 1) // 2),
            "seven": (*packed, kw, functools.partial(route, "seven", False, D), pairs),
            "five": (*packed, kw, functools.partial(route, "five", False, D), pairs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default="softcap", choices=["softcap", "packed"])
    ap.add_argument("--rows", default=None, help="default: the study's rows (ROWS but g4-T2048-D64; PACKED)")
    ap.add_argument("--cap", type=float, default=30.0)
    ap.add_argument("--hopper", action="store_true", help="softcap: force the Hopper kernels on plain and cap")
    ap.add_argument("--approx", action="store_true", help="softcap: the experiment above")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.approx:
        patch_approx_tanh()
    rows = args.rows.split(",") if args.rows else (
        ["mha-long", "gqa4-long", "g8-T8192"] if args.study == "softcap" else list(PACKED))
    dev = torch.device("cuda")
    timer = Timer(dev)
    record = {"device": torch.cuda.get_device_name(), "study": args.study, "approx": args.approx,
              "hopper": args.hopper, "rows": {}}
    for name in rows:
        cands = candidates(args.study, name, args, dev)
        graphs, eager, grads, why = {}, {}, {}, {}
        for r, (q, k, v, do, kw, settings, _) in cands.items():
            with settings():
                why[r] = (select_forward(q, k, v, **kw).explain(),
                          select_backward(q, k, v, **kw).explain().splitlines()[:2])
            graph_fwd, graph_step, grads[r], fwd, step = capture(q, k, v, do, kw, settings)
            graphs[f"{r}/fwd"], graphs[f"{r}/step"] = graph_fwd.replay, graph_step.replay
            eager[f"{r}/fwd"], eager[f"{r}/step"] = fwd, step
        for fn in list(graphs.values()) + list(eager.values()):
            timer.warmup(fn)
        med = {}
        for kind, timed, rounds in (("graph", graphs, args.rounds), ("eager", eager, max(1, args.rounds - 1))):
            got = interleaved(timer, timed, rounds=rounds, iters=args.iters)
            med[kind] = {n: statistics.median([x for rr in xs for x in rr]) for n, xs in got.items()}
        names = list(cands)
        first, *others = names
        shape = lambda g: g.reshape(-1, *g.shape[2:])  # noqa: E731 - packed and dense gradients alike
        rel = {r: [rel_rms(shape(a), shape(b)) for a, b in zip(grads[r], grads[names[1]])] for r in others[1:]}
        record["rows"][name] = {"medians_us": med, "routes": why, "rel_rms_dq_dk_dv": rel,
                                "pairs": {r: c[-1] for r, c in cands.items()}}
        print(f"== {name}; rel RMS dq dk dv against {names[1]}: "
              + "; ".join(f"{r} " + " ".join(f"{x:.1e}" for x in xs) for r, xs in rel.items()))
        for kind in ("graph", "eager"):
            m = med[kind]
            t = {r: (m[f"{r}/fwd"], m[f"{r}/step"] - m[f"{r}/fwd"], m[f"{r}/step"]) for r in names}
            for r in names:
                per_pair = [a / cands[r][-1] / (b / cands[first][-1]) for a, b in zip(t[r], t[first])]
                ratio = "" if r == first else f"  / {first} (per pair): " + " ".join(f"{x:.3f}" for x in per_pair)
                print(f"  {kind:5s} {r:8s} fwd {t[r][0]:8.1f}  bwd {t[r][1]:8.1f}  step {t[r][2]:8.1f} us{ratio}")
        for r in names:
            print(f"  {r}: {why[r][0]} | {' | '.join(why[r][1])}")
        sys.stdout.flush()
        del graphs, eager, grads, cands
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
