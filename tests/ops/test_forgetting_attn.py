# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_forgetting_attn` against its own fp32 reference `naive_forgetting_attn` (written out from the
definition, not through `naive_parallel_attn`): o, dq, dk, dv, dg at error ratio < 0.005; dense and packed,
windowed, GQA. The reference builds a [T, T, T] mask, so shapes stay at T <= 1024 even on the GPU."""

import pytest
import torch
from conftest import DEVICE
from helpers import Case, check_against_oracle, make_inputs, params

from fla_bwd.ops.forgetting_attn import naive_forgetting_attn, parallel_forgetting_attn

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

CPU_CASES = [
    Case(B=2, T=63, HQ=2, H=2, K=64, dtype=f16, gate=True),
    Case(B=1, T=111, HQ=4, H=2, K=128, dtype=bf16, gate=True),
    Case(B=2, T=40, HQ=8, H=1, K=64, V=32, dtype=f32, gate=True),
    Case(B=1, T=1, HQ=2, H=1, K=64, dtype=bf16, gate=True),
    Case(B=1, T=50, HQ=4, H=2, K=64, dtype=f16, gate=True, scale=0.2),
    Case(B=1, T=90, HQ=4, H=1, K=100, dtype=f16, gate=True, window=1),
    Case(B=2, T=70, HQ=4, H=2, K=64, dtype=bf16, gate=True, window=33),
    Case(T=100, HQ=4, H=2, K=64, dtype=bf16, gate=True, cu_seqlens=(0, 1, 2, 50, 100)),
    Case(T=111, HQ=8, H=2, K=128, dtype=f16, gate=True, window=16, cu_seqlens=(0, 45, 46, 111)),
    Case(T=64, HQ=2, H=2, K=60, dtype=f32, gate=True, window=20, cu_seqlens=(0, 0, 31, 64)),
]

GPU_CASES = CPU_CASES + [
    Case(B=2, T=512, HQ=16, H=4, K=128, dtype=bf16, gate=True),
    Case(B=1, T=1024, HQ=16, H=4, K=64, dtype=f16, gate=True, window=256),
    Case(T=1024, HQ=16, H=2, K=128, dtype=bf16, gate=True, cu_seqlens=(0, 1, 300, 301, 1024)),
]

CASES = GPU_CASES if DEVICE == "cuda" else CPU_CASES


def _forgetting_oracle(case):
    def oracle(q, k, v, g, sink_bias):
        return naive_forgetting_attn(q, k, v, g, scale=case.scale, window_size=case.window)
    return oracle


def _forgetting_op(case):
    def fn(x):
        return parallel_forgetting_attn(x.q, x.k, x.v, x.g, scale=case.scale, window_size=case.window,
                                        cu_seqlens=x.cu_seqlens)
    return fn


@pytest.mark.parametrize("case", params(CASES))
def test_forgetting_attn_matches_reference(case):
    check_against_oracle(case, fn=_forgetting_op(case), oracle=_forgetting_oracle(case))


def test_forgetting_attn_requires_gate():
    x = make_inputs(Case(B=1, T=8, HQ=2, H=1, K=64, dtype=bf16))
    with pytest.raises(ValueError, match="g "):
        parallel_forgetting_attn(x.q, x.k, x.v, None)
