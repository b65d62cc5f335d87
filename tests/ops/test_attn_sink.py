# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Attention sinks (one extra per-head logit in the softmax denominator): o and every gradient, dsink included,
against the fp32 oracle at error ratio < 0.005; alone and with windows, gates, packing and GQA; sinks far below
the scores (-30: a no-op) and far above them (+5: most of the mass)."""

import pytest
import torch
from conftest import DEVICE
from helpers import Case, check_against_oracle, params

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
RANDN = float("nan")  # sink_bias = randn(HQ)

CPU_CASES = [
    # Sink alone.
    Case(B=1, T=63, HQ=2, H=2, K=64, dtype=f16, sink=RANDN),
    Case(B=2, T=111, HQ=4, H=2, K=64, dtype=bf16, sink=RANDN),
    Case(B=1, T=15, HQ=2, H=1, K=100, V=60, dtype=f32, sink=RANDN),
    Case(B=1, T=1, HQ=2, H=1, K=64, dtype=bf16, sink=RANDN),
    Case(B=1, T=63, HQ=4, H=2, K=128, dtype=bf16, sink=RANDN, sink_dtype=bf16),
    # Sink + window.
    Case(B=2, T=63, HQ=2, H=1, K=64, dtype=f16, sink=RANDN, window=1),
    Case(B=1, T=63, HQ=4, H=2, K=64, dtype=bf16, sink=-1.0, window=1),
    Case(B=1, T=111, HQ=4, H=1, K=64, dtype=bf16, sink=RANDN, window=16),
    Case(B=1, T=70, HQ=2, H=2, K=60, dtype=f32, sink=RANDN, window=69),
    # Sink + gate.
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, sink=RANDN, gate=True),
    Case(B=1, T=111, HQ=2, H=2, K=128, dtype=f16, sink=RANDN, gate=True, window=33),
    # Sink + packed sequences (length-1 ones, several KV heads).
    Case(T=80, HQ=4, H=2, K=64, dtype=bf16, sink=RANDN, cu_seqlens=(0, 1, 2, 40, 80)),
    Case(T=100, HQ=8, H=2, K=64, dtype=f16, sink=RANDN, gate=True, window=20, cu_seqlens=(0, 33, 34, 34, 100)),
    # A bf16 sink over several sequences: the oracle's dsink is summed in fp32 (`helpers.run_reference`).
    Case(T=120, HQ=4, H=2, K=64, dtype=bf16, sink=RANDN, sink_dtype=bf16, cu_seqlens=(0, 30, 31, 77, 120)),
    # Extreme sinks.
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, sink=-30.0),
    Case(B=1, T=63, HQ=4, H=1, K=64, dtype=f16, sink=-30.0, gate=True, window=16),
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, sink=5.0),
    Case(T=70, HQ=2, H=1, K=128, dtype=f16, sink=5.0, gate=True, cu_seqlens=(0, 1, 35, 70)),
    Case(B=1, T=50, HQ=2, H=1, K=64, dtype=f32, sink=5.0, window=1),
]

GPU_CASES = CPU_CASES + [
    Case(B=2, T=1024, HQ=16, H=4, K=128, dtype=bf16, sink=RANDN),
    Case(B=1, T=4096, HQ=32, H=8, K=64, dtype=bf16, sink=RANDN, window=128),
    Case(B=1, T=2048, HQ=32, H=4, K=128, dtype=f16, sink=RANDN, gate=True),
    Case(T=4096, HQ=16, H=2, K=128, dtype=bf16, sink=RANDN, cu_seqlens=(0, 1, 1024, 1025, 4096)),
    Case(B=1, T=2048, HQ=16, H=4, K=64, dtype=bf16, sink=-30.0),
    Case(B=1, T=2048, HQ=16, H=4, K=64, dtype=bf16, sink=5.0),
]

CASES = GPU_CASES if DEVICE == "cuda" else CPU_CASES


@pytest.mark.parametrize("case", params(CASES))
def test_sink_matches_oracle(case):
    check_against_oracle(case)
