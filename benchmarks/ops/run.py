# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Benchmark runner. See benchmarks/README.md.

    python -m benchmarks.ops.run --op parallel_attn --shapes g8-T8192,gqa4-long --modes bwd,fwdbwd --ab \
        --peers flex,sdpa-cudnn,sdpa-fa2,fla,fa3 --repeats 5 --json out.json
    python -m benchmarks.ops.run --list
    python -m benchmarks.ops.run --smoke --skip-gate      # CPU interpreter self-test, not a performance number
    python -m benchmarks.ops.run --part 2/3 --defer-gate --gate-stamp /tmp/gate.json --ab ...   # one part of three
"""

import argparse
import json
import os
import signal
import sys
import time

from .registry import SMOKE_SHAPES, get_op, listing, select_shapes
from .shapes import MODES, PEERS, ShapeError, parse_custom

T_START = time.time()  # the time budget counts from here: the gate is part of it

EXIT_USAGE, EXIT_GATE_RED, EXIT_OP_FAILED = 2, 3, 4


class UsageError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m benchmarks.ops.run", description=__doc__.split("\n")[0])
    p.add_argument("--op", default="parallel_attn", help="registered op (default parallel_attn)")
    p.add_argument("--shapes", default=None, help="comma-separated names, group:NAME, or all (default: all)")
    p.add_argument("--custom", action="append", default=[], metavar="SPEC",
                   help="extra shape B=1,T=1024,HQ=32,H=4,D=128[,W=512][,gated][,sink][,varlen][,fp16|fp32]"
                        "[,noncausal][,SOFTCAP=30][,lse][,TQ=256]; repeatable")
    p.add_argument("--modes", default=None, help="comma-separated subset of fwd,bwd,fwdbwd (default: per shape)")
    p.add_argument("--ab", action="store_true", help="A/B: dkv_path('auto') against the forced legacy dK/dV path")
    p.add_argument("--peers", default="", help="comma-separated flex,sdpa-cudnn,sdpa-fa2,fla,fa3,fa4,fa4-det | all | "
                   "none (fa4, fa4-det: FlashAttention-4 and its deterministic backward, after "
                   "benchmarks/tools/install_fa4.sh)")
    p.add_argument("--force-peers", action="store_true", help="time peers on control rows too")
    p.add_argument("--repeats", type=int, default=None,
                   help="independent rounds (A/B comparisons), default 5 (--smoke: 2)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed calls per candidate per pass, default 20 (--smoke: 1)")
    p.add_argument("--fa3-calls", type=int, default=30, help="FA3 calls per wall-clock repeat, default 30")
    p.add_argument("--json", default=None, help="write the full record here (rewritten after every shape)")
    p.add_argument("--list", action="store_true", help="list ops and shapes and exit")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes; on a CPU-only machine under TRITON_INTERPRET=1 (not a performance number)")
    p.add_argument("--skip-gate", action="store_true", help="do not run the correctness gate (loud warning)")
    p.add_argument("--gate-only", action="store_true", help="run the correctness gate and exit with its status")
    p.add_argument("--gate-file", default=None, help="override the op's gating test files (comma-separated)")
    p.add_argument("--gate-timeout", type=float, default=420.0, help="seconds before the gate counts as red")
    p.add_argument("--part", default=None, metavar="K/N",
                   help="run only part K of N of the selected shapes, split by estimated time (benchmarks/ops/plan.py)")
    p.add_argument("--defer-gate", action="store_true",
                   help="a later part: do not run the gate; inherit part 1's result from --gate-stamp when it is there "
                        "for the same code, else record it as deferred (benchmarks/merge.py checks part 1)")
    p.add_argument("--gate-stamp", default=None, metavar="PATH",
                   help="write the gate result here after running it (part 1); read it with --defer-gate")
    p.add_argument("--overhead", nargs="?", const="all", default=None, metavar="SHAPES",
                   help="host overhead (wall time vs whole-step CUDA-graph replay) on all shapes or the listed ones")
    p.add_argument("--baseline", action="append", default=[], metavar="DIR",
                   help="also time an earlier commit's package, written by benchmarks/tools/make_baseline.py, on "
                        "every row (its default dispatch; a column fla_bwd@COMMIT beside the peers); repeatable")
    p.add_argument("--baseline-modes", default="bwd", help="the modes the baselines are timed in (default bwd)")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="time budget in seconds (0: none): past it no further shape starts")
    p.add_argument("--peer-budget-s", type=float, default=None,
                   help="past this many seconds no further peer is set up (default: --budget-s, less a reserve "
                        "of 6 s per shape still to run)")
    return p.parse_args(argv)


def resolve(args):
    op = get_op(args.op)
    if args.repeats is None:
        args.repeats = 2 if args.smoke else 5
    if args.iters is None:
        args.iters = 1 if args.smoke else 20
    if args.repeats < 1 or args.iters < 1 or args.fa3_calls < 1:
        raise UsageError("--repeats, --iters and --fa3-calls must be >= 1")
    if args.ab and args.repeats < 5 and not args.smoke:
        raise UsageError("--ab needs --repeats >= 5 (at least five independent comparisons)")
    if args.defer_gate and (args.skip_gate or args.gate_only):
        raise UsageError("--defer-gate cannot be combined with --skip-gate or --gate-only")
    if args.defer_gate and not args.part:
        raise UsageError("--defer-gate needs --part K/N with K >= 2 (part 1 runs the gate)")
    if args.smoke and not args.shapes and not args.custom:
        shapes = [SMOKE_SHAPES[0]]
    else:
        shapes = select_shapes(args.shapes) if (args.shapes or not args.custom) else []
    shapes += [parse_custom(spec, name=f"custom{i}") for i, spec in enumerate(args.custom)]
    args.part_info = None
    if args.part:
        from . import plan

        try:
            k, n = plan.parse_part(args.part)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if args.defer_gate and k == 1:
            raise UsageError("--defer-gate is for parts 2..N: part 1 runs the gate")
        parts = plan.split(shapes, n)
        shapes = parts[k - 1]
        args.part_info = {"index": k, "of": n, "shapes": [s.name for s in shapes],
                          "all_shapes": [s.name for p_ in parts for s in p_],
                          "estimate_s": plan.part_estimate(shapes, k)}
        if args.overhead not in (None, "all"):  # the overhead rows run in whichever part holds them
            keep = [x for x in args.overhead.split(",") if x.strip() in set(args.part_info["shapes"])]
            args.overhead = ",".join(keep) or None
    if args.modes:
        modes = tuple(m.strip() for m in args.modes.split(","))
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            raise UsageError(f"unknown mode(s) {bad}; modes are {', '.join(MODES)}")
        shapes = [s.with_modes(modes) for s in shapes]
    bad = [m for m in args.baseline_modes.split(",") if m.strip() not in MODES]
    if bad:
        raise UsageError(f"--baseline-modes: unknown mode(s) {bad}; modes are {', '.join(MODES)}")
    peers = () if args.peers in ("", "none") else PEERS if args.peers == "all" else tuple(
        x.strip() for x in args.peers.split(","))
    bad = [x for x in peers if x not in PEERS]
    if bad:
        raise UsageError(f"unknown peer(s) {bad}; peers are {', '.join(PEERS)}")
    for s in shapes:
        op.check(s)
    if args.overhead not in (None, "all"):
        names = [x.strip() for x in args.overhead.split(",")]
        missing = [x for x in names if x not in {s.name for s in shapes}]
        if missing:
            raise UsageError(f"--overhead names shapes not in this run: {missing}")
    return op, shapes, peers


def progress_bar(total):
    """tqdm on stderr (stdout stays the log); returns (tick, close)."""
    from tqdm import tqdm

    bar = tqdm(total=total, file=sys.stderr, mininterval=2.0, desc="shape x mode")
    return bar.update, bar.close


def write_json(path, data):
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, path)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        print(listing())
        return 0
    op, shapes, peers = resolve(args)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        raise UsageError("no CUDA GPU found: the benchmark needs one (use --smoke for the CPU interpreter self-test)")
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported (by the op below)
        if peers:
            print("note: --smoke on CPU: peers are not run", flush=True)
            peers = ()
    try:
        op.load()
    except Exception as e:
        raise UsageError(f"cannot import {op.module}.{op.attr}: {type(e).__name__}: {e}") from None
    from .candidates import load_baseline

    baselines = []
    for path in args.baseline:
        try:
            baselines.append(load_baseline(path))
        except (ValueError, ImportError) as e:
            raise UsageError(f"--baseline {path}: {type(e).__name__}: {e}") from None
    if len({label for label, _ in baselines}) < len(baselines):
        raise UsageError(f"--baseline: two packages of one label: {[label for label, _ in baselines]}")
    if args.ab:
        try:
            from fla_bwd.ops.attn import dkv_path  # noqa: F401
        except ImportError as e:
            raise UsageError(f"--ab needs fla_bwd.ops.attn.dkv_path: {e}") from None

    from . import bench, runinfo, summary
    from .timing import Timer

    runinfo.pin_triton_cache_dir()  # before any peer compiles: one kernel cache for the gate, prewarm and every row

    gate_files = args.gate_file.split(",") if args.gate_file else list(op.gate_files)
    part_index = args.part_info["index"] if args.part_info else 1
    if args.skip_gate:
        gate = runinfo.skipped_gate(gate_files)
    elif args.defer_gate:
        gate = runinfo.deferred_gate(gate_files, args.gate_stamp, from_part=1)
    else:
        if args.gate_stamp:
            runinfo.clear_gate_stamp(args.gate_stamp)
        gate = runinfo.run_gate(gate_files, args.gate_timeout)
        gate["ran_in_part"] = part_index
        if args.gate_stamp:
            runinfo.write_gate_stamp(args.gate_stamp, gate, part_index)
    runinfo.print_gate(gate)
    if args.gate_only:
        return 0 if gate["status"] == "green" else EXIT_GATE_RED

    device = torch.device("cuda" if cuda else "cpu")
    smoke = args.smoke
    timer = Timer(device, warmup_calls=(1, 1) if smoke else (3, 25))
    st = bench.Settings(modes=(), ab=args.ab, peers=peers, repeats=args.repeats, iters=args.iters,
                        fa3_calls=args.fa3_calls, overhead=args.overhead if cuda else None,
                        report_ratios=gate["status"] != "red", force_peers=args.force_peers,
                        baselines=tuple(baselines),
                        baseline_modes=tuple(m.strip() for m in args.baseline_modes.split(",") if m.strip()))
    data = {"schema": "fla_bwd-bench/1", "op": op.name, "smoke": smoke, "timer": timer.kind, "gate": gate,
            "env": runinfo.environment(), "settings": {k: v for k, v in vars(args).items()}, "peers": list(peers),
            "results": [], "skipped_shapes": {}, "partial": True, "part": args.part_info}
    if smoke:
        print("SMOKE RUN: timings below are interpreter/CPU self-test numbers, NOT a performance number", flush=True)
    print(f"{len(shapes)} shapes, peers: {', '.join(peers) or 'none'}, A/B: {args.ab}, timer: {timer.kind}"
          + "".join(f", baseline {label} ({','.join(st.baseline_modes)})" for label, _ in baselines), flush=True)
    budget = bench.Budget(args.budget_s, args.peer_budget_s, t0=T_START)
    tick, close = progress_bar(sum(len(s.modes) for s in shapes))
    failed = interrupted = False
    for i, shape in enumerate(shapes):
        budget.remaining = len(shapes) - i - 1
        if not budget.shapes_ok():
            data["skipped_shapes"][shape.name] = f"time budget {budget.total:.0f} s spent"
            print(f"  {shape.name}: skipped (time budget)", flush=True)
            continue
        print(f"-> {shape.name}: {shape.describe()} modes={','.join(shape.modes)} t={budget.elapsed():.0f}s",
              flush=True)
        st.modes = shape.modes
        rec = bench.new_record(shape, shape.modes)
        rec["started_s"] = round(budget.elapsed(), 1)
        t_shape = time.time()
        try:
            bench.measure_shape(op, shape, st, timer, device, budget, log=lambda s: print(s, flush=True), tick=tick,
                                rec=rec)
        except KeyboardInterrupt:  # `timeout -s TERM`: keep what was measured, still print the tables
            print(f"  interrupted during {shape.name}: stopping, summarising what was measured", flush=True)
            interrupted = True
            if rec["modes"]:
                rec["errors"]["interrupted"] = "stopped before every mode ran"
                rec["elapsed_s"] = round(time.time() - t_shape, 1)
                data["results"].append(rec)
            for rest in shapes[i + (1 if rec["modes"] else 0):]:
                data["skipped_shapes"][rest.name] = "interrupted"
            break
        except Exception as e:
            from .candidates import one_line

            rec["errors"]["shape"] = one_line(e, 400)
            print(f"  {shape.name}: FAILED {rec['errors']['shape']}", flush=True)
        rec["elapsed_s"] = round(time.time() - t_shape, 1)  # the whole shape: inputs, every mode, peers, memory
        failed |= bool(rec["errors"])
        data["results"].append(rec)
        write_json(args.json, data)
    close()
    all_modes = [m for m in MODES if any(m in r["modes"] for r in data["results"])]
    data["geomean"] = summary.aggregate(data["results"], all_modes) if st.report_ratios else {}
    data["checks"] = summary.checks(data["results"], all_modes)
    data["partial"] = bool(data["skipped_shapes"])
    data["elapsed_s"] = round(budget.elapsed(), 1)
    data["env"].update(runinfo.peer_versions())
    write_json(args.json, data)
    for mode in sorted(all_modes, key=lambda m: m == "bwd"):  # the backward-alone table prints last
        print("\n" + summary.render(data, mode), flush=True)
    if gate["status"] == "red":
        return EXIT_GATE_RED
    if interrupted:
        return 130
    return EXIT_OP_FAILED if failed else 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def cli() -> int:
    t0 = time.time()
    # `timeout` sends SIGTERM/SIGINT; a job started in the background may have inherited SIGINT ignored
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        code = main()
    except (ShapeError, UsageError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `--list | head`
        sys.stderr.close()
        return 0
    print(f"done in {time.time() - t0:.0f} s (exit {code})", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(cli())
