# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""scripts/compile_sm90.py compiles what the GPU runs: Triton's JIT specialises a 16-byte aligned pointer (and an
integer that is a multiple of 16, unless the kernel says `do_not_specialize`) as divisible by 16, and the static
reports are only the GPU's code with the same specialisation (without it no load is vectorised or pipelined: the
dQ-from-dS kernel compiled to one stage of shared memory where the H200 ran three, PERF.md "Corrections")."""

import os
import re
import subprocess
import sys
import tempfile

import pytest

# The script runs in a subprocess; this import makes the dependency visible to scripts/find_dependent_tests.py.
import fla_bwd.ops.attn.from_ds  # noqa: F401

pytest.importorskip("triton.backends.nvidia")

SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
PROBE = f"""
import sys
sys.path.insert(0, {SCRIPTS!r})
import torch
import compile_sm90
from fla_bwd.ops.attn.from_ds import delta_kernel
t = torch.empty(1, dtype=torch.bfloat16)
c = compile_sm90.compile_sm90(delta_kernel, dict(o=t, o_lo=None, do=t, dlse=None, delta=torch.empty(1), R=1024,
                                                 NTOK=64, HQ=16, V=128, BR=32, BV=128), 4, 2)
print(next(line for line in c.asm["ttir"].splitlines() if "tt.func" in line))
"""


def test_arguments_are_specialised_as_the_jit_does():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory(prefix="fla_bwd-sm90-") as cache:  # a private Triton cache: nothing left behind
        env["TRITON_CACHE_DIR"] = cache
        out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    sig = out.stdout
    for ptr in ("o", "do", "delta"):
        assert re.search(rf"%{ptr}: !tt\.ptr<\w+> \{{tt\.divisibility = 16", sig), sig
    # R is a multiple of 16 but `do_not_specialize`; NTOK (also do_not_specialize) likewise.
    for name in ("R", "NTOK"):
        assert re.search(rf"%{name}: i32 loc", sig), sig
