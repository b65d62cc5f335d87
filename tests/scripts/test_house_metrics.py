# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for scripts/house_metrics.py on a synthetic checkout built in tmp_path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import house_metrics  # noqa: E402

KERNELS = '''import triton
import triton.language as tl
from fla_bwd import settings


@triton.jit(do_not_specialize=["T"])
def add_kernel(x, y, T, BT: tl.constexpr, USE_G: tl.constexpr = False):
    pass  # PERF.md #17 and #42w


@triton.jit
def helper(x):  # [BT, BS] is no reference, nor is #include
    return x


class Plan:
    def run(self):
        def inner():
            return 1
        return inner()
'''


def test_synthetic_checkout(tmp_path):
    files = {"fla_bwd/__init__.py": "", "fla_bwd/settings.py": "", "fla_bwd/kernels.py": KERNELS,
             "tests/test_a.py": "# see #3\n", "benchmarks/run.py": "a = 1\nb = 2\n", "benchmarks/go.sh": "echo\n",
             "benchmarks/results/r1/plot.py": "x = 1\n", "benchmarks/results/r1/data.json": "{}\n",
             "PERF.md": "# log\n\n#1\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    md = house_metrics.report(tmp_path)
    assert f"| fla_bwd/kernels.py | {len(KERNELS.splitlines())} | 5 | 2 | `Plan.run` 4 |" in md
    assert "| fla_bwd/kernels.py | `add_kernel` | 5 | 2 |" in md
    assert "## jit kernels: 1" in md
    assert "- fla_bwd.settings: 1: fla_bwd.kernels" in md
    assert "- fla_bwd/: 2" in md and "- tests/: 1" in md and "- scripts/: 0" in md
    assert "2 files, 3 lines" in md  # benchmarks/ code outside results/
    assert "- files under benchmarks/results/: 2 (1 code)" in md
    assert "- PERF.md: 3 lines" in md
