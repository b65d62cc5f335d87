#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The host time of `parallel_attn` on a machine without a GPU: every kernel launch is stubbed at the compiled
launcher (what `fla_bwd.ops.utils.launch` calls once a kernel is compiled), so the figures are this package's
Python and torch's autograd, without Triton's compile and without the driver. For iterating on the host path
(issue 19); the numbers that count are `profile_host.py`'s on the GPU machine.

    python benchmarks/tools/profile_host_cpu.py [--profile] [--calls 2000] [--hopper] [--stamps]

Torch's CPU allocator returns large buffers to the system at every free (glibc's mmap), which the CUDA caching
allocator does not: `MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000` in the environment keeps them in the
heap, for figures nearer a GPU host's (PERF.md #58).

Must run without TRITON_INTERPRET (the stub replaces compiled kernels, which the interpreter has none of).
"""

import argparse
import cProfile
import functools
import io
import os
import pstats
import statistics
import time

import torch

if os.environ.get("TRITON_INTERPRET", "0") == "1":
    raise SystemExit("profile_host_cpu.py stubs compiled launches: run it without TRITON_INTERPRET")

import host_steps  # noqa: E402  (this directory)

from fla_bwd.ops.attn import gluon_dkv, parallel_attn  # noqa: E402
from fla_bwd.ops.utils import (
    checks,  # noqa: E402
    launch,  # noqa: E402
)

SHAPES = {
    "gqa4-short": dict(B=4, T=512, HQ=32, H=8, D=128),
    "mha-short": dict(B=4, T=512, HQ=32, H=32, D=128),
    "gated": dict(B=4, T=512, HQ=32, H=8, D=128, gate=True),
    "sink": dict(B=4, T=512, HQ=32, H=8, D=128, sink=True),
    "varlen": dict(B=1, T=2048, HQ=32, H=8, D=128, cu=(0, 300, 1024, 1500, 2048)),
    "mha-T1024": dict(B=4, T=1024, HQ=32, H=32, D=128),
    "gqa4-long": dict(B=2, T=2048, HQ=32, H=8, D=128),
    "mha-long": dict(B=2, T=2048, HQ=32, H=32, D=128),  # issue 18: compare FLA_BWD_DQ_PATH=recompute / from-ds
    "gqa4-long-gated": dict(B=2, T=2048, HQ=32, H=8, D=128, gate=True),  # five products with --hopper
    "g8-T2048-D64": dict(B=2, T=2048, HQ=32, H=4, D=64),  # seven products (five need D > 64)
}


class _NoKernel:
    """Stands for a compiled kernel: launching it does nothing."""
    function, packed_metadata = 0, ()

    def run(self, *args):
        pass


class _NoJit:
    """Wraps a kernel: `[grid](**kwargs)` returns a `_NoKernel`; `.fn` keeps the kernel for its signature."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return lambda **kwargs: _NoKernel()


def stub(hopper: bool = False) -> None:
    """Make the package believe it runs compiled kernels on a GPU while its tensors are CPU tensors; `hopper`: and
    on an sm_90 one, so that "auto" may pick the Hopper dK/dV step (its descriptors are rebased every call here:
    the 3.6 launcher's memo, `gluon_dkv.HopperDkvLaunch._launch_memoized`, needs the real launcher)."""
    init = launch.Launch.__init__
    launch.Launch.__init__ = lambda self, kernel, grid, args: init(self, _NoJit(kernel), grid, args)
    launch._direct_stream = lambda device: 0
    checks.check_runnable = lambda name, x: None
    if hopper:
        gluon_dkv.why_not = lambda s, device, aligned: None


def inputs(B, T, HQ, H, D, gate=False, sink=False, cu=None):
    q = torch.randn(B, T, HQ, D, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, T, H, D, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, T, H, D, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, T, HQ, requires_grad=True) if gate else None
    s = torch.randn(HQ, requires_grad=True) if sink else None
    cu_seqlens = torch.tensor(cu, dtype=torch.int32) if cu is not None else None
    return (q, k, v, g), dict(sink_bias=s, cu_seqlens=cu_seqlens)


def median_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    out = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls // 5):
            fn()
        out.append((time.perf_counter() - t0) * 1e6 / (calls // 5))
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="cProfile of the backward, by own time")
    ap.add_argument("--hopper", action="store_true", help="let the dispatch pick the Hopper dK/dV step (sm_90)")
    ap.add_argument("--stamps", action="store_true",
                    help="median us from the backward's call to each step of its plan (`host_steps.py`)")
    args = ap.parse_args()
    stub(args.hopper)
    if args.stamps:
        host_steps.install()
    for name in args.shapes.split(","):
        (q, k, v, g), kw = inputs(**SHAPES[name])
        leaves = [x for x in (q, k, v, g, kw["sink_bias"]) if x is not None]
        o = parallel_attn(q, k, v, g, **kw)
        do = torch.randn_like(o)
        fwd = median_us(functools.partial(parallel_attn, q, k, v, g, **kw), args.calls)
        backward = functools.partial(torch.autograd.grad, o, leaves, do, retain_graph=True)
        bwd = median_us(backward, args.calls)
        print(f"{name:12s} forward {fwd:7.1f} us   backward {bwd:7.1f} us")
        if args.stamps:
            host_steps.print_stamps(host_steps.median_stamps(backward, args.calls))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                torch.autograd.grad(o, leaves, do, retain_graph=True)
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            print(s.getvalue())


if __name__ == "__main__":
    main()
