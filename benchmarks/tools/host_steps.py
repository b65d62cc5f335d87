# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Where a backward's host time goes, step by step: the time from the call (`torch.autograd.grad`) to autograd's
call of our Function's backward, to each step of the launch plan (`fla_bwd.ops.utils.launch.Plan`: an allocation,
a launch, the Hopper dK/dV step), and to the return. The GPU idles until the big dK/dV launch is issued, so the
stamps before it are the host's critical path of a call from an idle queue; all of them together, its throughput.

Used by `profile_host.py --steps` (on the GPU machine: real launches) and `profile_host_cpu.py --stamps` (stubbed
launches); on its own, `python3 benchmarks/tools/host_steps.py ROWS [N]` stamps the benchmark runner's eager loop
on registry rows (`runner_loop`). `install()` patches the package in this process only.
"""

import functools
import statistics
import time
from typing import Callable, List, Optional, Tuple

STAMPS: List[Tuple[str, float]] = []


def _label(step) -> str:
    from fla_bwd.ops.utils import launch

    if isinstance(step, launch.Empty):
        return f"alloc {step.name}"
    if isinstance(step, launch.Apply):
        return f"apply {step.name}"
    kernel = getattr(step, "kernel", None) or getattr(getattr(step, "launch", None), "kernel", None)
    while hasattr(kernel, "fn"):  # heuristics, JIT and interpreter wrappers
        kernel = kernel.fn
    return f"{type(step).__name__} {getattr(kernel, '__name__', '')}".rstrip()


class _Stamped:
    """A plan step that records the time it starts at."""

    def __init__(self, step):
        self.step, self.label = step, _label(step)

    def __call__(self, env, device, stream):
        STAMPS.append((self.label, time.perf_counter()))
        self.step(env, device, stream)


def install() -> None:
    """Stamp autograd's entry into our backward, each plan step and the backward's return (idempotent)."""
    from fla_bwd.ops.attn import autograd
    from fla_bwd.ops.utils import launch

    if getattr(launch.Plan.run, "_stamped", False):
        return
    run = launch.Plan.run

    def stamped_run(self, env):
        steps = self.steps
        wrapped = getattr(self, "_stamped_steps", None)
        if wrapped is None or len(wrapped) != len(steps):
            wrapped = self._stamped_steps = [_Stamped(s) for s in steps]
        self.steps = wrapped
        try:
            return run(self, env)
        finally:
            self.steps = steps

    stamped_run._stamped = True
    launch.Plan.run = stamped_run
    backward = autograd.EagerParallelAttn.backward

    def stamped_backward(ctx, do):
        STAMPS.append(("Function.backward entered", time.perf_counter()))
        out = backward(ctx, do)
        STAMPS.append(("Function.backward returns", time.perf_counter()))
        return out

    autograd.EagerParallelAttn.backward = staticmethod(stamped_backward)


def median_stamps(fn: Callable, calls: int, before: Optional[Callable] = None) -> List[Tuple[str, float]]:
    """(label, median us from fn's call) for each stamp of `calls` calls of fn, and ("returned", ...) last;
    `before` runs ahead of each call, untimed (e.g. a synchronize: a call from an idle queue)."""
    rows = []
    for _ in range(calls):
        if before is not None:
            before()
        STAMPS.clear()
        t0 = time.perf_counter()
        result = fn()
        t1 = time.perf_counter()
        rows.append([(n, (t - t0) * 1e6) for n, t in STAMPS] + [("returned", (t1 - t0) * 1e6)])
        del result
    return _medians(rows)


def _medians(rows: List[List[Tuple[str, float]]]) -> List[Tuple[str, float]]:
    """Per stamp of the last call, its median over the calls that made the same stamps (a first call's compile
    makes others)."""
    labels = [n for n, _ in rows[-1]]
    same = [r for r in rows if [n for n, _ in r] == labels]
    return [(n, statistics.median(r[i][1] for r in same)) for i, n in enumerate(labels)]


def print_stamps(stamps: List[Tuple[str, float]], indent: str = "    ") -> None:
    """One line a stamp: us from the call, (+ us since the stamp before: what the step before took), label."""
    previous = 0.0
    for label, us in stamps:
        print(f"{indent}{us:8.1f} us  (+{us - previous:6.1f})  {label}")
        previous = us


def _stamped_block(timer, bwd, iters: int) -> dict:
    import torch

    starts, ends, stamps, host = [], [], [], []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        timer.flush()
        STAMPS.clear()
        t0 = time.perf_counter()
        start.record()
        bwd()
        end.record()
        t1 = time.perf_counter()
        starts.append(start), ends.append(end), host.append((t1 - t0) * 1e6)
        stamps.append([(n, (t - t0) * 1e6) for n, t in STAMPS])
    torch.cuda.synchronize()
    events = [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]
    return {"event_us": statistics.median(events), "host_us": statistics.median(host), "events_us": events,
            "stamps_us": _medians(stamps)}


def _print_block(name: str, block: dict) -> None:
    print(f"{name}: events {block['event_us']:.1f} us, host {block['host_us']:.1f} us an iteration")
    print_stamps(block["stamps_us"])


def runner_loop(rows: List[str], iters: int) -> dict:
    """The benchmark runner's eager backward-alone loop (`benchmarks.ops.timing.Timer.block`: an L2 flush, a start
    event, the backward, an end event, no synchronize between iterations) on registry rows, stamped: per row the
    median event time, the median host time an iteration, and the median stamps of the backward."""
    import torch

    from benchmarks.ops.registry import OPS, SHAPES, make_inputs
    from benchmarks.ops.timing import Timer
    from fla_bwd.ops.attn import dkv_path, parallel_attn

    install()
    op, by_name, out = OPS["parallel_attn"], {s.name: s for s in SHAPES}, {}
    timer = Timer(torch.device("cuda"))
    for row in rows:
        shape = by_name[row]
        inputs = make_inputs(op, shape, "cuda")
        o = op.call(parallel_attn, inputs, shape)
        do = torch.randn_like(o)
        leaves = [x for x in (inputs.get(n) for n in ("q", "k", "v", "g")) if x is not None]

        bwd = functools.partial(torch.autograd.grad, o, leaves, do, retain_graph=True)
        timer.warmup(bwd)
        out[row] = _stamped_block(timer, bwd, iters)
        _print_block(row, out[row])
        # The runner interleaves the A/B's legacy candidate (`dkv_path("legacy")`) with ours: again after its block.
        with dkv_path("legacy"):
            o_legacy = op.call(parallel_attn, inputs, shape)
            legacy = functools.partial(torch.autograd.grad, o_legacy, leaves, do, retain_graph=True)
            timer.warmup(legacy)
            out[row]["legacy_event_us"] = statistics.median(timer.block(legacy, iters))
        out[row + " after legacy"] = _stamped_block(timer, bwd, iters)
        _print_block(f"{row} after legacy's block ({out[row]['legacy_event_us']:.1f} us)", out[row + " after legacy"])
    return out


if __name__ == "__main__":  # the runner's loop on the GPU machine: python3 benchmarks/tools/host_steps.py ROWS [N]
    import json
    import os
    import sys

    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    result = runner_loop(sys.argv[1].split(","), int(sys.argv[2]) if len(sys.argv) > 2 else 40)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "runner_loop.json"), "w") as f:
            json.dump(result, f, indent=1)
