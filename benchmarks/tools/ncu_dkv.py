#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""One backward of `parallel_attn` between cudaProfilerStart/Stop, for Nsight Compute:

    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum,... \\
        python benchmarks/tools/ncu_dkv.py --path gqa --T 8192 --W 512

Every kernel the backward launches (dQ, dK/dV and, on the per-query-head and split paths, the group sum) is
captured, so the launch count and the DRAM bytes of the reduction show up next to the dK/dV kernel. `--path` takes
the names FLA_BWD_DKV_PATH takes (`fla_bwd.settings.DKV_PATHS`; "legacy" is the old name of "per-query-head"),
`--dq-path` those of FLA_BWD_DQ_PATH.
"""

import argparse

import torch

from fla_bwd.ops.attn import dkv_path, dq_path, parallel_attn
from fla_bwd.settings import DKV_PATHS, DQ_PATHS


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", choices=DKV_PATHS, required=True)
    ap.add_argument("--dq-path", choices=DQ_PATHS, default="auto", help="from-ds: the five-product backward")
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--HQ", type=int, default=32)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--W", type=int, default=None)
    a = ap.parse_args()
    torch.manual_seed(0)
    q = torch.randn(a.B, a.T, a.HQ, a.D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(a.B, a.T, a.H, a.D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(a.B, a.T, a.H, a.D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(q)
    with dkv_path(a.path), dq_path(a.dq_path):
        o = parallel_attn(q, k, v, window_size=a.W)
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # compile outside the profiled region
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
