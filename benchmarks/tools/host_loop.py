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

from benchmarks.ops import candidates, peers, registry
from benchmarks.ops.bench import make_do
from benchmarks.ops.timing import Timer
from benchmarks.tools.tune_attn import kernel_times


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


class Stamps:
    """Wraps `EagerParallelAttn.backward` to record (entry, exit) host times of every call (`restore` unwraps it)."""

    def __init__(self):
        from fla_bwd.ops.attn import autograd

        self.calls, inner = [], autograd.EagerParallelAttn.backward

        def stamped(ctx, do):
            t_in = time.perf_counter()
            grads = inner(ctx, do)
            self.calls.append((t_in, time.perf_counter()))
            return grads

        self.restore = lambda: setattr(autograd.EagerParallelAttn, "backward", staticmethod(inner))
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


def row_calls(name: str, kinds, device="cuda") -> dict:
    """kind -> the runner's timed backward of the registered row `name` (`candidates.Candidate.build("bwd")`, so
    the forward runs once, here): this package's under `settings.ds_kernel(kind)`, or SDPA's cuDNN backend."""
    import dataclasses

    from fla_bwd import settings

    op = registry.get_op("parallel_attn")
    shape = op.check(registry.get_shape(name))
    inputs = registry.make_inputs(op, shape, device)
    do = make_do(shape, inputs, device)
    calls = {}
    for kind in kinds:
        if kind == "cudnn":
            calls[kind] = peers.torch_candidate("sdpa-cudnn", shape, inputs, do).build("bwd")
        else:
            ours = candidates.ours(op.load(), op.call, inputs, shape, do, None)
            calls[kind] = dataclasses.replace(ours, ctx=lambda kind=kind: settings.ds_kernel(kind)).build("bwd")
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
        try:
            registry.get_shape(r)
        except ValueError as e:
            ap.error(f"--rows: {e}")
    for kind in kinds:
        if kind not in ("auto", "triton", "hopper", "cudnn"):
            ap.error(f"--kinds: {kind!r} is not auto, triton, hopper or cudnn")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (host time of the CPU interpreter measures nothing)")
    rng = random.Random(args.seed)
    stamps = Stamps()
    try:
        _run(rows, kinds, args, rng, stamps)
    finally:
        stamps.restore()


def _run(rows, kinds, args, rng, stamps: Stamps) -> None:
    """Every row's interleaved blocks, then its kernel times; prints two lines a (row, kind)."""
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
            each = kernel_times(calls[kind], 5)
            print(f"{name:14s} {kind:6s} kernels {sum(each.values()):6.0f} | {fields} | events by round {rounds}",
                  flush=True)
            print("    " + ", ".join(f"{k} {t:.0f}" for k, t in sorted(each.items(), key=lambda kv: -kv[1])))
        del calls
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
