# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""pytest-benchmark entry point (secondary to benchmarks.ops.run, which does the A/B, peers and statistics).

    BENCH_SHAPES=g8-T8192,gqa4-long BENCH_MODES=bwd,fwdbwd pytest benchmarks/ops/bench_pytest.py --benchmark-only

Each test times one (shape, mode, dK/dV path) with pytest-benchmark's pedantic mode: an L2 flush before every
round, a synchronize inside the timed call. Needs CUDA. The file name keeps it out of plain test collection.
"""

import os

import pytest
import torch

from benchmarks.ops import registry
from benchmarks.ops.candidates import ours
from benchmarks.ops.timing import Timer

_SHAPES = "g8-T8192,g8-T4096,gqa4-long,mha-long,g8-T8192-W512,varlen-gated-8192"


_PARAMS = [(n, m, p) for n in os.environ.get("BENCH_SHAPES", _SHAPES).split(",")
           for m in os.environ.get("BENCH_MODES", "bwd").split(",") for p in ("auto", "legacy")]


@pytest.mark.parametrize("shape_name,mode,path", _PARAMS)
def test_parallel_attn(benchmark, shape_name, mode, path):
    if not torch.cuda.is_available():
        pytest.skip("pytest-benchmark timings need a CUDA GPU (the CPU self-test is `run --smoke`)")
    op = registry.get_op("parallel_attn")
    shape = registry.get_shape(shape_name)
    device = torch.device("cuda")
    inputs = registry.make_inputs(op, shape, device)
    do = torch.randn(inputs["q"].shape[:-1] + (shape.V,), device=device, dtype=inputs["q"].dtype)
    fn = ours(op.load(), op.call, inputs, shape, do, path).build(mode)
    timer = Timer(device)
    timer.warmup(fn)

    def timed():
        fn()
        torch.cuda.synchronize()

    benchmark.extra_info.update(shape=shape.describe(), mode=mode, dkv_path=path, tflops_at_median=None)
    benchmark.pedantic(timed, setup=timer.flush, rounds=30, iterations=1, warmup_rounds=2)
    med = benchmark.stats.stats.median
    benchmark.extra_info["tflops_at_median"] = shape.flops(mode) / med / 1e12
