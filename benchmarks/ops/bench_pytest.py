# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""pytest-benchmark over the benchmark registry: one test per (shape, mode, candidate).

    pytest benchmarks/ops/bench_pytest.py --benchmark-only [--benchmark-json out.json]
    BENCH_SHAPES=g8-T8192,group:window BENCH_MODES=bwd BENCH_PEERS=flex,sdpa-cudnn \
        pytest benchmarks/ops/bench_pytest.py --benchmark-only

Environment (read at collection):

- `BENCH_SHAPES`: registry names, `group:NAME` or `all` (as the runner's `--shapes`); default the headline set
  below on a GPU, `smoke` without one;
- `BENCH_MODES`: `fwd`, `bwd`, `fwdbwd`, comma-separated; default each shape's own modes;
- `BENCH_PATHS`: this package's dK/dV paths, each a candidate (`auto` is `fla_bwd`, `legacy` is `fla_bwd[legacy]`);
  default `auto,legacy`;
- `BENCH_PEERS`: torch peers (`flex`, `sdpa-cudnn`, `sdpa-fa2`, `fla`, `fa4`, `fa4-det`); default none. A peer
  that cannot run a row is skipped with its reason (`benchmarks/ops/peers.py`), as is a row the registry keeps peers
  off. FA3 (JAX) is timed by the runner only;
- `BENCH_ROUNDS`: rounds per test (default 30 on a GPU, 3 without one).

The candidates, inputs, `do` and warm-up are the runner's (`benchmarks/ops/bench.py`, `candidates.py`,
`timing.Timer.warmup`). Each round flushes the L2 (setup, untimed), then pytest-benchmark's clock times the call and a
synchronize. The runner's own measure (`timing.median_us`: CUDA events around the call alone) is stored next to it
in `extra_info["timer_median_us"]`, with TFLOP/s at both medians. Each (shape, mode) is one pytest-benchmark group,
so its table compares the candidates of a row. The runner (`python -m benchmarks.ops.run`) stays the benchmark of
record: it adds the correctness gate, interleaved rounds, paired ratios, FA3, kernel counts and memory.

Without a GPU the kernels run under Triton's interpreter (set here before triton is imported) and only the smoke
shapes run: a test of this harness (tests/benchmarks/test_bench_pytest.py), not a performance number.
"""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before fla_bwd imports triton

from benchmarks.ops import peers as P  # noqa: E402
from benchmarks.ops import registry  # noqa: E402
from benchmarks.ops.bench import make_do  # noqa: E402
from benchmarks.ops.candidates import ours  # noqa: E402
from benchmarks.ops.timing import Timer, median_us  # noqa: E402

GPU_SHAPES = "g8-T8192,g8-T4096,gqa4-long,mha-long,g8-T8192-W512,varlen-gated-8192"
TORCH_PEERS = ("flex", "sdpa-cudnn", "sdpa-fa2", "fla", "fa4", "fa4-det")


def _env_list(name, default):
    return [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]


def _params():
    shapes = registry.select_shapes(os.environ.get("BENCH_SHAPES") or (GPU_SHAPES if CUDA else "smoke"))
    modes = _env_list("BENCH_MODES", "")
    cands = [f"path:{p}" for p in _env_list("BENCH_PATHS", "auto,legacy")] + _env_list("BENCH_PEERS", "")
    bad = [c for c in cands if not c.startswith("path:") and c not in TORCH_PEERS]
    if bad:
        raise ValueError(f"BENCH_PEERS: {bad} are not torch peers ({', '.join(TORCH_PEERS)})")
    return [pytest.param(s.name, m, c, id=f"{s.name}-{m}-{c.removeprefix('path:')}")
            for s in shapes for m in (modes or s.modes) for c in cands]


def _candidate(cand, op, shape, inputs, do):
    if cand.startswith("path:"):
        return ours(op.load(), op.call, inputs, shape, do, cand.removeprefix("path:"))
    if not CUDA:
        pytest.skip(f"{cand}: peers need a GPU")
    if shape.peers is not True and not (shape.peers and cand in shape.peers):
        pytest.skip(f"{cand}: not timed on this row by the registry")
    why = P.unavailable(cand) or P.unsupported(cand, shape)
    if why:
        pytest.skip(f"{cand}: {why}")
    return P.torch_candidate(cand, shape, inputs, do)


@pytest.mark.parametrize("shape_name,mode,cand", _params())
def test_parallel_attn(benchmark, shape_name, mode, cand):
    shape = registry.get_shape(shape_name)
    if not CUDA and shape.group != "smoke":
        pytest.skip("no GPU: only the smoke shapes run (Triton interpreter)")
    op = registry.get_op("parallel_attn")
    op.check(shape)
    device = torch.device("cuda" if CUDA else "cpu")
    inputs = registry.make_inputs(op, shape, device)
    c = _candidate(cand, op, shape, inputs, make_do(shape, inputs, device))
    fn = c.build(mode)
    timer = Timer(device, warmup_calls=(3, 25) if CUDA else (1, 1))
    timer.warmup(fn)

    def timed():
        fn()
        timer.sync()

    benchmark.group = f"{shape.name} {mode}"
    benchmark.extra_info.update(shape=shape.name, config=shape.describe(), mode=mode, candidate=c.name,
                                timer=f"pytest-benchmark clock around call + synchronize; {timer.kind}")
    benchmark.pedantic(timed, setup=timer.flush, rounds=int(os.environ.get("BENCH_ROUNDS", 30 if CUDA else 3)),
                       iterations=1, warmup_rounds=1)
    if benchmark.stats is not None:  # None under --benchmark-disable
        flops = shape.flops(mode)
        ev_us = median_us(fn, device, iters=20 if CUDA else 2, timer=timer)
        benchmark.extra_info.update(tflops_at_median=flops / benchmark.stats.stats.median / 1e12,
                                    timer_median_us=ev_us, tflops_at_timer_median=flops / (ev_us * 1e-6) / 1e12)
    c.release()
