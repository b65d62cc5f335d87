# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`pytest benchmarks/ops/bench_pytest.py --benchmark-only` (pytest-benchmark over the registry) as a supported way
to run the benchmark: its collection from the registry, and one tiny run of the smoke shape (Triton interpreter
without a GPU; a harness test, not a performance number) in well under a minute."""

import json
import os
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join("benchmarks", "ops", "bench_pytest.py")


def run_bench(*args, timeout=120, **env):
    # Not as an xdist worker (the suite runs under `-n 2`): pytest-benchmark, seeing one, disables itself.
    env = dict({k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, **env)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", BENCH, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_collects_registry_rows_modes_and_candidates():
    proc = run_bench("--collect-only", BENCH_SHAPES="group:window", BENCH_MODES="bwd,fwdbwd", BENCH_PEERS="flex")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ids = [x.split("[", 1)[1].rstrip("]") for x in proc.stdout.splitlines() if "test_parallel_attn[" in x]
    want = {f"{s}-{m}-{c}" for s in ("g8-T8192-W512", "g8-T16384-W256", "g8-T8192-W256", "g8-T16384-W512")
            for m in ("bwd", "fwdbwd") for c in ("auto", "legacy", "flex")}
    assert set(ids) == want and len(ids) == len(want)
    bad = run_bench("--collect-only", BENCH_SHAPES="smoke", BENCH_PEERS="fa3")
    assert bad.returncode != 0 and "not torch peers" in bad.stdout + bad.stderr


def test_benchmark_only_smoke_run(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_bench("--benchmark-only", "--benchmark-json", str(out), BENCH_SHAPES="smoke", BENCH_MODES="bwd",
                     BENCH_ROUNDS="2", BENCH_PEERS="flex")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if not torch.cuda.is_available():
        assert "2 passed, 1 skipped" in proc.stdout  # flex: peers need a GPU
    data = json.loads(out.read_text())
    by = {b["name"]: b for b in data["benchmarks"]}
    assert {"test_parallel_attn[smoke-bwd-auto]", "test_parallel_attn[smoke-bwd-legacy]"} <= set(by)
    for name, cand in (("auto", "fla_bwd"), ("legacy", "fla_bwd[legacy]")):
        b = by[f"test_parallel_attn[smoke-bwd-{name}]"]
        assert b["group"] == "smoke bwd" and b["stats"]["rounds"] == 2 and b["stats"]["median"] > 0
        info = b["extra_info"]
        assert info["candidate"] == cand and info["mode"] == "bwd" and info["config"] == "B1 T64 HQ4 H2 D32 bf16"
        assert info["tflops_at_median"] > 0 and info["timer_median_us"] > 0 and info["tflops_at_timer_median"] > 0
