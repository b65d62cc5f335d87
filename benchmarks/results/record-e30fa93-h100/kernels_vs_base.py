# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Per-kernel backward times of HEAD against the 12ac0d6 baseline on the rows whose 12ac0d6 check failed in the
H100 record at e30fa93 (PERF.md #71): the profiler's mean CUDA time per kernel over ITERS backwards, in ROUNDS
interleaved rounds, plus HEAD with the seven-product path forced (`dkv_path("legacy")`). ROWS, ROUNDS and ITERS
(environment) narrow it.

    python benchmarks/results/record-e30fa93-h100/kernels_vs_base.py [.baseline/fla_bwd_12ac0d6]
"""

import contextlib
import json
import os
import sys

import torch

from benchmarks.ops.candidates import leaves_of, load_baseline
from benchmarks.ops.registry import get_op, get_shape, make_inputs
from benchmarks.tools.tune_attn import kernel_times
from fla_bwd.ops.attn import dkv_path, parallel_attn

ROWS = os.environ.get("ROWS", "ctl-fp32-g8-T2048,ctl-K128-V64-g8-T2048,mha-short,gqa4-short,mha-short-fp16,"
                      "g4-T2048-D64").split(",")
ROUNDS, ITERS = int(os.environ.get("ROUNDS", 3)), int(os.environ.get("ITERS", 20))


def backward(o, leaves, do):
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def main():
    label, base = load_baseline(sys.argv[1] if len(sys.argv) > 1 else ".baseline/fla_bwd_12ac0d6")
    op = get_op("parallel_attn")
    out = {}
    for row in ROWS:
        shape = get_shape(row)
        inputs = make_inputs(op, shape, "cuda")
        leaves = leaves_of(inputs)
        do = torch.randn_like(op.call(parallel_attn, inputs, shape)).detach()
        cands = {"head": (parallel_attn, None), "head[legacy]": (parallel_attn, "legacy"), label: (base, None)}
        res = {c: [] for c in cands}
        for _ in range(ROUNDS):
            for name, (fn, path) in cands.items():
                ctx = dkv_path(path) if path else contextlib.nullcontext()
                with ctx:
                    o = op.call(fn, inputs, shape)
                    res[name].append(kernel_times(backward(o, leaves, do), iters=ITERS))
        out[row] = res
        print(f"== {row}")
        for name, rounds in res.items():
            keys = sorted({k for r in rounds for k in r})
            tot = [sum(r.values()) for r in rounds]
            print(f"  {name:22s} total {' '.join(f'{t:8.1f}' for t in tot)}")
            for k in keys:
                print(f"    {k[:58]:58s} {' '.join(f'{r.get(k, 0):8.1f}' for r in rounds)}")
        sys.stdout.flush()
    json.dump(out, open(sys.argv[2] if len(sys.argv) > 2 else "/dev/null", "w"), indent=1)


if __name__ == "__main__":
    main()
