# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Every kernel, at every tile-config class the launchers use, compiles for sm_90 (Hopper) and fits in the shared
memory one block may use there. Runs on a CPU machine (Triton compiles for a target without a GPU), in a
subprocess because the suite itself runs under the interpreter. Catches a config that only fails on the GPU: fp32
at D = 128 once asked for 256 KB in the forward."""

import os
import subprocess
import sys

import pytest

# The kernels are compiled in a subprocess; this import makes the dependency visible to
# scripts/find_dependent_tests.py, which reads imports.
import fla_bwd.ops.attn.parallel  # noqa: F401

pytest.importorskip("triton.backends.nvidia")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "compile_sm90.py")


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_kernels_fit_hopper_shared_memory(dtype):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # Two compile processes: 36 kernels per dtype take ~2.5 min in one on CI's 2 cores.
    proc = subprocess.run([sys.executable, SCRIPT, "--dims", "64,128,256", "--dtype", dtype, "--check-smem",
                           "--jobs", "2"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # 4 kernels x 3 CONTAIN modes (see `_launch_contained`) x 3 head dims, each reported
    assert proc.stdout.count("smem") == 36, proc.stdout
