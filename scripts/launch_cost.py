#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Host cost of one kernel launch on a GPU machine, four ways, back to back and from an idle queue (PERF.md,
"Levers": a Triton launch measured 35-37 us from an idle queue on the H200 machines, whatever its arguments).

    python scripts/launch_cost.py [--calls 200]

Ways: a torch kernel (`x.add_(1)`); `kernel[grid](...)`; the compiled kernel's runner (`compiled[grid](...)`, what
`fla_bwd.ops.utils.launch.Launcher` calls); the compiled kernel's launcher called directly with the stream and
function handles looked up once (`compiled.run(...)`). Back to back: mean us per launch over `--calls` launches
issued without a synchronize; idle: median of single launches each after a synchronize.
"""

import argparse
import statistics
import time

import torch
import triton
import triton.language as tl


@triton.jit
def _nop(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, C: tl.constexpr):
    pass


def _time(fn, calls: int) -> tuple:
    """(back-to-back mean us, idle median us) of fn's host time."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    b2b = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    idle = []
    for _ in range(min(calls, 50)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        idle.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return b2b, statistics.median(idle)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("launch_cost.py needs a CUDA GPU")
    x = torch.zeros(16, device="cuda")
    ptrs = [torch.zeros(16, device="cuda") for _ in range(10)]
    ints = list(range(1, 11))
    grid = (1, 1, 1)
    compiled = _nop[grid](*ptrs, *ints, C=1)
    stream = torch.cuda.current_stream().cuda_stream
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    # The compiled launcher takes every parameter, constexprs included (as Launcher passes them).
    values = [*ptrs, *ints, 1]
    ways = {
        "torch x.add_(1)": lambda: x.add_(1),
        "kernel[grid](...)": lambda: _nop[grid](*ptrs, *ints, C=1),
        "compiled[grid](...)": lambda: compiled[grid](*values),
        "compiled.run(...) direct": lambda: run(1, 1, 1, stream, function, packed, None, None, None, *values),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for name, fn in ways.items():
        b2b, idle = _time(fn, args.calls)
        print(f"  {name:28s} back to back {b2b:7.1f} us/launch   from idle {idle:7.1f} us")


if __name__ == "__main__":
    main()
