# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""g8-T8192's backward (default settings) in a short loop, then sustained for ~8 s, then short again after a rest:
CUDA-event medians (L2 flushed) beside the SM clock, power and the driver's clock-event reasons."""
import statistics
import subprocess
import time

import torch

from benchmarks.ops.timing import Timer
from benchmarks.tools.five_ab import SHAPES, _inputs
from fla_bwd.ops.attn import parallel_attn


def smi():
    q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"
    return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


s = SHAPES["g8-T8192"]
q, k, v, do, g = _inputs(s.B, s.T, s.HQ, s.H, s.K, torch.bfloat16, 0, False)
o = parallel_attn(q, k, v)
bwd = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
timer = Timer(torch.device("cuda"))
for _ in range(5):
    bwd()
torch.cuda.synchronize()
time.sleep(3)
print("idle", smi(), flush=True)
print("short", round(statistics.median(timer.block(bwd, 10))), smi(), flush=True)
t0 = time.time()
while time.time() - t0 < 10:
    med = statistics.median(timer.block(bwd, 40))
    print(f"sustained t={time.time() - t0:4.1f}s", round(med), smi(), flush=True)
time.sleep(5)
print("rested", smi(), flush=True)
print("short again", round(statistics.median(timer.block(bwd, 10))), smi(), flush=True)
