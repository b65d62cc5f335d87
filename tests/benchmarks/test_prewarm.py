# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""CPU test of benchmarks/tools/prewarm.py: its worker processes run the smoke shape through both dK/dV paths under
the Triton interpreter, and a shape the op refuses makes the tool exit 1 and name it."""

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


def test_prewarm_exits_1_and_names_a_failed_task():
    r = _prewarm("--shapes", "smoke", "--paths", "no-such-path", "--workers", "1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "smoke [no-such-path]" in r.stdout and "1 tasks, 1 failed" in r.stdout, r.stdout
