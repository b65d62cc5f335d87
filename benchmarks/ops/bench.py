# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Measure one shape: this package (dispatch and, with --ab, the forced legacy dK/dV path), earlier commits'
packages where given (--baseline) and the peers."""

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Optional

import torch

from . import candidates as C
from . import peers as P
from .metrics import GRAPH_KEY, compare_to_graph, host_overhead, kernel_count, paired_graphs_us, peak_memory
from .registry import make_inputs
from .timing import interleaved, ratio_stats, summarize, wall_median_us

OURS, LEGACY = "fla_bwd", "fla_bwd[legacy]"


@dataclass
class Settings:
    modes: tuple
    ab: bool
    peers: tuple
    repeats: int
    iters: int
    fa3_calls: int
    overhead: Optional[str]  # None, "all" or comma-separated shape names
    report_ratios: bool  # False on a red gate: no speedup is computed or stored
    force_peers: bool = False  # time peers on rows marked peers=False too
    baselines: tuple = ()  # (label, parallel_attn) of earlier commits' packages (`candidates.load_baseline`)
    baseline_modes: tuple = ("bwd",)  # the modes they are timed in, on every row


class Budget:
    """Past `total_s` no further shape starts. A peer is set up only while the time left after it still covers
    `reserve_s` for each shape not yet started (so the cheap A/B-only rows at the end still run), and never past
    `peers_s` (default: total). Zero means no limit. The clock starts at `t0` (the process start: the gate counts)."""

    def __init__(self, total_s: float, peers_s: Optional[float] = None, t0: Optional[float] = None,
                 reserve_s: float = 6.0):
        self.t0, self.total = (t0 or time.time()), total_s
        self.soft = total_s if peers_s is None else peers_s
        self.reserve_s, self.remaining = reserve_s, 0

    def elapsed(self) -> float:
        return time.time() - self.t0

    def peers_ok(self) -> bool:
        if not self.soft:
            return True
        return self.elapsed() < self.soft and self.elapsed() + self.reserve_s * self.remaining < (self.total or 1e18)

    def shapes_ok(self) -> bool:
        return not self.total or self.elapsed() < self.total


def _free(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _paired_graphs(timed: list, mode: str, timer) -> tuple:
    """({name: graph figures}, error or None) for `host_overhead(graphs=...)`: on a backward row with an earlier
    commit's package timed (`--baseline`), every package's graphs captured and replayed interleaved
    (`metrics.paired_graphs_us`), the figures `summary.baseline_checks` compares; elsewhere, or where a capture fails
    (each package then captures its own), none."""
    if mode != "bwd" or not any(c.kind == "baseline" for c in timed):
        return {}, None
    for c in timed:
        c.release()  # as before `host_overhead`'s captures
    try:
        return paired_graphs_us({c.name: c.build for c in timed}, flush=timer.flush), None
    except Exception as e:
        return {}, C.one_line(e)


def _tflops(flops: float, us: float) -> Optional[float]:
    return flops / (us * 1e-6) / 1e12 if us and us > 0 else None


def _ratios(per_round, num: str, den: str) -> list:
    """One ratio per independent round: median(num) / median(den); > 1 means `den` is faster."""
    return [statistics.median(a) / statistics.median(b) for a, b in zip(per_round[num], per_round[den])]


def timed_as_fa3(cand, mode: str, calls: int, repeats: int, sync, warmup: int = 3) -> dict:
    """`cand` timed as `peers.time_fa3` times FA3 (wall clock around `calls` calls and one `sync`, no L2 flush,
    median of `repeats`), right after it: FA3 runs through JAX apart from the interleaved rounds, so this is the
    like-for-like figure beside the CUDA-event median (a host stall in one moment moves both or neither)."""
    try:
        fn = cand.build(mode)
        for _ in range(warmup):
            fn()
        out = summarize(wall_median_us(fn, sync, calls, repeats))
    finally:
        cand.release()
    out["timer"] = f"wall clock, {repeats} repeats x {calls} calls + synchronize (as fa3)"
    return out


def make_do(shape, inputs: dict, device) -> torch.Tensor:
    """The output gradient `do` [B, T, HQ, V]: normal, from the shape's seed + 1, in q's dtype."""
    gen = torch.Generator(device="cpu").manual_seed(shape.seed + 1)
    return torch.randn(inputs["q"].shape[:-1] + (shape.V,), generator=gen).to(device, inputs["q"].dtype)


def new_record(shape, modes) -> dict:
    return {"shape": shape.as_dict(), "flops": {m: shape.flops(m) for m in modes}, "modes": {}, "skipped_peers": {},
            "errors": {}, "elapsed_s": None}


def measure_shape(op, shape, st: Settings, timer, device, budget: Budget, log=print, tick=None,
                  rec: Optional[dict] = None) -> dict:
    """Fills and returns the shape's record (`rec`, so an interrupted caller keeps the finished modes); never
    raises for a failing peer (its reason is recorded instead)."""
    op.check(shape)
    op_fn = op.load()
    inputs = make_inputs(op, shape, device)
    do = make_do(shape, inputs, device)
    rec = new_record(shape, st.modes) if rec is None else rec
    if st.force_peers or shape.peers is True:
        peers = st.peers
    else:
        peers = tuple(p for p in st.peers if shape.peers and p in shape.peers)
    for p in st.peers:
        if p not in peers:
            rec["skipped_peers"][p] = "not timed on this row by the registry (--force-peers times it)"
    for mode in st.modes:
        t_mode = time.time()
        cands = [C.ours(op_fn, op.call, inputs, shape, do, "auto" if st.ab else None)]
        if st.ab:
            cands.append(C.ours(op_fn, op.call, inputs, shape, do, "legacy"))
        if mode in st.baseline_modes:
            for label, fn in st.baselines:
                why = C.baseline_unsupported(fn, shape)  # a variant row's call may be newer than that package
                if why is None:
                    cands.append(C.baseline(label, fn, op.call, inputs, shape, do))
                else:
                    rec["skipped_peers"][label] = why
        fa3 = False
        for p in peers:
            why = P.unavailable(p) or P.unsupported(p, shape)
            if why is None and not budget.peers_ok():
                why = f"time budget: {budget.elapsed():.0f} s of {budget.total or budget.soft:.0f} s spent"
            if why is not None:
                rec["skipped_peers"][p] = why
            elif p == "fa3":
                fa3 = True
            else:
                try:
                    cands.append(P.torch_candidate(p, shape, inputs, do))
                except Exception as e:
                    rec["skipped_peers"][p] = f"set-up failed: {C.one_line(e)}"
        built, setup_s = {}, {}
        for c in cands:
            t_c = time.time()
            try:
                fn = c.build(mode)
                timer.warmup(fn)
                built[c.name] = fn
                setup_s[c.name] = round(time.time() - t_c, 2)  # build + warm-up: compile/autotune lands here
            except Exception as e:
                c.release()
                _free(device)
                if c.kind == "ours":
                    rec["errors"][f"{mode}:{c.name}"] = C.one_line(e, 400)
                else:
                    rec["skipped_peers"][c.name] = f"{mode}: {C.one_line(e)}"
        if OURS not in built:
            log(f"  {shape.name} {mode}: this package failed: {rec['errors'].get(f'{mode}:{OURS}')}")
            for c in cands:
                c.release()
            _free(device)
            continue
        try:
            host = {}
            per_round = interleaved(timer, built, st.repeats, st.iters, host=host)
        except Exception as e:
            rec["errors"][f"{mode}:timing"] = C.one_line(e, 400)
            for c in cands:
                c.release()
            _free(device)
            continue
        res = {"candidates": {}, "timer": timer.kind, "rounds": st.repeats, "iters_per_pass": st.iters,
               "setup_s": setup_s}
        flops = shape.flops(mode)
        for name, rounds in per_round.items():
            s = summarize([x for r in rounds for x in r])
            s["round_medians_us"] = [statistics.median(r) for r in rounds]
            s["host_us"] = statistics.median([x for r in host[name] for x in r])  # a call's issue time
            s["host_round_medians_us"] = [statistics.median(r) for r in host[name]]
            s["tflops"] = _tflops(flops, s["median_us"])
            res["candidates"][name] = s
        if timer.cuda:
            for name, fn in built.items():
                res["candidates"][name]["kernels"] = kernel_count(fn)
        built.clear()
        for c in cands:
            c.release()
        _free(device)
        if timer.cuda:
            for c in cands:
                if c.name not in res["candidates"]:
                    continue
                fn = None
                try:
                    fn = c.build(mode)
                    res["candidates"][c.name]["memory"] = peak_memory(fn, c.held() + [timer.flush_buf])
                except Exception as e:
                    res["candidates"][c.name]["memory"] = {"error": C.one_line(e)}
                del fn
                c.release()
                _free(device)
            if st.overhead and (st.overhead == "all" or shape.name in st.overhead.split(",")):
                timed = [c for c in cands if c.kind in ("ours", "baseline") and c.name in res["candidates"]]
                paired, paired_error = _paired_graphs(timed, mode, timer)
                for c in timed:
                    cres = res["candidates"][c.name]
                    c.release()  # the timed calls' forward output: see host_overhead's `release`
                    try:
                        ov = host_overhead(c.build, mode, flush=timer.flush, release=c.release,
                                           graphs=paired.get(c.name))
                        cres["overhead"] = compare_to_graph(ov, mode, cres["median_us"])
                    except Exception as e:
                        cres["overhead"] = {"error": C.one_line(e)}
                    if paired_error:
                        cres["overhead"]["paired_error"] = paired_error
                    c.release()
                    _free(device)
        if fa3:
            t_c = time.time()
            try:
                s = P.time_fa3(shape, inputs, do, mode, st.fa3_calls, st.repeats)
                s["tflops"] = _tflops(flops, s["median_us"])
                res["candidates"]["fa3"] = s
            except Exception as e:
                rec["skipped_peers"]["fa3"] = f"{mode}: {C.one_line(e)}"
            if "fa3" in res["candidates"]:
                try:
                    res["candidates"][OURS]["as_fa3"] = timed_as_fa3(
                        cands[0], mode, st.fa3_calls, st.repeats, lambda _: torch.cuda.synchronize())
                except Exception as e:
                    res["candidates"][OURS]["as_fa3"] = {"error": C.one_line(e)}
            setup_s["fa3"] = round(time.time() - t_c, 2)  # jit compile + warm-up + timing (and ours as fa3)
            _free(device)
        if st.report_ratios:
            if LEGACY in per_round:
                res["ab"] = ratio_stats(_ratios(per_round, LEGACY, OURS))
            res["vs"] = {n: ratio_stats(_ratios(per_round, n, OURS)) for n in per_round if n not in (OURS, LEGACY)}
            if "fa3" in res["candidates"]:
                fa3_us = res["candidates"]["fa3"]["median_us"]
                res["vs"]["fa3"] = ratio_stats([fa3_us / res["candidates"][OURS]["median_us"]])
                as_fa3 = res["candidates"][OURS].get("as_fa3", {})
                if "median_us" in as_fa3:
                    res["vs"]["fa3"]["same_method"] = fa3_us / as_fa3["median_us"]
        res["seconds"] = round(time.time() - t_mode, 1)
        rec["modes"][mode] = res
        if tick is not None:
            tick()
        log(mode_line(shape.name, mode, res))
    del inputs, do
    _free(device)
    return rec


def mode_line(name: str, mode: str, res: dict) -> str:
    ours = res["candidates"][OURS]
    tf = ours.get("tflops")
    s = f"  {name:<24} {mode:<6} {OURS} {ours['median_us']:10.1f} us"
    s += f" {tf:7.1f} TFLOP/s" if tf is not None else ""
    if ours.get("host_us") is not None:
        s += f" (host {ours['host_us']:.0f})"
    ab = res.get("ab")
    if ab and ab.get("median"):
        s += f" | A/B legacy/auto {ab['median']:.3f} [{ab['min']:.3f}-{ab['max']:.3f}]"
    for peer, r in res.get("vs", {}).items():
        if r.get("median"):
            s += f" | {peer} {r['median']:.2f}x"
            if r.get("same_method"):
                s += f" (both timed as fa3: {r['same_method']:.2f}x)"
    ov = ours.get("overhead", {})
    if "host_overhead_us" in ov:
        s += " | " + overhead_text(mode, ov)
    elif "graph_error" in ov:
        s += f" | graph capture failed: {ov['graph_error'][:120]}"
    return s + f" ({res['seconds']} s)"


def overhead_text(mode: str, ov: dict) -> str:
    """The runner's figure for the mode next to the whole-step CUDA-graph kernel time (metrics.host_overhead), e.g.
    `bwd alone 436 us vs graph bwd 146 us = 2.99x (wall 450, graph step 260, fwd 114)`."""
    label = {"fwd": "fwd", "bwd": "bwd alone", "fwdbwd": "fwd+bwd"}[mode]
    graph = {"fwd": "graph fwd", "bwd": "graph bwd", "fwdbwd": "graph step"}[mode]
    ratio = ov.get(f"{mode}_over_graph")
    s = f"{label} {ov[f'{mode}_median_us']:.0f} us vs " if f"{mode}_median_us" in ov else ""
    s += f"{graph} {ov[GRAPH_KEY[mode]]:.0f} us"
    s += f" = {ratio:.2f}x" if ratio is not None else ""
    return s + (f" (wall {ov['wall_us']:.0f}, graph step {ov['graph_step_us']:.0f}, fwd {ov['graph_fwd_us']:.0f})")
