#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Host (CPU) time to issue `parallel_attn` against SDPA's FlashAttention-2 backend, in one process (issue 19).

One run measures the no-work autograd floor (a forward and a backward through a torch.autograd.Function that does
nothing but allocate its outputs), the host cost of one kernel launch (`launch_floor`), and for each row, ours and
SDPA-FA2 on the row's dense twin: the issue time of a forward (autograd on) and of a backward
(`torch.autograd.grad(o, leaves, do, retain_graph=True)`), two ways. `idle`: one call from an idle queue
(synchronize, time the call alone), median of --calls. `b2b`: --b2b calls back to back (each releasing the previous
result, as a loop does), then one synchronize; host time per call before that synchronize (`b2b_wall`: after it),
median of 3. Ours and SDPA alternate in --rounds rounds, the order flipped each round, so host noise hits both;
ratios are ours / SDPA per round, reported as their median. The process is pinned to one CPU core first (the threads
it starts later, CUDA's and autograd's, inherit it).

    python benchmarks/tools/profile_host.py [--json benchmarks/results/host.json] [--rounds 5] [--rows mha-short,...]
    TRITON_INTERPRET=1 python benchmarks/tools/profile_host.py --smoke --json /tmp/host.json   # CPU self-test

`--steps`: then, per row, our backward from an idle queue stamped step by step (`host_steps.py`: autograd's entry
into our backward, each allocation and launch of its plan, the return), medians of --calls.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import host_steps  # this directory
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# The repository root, after PYTHONPATH's entries (as tune_attn.py: PYTHONPATH may pick the tree under test).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PYTHONPATH = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
sys.path.insert(max((i + 1 for i, p in enumerate(sys.path) if p and os.path.abspath(p) in _PYTHONPATH), default=1),
                _ROOT)

G4 = dict(B=4, T=512, HQ=32, H=8, D=128)
ROWS = {  # bf16; g = logsigmoid(randn) [B, T, HQ] fp32; sink_bias randn [HQ] fp32; cu_seqlens int32 on the device
    "mha-short": dict(B=4, T=512, HQ=32, H=32, D=128), "gqa4-short": G4,
    "gqa4-long": dict(B=2, T=2048, HQ=32, H=8, D=128), "gqa4-short-gated": dict(G4, gate=True),
    "gqa4-long-gated": dict(B=2, T=2048, HQ=32, H=8, D=128, gate=True),  # issue 18's gated bar row (PERF.md #75)
    "varlen-T2048": dict(B=1, T=2048, HQ=32, H=8, D=128, cu=(0, 300, 1024, 1500, 2048)),
    "gqa4-short-sink": dict(G4, sink=True),
}
SMOKE = dict(B=1, T=64, HQ=4, D=32)  # --smoke: every row at this size (H: HQ for MHA, else 2; cu scaled to T = 64)
METRICS = ("fwd_idle", "fwd_b2b", "bwd_idle", "bwd_b2b", "fwd_b2b_wall", "bwd_b2b_wall")


def sync():  # not torch.cuda.is_available() at import: that starts the driver's threads before `pin` runs
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip()[:200]}"


def idle_us(fn, calls):
    """Median CPU time of one call issued from an idle queue (the result is released after the clock stops)."""
    out = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        r = fn()
        out.append((time.perf_counter() - t0) * 1e6)
        del r
    sync()
    return statistics.median(out)


def b2b_us(fn, calls, repeats=3):
    """Per-call host time of `calls` back-to-back calls (before the one synchronize) and wall time (after it)."""
    issue, wall = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            r = fn()
        t1 = time.perf_counter()
        sync()
        issue.append((t1 - t0) * 1e6 / calls)
        wall.append((time.perf_counter() - t0) * 1e6 / calls)
        del r
    return statistics.median(issue), statistics.median(wall)


@triton.jit
def _nop_kernel(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19,
                C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    pass


def launch_floor() -> dict:
    """Host cost of one launch, from idle and back to back: a torch kernel, an allocation, a trivial Triton kernel
    with 20 arguments through `kernel[grid]`, through the compiled kernel, and through its launcher called directly
    (`compiled.run`: Triton internals; where they differ, that line reports the error)."""
    x, grid, out = torch.zeros(16, device="cuda"), (1, 1, 1), {}
    ptrs, mixed = [x] * 20, [x] * 10 + [1] * 10
    ways = {"torch x.add_(1)": lambda: x.add_(1), "torch.empty": lambda: torch.empty(64, device="cuda"),
            "kernel[grid], 20 tensors": lambda: _nop_kernel[grid](*ptrs, C0=1, C1=2, C2=3, C3=4),
            "kernel[grid], 10 tensors + 10 ints": lambda: _nop_kernel[grid](*mixed, C0=1, C1=2, C2=3, C3=4)}
    try:
        compiled = _nop_kernel[grid](*ptrs, C0=1, C1=2, C2=3, C3=4)
        values, stream = [*ptrs, 1, 2, 3, 4], torch.cuda.current_stream().cuda_stream
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        ways["compiled[grid](...)"] = lambda: compiled[grid](*values)
        ways["compiled.run(...) direct"] = lambda: run(1, 1, 1, stream, function, packed, None, None, None, *values)
    except Exception as e:
        out["compiled kernel"] = {"error": _err(e)}
    for label, fn in ways.items():
        try:
            for _ in range(10):
                fn()
            out[label] = {"idle_us": idle_us(fn, 50), "b2b_us": b2b_us(fn, 200)[0]}
        except Exception as e:
            out[label] = {"error": _err(e)}
    return out


class _NoWork(torch.autograd.Function):
    """`parallel_attn`'s autograd signature (8 inputs, 9 saved tensors) with no work: its backward only allocates
    the three gradients. Its issue time is the floor any backward through a torch.autograd.Function pays here."""

    @staticmethod
    def forward(ctx, q, k, v, g, sink_bias, cu_seqlens, scale, window_size):
        o, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, o, lse, None, g, sink_bias, cu_seqlens)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors[:3]
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None, None, None, None, None


def make_inputs(spec, dev, heads_first):
    """bf16 leaves q, k, v ([B, heads, T, D] with `heads_first`, else [B, T, heads, D]), our extra arguments, the
    backward's leaves, a description."""
    B, T, HQ, H, D = (spec[n] for n in "B T HQ H D".split())
    shape = (lambda h: (B, h, T, D)) if heads_first else (lambda h: (B, T, h, D))
    q, k, v = (torch.randn(shape(h), device=dev, dtype=torch.bfloat16).requires_grad_() for h in (HQ, H, H))
    extra = {}
    if spec.get("gate"):
        extra["g"] = F.logsigmoid(torch.randn(B, T, HQ, device=dev)).requires_grad_()
    if spec.get("sink"):
        extra["sink_bias"] = torch.randn(HQ, device=dev).requires_grad_()
    leaves = [q, k, v, *extra.values()]
    if spec.get("cu"):
        extra["cu_seqlens"] = torch.tensor(spec["cu"], device=dev, dtype=torch.int32)
    return q, k, v, extra, leaves, f"B{B} T{T} HQ{HQ} H{H} D{D} bf16"


def _calls(fwd, leaves, desc):
    """(the forward, the backward of one forward's output, the description)."""
    o = fwd()
    do = torch.randn_like(o)
    return fwd, lambda: torch.autograd.grad(o, leaves, do, retain_graph=True), desc


def autograd_floor(spec, dev, calls) -> dict:
    q, k, v, _, leaves, _ = make_inputs(spec, dev, heads_first=False)
    fwd, bwd, _ = _calls(lambda: _NoWork.apply(q, k, v, None, None, None, spec["D"] ** -0.5, 0), leaves, "")
    for _ in range(10):
        fwd()
        bwd()
    return {"fwd_idle_us": idle_us(fwd, calls), "fwd_b2b_us": b2b_us(fwd, 30)[0],
            "bwd_idle_us": idle_us(bwd, calls), "bwd_b2b_us": b2b_us(bwd, 30)[0]}


def ours(spec, dev):
    from fla_bwd import parallel_attn
    q, k, v, extra, leaves, desc = make_inputs(spec, dev, heads_first=False)
    return _calls(lambda: parallel_attn(q, k, v, **extra), leaves, desc + "".join(f" +{n}" for n in extra))


def sdpa_fa2(spec, dev):
    """SDPA under the caller's `sdpa_kernel(FLASH_ATTENTION)` on the row's dense twin ([B, H, T, D], is_causal):
    GQA through enable_gqa=True (under FLASH_ATTENTION alone SDPA raises rather than fall back to another backend);
    if that is refused, K and V repeated to HQ heads outside the timed call."""
    q, k, v, _, leaves, desc = make_inputs({n: spec[n] for n in "B T HQ H D".split()}, dev, heads_first=True)
    how, gqa = "MHA", spec["HQ"] > spec["H"]
    if gqa:
        try:
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            how = "enable_gqa=True"
        except Exception as e:
            k, v = (x.detach().repeat_interleave(spec["HQ"] // spec["H"], dim=1).requires_grad_() for x in (k, v))
            leaves, how, gqa = [q, k, v], f"K/V repeated to HQ heads (enable_gqa refused: {_err(e)[:120]})", False
    return _calls(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa), leaves,
                  f"{desc} [B, H, T, D], {how}")


def compare_row(spec, dev, rounds, calls, b2b, warm=5, repeats=3):
    impls = {"ours": ours(spec, dev), "sdpa_fa2": sdpa_fa2(spec, dev)}
    for fwd, bwd, _ in impls.values():
        for _ in range(warm):  # compile, autotune and fill the caches first
            fwd(), bwd()
    sync()
    per = {name: {m: [] for m in METRICS} for name in impls}
    for r in range(rounds):
        for name in (list(impls) if r % 2 == 0 else list(impls)[::-1]):
            for d, fn in zip(("fwd", "bwd"), impls[name][:2]):
                per[name][f"{d}_idle"].append(idle_us(fn, calls))
                issue, wall = b2b_us(fn, b2b, repeats)
                per[name][f"{d}_b2b"].append(issue)
                per[name][f"{d}_b2b_wall"].append(wall)
    out = {name: {"call": impls[name][2], **{m: {"median_us": statistics.median(v), "rounds_us": v}
                                             for m, v in per[name].items()}} for name in impls}
    ratios = {m: [a / b for a, b in zip(per["ours"][m], per["sdpa_fa2"][m])] for m in METRICS}
    out["ratio_ours_over_sdpa"] = {m: {"median": statistics.median(rs), "min": min(rs), "max": max(rs), "rounds": rs}
                                   for m, rs in ratios.items()}
    return out


def steps_of(spec, dev, calls):
    """Our backward of this row stamped step by step (`host_steps`), from an idle queue: [(label, median us)]."""
    host_steps.install()
    _, bwd, _ = ours(spec, dev)
    for _ in range(3):
        bwd()
    return host_steps.median_stamps(bwd, calls, before=sync)


def pin(cpu):
    if cpu is not None and cpu < 0:
        return "not pinned (--cpu -1)"
    if not hasattr(os, "sched_setaffinity"):
        return "not pinned: os.sched_setaffinity is not available here"
    allowed = sorted(os.sched_getaffinity(0))
    core = cpu if cpu is not None else allowed[min(1, len(allowed) - 1)]  # not core 0, which takes most interrupts
    os.sched_setaffinity(0, {core})
    return f"pinned to CPU core {core} (of {len(allowed)} allowed)"


def environment(pinned):
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
           "python": platform.python_version(), "host": platform.node(), "cpu_affinity": pinned,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for key, cmd in (("commit", ["git", "rev-parse", "HEAD"]), ("dirty", ["git", "status", "--porcelain", "-uno"]),
                     ("driver", ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])):
        try:
            res = subprocess.run(cmd, cwd=_ROOT, capture_output=True, text=True, timeout=20)
            env[key] = res.stdout.strip() if res.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            env[key] = None
    # BENCH_COMMIT first: the device machine's copy of the tree carries a .git of an older commit
    env["commit"] = os.environ.get("BENCH_COMMIT") or env["commit"]
    env["dirty"] = bool(env["dirty"]) if env["dirty"] is not None else None
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(prog="profile_host.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=os.path.join(_ROOT, "benchmarks", "results", "host.json"))
    ap.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of " + ",".join(ROWS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50, help="calls per idle-queue median (>= 50 for the record)")
    ap.add_argument("--b2b", type=int, default=30, help="back-to-back calls before the one synchronize")
    ap.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the second allowed; -1: none)")
    ap.add_argument("--steps", action="store_true", help="also our backward's host time step by step (host_steps.py)")
    ap.add_argument("--smoke", action="store_true", help="tiny rows, 2 rounds, few calls: a self-test of the script "
                    "(without a GPU under TRITON_INTERPRET=1); NOT a measurement")
    args = ap.parse_args(argv)
    names = args.rows.split(",")
    if set(names) - set(ROWS):
        ap.error(f"unknown rows {sorted(set(names) - set(ROWS))}")
    pinned = pin(args.cpu)  # before CUDA starts its threads
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        raise SystemExit("profile_host.py measures on a GPU; without one only --smoke runs (TRITON_INTERPRET=1)")
    rows = {n: dict(ROWS[n]) for n in ["gqa4-short", *names]}  # gqa4-short: the autograd floor's shapes
    quick = {}  # --smoke: one warm-up call, one back-to-back repeat
    if args.smoke:
        args.rounds, args.calls, args.b2b, quick = 2, 2, 2, dict(warm=1, repeats=1)
        for spec in rows.values():
            cu = spec.get("cu")
            spec.update(SMOKE, H=SMOKE["HQ"] if spec["H"] == spec["HQ"] else 2)
            spec.update(cu=tuple(x * SMOKE["T"] // cu[-1] for x in cu) if cu else None)
    dev = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    print(f"profile_host.py: {pinned}; {'SMOKE (not a measurement), ' if args.smoke else ''}"
          f"{args.rounds} rounds, idle median of {args.calls} calls, back to back {args.b2b}")
    record = {"env": environment(pinned), "smoke": args.smoke, "method": __doc__.split("\n\n")[1],
              "settings": {k: getattr(args, k) for k in ("rounds", "calls", "b2b")}, "rows": {}}

    def dump():  # after every part: a run stopped at its time limit keeps what it measured
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)

    floor = record["autograd_floor"] = autograd_floor(rows["gqa4-short"], dev, args.calls)
    print(f"autograd floor (no-work Function, gqa4-short shapes): forward issue idle {floor['fwd_idle_us']:.1f} us, "
          f"back to back {floor['fwd_b2b_us']:.1f} us; backward issue idle {floor['bwd_idle_us']:.1f} us, back to "
          f"back {floor['bwd_b2b_us']:.1f} us")
    record["launch_floor"] = launch_floor() if cuda else {"skipped": "no GPU"}
    for label, r in record["launch_floor"].items():
        print(f"  launch {label:36s} " + (f"idle {r['idle_us']:7.1f} us  back to back {r['b2b_us']:7.1f} us"
                                          if "idle_us" in r else str(r)))
    dump()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # entered once: the timed calls are the SDPA calls alone
        for n in names:
            try:
                res = record["rows"][n] = compare_row(rows[n], dev, args.rounds, args.calls, args.b2b, **quick)
            except Exception as e:
                res = record["rows"][n] = {"error": _err(e)}
            dump()
            if "error" in res:
                print(f"{n}: FAILED {res['error']}")
                continue
            print(f"{n} ({res['ours']['call']}; SDPA: {res['sdpa_fa2']['call']})")
            for m in METRICS[:4]:
                r, a, b = res["ratio_ours_over_sdpa"][m], res["ours"][m], res["sdpa_fa2"][m]
                print(f"  {m:9s} ours {a['median_us']:8.1f} us  sdpa-fa2 {b['median_us']:8.1f} us  ours/sdpa "
                      f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]")
            if args.steps:
                res["steps_idle_us"] = steps_of(rows[n], dev, args.calls)
                dump()
                print("  our backward from an idle queue, step by step (median us since the call):")
                host_steps.print_stamps(res["steps_idle_us"])
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
