#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The backward's kernel time under dispatch paths that "auto" does not take, beside an earlier commit's package: on
each row, every candidate's whole-step and forward CUDA graphs replayed interleaved (`metrics.paired_graphs_us`,
the figures of the runner's "graph kernels paired" check), ROUNDS times; then each candidate's eager backward (the
runner's method: CUDA events, L2 flushed, median) and its gradients' largest difference from auto's. It answers
whether a path is faster in kernel time where auto's rule was set by host time (short rows, PERF.md #73). Not a
benchmark of record.

    python3 -m benchmarks.tools.graph_paths --rows mha-short,mha-short-fp16,gqa4-short \
        --paths auto,five-hopper,five-triton --baseline .baseline/fla_bwd_12ac0d6 --json $OUT/graph_paths.json
"""

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys

import torch

from benchmarks.ops import candidates as C
from benchmarks.ops.bench import make_do
from benchmarks.ops.metrics import PAIRED_CALLS, paired_graphs_us
from benchmarks.ops.registry import get_op, get_shape, make_inputs
from benchmarks.ops.timing import Timer, median_us
from fla_bwd import settings
from fla_bwd.ops.attn import parallel_attn

# name -> the settings it forces (`fla_bwd.settings`): dK/dV path, dq path, five-product dK/dV kernel.
PATHS = {
    "auto": {},
    "legacy": {"dkv_path": "legacy"},
    "five-hopper": {"dq_path": "from-ds", "ds_kernel": "hopper"},
    "five-triton": {"dq_path": "from-ds", "ds_kernel": "triton"},
}


def forcing(path: str):
    """A context factory that enters every setting `PATHS[path]` forces."""
    def ctx():
        stack = contextlib.ExitStack()
        for setting, value in PATHS[path].items():
            stack.enter_context(getattr(settings, setting)(value))
        return stack
    return ctx


def candidates(op, shape, inputs, do, paths, base) -> list:
    """Ours under each forced path (`candidates.ours`, its context `forcing`), then the baseline package (`base`:
    its label and op, or None)."""
    out = [dataclasses.replace(C.ours(parallel_attn, op.call, inputs, shape, do, None), name=f"fla_bwd[{p}]",
                               ctx=forcing(p)) for p in paths]
    if base is not None:
        out.append(C.baseline(*base, op.call, inputs, shape, do))
    return out


def grads(cand) -> list:
    fn = cand.build("bwd")
    g = [t.float() for t in fn()]
    cand.release()
    return g


def measure_row(op, name: str, paths, base, rounds: int, calls: int, timer, device="cuda") -> dict:
    shape = get_shape(name)
    inputs = make_inputs(op, shape, device)
    do = make_do(shape, inputs, device)
    rec = {"shape": shape.describe(), "rounds": [], "errors": {}}
    cands, got = [], {}
    for c in candidates(op, shape, inputs, do, paths, base):
        try:  # a path that cannot run this row says why (e.g. a forced kernel that cannot), the others still run
            got[c.name] = grads(c)
            cands.append(c)
        except Exception as e:
            rec["errors"][c.name] = C.one_line(e)
    for _ in range(rounds if cands else 0):
        figs = paired_graphs_us({c.name: c.build for c in cands}, calls=calls, flush=timer.flush)
        rec["rounds"].append({k: dict(v, graph_bwd_us=v["graph_step_us"] - v["graph_fwd_us"]) for k, v in figs.items()})
        for c in cands:
            c.release()
    rec["eager_bwd_us"], rec["max_grad_diff"] = {}, {}
    for c in cands:
        rec["eager_bwd_us"][c.name] = median_us(c.build("bwd"), device, timer=timer)
        rec["max_grad_diff"][c.name] = max((a - b).abs().max().item() for a, b in zip(got[c.name], got[cands[0].name]))
        c.release()
    return rec


def report(name: str, rec: dict) -> None:
    for cand, why in rec["errors"].items():
        print(f"== {name}: {cand} did not run: {why}")
    if not rec["eager_bwd_us"]:
        return
    first = next(iter(rec["eager_bwd_us"]))
    print(f"== {name} ({rec['shape']}): graph bwd us per round | median ratio to {first} | eager bwd us | max |dgrad|")
    for cand in rec["eager_bwd_us"]:
        bwd = [r[cand]["graph_bwd_us"] for r in rec["rounds"]]
        ratio = statistics.median(r[cand]["graph_bwd_us"] / r[first]["graph_bwd_us"] for r in rec["rounds"])
        print(f"  {cand:30s} {' '.join(f'{x:8.1f}' for x in bwd)} | {ratio:.4f} | "
              f"{rec['eager_bwd_us'][cand]:8.1f} | {rec['max_grad_diff'][cand]:.2e}")
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", required=True, help="registry shape names, comma-separated")
    ap.add_argument("--paths", default="auto,five-hopper,five-triton", help=f"comma-separated, of {list(PATHS)}")
    ap.add_argument("--baseline", default=None, help="an earlier commit's package (make_baseline.py)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=PAIRED_CALLS, help="replays per graph per round")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    paths = args.paths.split(",")
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        ap.error(f"--paths: unknown {unknown}; known: {list(PATHS)}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (graph replays)")
    op, timer = get_op("parallel_attn"), Timer(torch.device("cuda"))
    base = C.load_baseline(args.baseline) if args.baseline else None
    out = {}
    for name in args.rows.split(","):
        try:
            out[name] = measure_row(op, name, paths, base, args.rounds, args.calls, timer)
            report(name, out[name])
        except Exception as e:  # e.g. a capture that failed: the other rows still run
            out[name] = {"error": C.one_line(e)}
            print(f"== {name}: {out[name]['error']}", flush=True)
        if args.json:  # after every row: a command stopped at its limit keeps the rows it finished
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
