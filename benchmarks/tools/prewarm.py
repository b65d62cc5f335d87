#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Fill Triton's on-disk kernel cache for registered shapes in parallel worker processes, before a benchmark.

The runner compiles every new Triton specialisation on a row's first call, one after another in one process; on
the H200's host that is most of a benchmark part's time. Each task here is one (shape, dK/dV path) pair: one
forward and one backward of `parallel_attn` under `dkv_path(path)`, the paths the runner's A/B times ("auto" and
"legacy"), and with --baseline an earlier commit's package as the runner times it (path "baseline"). Nothing is
timed or checked: the cache (TRITON_CACHE_DIR, pinned to Triton's default where unset, as the runner pins it:
`runinfo.pin_triton_cache_dir`) is the only product, and the runner started afterwards on the same machine finds
every kernel compiled. Peers are not warmed.

    python -m benchmarks.tools.prewarm [--shapes all|NAME,...] [--part K/N] [--workers 12] [--paths auto,legacy]
    TRITON_INTERPRET=1 python -m benchmarks.tools.prewarm --shapes smoke --workers 2 --device cpu   # self-test
Exit code 1 when a task failed (each failure is printed with its error).
"""

import argparse
import multiprocessing as mp
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _warm(task):
    """One task in a worker: (shape name, path, device, baseline dir) -> (shape name, path, seconds, error)."""
    name, path, device, baseline = task
    t0 = time.time()
    try:
        import contextlib

        import torch

        from benchmarks.ops.candidates import baseline_unsupported, leaves_of, load_baseline
        from benchmarks.ops.registry import get_op, get_shape, make_inputs
        from fla_bwd.ops.attn import dkv_path

        op, shape = get_op("parallel_attn"), get_shape(name)
        inputs = make_inputs(op, shape, torch.device(device))
        if path == "baseline":  # an earlier commit's package, under its own default dispatch
            fn, ctx = load_baseline(baseline)[1], contextlib.nullcontext()
            if baseline_unsupported(fn, shape):  # the runner does not time it on this row either
                return name, path, round(time.time() - t0, 1), None
        else:
            fn, ctx = op.load(), dkv_path(path)
        with ctx:
            o = op.call(fn, inputs, shape)
            torch.autograd.grad(o, leaves_of(inputs), torch.randn_like(o))
        if device == "cuda":
            torch.cuda.synchronize()
        err = None
    except Exception as e:  # reported, not raised: a failed warm-up only costs the runner its compile time
        err = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
    return name, path, round(time.time() - t0, 1), err


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="all", help="registry names, comma-separated, or 'all'")
    p.add_argument("--part", default=None, help="K/N: only part K of N of that selection, as the runner's --part")
    p.add_argument("--paths", default="auto,legacy", help="dkv_path values to warm, comma-separated")
    p.add_argument("--baseline", action="append", default=[], metavar="DIR",
                   help="also warm an earlier commit's package (the runner's --baseline): a task path 'baseline'; "
                        "repeatable")
    p.add_argument("--workers", type=int, default=12, help="worker processes (each compiles on one CPU core)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                   help="cpu: a self-test under TRITON_INTERPRET=1")
    args = p.parse_args(argv)
    if args.workers < 1:
        raise SystemExit(f"--workers must be >= 1, got {args.workers}")
    sys.path.insert(0, _ROOT)
    from benchmarks.ops import plan
    from benchmarks.ops.registry import select_shapes
    from benchmarks.ops.runinfo import pin_triton_cache_dir

    cache_dir = pin_triton_cache_dir()  # the workers inherit it: the cache the runner reads afterwards

    shapes = select_shapes(args.shapes)
    if args.part:
        try:
            k, n = plan.parse_part(args.part)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        shapes = plan.split(shapes, n)[k - 1]  # the runner's split of the same selection
    paths = [(x, None) for x in args.paths.split(",") if x] + [("baseline", b) for b in args.baseline]
    tasks = [(s.name, path, args.device, base) for path, base in paths for s in shapes]  # first path first
    t0 = time.time()
    failed = 0
    with mp.get_context("spawn").Pool(processes=min(args.workers, len(tasks))) as pool:
        for name, path, sec, err in pool.imap_unordered(_warm, tasks):
            failed += err is not None
            print(f"[prewarm +{time.time() - t0:.0f}s] {name} [{path}] {sec} s{'  ' + err if err else ''}", flush=True)
    print(f"[prewarm] {len(tasks)} tasks, {failed} failed, {time.time() - t0:.0f} s with {args.workers} workers, "
          f"cache {cache_dir}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
