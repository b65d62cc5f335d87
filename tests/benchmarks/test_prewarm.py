# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""CPU test of benchmarks/tools/prewarm.py: its worker processes run the smoke shape through both dK/dV paths under
the Triton interpreter, and a task that fails (an unknown dK/dV path) makes the tool exit 1 and name it; the
runner's and the tool's TRITON_CACHE_DIR pin (one kernel cache for both, whatever Inductor sets later)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _prewarm(*args):
    env = dict(os.environ, TRITON_INTERPRET="1")
    return subprocess.run([sys.executable, "-m", "benchmarks.tools.prewarm", "--device", "cpu", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)


def test_prewarm_runs_every_shape_and_path_in_workers():
    r = _prewarm("--shapes", "smoke", "--workers", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "smoke [auto]" in r.stdout and "smoke [legacy]" in r.stdout, r.stdout
    assert "2 tasks, 0 failed" in r.stdout, r.stdout


def test_prewarm_warms_a_baseline_package(tmp_path):
    """Each `--baseline DIR` adds one task a shape for an earlier commit's package (`make_baseline.py`)."""
    made = subprocess.run([sys.executable, "-m", "benchmarks.tools.make_baseline", "--commit", "HEAD", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    r = _prewarm("--shapes", "smoke", "--paths", "auto", "--baseline", made.stdout.strip(), "--baseline",
                 made.stdout.strip(), "--workers", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("smoke [baseline]") == 2 and "3 tasks, 0 failed" in r.stdout, r.stdout


def test_prewarm_exits_1_and_names_a_failed_task():
    r = _prewarm("--shapes", "smoke", "--paths", "no-such-path", "--workers", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "smoke [no-such-path]" in r.stdout and "1 tasks, 1 failed" in r.stdout, r.stdout


def test_pin_triton_cache_dir_sets_tritons_default_and_keeps_a_users(monkeypatch, tmp_path):
    sys.path.insert(0, REPO)
    import triton

    from benchmarks.ops.runinfo import pin_triton_cache_dir

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    default = triton.knobs.cache.dir
    assert pin_triton_cache_dir() == default and os.environ["TRITON_CACHE_DIR"] == default
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert pin_triton_cache_dir() == str(tmp_path) and os.environ["TRITON_CACHE_DIR"] == str(tmp_path)


def test_gpu_run_names_only_registered_shapes_and_parses():
    """gpu_run.sh's default overhead rows are registry names (a typo would silently drop a row's kernel time), and
    the script passes `bash -n`."""
    import re

    sys.path.insert(0, REPO)
    from benchmarks.ops.registry import SHAPES

    script = os.path.join(REPO, "benchmarks", "gpu_run.sh")
    assert subprocess.run(["bash", "-n", script], capture_output=True).returncode == 0
    text = open(script).read()
    rows = []
    for m in re.finditer(r"^HOST_LINE_ROWS\+?=,?(\S+)$", text, re.M):
        rows += m.group(1).split(",")
    assert len(rows) >= 11, rows
    assert set(rows) <= {s.name for s in SHAPES}, set(rows) - {s.name for s in SHAPES}
    # the default baseline is the package make_baseline writes for 12ac0d6 (a rename would drop the column)
    from benchmarks.tools.make_baseline import module_name

    (default,) = re.findall(r"^BASELINE=\$\{BASELINE-\.baseline/(\S+)\}$", text, re.M)
    assert default == module_name("12ac0d65fb484312ba8326d72a35979c695a3a25")


def test_prewarm_part_warms_the_runners_part_of_the_selection():
    """`--part K/N` splits the `--shapes` selection as the runner's `--part` does (`plan.split`)."""
    sys.path.insert(0, REPO)
    from benchmarks.ops import plan, registry

    names = "smoke,smoke-varlen-gated"
    want = [s.name for s in plan.split(registry.select_shapes(names), 3)[2]]
    r = _prewarm("--shapes", names, "--part", "3/3", "--paths", "auto", "--workers", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    warmed = sorted(line.split("] ", 1)[1].split(" [")[0] for line in r.stdout.splitlines() if " [auto] " in line)
    assert warmed == sorted(want) and len(want) == 1, (warmed, want)
    assert _prewarm("--part", "3/2").returncode != 0
