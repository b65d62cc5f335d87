# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`python -m fla_bwd`: a report of the environment fla_bwd runs in, then a small self-check.

    python -m fla_bwd [--no-check] [--tolerance RATIO]

The report (for bug reports, like `python -m torch.utils.collect_env`): fla_bwd's version and location, Python,
torch, Triton, the GPU (name, compute capability) or the CPU interpreter, which launch path the kernels take, the
Triton cache directory and its size, and the FLA_BWD_* settings in effect. The self-check runs one small gated GQA
forward and backward and compares o and every gradient with the fp32 oracle (`naive_parallel_attn`) by error ratio
rms(ref - out) / rms(ref), the test suite's rule. Exit status 0 when everything passes, 1 otherwise.

Without CUDA, TRITON_INTERPRET=1 is set before Triton is imported (Triton picks interpreted or compiled kernels at
import), so the check runs under the CPU interpreter.
"""

import argparse
import os
import platform
import sys
from typing import Callable, Optional

import fla_bwd

# The self-check: a gated GQA call with a window, a ragged tile and head dims that differ, in bf16; the test suite's
# error-ratio limit.
CHECK_SHAPE = dict(B=1, T=24, HQ=2, H=1, K=32, V=16)
CHECK_WINDOW = 16
DEFAULT_TOLERANCE = 0.005


def _choose_interpreter() -> bool:
    """Whether CUDA is available; without it, turn Triton's interpreter on while Triton is not imported yet."""
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    return cuda


def _gpu_lines(cuda: bool) -> list:
    import torch

    if not cuda:
        return [("GPU", "no GPU: the interpreter (TRITON_INTERPRET=1) runs the kernels")]
    i = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(i)
    return [("GPU", f"{torch.cuda.get_device_name(i)}, compute capability {major}.{minor} "
                    f"(device {i} of {torch.cuda.device_count()})"),
            ("CUDA (torch build)", str(torch.version.cuda))]


def _launch_path(cuda: bool) -> str:
    """The path `fla_bwd.ops.utils.launch` takes, from its own rule (`_direct_stream`) and the reasons it checks."""
    import torch

    from fla_bwd.ops.utils import launch, triton_private
    from fla_bwd.utils import is_interpreter

    if is_interpreter():
        return "public (kernel[grid](...)): the interpreter runs every launch"
    if not cuda:
        return "none: no GPU and the interpreter is off"
    if launch._direct_stream(torch.device("cuda", torch.cuda.current_device())) is not None:
        return ("fast direct launch (the compiled kernel's launcher; a kernel whose Triton internals do not check "
                "out at its first launch takes the public path)")
    if not triton_private.launch_hooks_empty():
        return "public (kernel[grid](...)): a launch hook (a profiler) is installed"
    return "public (kernel[grid](...)): FLA_BWD_FAST_LAUNCH=0 or fla_bwd.settings.set_fast_launch(False)"


def _triton_cache() -> tuple:
    """(directory, its size in words)."""
    try:
        from triton import knobs
        directory = knobs.cache.dir
    except (ImportError, AttributeError):  # a Triton without knobs: its documented default
        directory = os.path.join(os.path.expanduser("~"), ".triton", "cache")
    if not os.path.isdir(directory):
        return directory, "not created yet"
    size, files = 0, 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:  # removed while walking
                pass
    return directory, f"{size / 2**20:.1f} MiB in {files} files"


def _settings() -> tuple:
    """(text, ok): the FLA_BWD_* settings the backward reads, through `dispatch.knobs`."""
    from fla_bwd.ops.attn import dispatch

    try:
        k = dispatch.knobs()
    except ValueError as e:
        return f"invalid: {e}", False
    return (f"FLA_BWD_DKV_PATH={k.dkv_path} FLA_BWD_DQ_PATH={k.dq_path} FLA_BWD_DS_KERNEL={k.ds_kernel} "
            f"FLA_BWD_CONTAINMENT={k.containment} FLA_BWD_DS_BUDGET_MIB={k.ds_budget / 2**20:g}"), True


def report(cuda: bool, out: Callable[[str], None] = print) -> bool:
    """Print the environment; False where it found something that stops the op (an invalid setting)."""
    import torch
    import triton

    lines = [
        ("fla_bwd", f"{fla_bwd.__version__} ({os.path.dirname(fla_bwd.__file__)})"),
        ("Python", f"{platform.python_version()} ({platform.python_implementation()}, {platform.platform()})"),
        ("torch", torch.__version__),
        ("Triton", f"{triton.__version__} ({os.path.dirname(triton.__file__)})"),
        *_gpu_lines(cuda),
        ("Launch path", _launch_path(cuda)),
    ]
    directory, size = _triton_cache()
    lines.append(("Triton cache", f"{directory} ({size})"))
    text, ok = _settings()
    lines.append(("Settings", text))
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        out(f"{name + ':':<{width + 1}} {value}")
    return ok


def _error_ratio(ref, out) -> float:
    """rms(ref - out) / rms(ref) in fp64 (the absolute rms of out where ref is 0)."""
    ref, out = ref.detach().double(), out.detach().double()
    err = (ref - out).pow(2).mean().sqrt().item()
    base = ref.pow(2).mean().sqrt().item()
    return err / base if base else err


def self_check(cuda: bool, tolerance: float = DEFAULT_TOLERANCE, out: Callable[[str], None] = print) -> bool:
    """One forward and backward of `parallel_attn` against the fp32 oracle; prints each error ratio and PASS/FAIL."""
    import torch
    import torch.nn.functional as F

    from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn

    s = CHECK_SHAPE
    device = "cuda" if cuda else "cpu"
    gen = torch.Generator().manual_seed(0)

    def leaf(*shape, transform=None):
        x = torch.randn(*shape, generator=gen)
        x = transform(x) if transform is not None else x
        return x.to(device)

    q = leaf(s["B"], s["T"], s["HQ"], s["K"]).bfloat16().requires_grad_()
    k = leaf(s["B"], s["T"], s["H"], s["K"]).bfloat16().requires_grad_()
    v = leaf(s["B"], s["T"], s["H"], s["V"]).bfloat16().requires_grad_()
    g = leaf(s["B"], s["T"], s["HQ"], transform=F.logsigmoid).requires_grad_()
    do = leaf(s["B"], s["T"], s["HQ"], s["V"]).bfloat16()
    shape = ", ".join(f"{n}={x}" for n, x in s.items())
    out(f"Self-check: bf16, {shape}, gate, window {CHECK_WINDOW} on {device}; error ratio "
        f"rms(ref - out) / rms(ref) against the fp32 oracle, limit {tolerance:g}")
    try:
        o = parallel_attn(q, k, v, g=g, window_size=CHECK_WINDOW)
        grads = torch.autograd.grad(o, (q, k, v, g), do)
    except Exception as e:  # any failure to run is the check's answer
        out(f"  FAIL: {type(e).__name__}: {e}")
        return False
    refs = [x.detach().float().requires_grad_() for x in (q, k, v, g)]
    ref_o = naive_parallel_attn(*refs[:3], window_size=CHECK_WINDOW, g=refs[3])
    ref_grads = torch.autograd.grad(ref_o, refs, do.float())
    ok = True
    for name, ref, got in zip(("o", "dq", "dk", "dv", "dg"), (ref_o, *ref_grads), (o, *grads)):
        finite = bool(torch.isfinite(got).all())
        r = _error_ratio(ref, got) if finite else float("nan")
        passed = finite and r < tolerance
        ok &= passed
        out(f"  {name:<3} {r:.3e}  {'ok' if passed else 'FAIL'}")
    out("PASS" if ok else "FAIL")
    return ok


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fla_bwd", description=__doc__.splitlines()[0])
    parser.add_argument("--no-check", action="store_true", help="print the report only, skip the self-check")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"the self-check's error-ratio limit (default {DEFAULT_TOLERANCE})")
    args = parser.parse_args(argv)
    cuda = _choose_interpreter()
    ok = report(cuda)
    if not args.no_check:
        ok = self_check(cuda, args.tolerance) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
