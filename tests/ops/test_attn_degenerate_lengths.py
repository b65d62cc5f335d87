# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn` on degenerate sequence lengths (issue 6, split out of test_attn_robust.py): zero-length segments
in cu_seqlens (leading, repeated, trailing), length-1 segments (o == v), dense T = 1, and windows at least as long
as the sequence (bitwise equal to full causal attention). Everything is compared with the fp32 oracle
`naive_parallel_attn` under the 0.005 error-ratio rule (`conftest.assert_close`)."""

import pytest
import torch
from helpers import Case, check_against_oracle, compare, make_inputs, run_parallel, run_reference

from fla_bwd.ops.attn import parallel_attn

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32


@pytest.mark.parametrize("case", [
    Case(T=20, HQ=2, H=1, K=32, dtype=bf16, cu_seqlens=(0, 0, 5, 5, 5, 20, 20)),
    Case(T=20, HQ=4, H=2, K=64, dtype=f16, gate=True, window=3, cu_seqlens=(0, 0, 5, 5, 5, 20, 20)),
    Case(T=20, HQ=2, H=2, K=32, dtype=f32, sink=0.0, gate=True, cu_seqlens=(0, 0, 0, 5, 5, 5, 20, 20, 20)),
    Case(T=40, HQ=2, H=1, K=32, dtype=bf16, gate=True, cu_seqlens=(0, 0, 0, 0, 40)),
], ids=lambda c: c.id)
def test_zero_length_segments(case):
    """cu_seqlens with repeated offsets (empty sequences, also leading/trailing): each non-empty sequence gets the
    oracle's result, every gradient finite (assert_close checks finiteness on the whole tensor)."""
    check_against_oracle(case)


@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_length_one_segments_exact(dtype, gate):
    """A length-1 sequence attends to itself only: o == v and (bf16) dv == do exactly (MHA, no sink); dq, dk, dg are
    0 in the oracle (softmax over one key) and near 0 here; the other sequences match the oracle."""
    case = Case(T=30, HQ=2, H=2, K=32, dtype=dtype, gate=gate, cu_seqlens=(0, 1, 2, 3, 10, 11, 30))
    x = make_inputs(case)
    out = run_parallel(case, x)
    ones = [0, 1, 2, 10]
    assert torch.equal(out["o"][:, ones], x.v[:, ones].detach()), "o != v on length-1 sequences"
    if dtype == bf16:
        assert torch.equal(out["dv"][:, ones], x.do[:, ones]), "dv != do on length-1 sequences"
    else:
        # The backward recomputes the score as k . q (another summation order than the forward's q . k), so in
        # fp32 p may be 1 - ulp: a few ulp (measured 4e-7 relative) instead of exact.
        assert torch.allclose(out["dv"][:, ones], x.do[:, ones], rtol=2e-6, atol=0), "dv != do on length-1"
    compare(run_reference(case, x), out)


@pytest.mark.parametrize("sink", [False, True], ids=["nosink", "sink"])
def test_dense_t1(sink):
    """T = 1, B = 3 (dense): o == v exactly without a sink, and everything matches the oracle."""
    case = Case(B=3, T=1, HQ=4, H=2, K=64, dtype=bf16, gate=True, sink=float("nan") if sink else None)
    x = make_inputs(case)
    out = check_against_oracle(case, x)
    if not sink:
        assert torch.equal(out["o"], x.v.detach().repeat_interleave(2, dim=2))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_window_at_least_t_is_full_causal(packed):
    """window_size = T and 10 * T give bitwise the same o and gradients as window_size=None; with packing,
    window_size >= the longest sequence too. And that matches the oracle."""
    if packed:
        case = Case(T=50, HQ=4, H=2, K=32, dtype=bf16, gate=True, cu_seqlens=(0, 20, 21, 50))
        windows = (29, 50, 500)
    else:
        case = Case(B=2, T=45, HQ=4, H=2, K=32, dtype=bf16, gate=True)
        windows = (45, 450)
    x = make_inputs(case)
    full = check_against_oracle(case, x)
    for W in windows:
        out = run_parallel(case, x, fn=lambda x, W=W: parallel_attn(x.q, x.k, x.v, g=x.g, window_size=W,
                                                                      cu_seqlens=x.cu_seqlens))
        for name in full:
            assert torch.equal(full[name], out[name]), f"window_size={W}: {name} differs from window_size=None"
