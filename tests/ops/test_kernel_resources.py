# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Every kernel, at every tile-config class the launchers use, compiles for sm_90 (Hopper) and fits in the shared
memory one block may use there. Runs on a CPU machine (Triton compiles for a target without a GPU), in a
subprocess because the suite itself runs under the interpreter. Catches a config that only fails on the GPU: fp32
at D = 128 once asked for 256 KB in the forward.

The slowest tests of the CPU suite: 36 kernels a dtype, ~2.5 min each on 2 idle cores with a cold Triton cache
(seconds with a warm one). `scripts/compile_sm90.py` prints a line as each kernel is done, in a fixed order; the
test fails only when no line has come for a while (a hang, not a slow machine: the allowance grows with the load
average), says which kernel was reported last (the next ones were compiling), and always kills the script's whole
process group (its spawn workers and their ptxas processes too), so nothing outlives the test."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

# The kernels are compiled in a subprocess; this import makes the dependency visible to
# scripts/find_dependent_tests.py, which reads imports.
import fla_bwd.ops.attn.parallel  # noqa: F401

pytest.importorskip("triton.backends.nvidia")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "compile_sm90.py")
# Seconds without a new line from the script before it counts as hung. One kernel takes ~10 s on an idle core; the
# allowance is this times max(1, load average / cores). FLA_BWD_COMPILE_STALL_S overrides it.
STALL_S = 300.0


def stall_allowance() -> float:
    if os.environ.get("FLA_BWD_COMPILE_STALL_S"):
        return float(os.environ["FLA_BWD_COMPILE_STALL_S"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return STALL_S * max(1.0, os.getloadavg()[0] / cores)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group the script leads (its own session): the script, its workers, their ptxas."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_watched(cmd: list, env: dict) -> tuple:
    """(exit status, output lines) of `cmd`, stdout and stderr merged. Fails the test, naming the last kernel
    reported, when no line comes within `stall_allowance()` seconds."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, last = [], [time.monotonic()]

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            last[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while proc.poll() is None:
            allowance = stall_allowance()
            if time.monotonic() - last[0] > allowance:
                # The script reports kernels in a fixed order (D, then fwd/dq/dkv_per_query_head/dkv_per_kv_head,
                # each [inline]/[flag]/[fixup]): the ones compiling are the next after the last reported.
                done = [ln.split("{")[0].strip() for ln in lines if ln.startswith("D=") and "smem" in ln]
                pytest.fail(f"compile_sm90.py printed nothing for {allowance:.0f} s (load {os.getloadavg()[0]:.1f}); "
                            f"killed its process group. "
                            + (f"{len(done)} kernels reported, the last {done[-1]}: the next ones in order were "
                               "compiling.\n" if done else "No kernel reported: the first ones were compiling.\n")
                            + "\n".join(lines[-20:]), pytrace=False)
            time.sleep(0.5)
        reader.join(timeout=10)
        return proc.returncode, lines
    finally:
        kill_group(proc)  # also after a normal exit: no worker may be left behind


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_kernels_fit_hopper_shared_memory(dtype):
    """Compile every kernel for sm_90 with `dtype` inputs (scripts/compile_sm90.py --check-smem, 2 processes) and
    check each fits Hopper's 227 KB of shared memory per block."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # Two compile processes: 36 kernels per dtype take ~2.5 min in one on CI's 2 cores.
    rc, lines = run_watched([sys.executable, SCRIPT, "--dims", "64,128,256", "--dtype", dtype, "--check-smem",
                             "--jobs", "2"], env)
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    # 4 kernels x 3 CONTAIN modes (see `host.add_contained`) x 3 head dims, each reported; in 16 bits also the
    # per-KV-head dK/dV kernel at the short windows' tiles (`config.dkv_tiles`: D = 128 of these) in 3 modes
    assert out.count("smem") == 36 + (3 if dtype == "bfloat16" else 0), out


def test_five_product_kernels_fit_hopper_shared_memory():
    """The five-product backward's kernels (scripts/compile_sm90.py --five: the dK/dV kernel with its dS store,
    unsplit, at four programs a key tile and gated, in 3 CONTAIN modes each, dQ-from-dS plain and gated, the gate's
    key-side sum and its one-launch form with dg's scan, delta, and the gated forward and delta with o_lo) at the
    head dims it runs (16-bit, D <= 128)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    rc, lines = run_watched([sys.executable, SCRIPT, "--five", "--dims", "64,128", "--check-smem", "--jobs", "2"], env)
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    # (3 dK/dV forms x 3 CONTAIN modes + 2 dQ-from-dS + key side + gate grad by band + delta + forward and delta
    # with o_lo) x 2 dims
    assert out.count("smem") == (3 * 3 + 2 + 1 + 1 + 1 + 2) * 2, out


def test_hopper_dkv_kernel_fits_hopper_shared_memory():
    """The five-product backward's Gluon dK/dV kernel (`gluon_dkv.py`; scripts/compile_sm90.py --hopper: its three
    launch forms, fp32 sums read and/or written, each plain and gated) compiles for sm_90 with the Triton installed
    here and fits."""
    import fla_bwd.ops.attn.gluon_dkv  # noqa: F401 - for scripts/find_dependent_tests.py

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    rc, lines = run_watched([sys.executable, SCRIPT, "--hopper", "--check-smem"], env)
    out = "\n".join(lines)
    assert rc == 0, out[-4000:]
    assert out.count("smem") == 3 * 2, out
