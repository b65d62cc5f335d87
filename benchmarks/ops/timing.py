# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Timing: CUDA events with an L2 flush before every iteration, interleaved candidates, summary statistics.

The one timing method of this repository: the runner (`benchmarks.ops.run`), the pytest-benchmark entry point
(`benchmarks/ops/bench_pytest.py`, flush and synchronize) and `benchmarks/tools/tune_attn.py` (`median_us`) all
time here.
On a machine without CUDA (the `--smoke` self-test) the same code times with time.perf_counter; such numbers
are labelled as not performance numbers by the runner.
"""

import statistics
import time
from typing import Callable, Dict, List, Optional

import torch

FLUSH_BYTES = 256 * 1024 * 1024


class Timer:
    """Times zero-argument callables; one instance per run (holds the flush buffer)."""

    def __init__(self, device: torch.device, flush_bytes: int = FLUSH_BYTES, warmup_calls=(3, 25)):
        self.cuda = device.type == "cuda"
        self.min_calls, self.max_calls = warmup_calls
        self.kind = "cuda-events+l2-flush" if self.cuda else "perf_counter (CPU interpreter; NOT a performance number)"
        self.flush_buf = torch.empty(flush_bytes // 4, dtype=torch.int32, device=device) if self.cuda else None
        self.host_us: List[float] = []  # the last block's host time per call: from fn's call to its return

    def flush(self) -> None:
        if self.flush_buf is not None:
            self.flush_buf.fill_(0x5A5A)  # a 256 MB write evicts the 60 MB L2

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def block(self, fn: Callable, iters: int) -> List[float]:
        """`iters` timed calls of fn, each after an L2 flush; returns microseconds per call, and keeps each call's
        host time in `host_us` (a call whose host time reaches its GPU time is host-bound, or waited on the GPU)."""
        self.host_us = []
        if not self.cuda:
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                self.host_us.append((time.perf_counter() - t0) * 1e6)
            return list(self.host_us)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            self.flush()
            starts[i].record()
            t0 = time.perf_counter()
            fn()
            self.host_us.append((time.perf_counter() - t0) * 1e6)
            ends[i].record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]

    def warmup(self, fn: Callable, tol: float = 0.05) -> int:
        """Call fn until compilation/autotuning is settled: the first call (JIT, autotune) is never counted;
        then at least `min_calls` calls and until two consecutive single-call timings agree within `tol`."""
        min_calls, max_calls = self.min_calls, self.max_calls
        fn()
        self.sync()
        prev, n = None, 1
        while n < max_calls:
            t = statistics.median(self.block(fn, 1))
            n += 1
            if n > min_calls and prev is not None and abs(t - prev) <= tol * max(prev, 1e-9):
                break
            prev = t
        return n


def interleaved(timer: Timer, cands: Dict[str, Callable], rounds: int, iters: int, progress=None,
                host: Optional[Dict] = None) -> Dict:
    """Time every candidate in `rounds` independent rounds. A round times the candidates in order, then in
    reverse order (iters calls each per pass), so slow drift cancels. Returns {name: [[samples of round r]]};
    `host`, a dict, receives the calls' host times (`Timer.host_us`) in the same form."""
    names = list(cands)
    per_round = {n: [] for n in names}
    for _ in range(rounds):
        got = {n: [] for n in names}
        got_host = {n: [] for n in names}
        for order in (names, names[::-1]):
            for n in order:
                got[n] += timer.block(cands[n], iters)
                if host is not None:
                    got_host[n] += timer.host_us
        for n in names:
            per_round[n].append(got[n])
            if host is not None:
                host.setdefault(n, []).append(got_host[n])
        if progress is not None:
            progress()
    return per_round


def median_us(fn: Callable, device, iters: int = 50, timer: Timer = None) -> float:
    """Median microseconds of `iters` calls of fn after the warm-up (the runner's method for a single candidate:
    CUDA events, an L2 flush before every call). `timer` reuses a Timer (and its flush buffer)."""
    timer = timer or Timer(torch.device(device))
    timer.warmup(fn)
    return statistics.median(timer.block(fn, iters))


def percentile(xs: List[float], p: int) -> float:
    """Linear-interpolated percentile (numpy's default), integer p in [1, 99]; nan for no data."""
    if len(xs) < 2:
        return float(xs[0]) if xs else float("nan")
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1]


def summarize(samples: List[float]) -> dict:
    return {
        "n": len(samples),
        "median_us": statistics.median(samples),
        "mean_us": statistics.fmean(samples),
        "std_us": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "min_us": min(samples),
        "p10_us": percentile(samples, 10),
        "p20_us": percentile(samples, 20),
        "p80_us": percentile(samples, 80),
        "p90_us": percentile(samples, 90),
    }


def ratio_stats(ratios: List[float]) -> dict:
    """Median ratio and its spread over independent comparisons."""
    r = [x for x in ratios if x == x and x > 0]
    if not r:
        return {"n": 0, "median": None}
    return {
        "n": len(r), "median": statistics.median(r), "min": min(r), "max": max(r),
        "p20": percentile(r, 20), "p80": percentile(r, 80), "ratios": r,
    }


def geomean(xs: List[float]) -> float:
    """Geometric mean of the positive, finite values (nan when there are none)."""
    xs = [x for x in xs if x and x > 0 and x == x]
    return statistics.geometric_mean(xs) if xs else float("nan")


def wall_median_us(fn: Callable, sync: Callable, calls: int, repeats: int) -> List[float]:
    """Wall-clock per-call microseconds: `repeats` times, `calls` calls then one sync (FA3/JAX methodology)."""
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = None
        for _ in range(calls):
            res = fn()
        sync(res)
        out.append((time.perf_counter() - t0) * 1e6 / calls)
    return out
