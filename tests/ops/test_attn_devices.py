# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tensors the kernels cannot run on get a clear ValueError before any kernel: CPU tensors when Triton's interpreter
is off, any tensor when TRITON_INTERPRET=1 was set too late (after `import triton`), real meta tensors, and tensors
on two devices. The interpreter cases run in a fresh Python process (the interpreter is chosen at import)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import DEVICE

from fla_bwd.ops.attn import parallel_attn
from fla_bwd.ops.utils import checks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CALL = """
import torch
from fla_bwd.ops.attn import parallel_attn
from fla_bwd.ops.utils import checks
from fla_bwd.ops.utils import launch

def forbidden(*args, **kwargs):
    raise AssertionError("a launcher or an allocation started")

launch.Plan.run = forbidden  # every buffer and launch of a call goes through it
q = torch.randn(1, 8, 2, 16)
try:
    parallel_attn(q, q[:, :, :1], q[:, :, :1])
except ValueError as e:
    print("MODE", checks.triton_mode())
    print("ERROR", e)
else:
    print("NO ERROR")
"""


def _run(prelude: str, env_interpret):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if env_interpret is not None:
        env["TRITON_INTERPRET"] = env_interpret
    code = textwrap.dedent(prelude) + _CALL
    # A subprocess that overruns is killed by subprocess.run (TimeoutExpired fails the test).
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_cpu_without_interpreter():
    out = _run("", None)
    assert "MODE compiled" in out, out
    assert "ERROR q is on the CPU but Triton's interpreter is off: set TRITON_INTERPRET=1 before importing triton " \
           "or fla_bwd, or move the tensors to a CUDA device" in out, out


def test_variable_set_after_fla_bwd_import():
    """Set after `import fla_bwd`: the kernels are compiled already; the message says the variable came too late."""
    out = _run("""
        import fla_bwd.ops.attn, os
        os.environ["TRITON_INTERPRET"] = "1"
    """, None)
    assert "MODE compiled" in out, out
    assert "ERROR q is on the CPU but Triton's interpreter is off (TRITON_INTERPRET is set now, but was not when " \
           "triton and fla_bwd were imported" in out, out
    assert "set TRITON_INTERPRET=1 before importing triton or fla_bwd" in out, out


def test_variable_set_after_triton_import():
    """Set after `import triton` but before fla_bwd: our kernels are InterpretedFunction, triton.language's helpers
    JITFunction; a launch would fail with "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    out = _run("""
        import triton, os
        os.environ["TRITON_INTERPRET"] = "1"
    """, None)
    assert "MODE mixed" in out, out
    assert "ERROR q cannot be processed: Triton's interpreter is only half on" in out, out
    assert "set TRITON_INTERPRET=1 before importing triton" in out, out


def test_interpreter_on_from_the_start():
    """The variable set before triton: the check passes and the call reaches the (stubbed) launch."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = "import torch\nfrom fla_bwd.ops.utils import checks\n" + _CALL.replace("except ValueError", "except "
                                                                                  "AssertionError")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "MODE interpreted" in r.stdout, r.stdout + r.stderr
    assert "a launcher or an allocation started" in r.stdout, r.stdout


@pytest.mark.skipif(DEVICE == "cuda", reason="this process runs the interpreter only without a GPU")
def test_mode_in_this_process():
    assert checks.triton_mode() == checks.INTERPRETED


@pytest.mark.parametrize("with_gate", [False, True], ids=["plain", "gate+sink"])
def test_meta_tensors(with_gate):
    q = torch.randn(1, 8, 4, 16, device="meta")
    k = torch.randn(1, 8, 2, 16, device="meta")
    kw = {}
    if with_gate:
        kw = {"g": torch.zeros(1, 8, 4, device="meta"), "sink_bias": torch.zeros(4, device="meta")}
    with pytest.raises(ValueError, match=r"^q is a meta tensor \(a shape without data\).*pass real tensors on a CUDA "
                                         r"device"):
        parallel_attn(q, k, k, **kw)


def test_fake_tensors_are_not_refused():
    """FakeTensors (what torch.compile traces with) pass the check, a meta one included."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(1, 8, 4, 16, device="meta")
        k = torch.empty(1, 8, 2, 16, device="meta")
    checks.check_attn_inputs(q, k, k, None, None, None, None, None)


@pytest.mark.parametrize("which", ["k", "v", "g", "sink_bias"])
def test_mixed_devices(which):
    """q on this process's device, one other tensor on meta (the second device a CPU-only machine has)."""
    q = torch.randn(1, 8, 4, 16, device=DEVICE)
    args = {"q": q, "k": torch.randn(1, 8, 2, 16, device=DEVICE), "v": torch.randn(1, 8, 2, 16, device=DEVICE),
            "g": torch.zeros(1, 8, 4, device=DEVICE), "sink_bias": torch.zeros(4, device=DEVICE)}
    args[which] = args[which].to("meta")
    with pytest.raises(ValueError, match=r"must be on one device, got .*: move them to one device") as info:
        parallel_attn(**args)
    assert f"{which} on meta" in str(info.value) and f"q on {DEVICE}" in str(info.value), str(info.value)


def test_mixed_devices_q_on_meta():
    q = torch.randn(1, 8, 4, 16, device="meta")
    k = torch.randn(1, 8, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"must be on one device, got .*: move them to one device") as info:
        parallel_attn(q, k, k)
    assert f"k on {DEVICE}" in str(info.value) and "q on meta" in str(info.value), str(info.value)


def test_cu_seqlens_on_another_device():
    q = torch.randn(1, 8, 4, 16, device=DEVICE)
    k = torch.randn(1, 8, 2, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"^cu_seqlens must be on the inputs' device.*move it with "
                                         r"cu_seqlens.to\(q.device\)"):
        parallel_attn(q, k, k, cu_seqlens=torch.tensor([0, 8], device="meta"))
