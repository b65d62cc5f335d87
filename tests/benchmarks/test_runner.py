# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The benchmark harness's own tests: registry, FLOP counting, varlen splits, CLI errors, gate, report, smoke run.

Runs on a CPU-only machine (the smoke run goes through Triton's interpreter) in well under a minute.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.ops import registry, summary, timing  # noqa: E402
from benchmarks.ops.shapes import (  # noqa: E402
    Shape,
    ShapeError,
    brute_force_pairs,
    cu_seqlens_list,
    parse_custom,
    unequal_split,
    visible_pairs,
)

# The anchors' shapes (shared/anchors/README.md): name -> (B, T, HQ, H, D, W)
ANCHOR_SHAPES = {
    "mha-short": (4, 512, 32, 32, 128, None), "mha-long": (2, 2048, 32, 32, 128, None),
    "gqa4-short": (4, 512, 32, 8, 128, None), "gqa4-long": (2, 2048, 32, 8, 128, None),
    "g8-T4096": (1, 4096, 32, 4, 128, None), "g8-T8192": (1, 8192, 32, 4, 128, None),
    "g4-T2048-D64": (2, 2048, 32, 8, 64, None), "g8-T8192-W512": (1, 8192, 32, 4, 128, 512),
    "g8-T16384-W256": (1, 16384, 32, 4, 128, 256), "g8-T8192-gated": (1, 8192, 32, 4, 128, None),
    "gqa4-long-gated": (2, 2048, 32, 8, 128, None),
}


def run_cli(*args, env_extra=None, timeout=120):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "benchmarks.ops.run", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ registry and FLOPs
def test_registry_shapes_valid_and_named_like_anchors():
    op = registry.get_op("parallel_attn")
    assert op.gate_files[0] == "tests/ops/test_attn.py"
    names = [s.name for s in registry.SHAPES]
    assert len(names) == len(set(names))
    for s in registry.SHAPES + registry.SMOKE_SHAPES:
        op.check(s)
        for spec in op.tensors:
            assert all(d > 0 for d in spec.shape(s))
    for name, (B, T, HQ, H, D, W) in ANCHOR_SHAPES.items():
        s = registry.get_shape(name)
        assert (s.B, s.T, s.HQ, s.H, s.K, s.V, s.W, s.dtype) == (B, T, HQ, H, D, D, W, "bf16"), name
    assert registry.get_shape("g8-T8192-gated").gated and not registry.get_shape("g8-T8192").gated
    groups = {s.group for s in registry.SHAPES}
    assert {"headline", "window", "varlen", "gated", "llama", "breadth", "control"} <= groups
    got = {(s.G, s.K) for s in registry.SHAPES if s.group in ("breadth", "headline", "llama") and s.K == s.V}
    assert {(g, d) for g in (2, 4, 8) for d in (64, 128)} <= got


@pytest.mark.parametrize("seqlens,window", [([1], None), ([7], None), ([9], 3), ([5], 5), ([5], 9), ([13], 1),
                                            ([4, 4], None), ([3, 11, 6], 4), ([16, 1, 9], None)])
def test_visible_pairs_against_brute_force(seqlens, window):
    assert sum(visible_pairs(n, window) for n in seqlens) == brute_force_pairs(seqlens, window)


def test_flops_match_formula_and_anchor_tflops():
    for s in [Shape("a", 2, 33, 4, 2, 16, 16), Shape("b", 1, 40, 4, 1, 8, 8, W=7),
              Shape("c", 1, 50, 6, 3, 16, 16, W=5, varlen=True, nseq=4, seed=2)]:
        pairs = brute_force_pairs(s.seqlens(), s.W)
        assert s.pairs() == pairs
        assert s.fwd_flops() == 4 * s.HQ * s.K * pairs  # 4 * B * HQ * D * pairs (B folded into the pairs)
        assert s.flops("bwd") == 2.5 * s.fwd_flops() and s.flops("fwdbwd") == 3.5 * s.fwd_flops()
    assert Shape("kv", 1, 10, 2, 1, 128, 64).fwd_flops() == 2 * 2 * (128 + 64) * 55
    # the anchors' own numbers (fa3 rows) come back from their times: same FLOP convention
    for name, us, tflops in (("g8-T8192", 2509.048933333465, 547.8399757846869),
                             ("g8-T8192-W512", 575.5369999998077, 289.19160450163173),
                             ("g4-T2048-D64", 416.6483333333323, 206.26816930344987)):
        got = registry.get_shape(name).flops("bwd") / (us * 1e-6) / 1e12
        assert abs(got - tflops) < 1e-6 * tflops, name


def test_varlen_post_init_valid_unequal_and_seeded():
    import torch

    op = registry.get_op("parallel_attn")
    for s in [registry.get_shape("varlen-gated-8192"), registry.get_shape("varlen-gated-16384"),
              registry.get_shape("smoke-varlen-gated")]:
        lens = s.seqlens()
        assert sum(lens) == s.T and all(n > 0 for n in lens) and len(set(lens)) == len(lens) >= 2
        assert lens == s.seqlens()  # fixed by the seed
    small = registry.get_shape("smoke-varlen-gated")
    a = registry.make_inputs(op, small, torch.device("cpu"))
    b = registry.make_inputs(op, small, torch.device("cpu"))
    cu = a["cu_seqlens"]
    assert cu.dtype == torch.int32 and cu.tolist() == cu_seqlens_list(small.seqlens())
    assert cu[0] == 0 and cu[-1] == small.T and bool((cu[1:] > cu[:-1]).all())
    assert torch.equal(a["q"], b["q"]) and torch.equal(a["g"], b["g"])
    assert a["q"].requires_grad and a["g"].dtype == torch.float32 and bool((a["g"] < 0).all())  # logsigmoid
    assert a["q"].abs().sum() > 0  # never zeros
    assert unequal_split(8192, 4, 1) != unequal_split(8192, 4, 2)
    dense = registry.make_inputs(op, registry.get_shape("smoke"), torch.device("cpu"))
    assert dense["cu_seqlens"] is None and dense["g"] is None


def test_custom_shape_parsing():
    s = parse_custom("B=1,T=1024,HQ=32,H=4,D=128,W=256,gated,varlen")
    assert (s.B, s.T, s.HQ, s.H, s.K, s.V, s.W, s.gated, s.varlen) == (1, 1024, 32, 4, 128, 128, 256, True, True)
    assert parse_custom("B=2,T=64,HQ=4,H=4,K=64,V=32,fp16").dtype == "fp16"
    for bad in ("B=1,T=1024,HQ=32,H=4", "B=1,T=x,HQ=32,H=4,D=8", "B=1,T=8,HQ=6,H=4,D=8", "B=1,,T=8",
                "B=1,T=8,HQ=4,H=4,D=8,bogus", "Q=1,T=8,HQ=4,H=4,D=8", "B=2,T=64,HQ=4,H=4,D=8,varlen",
                "B=1,T=8,HQ=4,H=4,D=0", "B=1,T=8,HQ=4,H=4,D=8,fp16,fp32"):
        with pytest.raises(ShapeError):
            parse_custom(bad)


# ------------------------------------------------------------------ timing and summary helpers
def test_interleaved_order_and_stats():
    order = []

    class FakeTimer:
        def block(self, fn, iters):
            return [fn() for _ in range(iters)]

    cands = {n: (lambda n=n: order.append(n) or float(len(order))) for n in ("a", "b", "c")}
    rounds = timing.interleaved(FakeTimer(), cands, rounds=2, iters=1)
    assert order == ["a", "b", "c", "c", "b", "a"] * 2
    assert all(len(rounds[n]) == 2 and len(rounds[n][0]) == 2 for n in cands)
    st = timing.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert st["median_us"] == 3.0 and st["min_us"] == 1.0 and st["p10_us"] == pytest.approx(1.4)
    assert timing.ratio_stats([1.1, 0.9, 1.0])["median"] == 1.0
    assert timing.geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_interleaved_keeps_host_times():
    class FakeTimer:
        def block(self, fn, iters):
            self.host_us = [10.0 * fn() for _ in range(iters)]
            return [x / 10.0 for x in self.host_us]

    host = {}
    rounds = timing.interleaved(FakeTimer(), {"a": lambda: 1.0, "b": lambda: 2.0}, rounds=3, iters=2, host=host)
    assert set(host) == {"a", "b"} and len(host["a"]) == 3 and all(len(r) == 4 for r in host["a"])
    assert host["b"][0] == [20.0] * 4 and rounds["b"][0] == [2.0] * 4
    cpu = timing.Timer(torch.device("cpu"))
    got = cpu.block(lambda: None, 3)
    assert got == cpu.host_us and len(got) == 3


def test_timed_as_fa3_builds_warms_times_and_releases():
    from benchmarks.ops.bench import timed_as_fa3

    calls, syncs, released = [], [], []

    class Cand:
        def build(self, mode):
            return lambda: calls.append(mode) or len(calls)

        def release(self):
            released.append(True)

    out = timed_as_fa3(Cand(), "bwd", calls=4, repeats=3, sync=syncs.append, warmup=2)
    assert len(calls) == 2 + 4 * 3 and set(calls) == {"bwd"} and released == [True]
    assert syncs == [6, 10, 14]  # one sync after each repeat's calls, on the last call's result
    assert out["n"] == 3 and out["median_us"] > 0 and "as fa3" in out["timer"]


def synthetic(gate="green"):
    """A run's JSON as the runner writes it, with two shapes, the A/B and two peers (one skipped on a row)."""
    def cand(us, tf):
        return {"n": 200, "median_us": us, "mean_us": us, "std_us": 1.0, "min_us": us, "p10_us": us, "p20_us": us,
                "p80_us": us, "p90_us": us, "tflops": tf, "kernels": {"kernels": 4}, "memory":
                {"peak_alloc_minus_inputs_MiB": 12.5}}
    results = []
    for name, us in (("g8-T8192", 3000.0), ("g8-T8192-gated", 3300.0), ("mha-short", 150.0)):
        s = registry.get_shape(name)
        modes = {}
        for mode in ("bwd", "fwdbwd"):
            c = {"fla_bwd": cand(us, s.flops(mode) / us / 1e6), "fla_bwd[legacy]": cand(us * 1.2, 1.0),
                 "flex": cand(us * 1.5, 2.0)}
            if name != "mha-short":
                c["fa3"] = cand(us * 0.8, 3.0)
            m = {"candidates": c, "seconds": 1.0}
            if gate != "red":
                m["ab"] = timing.ratio_stats([1.2, 1.19, 1.21, 1.2, 1.22])
                m["vs"] = {p: timing.ratio_stats([c[p]["median_us"] / us]) for p in c if not p.startswith("fla_")}
            modes[mode] = m
        results.append({"shape": s.as_dict(), "modes": modes, "errors": {},
                        "skipped_peers": {"fa3": "no"} if name == "mha-short" else {}})
    data = {"op": "parallel_attn", "smoke": False, "timer": "cuda-events+l2-flush", "results": results,
            "gate": {"status": gate, "skipped": False, "file": "tests/ops/test_attn.py"},
            "env": {"gpu": "NVIDIA H200", "torch": "2.11"}, "skipped_shapes": {}, "partial": False}
    data["geomean"] = summary.aggregate(results, ["bwd", "fwdbwd"]) if gate != "red" else {}
    data["checks"] = summary.checks(results, ["bwd", "fwdbwd"])
    return data


def test_aggregate_and_checks():
    data = synthetic()
    g = data["geomean"]["bwd"]
    assert g["ab"]["all"] == pytest.approx(1.2) and g["ab"]["n"] == 3
    assert g["vs:flex"]["all"] == pytest.approx(1.5) and g["vs:fa3"]["n"] == 2
    (chk,) = [c for c in data["checks"] if c["check"].endswith("(bwd)")]
    assert chk["ratio"] == pytest.approx(1.1) and chk["pass"]
    text = summary.render(data, "bwd")
    assert "backward alone" in text and "1.200 [1.190-1.220]" in text and "(1.50x)" in text
    red = summary.render(synthetic(gate="red"), "bwd")
    assert "GATE RED" in red and "A/B legacy/auto (dispatch" not in red and "(1.50x)" not in red


def test_gated_check_adds_the_graph_kernel_ratio_where_both_twins_have_one():
    """With host-overhead figures on both twins, a second check gives their CUDA-graph kernel ratio (here 1.10 eager,
    1.20 by kernels: a fail the eager line alone would hide); with one twin's missing, only the eager check."""
    data = synthetic()
    by = {r["shape"]["name"]: r for r in data["results"]}
    for name, graph in (("g8-T8192", 2500.0), ("g8-T8192-gated", 3000.0)):
        by[name]["modes"]["bwd"]["candidates"]["fla_bwd"]["overhead"] = {"graph_bwd_us": graph}
    got = {c["check"]: c for c in summary.checks(data["results"], ["bwd", "fwdbwd"])}
    graph = got["gated/ungated g8-T8192-gated vs g8-T8192, graph kernels (bwd)"]
    assert graph["ratio"] == pytest.approx(1.2) and not graph["pass"]
    assert got["gated/ungated g8-T8192-gated vs g8-T8192 (bwd)"]["pass"]
    assert not any("graph" in c and c.endswith("(fwdbwd)") for c in got)  # no fwdbwd graph figures were given
    assert "graph kernels (bwd): 1.200 > 1.15 -> FAIL" in "\n".join(summary.check_lines({"checks": list(got.values())}))
    del by["g8-T8192"]["modes"]["bwd"]["candidates"]["fla_bwd"]["overhead"]
    assert [c["check"] for c in summary.checks(data["results"], ["bwd"])] == [
        "gated/ungated g8-T8192-gated vs g8-T8192 (bwd)"]


def test_baseline_checks_compare_long_rows_eager_and_short_rows_by_kernels():
    """Issue 18's bar against an earlier commit in the same run: a row whose baseline backward takes >= 400 us (in
    the commit's record where it has one) may be 2% slower by eager medians; a shorter one no slower by graph kernel
    time (the paired figure where both have one), or by eager medians without one."""
    def row(name, ours_us, base_us, graphs=None, paired=False, blocks=None, base="fla_bwd@12ac0d6"):
        c = {"fla_bwd": {"median_us": ours_us}, base: {"median_us": base_us}}
        for key, g in zip(c, graphs or ()):
            c[key]["overhead"] = {"graph_bwd_us": g, **({"graphs_paired": True} if paired else {})}
            if blocks:
                c[key]["overhead"]["graph_bwd_blocks_us"] = blocks[key]
        return {"shape": {"name": name}, "modes": {"bwd": {"candidates": c}}}

    got = summary.baseline_checks([row("long", 1015.0, 1000.0), row("long-slow", 1025.0, 1000.0),
                                   row("short", 390.0, 300.0, graphs=(150.0, 160.0)), row("short-nograph", 301, 300),
                                   row("short-paired", 390.0, 300.0, graphs=(149.5, 149.6), paired=True)])
    assert [(c["check"], round(c["ratio"], 4), c["limit"], c["pass"]) for c in got] == [
        ("long fla_bwd/fla_bwd@12ac0d6 (bwd)", 1.015, 1.02, True),
        ("long-slow fla_bwd/fla_bwd@12ac0d6 (bwd)", 1.025, 1.02, False),
        ("short fla_bwd/fla_bwd@12ac0d6, graph kernels (bwd)", 0.9375, 1.0, True),
        ("short-nograph fla_bwd/fla_bwd@12ac0d6, eager (no graph figure) (bwd)", 1.0033, 1.0, False),
        ("short-paired fla_bwd/fla_bwd@12ac0d6, graph kernels paired (bwd)", 0.9993, 1.0, True)]
    assert summary.checks([row("long", 1015.0, 1000.0)], ["fwdbwd"]) == []  # a backward-alone bar only
    # Rows of the newest record's commit (`benchmarks/results/summary.json`, 2207b11) are sorted by its figures:
    # gqa4-short took 358 us there (a kernel check however long its host-bound eager median runs here), mha-long 509.
    # An older commit's record lives in git history: this run's figures sort its rows.
    record = summary.record_bwd_us("fla_bwd@2207b11")
    assert record["gqa4-short"] < 400 <= record["mha-long"]
    assert summary.record_bwd_us("fla_bwd@12ac0d6") == {}
    blocks = {"fla_bwd": [150.0, 152.0], "fla_bwd@12ac0d6": [151.0, 150.0]}
    got = summary.baseline_checks([row("short-blocks", 390.0, 300.0, graphs=(151.0, 150.5), paired=True,
                                       blocks=blocks)])
    assert got[0]["blocks"] == [pytest.approx(150 / 151), pytest.approx(152 / 150)]
    assert summary.check_lines({"checks": got}) == [
        "check short-blocks fla_bwd/fla_bwd@12ac0d6, graph kernels paired (bwd): 1.003 > 1.0 -> FAIL"
        " (over 2 blocks of its replays: 0.993-1.013)"]
    new = "fla_bwd@2207b11"
    got = summary.baseline_checks([row("gqa4-short", 400.0, 650.0, graphs=(155.0, 154.0), paired=True, base=new),
                                   row("mha-long", 301.0, 300.0, graphs=(150.0, 160.0), paired=True, base=new)])
    assert [(c["check"], round(c["ratio"], 4), c["limit"], c["pass"]) for c in got] == [
        ("gqa4-short fla_bwd/fla_bwd@2207b11, graph kernels paired (bwd)", 1.0065, 1.0, False),
        ("mha-long fla_bwd/fla_bwd@2207b11 (bwd)", 1.0033, 1.02, True)]
    assert summary.record_bwd_us("fla_bwd@abafb86+kv_early") == {}  # no record: this run's figures sort the rows


def test_baseline_package_runs_beside_ours(tmp_path):
    """make_baseline writes a commit's package under its own name (here HEAD's, so its gradients must be ours bit
    for bit), and the runner times it on every row as `fla_bwd@COMMIT` with its ratio and check."""
    import torch

    made = subprocess.run([sys.executable, "-m", "benchmarks.tools.make_baseline", "--commit", "HEAD", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    pkg = made.stdout.strip().splitlines()[-1]
    label = "fla_bwd@" + open(os.path.join(pkg, "BASELINE_COMMIT")).read()[:7]
    assert os.path.basename(pkg) == "fla_bwd_" + label[8:]
    env = {} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    same = subprocess.run([sys.executable, "-c", f"""
import torch
from benchmarks.ops.candidates import load_baseline
from fla_bwd.ops.attn import parallel_attn
label, base = load_baseline({pkg!r})
dev = "cuda" if torch.cuda.is_available() else "cpu"
q, k, v = (torch.randn(1, 64, h, 32, device=dev, dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2))
do = torch.randn(1, 64, 4, 32, device=dev, dtype=torch.bfloat16)
a = torch.autograd.grad(parallel_attn(q, k, v), (q, k, v), do)
b = torch.autograd.grad(base(q, k, v), (q, k, v), do)
assert base.__module__.startswith({os.path.basename(pkg)!r}), base.__module__
assert all(torch.equal(x, y) for x, y in zip(a, b)), [(x - y).abs().max() for x, y in zip(a, b)]
print("same", label)
"""], cwd=REPO, env=dict(os.environ, **env), capture_output=True, text=True, timeout=300)
    assert same.returncode == 0 and f"same {label}" in same.stdout, same.stdout[-2000:] + same.stderr[-2000:]
    out = tmp_path / "base.json"
    proc = run_cli("--smoke", "--skip-gate", "--repeats", "1", "--shapes", "smoke", "--modes", "bwd", "--baseline",
                   pkg, "--json", str(out), env_extra=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = json.loads(out.read_text())["results"]
    assert rec["modes"]["bwd"]["candidates"][label]["median_us"] > 0 and rec["modes"]["bwd"]["vs"][label]["median"]
    assert f"check smoke fla_bwd/{label} (bwd)" in proc.stdout and f"{label} us (x)" in proc.stdout


def test_baseline_with_a_candidate_patch(tmp_path):
    """`make_baseline --patch` applies a candidate patch to the commit's package before renaming it; its label and
    module name carry the patch's name."""
    import difflib

    sys.path.insert(0, REPO)
    from benchmarks.ops.candidates import load_baseline

    old = subprocess.run(["git", "show", "HEAD:fla_bwd/__init__.py"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.splitlines(keepends=True)
    new = old + ["CANDIDATE = 1\n"]
    patch = tmp_path / "my-idea.patch"
    patch.write_text("".join(difflib.unified_diff(old, new, "a/fla_bwd/__init__.py", "b/fla_bwd/__init__.py")))
    made = subprocess.run([sys.executable, "-m", "benchmarks.tools.make_baseline", "--commit", "HEAD", "--patch",
                           str(patch), "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr
    pkg = made.stdout.strip().splitlines()[-1]
    assert os.path.basename(pkg).endswith("_my_idea")
    assert "CANDIDATE = 1" in open(os.path.join(pkg, "__init__.py")).read()
    label, fn = load_baseline(pkg)
    assert label.startswith("fla_bwd@") and label.endswith("+my_idea") and fn.__module__.startswith(
        os.path.basename(pkg))
    bad = subprocess.run([sys.executable, "-m", "benchmarks.tools.make_baseline", "--commit", "HEAD", "--patch",
                          str(tmp_path / "nope.patch"), "--out", str(tmp_path / "out")], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "patch failed" in bad.stderr and "Traceback" not in bad.stderr
    # two packages in one run (a commit and a candidate on it); one label twice is refused
    plain = subprocess.run([sys.executable, "-m", "benchmarks.tools.make_baseline", "--commit", "HEAD", "--out",
                            str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0, plain.stderr
    plain_pkg = plain.stdout.strip().splitlines()[-1]
    import torch

    env = {} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    out = tmp_path / "two.json"
    proc = run_cli("--smoke", "--skip-gate", "--repeats", "1", "--shapes", "smoke", "--modes", "bwd", "--baseline",
                   plain_pkg, "--baseline", pkg, "--json", str(out), env_extra=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (rec,) = json.loads(out.read_text())["results"]
    assert {label, label.split("+")[0]} <= set(rec["modes"]["bwd"]["candidates"])
    twice = run_cli("--smoke", "--baseline", pkg, "--baseline", pkg)
    assert twice.returncode == 2 and "two packages of one label" in twice.stderr


def test_row_kinds_answer_and_check_wording():
    kinds = {s.name: summary.row_kind(s.as_dict()) for s in registry.SHAPES}
    assert kinds["g8-T8192"] == kinds["ctl-K128-V64-g8-T2048"] == "dense GQA" and kinds["mha-long"] == "MHA"
    assert kinds["mha-short"] == kinds["gqa4-short"] == "short (T<=512)" and kinds["g8-T8192-W512"] == "windowed"
    assert kinds["g8-T8192-gated"] == "gated" and kinds["varlen-gated-8192"] == "varlen"
    assert kinds["ctl-fp32-g8-T2048"] == "fp32" and set(kinds.values()) == set(summary.KINDS)
    data = synthetic()
    head, body, groups = summary.answer(data)
    assert head[0] == "peer" and [r[0] for r in body] == ["fa3", "flex"]  # no fla_bwd[legacy]
    assert groups == {"dense GQA": ["g8-T8192"], "short (T<=512)": ["mha-short"], "gated": ["g8-T8192-gated"]}
    assert data["geomean"]["bwd"]["vs:flex"]["by_kind"] == pytest.approx({k: 1.5 for k in groups})
    assert summary.answer(synthetic(gate="red"))[1] == []
    # a pass/fail line never reads as a contradiction: the operator follows the outcome, the digits the limit
    for ratio, ok, want in ((1.1516062327247014, False, "1.152 > 1.15"), (1.0880878, True, "1.088 <= 1.15"),
                            (1.15004, False, "1.15004 > 1.15"), (1.1500, True, "1.150 <= 1.15")):
        assert summary.fmt_check(ratio, 1.15, ok) == want
        shown, op, _ = want.split()
        assert (float(shown) <= 1.15) == (op == "<=") == ok


def test_percentile_and_unequal_split_from_the_standard_library():
    xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    s = sorted(xs)
    for p in (10, 20, 50, 80, 90):  # linear interpolation between order statistics (numpy's default)
        k = (len(s) - 1) * p / 100
        assert timing.percentile(xs, p) == pytest.approx(s[int(k)] + (s[min(int(k) + 1, 5)] - s[int(k)]) * (k % 1))
    assert timing.percentile([7.0], 20) == 7.0
    assert unequal_split(8192, 4, 7) == unequal_split(8192, 4, 7) != unequal_split(8192, 4, 8)
    assert registry.get_shape("varlen-gated-8192").seqlens() == [2227, 869, 1233, 3863]  # pinned: the record's


def test_report_on_synthetic_json(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(synthetic()))
    anchors = tmp_path / "anchors.jsonl"
    anchors.write_text(json.dumps({"peer": "sdpa-fa2", "shape": "g8-T8192", "bwd_tflops": 290.0}) + "\n")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "report.py"), str(path), "--out-dir",
                           str(tmp_path / "out"), "--anchors", str(anchors), "--print-mode", "bwd"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "out" / "summary.md").read_text()
    assert re.search(r"\| g8-T8192 +\|", md) and "## bwd (backward alone)" in md and "NVIDIA H200" in md
    # the answer comes first: the peer-by-kind table before the run and the detail tables
    assert md.index("## Answer") < md.index("## Run") < md.index("## bwd (backward alone)")
    assert re.search(r"\| flex +\| 1\.50 / 1\.50 +\| 1\.50 / 1\.50 +\|", md)  # all rows, then dense GQA
    assert re.search(r"\| fa3 +\| 0\.80 / 0\.80 \(2 of 3\) +\| 0\.80 / 0\.80 +\| n/a +\|", md)  # short: n/a
    assert "fla_bwd[legacy]" not in md[: md.index("## Run")]  # the internal A/B variant is no peer
    png = (tmp_path / "out" / "peer_ratios.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert proc.stdout.rstrip().splitlines()[-1].startswith("check gated/ungated")  # bwd table printed last
    bad = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "report.py"), str(tmp_path / "nope.json")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "error" in bad.stderr and "Traceback" not in bad.stderr


# ------------------------------------------------------------------ CLI
@pytest.mark.parametrize("args,needle", [
    (["--op", "nope"], "unknown op"),
    (["--shapes", "g8-T8192,nope"], "unknown shape"),
    (["--shapes", "group:nope"], "unknown shape group"),
    (["--modes", "bwd,sideways"], "unknown mode"),
    (["--custom", "B=1,T=1024,HQ=30,H=4,D=128"], "not a multiple"),
    (["--custom", "B=1,T=1024,HQ=32,D=128"], "missing H"),
    (["--peers", "flex,nope"], "unknown peer"),
    (["--ab", "--repeats", "3"], "at least five"),
    (["--smoke", "--overhead", "g8-T8192"], "--overhead names shapes not in this run"),
    (["--smoke", "--baseline", "/no/such/dir"], "no BASELINE_COMMIT"),
    (["--smoke", "--baseline-modes", "bwd,sideways"], "unknown mode"),
])
def test_cli_errors_are_clean(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_cli_list_and_no_gpu():
    proc = run_cli("--list")
    assert proc.returncode == 0 and "g8-T8192-W512" in proc.stdout and "varlen-gated-8192" in proc.stdout
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU error path cannot be exercised here")
    proc = run_cli("--shapes", "g8-T8192")
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr


def test_gate_red_and_green(tmp_path):
    env = {"TRITON_INTERPRET": "1"}
    (tmp_path / "test_red.py").write_text("def test_red():\n    assert False\n")
    (tmp_path / "test_green.py").write_text("def test_green():\n    assert True\n")
    red = run_cli("--smoke", "--gate-only", "--gate-file", str(tmp_path / "test_red.py"), env_extra=env)
    assert red.returncode == 3 and "GATE RED" in red.stdout and "NO SPEEDUP" in red.stdout
    green = run_cli("--smoke", "--gate-only", "--gate-file", str(tmp_path / "test_green.py"), env_extra=env)
    assert green.returncode == 0 and "gate: GREEN" in green.stdout


# ------------------------------------------------------------------ the smoke run (this package's kernels)
def test_smoke_run(tmp_path):
    import torch

    out = tmp_path / "smoke.json"
    env = {} if torch.cuda.is_available() else {"TRITON_INTERPRET": "1"}
    proc = run_cli("--smoke", "--skip-gate", "--ab", "--repeats", "1", "--shapes", "smoke,smoke-varlen-gated",
                   "--json", str(out), env_extra=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "NOT A PERFORMANCE NUMBER" in proc.stdout and "GATE SKIPPED" in proc.stdout
    data = json.loads(out.read_text())
    assert data["smoke"] and data["gate"]["skipped"] and not data["partial"]
    assert "torch_version" in data["env"]["collect_env"] and "\n" not in str(data["env"]["driver"] or "")
    by = {r["shape"]["name"]: r for r in data["results"]}
    assert set(by["smoke"]["modes"]) == {"fwd", "bwd", "fwdbwd"} and set(by["smoke-varlen-gated"]["modes"]) == {"bwd"}
    for r in data["results"]:
        assert not r["errors"], r["errors"]
        for m in r["modes"].values():
            assert m["candidates"]["fla_bwd"]["n"] == 2 and m["candidates"]["fla_bwd[legacy]"]["median_us"] > 0
            assert m["ab"]["n"] == 1
    assert proc.stdout.rstrip().splitlines()[-2].startswith("geomean bwd")  # the bwd table is printed last
