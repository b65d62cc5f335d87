# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Every GPU launch of one eager step (forward, then the backward) of HEAD and of a baseline package, in issue order,
with each launch's median duration over ITERS steps in ROUNDS interleaved rounds (the torch profiler's CUDA
events): whether a graph-kernel gap between packages that run the same kernels (mha-short-fp16 against 12ac0d6,
PERF.md #73/#74) sits in one launch, or outside the kernels.

    python benchmarks/results/session33/launches.py [.baseline/fla_bwd_12ac0d6] [rows]
"""

import statistics
import sys

import torch

from benchmarks.ops.candidates import leaves_of, load_baseline
from benchmarks.ops.registry import get_op, get_shape, make_inputs
from fla_bwd.ops.attn import parallel_attn

ROUNDS, ITERS = 3, 20


def launches(step) -> list:
    """[[(name, us) of each launch of a step] for each of ITERS steps]."""
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(ITERS):
            step()
            torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    per = len(kernels) // ITERS
    return [[(e.name[:48], e.time_range.elapsed_us()) for e in kernels[i * per:(i + 1) * per]] for i in range(ITERS)]


def main():
    label, base = load_baseline(sys.argv[1] if len(sys.argv) > 1 else ".baseline/fla_bwd_12ac0d6")
    rows = (sys.argv[2] if len(sys.argv) > 2 else "mha-short-fp16,mha-short").split(",")
    op = get_op("parallel_attn")
    for row in rows:
        shape = get_shape(row)
        inputs = make_inputs(op, shape, "cuda")
        leaves = leaves_of(inputs)
        do = torch.randn_like(op.call(parallel_attn, inputs, shape)).detach()
        got = {"HEAD": [], label: []}
        for _ in range(ROUNDS):
            for name, fn in (("HEAD", parallel_attn), (label, base)):
                def step(fn=fn, inputs=inputs, shape=shape, leaves=leaves, do=do):
                    torch.autograd.grad(op.call(fn, inputs, shape), leaves, do)
                got[name] += launches(step)
        print(f"== {row}: median us of each launch of a step (fwd + bwd), {ROUNDS} x {ITERS} steps")
        for name, steps in got.items():
            n = {len(s) for s in steps}
            if len(n) != 1:
                print(f"  {name}: steps launch {sorted(n)} kernels (not one count)")
                continue
            cols = list(zip(*steps))
            meds = [statistics.median(us for _, us in col) for col in cols]
            print(f"  {name}: {len(cols)} launches, sum of medians {sum(meds):.1f} us")
            for col, med in zip(cols, meds):
                print(f"    {col[0][0]:48s} {med:8.2f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
