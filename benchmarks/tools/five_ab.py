# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""A/B of the seven- and five-product backwards (issue 18) on the GPU: backward alone (CUDA events, L2 flushed,
interleaved rounds, medians), per-kernel times, oracle error and bitwise checks, and peak memory.

    python -m benchmarks.tools.five_ab --rows g8-T8192,gqa4-long --json out.json [--fwdbwd]

Gated rows (g8-T8192-gated, ...) pass the gate too and report dg's oracle error.

Candidates: "seven" (FLA_BWD_DQ_PATH=recompute), "five" (from-ds at the default dS budget), "five-1chunk"
(from-ds with a budget large enough for one chunk) and "five@N" (from-ds at a budget of N MiB: smaller chunks), each
optionally with knobs of the dQ-from-dS launch: "+wN" (num_warps N), "+sN" (num_stages N), "+rN" (maxnreg N),
e.g. "five+w8+r128", and "+triton" / "+hopper" (FLA_BWD_DS_KERNEL: the dK/dV kernel, default "auto").
The
results of issue 18's runs are in benchmarks/results/five-product/ (runs 1-3 and 10-11 used experiment switches,
FLA_BWD_EXP_*, since removed: PERF.md #42 says which variant each was).
"""

import argparse
import contextlib
import json
import os
import statistics

import torch

from benchmarks.ops.registry import SHAPES as _SHAPES
from benchmarks.ops.shapes import Shape
from benchmarks.ops.timing import Timer, interleaved
from benchmarks.tools.tune_attn import kernel_times, make_inputs, ratio
from fla_bwd import settings
from fla_bwd.ops.attn import config, host, naive_parallel_attn, parallel_attn

# The registry's rows, and the dense G8 T16384 of issue 18's memory bar.
SHAPES = dict({s.name: s for s in _SHAPES}, **{"g8-T16384": Shape("g8-T16384", 1, 16384, 32, 4, 128, 128),
                                                "mha-T4096": Shape("mha-T4096", 1, 4096, 32, 32, 128, 128),
                                                "mha-D64": Shape("mha-D64", 2, 2048, 32, 32, 64, 64),
                                                "mha-T1024": Shape("mha-T1024", 4, 1024, 32, 32, 128, 128)})
CANDIDATES = {"seven": ("recompute", None), "five": ("from-ds", None), "five-1chunk": ("from-ds", "65536")}


def candidate(name):
    """(dq path, dS budget in MiB or None) of a candidate: one of CANDIDATES, or "five@N" (from-ds at N MiB), before
    any "+knob"."""
    name = name.split("+")[0]
    if name.startswith("five@"):
        return "from-ds", name[len("five@"):]
    return CANDIDATES[name]


def knobs(name) -> dict:
    """The `config` entries a candidate's "+knob"s set."""
    launch = dict(config.DQ_FROM_DS_LAUNCH)
    out = {}
    for knob in name.split("+")[1:]:
        if knob in ("triton", "hopper"):
            continue  # the ds kernel, `_Env`
        if knob[:1] in ("w", "s", "r") and knob[1:].isdigit():
            launch[{"w": "num_warps", "s": "num_stages", "r": "maxnreg"}[knob[0]]] = int(knob[1:])
        else:
            raise ValueError(f"unknown knob {knob!r} in candidate {name!r}")
    if launch != config.DQ_FROM_DS_LAUNCH:
        out["DQ_FROM_DS_LAUNCH"] = launch
    return out


_PLAN_CACHES: dict = {}  # candidate -> host plan cache: plans are built with the candidate's knobs


class _Env:
    """dq path, budget and knobs for a block."""

    def __init__(self, cand):
        self.path, self.budget = candidate(cand)
        self.knobs = knobs(cand)
        parts = cand.split("+")[1:]
        self.ds = "triton" if "triton" in parts else "hopper" if "hopper" in parts else "auto"
        self.plans = _PLAN_CACHES.setdefault(cand, {})

    def __enter__(self):
        self.ctx = settings.dq_path(self.path)
        self.ctx.__enter__()
        self.ds_ctx = settings.ds_kernel(self.ds)
        self.ds_ctx.__enter__()
        self.old = os.environ.pop("FLA_BWD_DS_BUDGET_MIB", None)
        if self.budget is not None:
            os.environ["FLA_BWD_DS_BUDGET_MIB"] = self.budget
        self.saved = {k: getattr(config, k) for k in self.knobs}
        for k, v in self.knobs.items():
            setattr(config, k, v)
        self.saved_plans, host._PLANS = host._PLANS, self.plans

    def __exit__(self, *exc):
        host._PLANS = self.saved_plans
        for k, v in self.saved.items():
            setattr(config, k, v)
        os.environ.pop("FLA_BWD_DS_BUDGET_MIB", None)
        if self.old is not None:
            os.environ["FLA_BWD_DS_BUDGET_MIB"] = self.old
        self.ds_ctx.__exit__(*exc)
        self.ctx.__exit__(*exc)


def _inputs(B, T, HQ, H, D, dtype, seed, gated=False):
    """q, k, v, dO and the gate (None unless `gated`), all but dO requiring grad."""
    q, k, v, g = make_inputs(B, T, HQ, H, D, gated, dtype, seed)
    return q, k, v, torch.randn_like(q), g


def _median_us(samples):
    return round(statistics.median([statistics.median(r) for r in samples]), 1)


def run_row(name, cands, rounds, iters, timer, fwdbwd=False):
    s = SHAPES[name]
    B, T, HQ, H, D, W = s.B, s.T, s.HQ, s.H, s.K, s.W
    dtype = torch.float16 if s.dtype == "fp16" else torch.bfloat16
    q, k, v, do, g = _inputs(B, T, HQ, H, D, dtype, 0, s.gated)
    ins = tuple(x for x in (q, k, v, g) if x is not None)
    out = {"row": name}
    fns, steps = {}, {}
    for c in cands:
        with _Env(c):
            o = parallel_attn(q, k, v, g=g, window_size=W)

        def bwd(c=c, o=o):
            with _Env(c):
                return torch.autograd.grad(o, ins, do, retain_graph=True)

        def step(c=c):  # forward + backward (a gated five-product forward also makes o_lo)
            with _Env(c):
                return torch.autograd.grad(parallel_attn(q, k, v, g=g, window_size=W), ins, do)
        for _ in range(3):
            bwd()
            step()
        fns[c], steps[c] = bwd, step
    torch.cuda.synchronize()
    samples = interleaved(timer, fns, rounds, iters)
    out["bwd_us"] = {c: _median_us(samples[c]) for c in cands}
    if fwdbwd:
        samples = interleaved(timer, steps, rounds, iters)
        out["fwdbwd_us"] = {c: _median_us(samples[c]) for c in cands}
    out["kernels"] = {c: kernel_times(fns[c]) for c in cands}
    # Bitwise: a second call equal to the first (determinism), and the chunked and one-chunk five-product equal.
    grads = {c: fns[c]() for c in cands}
    out["deterministic"] = {c: all(torch.equal(a, b) for a, b in zip(grads[c], fns[c]())) for c in cands}
    fives = [c for c in cands if candidate(c)[0] == "from-ds"]
    if len(fives) > 1:  # every chunking and knob bitwise the first
        out["chunks_equal"] = {c: all(torch.equal(a, b) for a, b in zip(grads[fives[0]], grads[c])) for c in fives[1:]}
    if "five" in grads and "seven" in grads and not s.gated:  # gated: the two deltas differ (`from_ds`)
        out["dk_dv_equal_seven"] = all(torch.equal(a, b) for a, b in zip(grads["five"][1:3], grads["seven"][1:3]))
    # Oracle error on the first 1024 tokens.
    Tc = min(T, 1024)
    q, k, v, do, g = _inputs(B, Tc, HQ, H, D, dtype, 1, s.gated)
    ins = tuple(x for x in (q, k, v, g) if x is not None)
    ref = naive_parallel_attn(q, k, v, g=g, window_size=W)
    rgrads = torch.autograd.grad(ref, ins, do.float())
    out["oracle"] = {}
    for c in cands:
        with _Env(c):
            o = parallel_attn(q, k, v, g=g, window_size=W)
            grads = torch.autograd.grad(o, ins, do)
        out["oracle"][c] = {n: f"{ratio(r, x):.2e}" for n, r, x in zip(("dq", "dk", "dv", "dg"), rgrads, grads)}
    return out


def peak_memory(name, cand):
    """Peak allocated over the inputs during a forward + backward (MiB)."""
    s = SHAPES[name]
    q, k, v, do, g = _inputs(s.B, s.T, s.HQ, s.H, s.K, torch.bfloat16, 2, s.gated)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with _Env(cand) if cand else contextlib.nullcontext():
        o = parallel_attn(q, k, v, g=g, window_size=s.W)
        torch.autograd.grad(o, tuple(x for x in (q, k, v, g) if x is not None), do)
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="gqa4-long,mha-long,g8-T4096,g8-T8192")
    ap.add_argument("--cands", default="seven,five,five-1chunk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--memory", default="", help="rows whose default-settings peak memory to report")
    ap.add_argument("--fwdbwd", action="store_true", help="also time forward + backward")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    timer = Timer(torch.device("cuda"))
    cands = args.cands.split(",")
    res = {"exp": {k: v for k, v in os.environ.items() if k.startswith("FLA_BWD_EXP")}, "rows": []}
    for name in filter(None, args.rows.split(",")):
        r = run_row(name, cands, args.rounds, args.iters, timer, args.fwdbwd)
        print(json.dumps(r), flush=True)
        res["rows"].append(r)
    res["memory_MiB"] = {name: {"auto": peak_memory(name, None), "seven": peak_memory(name, "seven")}
                         for name in filter(None, args.memory.split(","))}
    print(json.dumps(res["memory_MiB"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
