# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for scripts/bitwise_cases.py: two of its cheapest cases, written, compared with themselves and with a
changed copy."""

import json
import subprocess
import sys
from pathlib import Path

# The script runs in a subprocess; this import makes the dependency visible to scripts/find_dependent_tests.py.
import fla_bwd.ops.attn  # noqa: F401

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bitwise_cases.py"
ONLY = ["--only", "window0|mha-bf16/dkv-gqa-split2$"]


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


def test_cases_cover_the_routes():
    out = run("--list")
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    for part in ("/dkv-gqa-split2", "/dkv-per-query-head", "/dq-from-ds", "/contain-inline", "/contain-two-launch",
                 "nan-", "varlen-", "forgetting/", "tail/", "fp32", "fp16", "bf16", "g8-"):
        assert any(part in n for n in names), part


def test_write_and_compare(tmp_path):
    first = tmp_path / "a.json"
    out = run("--out", str(first), *ONLY)
    assert out.returncode == 0, out.stderr[-3000:]
    cases = json.loads(first.read_text())["cases"]
    assert cases["mha-bf16/dkv-gqa-split2"]["refused"].startswith("refused: ")  # G = 1 cannot split
    assert cases["g8-gate-sink-bf16/window0"]["dsink"].startswith("float32[8] ")
    out = run("--compare", str(first), *ONLY)
    assert out.returncode == 0 and "2 equal, 0 not" in out.stdout, out.stdout + out.stderr[-3000:]
    data = json.loads(first.read_text())
    data["cases"]["g8-gate-sink-bf16/window0"]["dq"] = "changed"
    (tmp_path / "b.json").write_text(json.dumps(data))
    out = run("--compare", str(tmp_path / "b.json"), *ONLY)
    assert out.returncode == 1 and "g8-gate-sink-bf16/window0: DIFFERENT: dq" in out.stdout, out.stdout
