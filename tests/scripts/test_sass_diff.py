# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for scripts/sass_diff.py on synthetic `compile_sm90.py --sass-hash` outputs."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sass_diff.py"
RES = "{'BT': 64} warps=4 stages=2: regs 128  stack 0 B  local 0 B  smem 1024 B"
BEFORE = (f"D= 64 fwd[inline]                 {RES}  sass aaaa  ptx 1111\n"
          f"D= 64 dkv_per_kv_head[flag]       {RES}  sass bbbb  ptx 2222\n"
          f"D=128 dq[fixup]                   {RES}  sass cccc  ptx 3333\n"
          "hopper dkv ACC_IN=False ACC_OUT=False gated=False bfloat16: regs 168  stack 0 B  local 0 B  smem 9 B  "
          "sass dddd  ptx 4444\n")


def run(before: str, after: str, tmp_path: Path, *args):
    for name, text in (("before", before), ("after", after)):
        (tmp_path / name).mkdir(exist_ok=True)
        (tmp_path / name / "bf16-plain.txt").write_text(text)
    return subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "before"), str(tmp_path / "after"), *args],
                          capture_output=True, text=True, timeout=30)


def test_equal(tmp_path):
    out = run(BEFORE, BEFORE.replace("regs 128", "regs 128 "), tmp_path)
    assert out.returncode == 0 and "bf16-plain: 4 of 4 equal (all)" in out.stdout, out.stdout + out.stderr


def test_differences_and_rename(tmp_path):
    after = BEFORE.replace("dkv_per_kv_head[flag]", "dkv_kv[flag]        ")
    after = after.replace("sass cccc  ptx 3333", "sass eeee  ptx 5555")
    out = run(BEFORE, after.replace("sass aaaa  ptx 1111", "sass ffff  ptx 1111"), tmp_path,
              "--rename", "dkv_per_kv_head=dkv_kv")
    assert out.returncode == 1
    assert "bf16-plain: 2 of 4 equal" in out.stdout, out.stdout
    assert "D=64 fwd[inline]: sass differs, ptx equal" in out.stdout
    assert "D=128 dq[fixup]: sass differs, ptx differs" in out.stdout
    assert "hopper" not in out.stdout
    out = run(BEFORE, BEFORE.replace("ptx 4444", "ptx 6666"), tmp_path)
    assert out.returncode == 0 and "bfloat16: sass equal, ptx differs (not counted)" in out.stdout, out.stdout
    out = run(BEFORE, after, tmp_path)  # without the rename: one kernel only before, one only after
    assert "D=64 dkv_per_kv_head[flag]: only before" in out.stdout and "D=64 dkv_kv[flag]: only after" in out.stdout
