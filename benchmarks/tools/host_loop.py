#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Whether an eager backward is host-bound in the benchmark's own loop, and where its host time goes (PERF.md #43).

The loop is the runner's (`benchmarks/ops/timing.py`): L2 flush, CUDA event, `torch.autograd.grad(o, (q, k, v), do,
retain_graph=True)`, event, with no synchronisation between iterations. Each block of ITERS iterations also records
the host clock: per iteration, inside `torch.autograd.grad`, and (stamps from `EagerParallelAttn.backward`) the
handoff to autograd's device thread, the body, and the return. A backward is GPU-bound when its host time per
iteration stays under the GPU's (events + the flush). Kinds are FLA_BWD_DS_KERNEL values, plus `cudnn` (SDPA's
cuDNN backend, the same loop): a reference for the host's speed at that moment. Blocks of every kind of a row are
interleaved in a fresh random order each round, and kernel times (torch.profiler) are taken only after all rounds,
so that no kind always follows a profiler session (#43's open question).

    python -m benchmarks.tools.host_loop --rows mha-long,g8-T2048-D128 --kinds triton,hopper,cudnn --rounds 6
"""

import argparse
import random
import statistics
import time

import torch
import torch.nn.functional as F

from benchmarks.ops.timing import Timer

ROWS = {"mha-long": (2, 2048, 32, 32), "gqa4-long": (2, 2048, 32, 8), "g8-T2048-D128": (2, 2048, 32, 4),
        "g2-T2048-D128": (2, 2048, 32, 16), "ctl-g16-T2048": (2, 2048, 32, 2), "g8-T4096": (1, 4096, 32, 4)}


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


class Stamps:
    """Wraps `EagerParallelAttn.backward` to record (entry, exit) host times of every call."""

    def __init__(self):
        from fla_bwd.ops.attn import autograd

        self.calls, inner = [], autograd.EagerParallelAttn.backward

        def stamped(ctx, do):
            t_in = time.perf_counter()
            grads = inner(ctx, do)
            self.calls.append((t_in, time.perf_counter()))
            return grads

        autograd.EagerParallelAttn.backward = staticmethod(stamped)


def block(fn, iters: int, flush, stamps: Stamps) -> dict:
    """One block of the runner's loop: medians (us) of events, host per iteration, inside the call, and the split."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    called, returned = [], []
    stamps.calls.clear()
    for i in range(iters):
        flush()
        starts[i].record()
        called.append(time.perf_counter())
        fn()
        returned.append(time.perf_counter())
        ends[i].record()
    torch.cuda.synchronize()
    out = dict(events=_med([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]),
               host_iter=_med([(b - a) * 1e6 for a, b in zip(called, called[1:])]),
               in_grad=_med([(b - a) * 1e6 for a, b in zip(called, returned)]))
    if len(stamps.calls) == iters:
        out.update(to=_med([(s[0] - c) * 1e6 for s, c in zip(stamps.calls, called)]),
                   body=_med([(s[1] - s[0]) * 1e6 for s in stamps.calls]),
                   back=_med([(r - s[1]) * 1e6 for s, r in zip(stamps.calls, returned)]))
    return out


def kernel_us(fn, calls: int = 5) -> float:
    """Sum of the CUDA kernels' times of one call (the flush's fill excluded), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return sum(e.device_time for e in prof.events()
               if e.device_type.name == "CUDA" and "fill" not in e.name.lower()
               and "elementwise" not in e.name) / calls


def _grad_call(o, leaves, do, ctx):
    """The runner's timed backward: `torch.autograd.grad` of o, inside `ctx()` (or none)."""
    def call():
        if ctx is None:
            return torch.autograd.grad(o, leaves, do, retain_graph=True)
        with ctx():
            return torch.autograd.grad(o, leaves, do, retain_graph=True)
    return call


def row_calls(name: str, kinds) -> dict:
    """kind -> the zero-argument timed call (the forward run once, here)."""
    from fla_bwd import settings
    from fla_bwd.ops.attn import parallel_attn

    B, T, HQ, H = ROWS[name]
    q, k, v = (torch.randn(B, T, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for h in (HQ, H, H))
    do = torch.randn(B, T, HQ, 128, device="cuda", dtype=torch.bfloat16)
    o = parallel_attn(q, k, v)
    calls = {}
    for kind in kinds:
        if kind == "cudnn":
            qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
                ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=HQ != H)
            calls[kind] = _grad_call(ot, (qt, kt, vt), do.transpose(1, 2), None)
        else:
            calls[kind] = _grad_call(o, (q, k, v), do, lambda kind=kind: settings.ds_kernel(kind))
    return calls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="mha-long,gqa4-long,g8-T2048-D128,g2-T2048-D128")
    ap.add_argument("--kinds", default="triton,hopper,cudnn", help="FLA_BWD_DS_KERNEL values and/or cudnn")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows, kinds = args.rows.split(","), args.kinds.split(",")
    for r in rows:
        if r not in ROWS:
            ap.error(f"--rows: unknown row {r!r}; known: {', '.join(ROWS)}")
    for kind in kinds:
        if kind not in ("auto", "triton", "hopper", "cudnn"):
            ap.error(f"--kinds: {kind!r} is not auto, triton, hopper or cudnn")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (host time of the CPU interpreter measures nothing)")
    rng = random.Random(args.seed)
    stamps = Stamps()
    flush = Timer(torch.device("cuda")).flush  # the runner's L2 flush
    for name in rows:
        calls = row_calls(name, kinds)
        for fn in calls.values():
            for _ in range(5):  # compile, plans
                fn()
        blocks = {kind: [] for kind in kinds}
        for _ in range(args.rounds):
            order = list(kinds)
            rng.shuffle(order)
            for kind in order:
                blocks[kind].append(block(calls[kind], args.iters, flush, stamps))
        for kind in kinds:
            b = blocks[kind]
            fields = " ".join(f"{f} {_med([x[f] for x in b if f in x]):6.0f}" for f in
                              ("events", "host_iter", "in_grad", "to", "body", "back") if f in b[0])
            rounds = " ".join(f"{x['events']:.0f}" for x in b)
            print(f"{name:14s} {kind:6s} kernels {kernel_us(calls[kind]):6.0f} | {fields} | events by round {rounds}",
                  flush=True)
        del calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
