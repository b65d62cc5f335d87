#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Where the host time of one `parallel_attn` backward goes, on a GPU (PERF.md #11 left it unexplained).

Prints, for each shape: the synchronised wall time of a backward call, the CPU time to issue it (no sync, queue
empty), the issue time of each launcher alone, and the top of a cProfile of repeated backward calls; first, the host
cost of one launch of a trivial kernel, six ways, from an idle queue and back to back (`launch_floor`).

    python benchmarks/tools/profile_host.py --shapes gqa4-short,mha-short
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
import triton
import triton.language as tl

from fla_bwd.ops.attn import host, parallel_attn, select_dkv_kernel
from fla_bwd.ops.attn.parallel import PER_QUERY_HEAD, DkvKernel
from fla_bwd.settings import set_fast_launch

SHAPES = {"gqa4-short": (4, 512, 32, 8, 128), "mha-short": (4, 512, 32, 32, 128)}


@triton.jit
def _nop_kernel(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19,
                C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    pass


def _host_us(fn, calls=50, sync=False):
    """Median microseconds of fn from an idle GPU queue: the CPU time to issue it, or with `sync` its wall time
    until the GPU is done."""
    out = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(out)


def _issue_us(fn, calls=50):
    return _host_us(fn, calls)


def _back_to_back_us(fn, calls=200):
    """Mean microseconds of host time per call of fn over `calls` calls issued without a synchronize."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    per_call = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    return per_call


def launch_floor() -> None:
    """Host cost of one launch, from an idle queue and back to back: a torch kernel, a trivial Triton kernel with
    20 tensor or 10 tensor + 10 integer arguments through `kernel[grid]`, through the compiled kernel's runner
    (what `fla_bwd.ops.utils.launch.Launcher` calls), and through the compiled launcher called directly with the
    stream and function handles looked up once (PERF.md, "Levers": is the floor Triton's or the driver's?)."""
    x = torch.zeros(16, device="cuda")
    grid = (1, 1, 1)
    ptrs, mixed = [x] * 20, [x] * 10 + [1] * 10
    compiled = _nop_kernel[grid](*ptrs, C0=1, C1=2, C2=3, C3=4)
    values = [*ptrs, 1, 2, 3, 4]  # the compiled launcher takes every parameter, constexprs included
    stream = torch.cuda.current_stream().cuda_stream
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    ways = {
        "torch x.add_(1)": lambda: x.add_(1),
        "torch.empty": lambda: torch.empty(64, device="cuda"),
        "kernel[grid], 20 tensors": lambda: _nop_kernel[grid](*ptrs, C0=1, C1=2, C2=3, C3=4),
        "kernel[grid], 10 tensors + 10 ints": lambda: _nop_kernel[grid](*mixed, C0=1, C1=2, C2=3, C3=4),
        "compiled[grid](...)": lambda: compiled[grid](*values),
        "compiled.run(...) direct": lambda: run(1, 1, 1, stream, function, packed, None, None, None, *values),
    }
    print("host cost of one launch:")
    for label, fn in ways.items():
        for _ in range(10):
            fn()
        print(f"  {label:36s} from idle {_issue_us(fn):7.1f} us   back to back {_back_to_back_us(fn):7.1f} us")


class _TrivialAttn(torch.autograd.Function):
    """`parallel_attn`'s autograd signature (8 inputs, 9 saved tensors) with no work: its backward only allocates
    the three gradients. Its issue time is the floor any backward through a torch.autograd.Function pays here."""

    @staticmethod
    def forward(ctx, q, k, v, g, sink_bias, cu_seqlens, scale, window_size):
        o, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, o, lse, None, g, sink_bias, cu_seqlens)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors[:3]
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None, None, None, None


def _python_speed_us() -> float:
    """A fixed pure-Python workload (dict and attribute traffic like a launch's preparation), median of 50: the
    ratio between two hosts' figures scales CPU-side costs measured on one to the other."""
    def work():
        d = {f"k{i}": i for i in range(40)}
        return sum(v % 16 == 0 for v in d.values()) + len(tuple(sorted(d)))
    out = []
    for _ in range(50):
        t0 = time.perf_counter()
        for _ in range(100):
            work()
        out.append((time.perf_counter() - t0) * 1e4)
    return statistics.median(out)


def autograd_floor() -> None:
    """The part of a backward's host time that is torch's, not this package's (issue 7's 40 us bar is on the
    whole call): a backward through `_TrivialAttn` at gqa4-short's shapes, and the Python speed of this host."""
    B, T, HQ, H, D = SHAPES["gqa4-short"]
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
    v = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16).requires_grad_()
    do = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
    o = _TrivialAttn.apply(q, k, v, None, None, None, D ** -0.5, 0)
    for _ in range(10):
        torch.autograd.grad(o, [q, k, v], do, retain_graph=True)
    floor = _issue_us(lambda: torch.autograd.grad(o, [q, k, v], do, retain_graph=True), calls=200)
    print(f"autograd floor: backward through a no-work Function of this signature, issue {floor:.1f} us; "
          f"Python speed {_python_speed_us():.1f} us per fixed workload (this project's CPU: see PERF.md)")


def _wall_us(fn, calls=50):
    return _host_us(fn, calls, sync=True)


def host_parts(q, k, v, do) -> dict:
    """The host functions of one backward (no gate, no sink, full causal), each a call without arguments, after a
    forward and a dQ pass that give them their inputs: what `profile_shape` times one by one."""
    T, D = q.shape[1], q.shape[3]
    scale, W = D ** -0.5, T
    o, lse, _ = host.forward(q, k, v, None, None, None, scale, 0)
    _, delta = host.attn_bwd_dq(q, k, v, o, do, lse, None, None, scale, W, None, "rounded")
    return {
        "dq (+delta)": lambda: host.attn_bwd_dq(q, k, v, o, do, lse, None, None, scale, W, None, "rounded"),
        "dkv gqa": lambda: host.attn_bwd_dkv(q, k, v, do, lse, delta, None, None, scale, W, None,
                                             DkvKernel(per_kv_head=True, split=1)),
        "dkv per-query-head": lambda: host.attn_bwd_dkv(q, k, v, do, lse, delta, None, None, scale, W, None,
                                                        PER_QUERY_HEAD),
        "select_dkv_kernel": lambda: select_dkv_kernel(q, k, v, W, None),
        "bwd impl": lambda: host.backward(do, q, k, v, o, lse, None, None, None, None, scale, 0),
    }


def profile_shape(name: str, top: int) -> None:
    B, T, HQ, H, D = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, T, HQ, D, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
    k = torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
    v = torch.randn(B, T, H, D, device="cuda", generator=gen, dtype=torch.bfloat16).requires_grad_()
    do = torch.randn(B, T, HQ, D, device="cuda", generator=gen, dtype=torch.bfloat16)
    o = parallel_attn(q, k, v)
    leaves = [q, k, v]

    def bwd():
        return torch.autograd.grad(o, leaves, do, retain_graph=True)

    for _ in range(5):
        bwd()
    torch.cuda.synchronize()
    print(f"\n== {name}: B{B} T{T} HQ{HQ} H{H} D{D}; dkv path {select_dkv_kernel(q, k, v).name}")
    for fast in (True, False):
        set_fast_launch(fast)
        print(f"{'fast launch ' if fast else 'kernel[grid]'}: backward wall {_wall_us(bwd):.1f} us, issue "
              f"{_issue_us(bwd):.1f} us; forward issue {_issue_us(lambda: parallel_attn(q, k, v)):.1f} us")
    set_fast_launch(True)
    with torch.no_grad():
        parts = host_parts(q, k, v, do)
        for label, fn in parts.items():
            fn()
            fast = _issue_us(fn)
            set_fast_launch(False)
            slow = _issue_us(fn)
            set_fast_launch(True)
            print(f"  issue {label:18s} {fast:8.1f} us (through kernel[grid]: {slow:8.1f} us)")
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    prof.enable()
    for _ in range(100):
        bwd()
        torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    print("cProfile, 100 synchronised backward calls, by own time:")
    print("\n".join(s.getvalue().splitlines()[:top + 12]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="gqa4-short,mha-short")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    autograd_floor()
    launch_floor()
    for name in args.shapes.split(","):
        profile_shape(name, args.top)


if __name__ == "__main__":
    main()
