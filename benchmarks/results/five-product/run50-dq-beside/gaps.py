# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Where the backward's event time goes beyond its kernels: a profiler timeline of g8-T8192 backwards, L2 flushed."""
import sys

import torch

from benchmarks.ops.timing import Timer
from benchmarks.tools.five_ab import SHAPES, _Env, _inputs
from fla_bwd.ops.attn import parallel_attn

name = sys.argv[1] if len(sys.argv) > 1 else "g8-T8192"
cand = sys.argv[2] if len(sys.argv) > 2 else "five+o0"
s = SHAPES[name]
q, k, v, do, g = _inputs(s.B, s.T, s.HQ, s.H, s.K, torch.bfloat16, 0, s.gated)
ins = tuple(x for x in (q, k, v, g) if x is not None)
timer = Timer(torch.device("cuda"))
with _Env(cand):
    o = parallel_attn(q, k, v, g=g, window_size=s.W)
    bwd = lambda: torch.autograd.grad(o, ins, do, retain_graph=True)
    for _ in range(5):
        bwd()
    torch.cuda.synchronize()
    ev = timer.block(bwd, 10)
    print("events us", [round(x) for x in ev], "host us", [round(x) for x in timer.host_us])
    activities = [torch.profiler.ProfilerActivity.CUDA, torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(5):
            timer.flush()
            bwd()
        torch.cuda.synchronize()
kern = []
for e in prof.profiler.kineto_results.events():
    if e.device_type() == torch.autograd.DeviceType.CUDA:
        kern.append((e.start_ns() / 1e3, e.duration_ns() / 1e3, e.name()[:40]))
kern.sort()
prev_end, prev = None, None
for st, du, nm in kern:
    if prev_end is not None:
        gap = st - prev_end
        if gap > 3:
            print(f"gap {gap:8.1f} us  after {prev:40s} before {nm}")
    print(f"   {st - kern[0][0]:10.1f} {du:9.1f} {nm}")
    prev_end, prev = st + du, nm
