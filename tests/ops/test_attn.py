# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn` against the fp32 oracle: o and every gradient (dq, dk, dv, dg) with error ratio < 0.005.

A targeted list, not a Cartesian product: T not a multiple of any tile (1, 15, 63, 111), B > 1, MHA and G = 2, 4,
8, head dims 60/64/100/128/256 and K != V, the three dtypes, gates, windows (W = 1, W < T, W >= T), packed
sequences of unequal lengths (length-1 and zero-length ones, several KV heads), and their combinations. Sinks are
in test_attn_sink.py, the dK/dV kernel dispatch in test_attn_gqa.py.
"""

import pytest
import torch
from conftest import DEVICE, assert_close
from helpers import Case, check_against_oracle, make_inputs, params, run_isolated, run_parallel, run_reference

from fla_bwd.ops.attn import parallel_attn

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

CPU_CASES = [
    # Plain causal attention: lengths, batch, heads, head dims, dtypes.
    Case(B=1, T=1, HQ=1, H=1, K=64, dtype=f16),
    Case(B=2, T=15, HQ=2, H=2, K=64, dtype=bf16),
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=f16),
    Case(B=1, T=111, HQ=4, H=1, K=128, dtype=bf16),
    Case(B=2, T=111, HQ=8, H=1, K=64, dtype=f32),
    Case(B=1, T=130, HQ=2, H=2, K=128, dtype=f32),
    Case(B=1, T=63, HQ=2, H=1, K=60, dtype=bf16),
    Case(B=2, T=40, HQ=2, H=2, K=100, dtype=f16),
    Case(B=1, T=15, HQ=2, H=1, K=64, V=32, dtype=f32),
    Case(B=2, T=63, HQ=4, H=2, K=100, V=60, dtype=bf16),
    Case(B=1, T=33, HQ=2, H=1, K=256, dtype=f16),
    Case(B=2, T=20, HQ=2, H=1, K=8, V=4, dtype=f16),
    Case(B=1, T=63, HQ=8, H=8, K=64, dtype=bf16),
    Case(B=1, T=50, HQ=4, H=2, K=64, dtype=bf16, scale=0.3),
    # Gates.
    Case(B=2, T=111, HQ=4, H=2, K=64, dtype=bf16, gate=True),
    Case(B=1, T=63, HQ=2, H=2, K=128, dtype=f16, gate=True),
    Case(B=1, T=15, HQ=1, H=1, K=64, dtype=f16, gate=True),
    Case(B=2, T=63, HQ=4, H=2, K=100, V=60, dtype=f32, gate=True),
    Case(B=1, T=63, HQ=8, H=1, K=64, dtype=bf16, gate=True, g_dtype=bf16),
    # Sliding window: W = 1, W < T (tile-ish and odd), W = T - 1, W = T, W > T.
    Case(B=2, T=63, HQ=2, H=1, K=64, dtype=f16, window=1),
    Case(B=1, T=111, HQ=4, H=2, K=64, dtype=bf16, window=16),
    Case(B=1, T=130, HQ=2, H=1, K=64, dtype=f32, window=33, gate=True),
    Case(B=1, T=111, HQ=2, H=2, K=100, dtype=f16, window=110),
    Case(B=2, T=63, HQ=4, H=1, K=64, dtype=bf16, window=63),
    Case(B=1, T=63, HQ=2, H=1, K=64, dtype=f16, window=1000),
    Case(B=2, T=63, HQ=4, H=1, K=64, dtype=f16, window=20, gate=True),
    Case(B=1, T=1, HQ=2, H=1, K=64, dtype=bf16, window=1, gate=True),
    # Packed sequences: unequal lengths, length 1, zero length, several KV heads, and combinations.
    Case(T=63, HQ=2, H=1, K=64, dtype=bf16, cu_seqlens=(0, 1, 17, 63)),
    Case(T=100, HQ=4, H=2, K=64, dtype=f16, cu_seqlens=(0, 1, 2, 40, 41, 100)),
    Case(T=77, HQ=2, H=2, K=64, dtype=f32, cu_seqlens=(0, 0, 30, 30, 77, 77)),
    Case(T=60, HQ=4, H=4, K=64, dtype=bf16, cu_seqlens=(0, 60)),
    Case(T=70, HQ=4, H=2, K=100, V=60, dtype=bf16, cu_seqlens=(0, 33, 34, 70)),
    Case(T=130, HQ=8, H=2, K=64, dtype=bf16, gate=True, cu_seqlens=(0, 33, 34, 96, 130)),
    Case(T=111, HQ=4, H=2, K=64, dtype=f16, window=17, cu_seqlens=(0, 50, 51, 111)),
    Case(T=90, HQ=4, H=1, K=128, dtype=f16, window=32, gate=True, cu_seqlens=(0, 1, 45, 90)),
    Case(T=64, HQ=2, H=1, K=60, dtype=f32, window=1, gate=True, cu_seqlens=(0, 31, 32, 64)),
    Case(T=130, HQ=8, H=4, K=64, dtype=f16, window=40, gate=True, cu_seqlens=(0, 1, 2, 3, 130)),
    Case(T=111, HQ=4, H=2, K=64, V=32, dtype=f32, gate=True, cu_seqlens=(0, 15, 16, 111)),
    Case(B=2, T=130, HQ=4, H=1, K=128, dtype=bf16, window=50, gate=True),
]

GPU_CASES = CPU_CASES + [
    Case(B=2, T=1024, HQ=16, H=4, K=128, dtype=bf16),
    Case(B=1, T=2048, HQ=32, H=8, K=128, dtype=bf16, gate=True),
    Case(B=1, T=4096, HQ=32, H=8, K=64, dtype=f16),
    Case(B=2, T=2048, HQ=16, H=16, K=128, dtype=f16),
    Case(B=1, T=1024, HQ=16, H=2, K=100, V=60, dtype=bf16),
    Case(B=1, T=2048, HQ=16, H=4, K=256, dtype=bf16),
    Case(B=1, T=2048, HQ=16, H=4, K=128, dtype=f32, gate=True),
    Case(B=1, T=4096, HQ=32, H=4, K=128, dtype=bf16, window=512),
    Case(B=1, T=4096, HQ=32, H=8, K=128, dtype=bf16, gate=True, window=1000),
    Case(B=1, T=4096, HQ=32, H=4, K=128, dtype=bf16, gate=True, cu_seqlens=(0, 1, 700, 2048, 2049, 4096)),
    Case(B=1, T=4096, HQ=16, H=2, K=64, dtype=f16, window=256, cu_seqlens=(0, 129, 1025, 1026, 4000, 4096)),
    # Short windows at head dims 65-128 take the dK/dV kernels' "dkv_window" tiles (`config.dkv_tiles`).
    Case(B=2, T=1000, HQ=8, H=2, K=128, dtype=f16, window=100),
    Case(B=1, T=3000, HQ=16, H=16, K=128, dtype=bf16, window=256, cu_seqlens=(0, 77, 1500, 1501, 3000)),
    Case(B=1, T=777, HQ=8, H=4, K=96, V=128, dtype=bf16, window=300),
]

CASES = GPU_CASES if DEVICE == "cuda" else CPU_CASES


@pytest.mark.parametrize("case", params(CASES))
def test_attn_matches_oracle(case):
    check_against_oracle(case)


def test_no_grad_forward_matches_oracle():
    """A forward under no_grad (no autograd graph) gives the same o as with grad."""
    case = Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, gate=True, window=20)
    x = make_inputs(case)
    with torch.no_grad():
        o = parallel_attn(x.q, x.k, x.v, g=x.g, window_size=case.window)
    ref = run_reference(case, x)
    assert_close("o", ref["o"], o)
    o2 = run_parallel(case, x)["o"]
    assert torch.equal(o, o2)


def _strided_like(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Same values as `t` ([B, T, ...]), new leaf, non-contiguous: "head_major" stores [B, H, T, D] (dims 1 and 2
    swapped), "batch_minor" stores [T, B, ...], "sliced" is the first T tokens of a longer tensor."""
    requires_grad, t = t.requires_grad, t.detach()
    if layout == "head_major":
        out = t.transpose(1, 2).contiguous().transpose(1, 2)
    elif layout == "batch_minor":
        out = t.transpose(0, 1).contiguous().transpose(0, 1)
    else:
        long = torch.zeros(t.shape[0], t.shape[1] + 17, *t.shape[2:], dtype=t.dtype, device=t.device)
        long[:, :t.shape[1]] = t
        out = long[:, :t.shape[1]]
    assert not out.is_contiguous() and torch.equal(out, t)
    return out.requires_grad_(requires_grad)


@pytest.mark.parametrize("layout", ["head_major", "batch_minor", "sliced"])
def test_non_contiguous_qkv(layout):
    """q, k, v and do as non-contiguous views, B > 1."""
    case = Case(B=2, T=63, HQ=4, H=2, K=64, dtype=f16, gate=True, window=40)
    x = make_inputs(case)
    x.q, x.k, x.v = (_strided_like(t, layout) for t in (x.q, x.k, x.v))
    x.do = _strided_like(x.do, layout)
    check_against_oracle(case, x)


def check_non_contiguous_gate(layout: str) -> None:
    case = Case(B=2, T=63, HQ=4, H=2, K=64, dtype=f16, gate=True, window=40)
    x = make_inputs(case)
    x.g = _strided_like(x.g, layout)
    check_against_oracle(case, x)


@pytest.mark.parametrize("layout", ["batch_minor", "sliced"])
def test_non_contiguous_gate(layout):
    """g `[B, T, HQ]` as a non-contiguous view with B > 1 (a slice of a longer tensor, or batch-minor storage).
    In a subprocess: a wrong stride can make the gate's cumsum kernel read out of bounds."""
    run_isolated("test_attn", "check_non_contiguous_gate", layout)


def check_non_contiguous_cu_seqlens(gate: bool) -> None:
    case = Case(T=70, HQ=4, H=2, K=64, dtype=bf16, gate=gate, cu_seqlens=(0, 5, 6, 70))
    x = make_inputs(case)
    long = torch.tensor([0, -1, 5, -1, 6, -1, 70], dtype=torch.int32, device=DEVICE)
    x.cu_seqlens = long[::2]
    assert not x.cu_seqlens.is_contiguous() and x.cu_seqlens.tolist() == list(case.cu_seqlens)
    check_against_oracle(case, x)


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_non_contiguous_cu_seqlens(gate):
    """cu_seqlens as a strided view (every other element of a longer tensor). In a subprocess: kernels that
    assume a contiguous cu_seqlens read (and, for the gate's cumsum, write) out of bounds."""
    run_isolated("test_attn", "check_non_contiguous_cu_seqlens", gate)


def test_grad_only_for_some_inputs():
    """Gradients for q alone, and for k, v alone (g given but not requiring grad)."""
    case = Case(B=1, T=40, HQ=4, H=2, K=64, dtype=f16, gate=True)
    x = make_inputs(case)
    x.g.requires_grad_(False)
    o = parallel_attn(x.q, x.k, x.v, g=x.g)
    ref = run_reference(case, x)
    dq, = torch.autograd.grad(o, [x.q], x.do, retain_graph=True)
    assert_close("dq", ref["dq"], dq)
    dk, dv = torch.autograd.grad(o, [x.k, x.v], x.do)
    assert_close("dk", ref["dk"], dk)
    assert_close("dv", ref["dv"], dv)
