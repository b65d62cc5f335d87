# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn` on sizes past 2**31 elements (issue 6, split out of test_attn_robust.py; GPU-only, skipped without
CUDA): a packed call whose B * T * HQ * D passes 2**31 against its pieces run alone (bitwise, one dK/dV path), and
its highest-addressed tokens against the fp32 oracle `naive_parallel_attn` (0.005 error-ratio rule,
`conftest.assert_close`); many packed gated sequences whose total passes 2**31, the last one against itself run
alone (bitwise)."""

import torch
import torch.nn.functional as F
from conftest import assert_close
from robust_helpers import leaf as _leaf
from robust_helpers import needs_gpu

from fla_bwd.ops.attn import dkv_path, naive_parallel_attn, parallel_attn

bf16 = torch.bfloat16


@needs_gpu
def test_past_int32_packed_vs_pieces():
    """B * T * HQ * D = 600000 * 32 * 128 = 2.46e9 > 2**31 (bf16 q is 4.9 GB), window 128: a packed call with
    cu_seqlens [0, T/2, T] against each half alone (each under 2**31). o, dq, dk, dv bitwise equal (the dK/dV
    kernel forced to one path for both). The last 128 tokens -- the highest addresses -- also match the oracle
    (with W = 128 they only see, and are only seen by, the last 256 tokens)."""
    T, HQ, H, D, W = 600_000, 32, 4, 128, 128
    assert T * HQ * D > 2 ** 31
    half = T // 2
    dev = "cuda"
    q = torch.randn(1, T, HQ, D, device=dev, dtype=bf16)
    k = torch.randn(1, T, H, D, device=dev, dtype=bf16)
    v = torch.randn(1, T, H, D, device=dev, dtype=bf16)
    do = torch.randn(1, T, HQ, D, device=dev, dtype=bf16)
    cu = torch.tensor([0, half, T], dtype=torch.int32, device=dev)
    with dkv_path("gqa"):
        qa, ka, va = (_leaf(t) for t in (q, k, v))
        o = parallel_attn(qa, ka, va, window_size=W, cu_seqlens=cu)
        dq, dk, dv = torch.autograd.grad(o, [qa, ka, va], do)
        del qa, ka, va
        for lo, hi in ((0, half), (half, T)):
            qp, kp, vp = (_leaf(t[:, lo:hi]) for t in (q, k, v))
            op = parallel_attn(qp, kp, vp, window_size=W)
            grads = torch.autograd.grad(op, [qp, kp, vp], do[:, lo:hi])
            for name, full, piece in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), (op,) + grads):
                part = full[:, lo:hi]
                if not torch.equal(part, piece):
                    r = (part.float() - piece.float()).pow(2).mean().sqrt() / piece.float().pow(2).mean().sqrt()
                    assert r.item() < 1e-6, f"{name} on tokens [{lo}, {hi}): packed != alone (ratio {r.item():.3e})"
            del qp, kp, vp, op, grads
    tail = slice(T - 2 * W, T)
    qt, kt, vt = (_leaf(t[:, tail]) for t in (q, k, v))
    ref_o = naive_parallel_attn(qt, kt, vt, window_size=W)
    ref = torch.autograd.grad(ref_o, [qt, kt, vt], do[:, tail].float())
    for name, r, x in zip(("o", "dq", "dk", "dv"), (ref_o,) + ref, (o, dq, dk, dv)):
        assert_close(f"{name}[>2**31 tail]", r[:, -W:], x[:, T - W:])


@needs_gpu
def test_past_int32_varlen_total():
    """Many packed sequences whose total B * T * HQ * D passes 2**31 (only the gate's and lse's [HQ, T] buffers
    stay small), with a gate: the last sequence (past 2**31) matches the same sequence run alone bitwise."""
    T, HQ, H, D, W = 560_000, 32, 8, 128, 64
    assert T * HQ * D > 2 ** 31
    lens = [100_000, 1, 259_999, 200_000 - 3000, 3000]
    assert sum(lens) == T
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(1, T, HQ, D, device="cuda", dtype=bf16)
    k = torch.randn(1, T, H, D, device="cuda", dtype=bf16)
    v = torch.randn(1, T, H, D, device="cuda", dtype=bf16)
    g = F.logsigmoid(torch.randn(1, T, HQ, device="cuda"))
    do = torch.randn(1, T, HQ, D, device="cuda", dtype=bf16)
    lo = T - lens[-1]
    with dkv_path("gqa"):
        leaves = [_leaf(t) for t in (q, k, v, g)]
        o = parallel_attn(*leaves[:3], g=leaves[3], window_size=W, cu_seqlens=cu)
        grads = torch.autograd.grad(o, leaves, do)
        full = [o[:, lo:]] + [gr[:, lo:] for gr in grads]
        del leaves, o, grads
        pieces = [_leaf(t[:, lo:]) for t in (q, k, v, g)]
        op = parallel_attn(*pieces[:3], g=pieces[3], window_size=W)
        alone = [op] + list(torch.autograd.grad(op, pieces, do[:, lo:]))
    for name, a, b in zip(("o", "dq", "dk", "dv", "dg"), full, alone):
        if not torch.equal(a, b):
            r = (a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()
            assert r.item() < 1e-6, f"{name}: last packed sequence != alone (ratio {r.item():.3e})"
