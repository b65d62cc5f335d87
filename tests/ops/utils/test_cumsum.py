# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The gate's per-sequence scans (`gate_cumsum`, `gate_grad`) against torch in fp64, dense and packed, sequences
that cross several chunks and end inside one, every output written (outputs NaN-poisoned by the conftest)."""

import math

import pytest
import torch

from fla_bwd.ops.utils.cumsum import gate_cumsum, gate_grad

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _segments(B, T, cu):
    bounds = cu.tolist() if cu is not None else [b * T for b in range(B + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


@pytest.mark.parametrize("B, T, HQ, lens", [
    (1, 1, 1, None),
    (2, 37, 3, None),          # several 16-token chunks under the interpreter, the last one partial
    (1, 41, 4, [5, 35, 1]),    # packed, unequal, a 1-token sequence
    (1, 0, 2, None),           # no tokens
])
def test_gate_scans_match_torch(B, T, HQ, lens):
    cu = None
    if lens is not None:
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    g = torch.randn(B, T, HQ, device=DEVICE)
    G = gate_cumsum(g, cu)                                   # [HQ, B * T], base-2 units
    dG_q, dG_k = (torch.randn(HQ, B * T, device=DEVICE) for _ in range(2))
    dg = gate_grad(dG_q, dG_k, B, T, cu, torch.float32)      # [B, T, HQ]
    flat = g.reshape(B * T, HQ).double()
    dG = (dG_q + dG_k).double().t()                          # [B * T, HQ], summed in fp32 as the kernel does
    ref_G, ref_dg = torch.empty_like(flat), torch.empty_like(flat)
    for bos, eos in _segments(B, T, cu):
        ref_G[bos:eos] = flat[bos:eos].cumsum(0) * math.log2(math.e)
        ref_dg[bos:eos] = dG[bos:eos].flip(0).cumsum(0).flip(0)
    torch.testing.assert_close(G.double(), ref_G.t(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dg.reshape(B * T, HQ).double(), ref_dg, rtol=1e-5, atol=1e-5)
