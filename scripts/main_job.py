#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The main job: one forward + backward of `parallel_attn` on a default shape, checked against the fp32 oracle,
with a timing line. A small shape under Triton's CPU interpreter when there is no GPU; a realistic one on a GPU.

    python scripts/main_job.py            # exit 0 when every output is within the 0.005 error ratio
"""

import os
import sys
import time

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch.nn.functional as F  # noqa: E402

from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn, select_dkv_kernel  # noqa: E402


def ratio(ref, out):
    ref, out = ref.double(), out.double()
    return ((ref - out).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def main():
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    # GPU: GQA with G = 8, gated; CPU: the same features at interpreter size.
    B, T, HQ, H, D = (1, 2048, 32, 4, 128) if cuda else (1, 96, 4, 2, 64)
    dtype = torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, T, HQ, D, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(B, T, H, D, device=device, dtype=dtype, requires_grad=True)
    g = F.logsigmoid(torch.randn(B, T, HQ, device=device)).requires_grad_()
    do = torch.randn(B, T, HQ, D, device=device, dtype=dtype)
    inputs = (q, k, v, g)

    def step():
        o = parallel_attn(q, k, v, g=g)
        return (o, *torch.autograd.grad(o, inputs, do))

    step()  # compile (GPU) / warm up
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = step()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0

    ref_o = naive_parallel_attn(q, k, v, g=g)
    ref = (ref_o, *torch.autograd.grad(ref_o, inputs, do.float()))
    names = ("o", "dq", "dk", "dv", "dg")
    ratios = {n: ratio(r, x) for n, r, x in zip(names, ref, out)}
    ok = all(r < 0.005 for r in ratios.values())
    where = torch.cuda.get_device_name() if cuda else "CPU (interpreter)"
    print(f"parallel_attn fwd+bwd  B={B} T={T} HQ={HQ} H={H} D={D} {str(dtype)[6:]} gated, "
          f"dK/dV path {select_dkv_kernel(q, k, v).name}, on {where}")
    print("error ratio vs fp32 oracle: " + "  ".join(f"{n} {r:.2e}" for n, r in ratios.items())
          + ("  (all < 0.005)" if ok else "  FAIL"))
    print(f"time: {elapsed * 1e3:.2f} ms for one forward + backward"
          + ("" if cuda else " (CPU interpreter: not a performance number)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
