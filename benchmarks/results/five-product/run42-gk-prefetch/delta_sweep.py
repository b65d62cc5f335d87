# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Session 17 (PERF.md #54): delta_kernel launch sweep (BR rows a program, num_warps) at the gqa4-long and
g8-T8192 shapes, with and without o_lo. CUDA events, L2 flushed, medians of interleaved rounds
(benchmarks.ops.timing). Run from the repository root on a GPU: python <this file>."""
import statistics

import torch
import triton

from benchmarks.ops.timing import Timer, interleaved
from fla_bwd.ops.attn.from_ds import delta_kernel


def launch(o, o_lo, do, delta, HQ, BR, num_warps):
    """One delta_kernel launch over o, dO `[NTOK, HQ, V]` into delta `[HQ, NTOK]`."""
    NTOK, _, V = o.shape
    R = NTOK * HQ
    delta_kernel[(triton.cdiv(R, BR),)](o=o, o_lo=o_lo, do=do, delta=delta, R=R, NTOK=NTOK, HQ=HQ, V=V, BR=BR, BV=V,
                                        num_warps=num_warps)


def main():
    dev = torch.device("cuda")
    timer = Timer(dev)
    for name, (B, T, HQ, V) in {"gqa4-long": (2, 2048, 32, 128), "g8-T8192": (1, 8192, 32, 128)}.items():
        o, do, o_lo = (torch.randn(B * T, HQ, V, device=dev, dtype=torch.bfloat16) for _ in range(3))
        ref, cands = {}, {}
        for lo in (False, True):
            for BR in (32, 64, 128):
                for nw in (4, 8):
                    d = torch.full((HQ, B * T), float("nan"), device=dev)
                    args = (o, o_lo if lo else None, do, d, HQ, BR, nw)
                    launch(*args)
                    torch.cuda.synchronize()
                    key = f"{'o_lo' if lo else 'plain'} BR{BR} w{nw}"
                    assert torch.allclose(d, ref.setdefault(lo, d.clone()), rtol=1e-5, atol=1e-5), key  # same sums
                    cands[key] = lambda args=args: launch(*args)
        for key, rounds in interleaved(timer, cands, rounds=5, iters=20).items():
            print(name, key, round(statistics.median([x for r in rounds for x in r]), 1), flush=True)


if __name__ == "__main__":
    main()
