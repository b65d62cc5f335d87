# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for the GPU harnesses in benchmarks/tools/: each parses its arguments on a CPU machine, and the parts that
do not need a GPU (tune_attn.py's table overrides, profile_host.py's --smoke run, the PYTHONPATH that ab_trees.sh
uses to pick the package under test) run here under the interpreter."""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "benchmarks" / "tools"


def run(script, *args, env=None, cwd=None):
    return subprocess.run([sys.executable, str(TOOLS / script), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("script", ["tune_attn.py", "profile_host.py", "ncu_dkv.py"])
def test_help(script, tmp_path):
    # from another folder: the scripts find the repository's packages themselves
    proc = run(script, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: " + script)


def test_tune_attn_rejects_unknown_names():
    proc = run("tune_attn.py", "--variants", "base,bt128")
    assert proc.returncode == 2
    assert "unknown bt128" in proc.stderr


def test_tune_attn_imports_fla_bwd_from_pythonpath(tmp_path):
    """ab_trees.sh runs tune_attn.py with PYTHONPATH set to the tree under test: that tree's fla_bwd must win over
    the checkout's (the repository root the script adds for `benchmarks`)."""
    (tmp_path / "fla_bwd").mkdir()
    (tmp_path / "fla_bwd" / "__init__.py").write_text('raise SystemExit("the B tree was imported")\n')
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = run("tune_attn.py", "--help", env=env)
    assert proc.returncode == 1
    assert "the B tree was imported" in proc.stderr


def test_shell_scripts_parse():
    for script in [*TOOLS.glob("*.sh"), REPO / "benchmarks" / "gpu_run.sh"]:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"


def test_tune_attn_variant_overrides_and_restores_the_public_tables():
    from benchmarks.tools import tune_attn as tune
    from fla_bwd.ops.attn import config, host

    tiles = {key: dict(kernels) for key, kernels in config.TILE_CONFIGS.items()}
    passes = dict(config.DELTA_MODES)
    with tune.variant("dkv128s64w8"):
        for key, kernels in config.TILE_CONFIGS.items():
            assert kernels["dkv"] == dict(tiles[key]["dkv"], BT=128, BS=64, num_warps=8, num_stages=2)
            assert kernels["dq"] is tiles[key]["dq"] and kernels["fwd"] is tiles[key]["fwd"]
        assert config.DELTA_MODES == passes
    with pytest.raises(RuntimeError), tune.variant("norefine"):
        assert host.DELTA_MODES is config.DELTA_MODES  # the table the dQ launcher reads
        assert not host._PLANS  # plans built from the base tables are gone
        assert all(p == passes["rounded"] for p in config.DELTA_MODES.values())
        raise RuntimeError  # restored on the way out of an error too
    # the same objects as before
    assert list(config.TILE_CONFIGS) == list(tiles)
    for key, kernels in config.TILE_CONFIGS.items():
        assert list(kernels) == list(tiles[key])
        assert all(kernels[k] is tiles[key][k] for k in kernels)
    assert list(config.DELTA_MODES) == list(passes)
    assert all(config.DELTA_MODES[m] is passes[m] for m in passes)


def test_tune_attn_norefine_reaches_the_dq_launcher():
    """A gated backward under "norefine" skips the fp32 delta refinement: dK/dV then use the rounded delta and
    change a little (dg is not checked: without the refinement pass its query side is not stored, so the variant is
    for timing only); after the block the backward is bitwise the base one again."""
    from benchmarks.tools import tune_attn as tune
    from fla_bwd import parallel_attn

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 48, 4, 32, generator=gen) for _ in range(3))
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()
    g = F.logsigmoid(torch.randn(1, 48, 4, generator=gen))
    do = torch.randn(1, 48, 4, 32, generator=gen)

    def grads():
        ins = [x.clone().requires_grad_() for x in (q, k, v, g)]
        return torch.autograd.grad(parallel_attn(*ins[:3], g=ins[3]), ins, do)

    base = grads()
    with tune.variant("norefine"):
        norefine = grads()
    after = grads()
    assert all(torch.equal(a, b) for a, b in zip(base, after))
    torch.testing.assert_close(norefine[0], base[0])  # dq uses the rounded delta in both
    assert not torch.equal(base[1], norefine[1])
    for i in (1, 2):
        torch.testing.assert_close(norefine[i], base[i], rtol=1e-3, atol=1e-3)


def test_profile_host_smoke_run(tmp_path):
    """profile_host.py end to end on the CPU (--smoke: tiny rows under the interpreter; not a measurement): ours and
    SDPA timed on each row with a per-round ratio for every metric, the autograd floor and the environment in the
    JSON, the process pinned to one core; with --steps, our backward's host time step by step (`host_steps.py`)."""
    out, rows = tmp_path / "host.json", ["gqa4-short-gated", "varlen-T2048", "gqa4-short-sink"]
    proc = subprocess.run([sys.executable, str(TOOLS / "profile_host.py"), "--smoke", "--steps", "--rows",
                           ",".join(rows), "--json", str(out)], capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, TRITON_INTERPRET="1"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "SMOKE (not a measurement)" in proc.stdout
    rec = json.loads(out.read_text())
    assert rec["smoke"] and rec["env"]["torch"] == torch.__version__ and {"commit", "date", "gpu"} <= set(rec["env"])
    assert rec["env"]["cpu_affinity"].startswith("pinned to CPU core") or not hasattr(os, "sched_setaffinity")
    assert rec["autograd_floor"]["bwd_idle_us"] > 0 and rec["launch_floor"] == {"skipped": "no GPU"}
    assert list(rec["rows"]) == rows
    for name, row in rec["rows"].items():
        assert "error" not in row, (name, row)
        for m in ("fwd_idle", "fwd_b2b", "bwd_idle", "bwd_b2b"):
            assert row["ours"][m]["median_us"] > 0 and row["sdpa_fa2"][m]["median_us"] > 0, (name, m)
            assert len(row["ratio_ours_over_sdpa"][m]["rounds"]) == rec["settings"]["rounds"] == 2
        labels, times = zip(*row["steps_idle_us"])
        assert labels[0] == "Function.backward entered" and labels[-1] == "returned", (name, labels)
        assert any(label.startswith("Launch ") for label in labels) and "alloc dq" in labels, (name, labels)
        assert list(times) == sorted(times) and times[0] > 0, (name, times)
    assert rec["rows"]["varlen-T2048"]["ours"]["call"].endswith("+cu_seqlens")
    assert "+g" in rec["rows"]["gqa4-short-gated"]["ours"]["call"]
    assert "enable_gqa=True" in rec["rows"]["gqa4-short-sink"]["sdpa_fa2"]["call"]
    assert run("profile_host.py", "--rows", "nope").returncode == 2


def test_five_ab_knobs_set_and_restore_the_dq_launch():
    """five_ab.py's "+wN/+sN/+rN" candidates: parsed into the dQ-from-dS launch config, set inside the block with a
    plan cache of their own, and the config and the package's plan cache restored after it."""
    from benchmarks.tools import five_ab
    from fla_bwd.ops.attn import config, host

    default = dict(config.DQ_FROM_DS_LAUNCH)
    assert five_ab.knobs("five") == {}
    assert five_ab.candidate("five@64+w8") == ("from-ds", "64")
    assert five_ab.knobs("five+w8+s4+r128") == {
        "DQ_FROM_DS_LAUNCH": dict(default, num_warps=8, num_stages=4, maxnreg=128)}
    with pytest.raises(ValueError, match="unknown knob 'pair'"):
        five_ab.knobs("five+pair")
    plans = host._PLANS
    with five_ab._Env("five+w8"):
        assert config.DQ_FROM_DS_LAUNCH["num_warps"] == 8
        assert host._PLANS is not plans
    assert config.DQ_FROM_DS_LAUNCH == default
    assert host._PLANS is plans


def test_host_loop_parses_and_refuses_bad_names():
    """host_loop.py (PERF.md #43) parses on the CPU and names a bad row or kind; it needs a GPU to measure."""
    def host_loop(*args):
        return subprocess.run([sys.executable, "-m", "benchmarks.tools.host_loop", *args], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
    proc = host_loop("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr
    proc = host_loop("--rows", "mha-long,nope")
    assert proc.returncode == 2 and "unknown shape 'nope'" in proc.stderr
    proc = host_loop("--kinds", "triton,flash")
    assert proc.returncode == 2 and "'flash' is not" in proc.stderr
    if not torch.cuda.is_available():
        proc = host_loop()
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_host_loop_calls_are_the_runners_backward(monkeypatch):
    """host_loop.py's timed calls (on the CPU, a registered smoke row): the runner's bwd candidate, its backward
    through `EagerParallelAttn` (stamped) under each kind's FLA_BWD_DS_KERNEL, returning q, k and v's gradients."""
    from benchmarks.tools import host_loop
    from fla_bwd import settings

    seen = []
    monkeypatch.setattr(settings, "ds_kernel", lambda kind: (seen.append(kind), contextlib.nullcontext())[1])
    stamps = host_loop.Stamps()
    try:
        calls = host_loop.row_calls("smoke", ["triton", "hopper"], device="cpu")
        assert set(calls) == {"triton", "hopper"}
        for kind, fn in calls.items():
            seen.clear()
            stamps.calls.clear()
            grads = fn()
            assert len(grads) == 3 and all(torch.isfinite(g).all() for g in grads)
            assert seen == [kind] and len(stamps.calls) == 1
    finally:
        stamps.restore()
