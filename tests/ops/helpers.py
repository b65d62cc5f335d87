# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Test cases and the comparison protocol shared by the attention tests.

Protocol: `parallel_attn` on inputs in the dtype under test, `torch.autograd.grad(o, inputs, do)`; the fp32 oracle
on the same tensors (one call per packed sequence), grads with `do.float()`; o and every gradient must have an
error ratio below 0.005 (`conftest.assert_close`).
"""

import dataclasses
import os
import signal
import subprocess
import sys
from typing import Callable, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, assert_close

import fla_bwd.ops.attn.host as host_module
from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclasses.dataclass(frozen=True)
class Case:
    B: int = 1
    T: int = 63
    HQ: int = 2
    H: int = 1
    K: int = 64
    V: Optional[int] = None  # None: V = K
    dtype: torch.dtype = torch.bfloat16
    gate: bool = False
    window: Optional[int] = None
    sink: Optional[float] = None  # None: no sink; float("nan"): randn(HQ); else that value + 0.5 * randn(HQ)
    cu_seqlens: Optional[Sequence[int]] = None  # packed: B must be 1 and T == cu_seqlens[-1]
    scale: Optional[float] = None
    g_dtype: torch.dtype = torch.float32
    sink_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        if self.cu_seqlens is not None:
            assert self.B == 1 and self.cu_seqlens[-1] == self.T, self

    @property
    def Vd(self) -> int:
        return self.K if self.V is None else self.V

    @property
    def id(self) -> str:
        parts = [f"B{self.B}", f"T{self.T}", f"HQ{self.HQ}", f"H{self.H}"]
        parts.append(f"D{self.K}" if self.V is None else f"K{self.K}V{self.V}")
        parts.append(_DTYPE_NAMES[self.dtype])
        if self.gate:
            parts.append("gate" if self.g_dtype == torch.float32 else f"gate_{_DTYPE_NAMES[self.g_dtype]}")
        if self.window is not None:
            parts.append(f"W{self.window}")
        if self.sink is not None:
            name = "sink" if self.sink != self.sink else f"sink{self.sink:+g}"
            parts.append(name if self.sink_dtype == torch.float32 else f"{name}_{_DTYPE_NAMES[self.sink_dtype]}")
        if self.cu_seqlens is not None:
            parts.append("cu" + "_".join(str(x) for x in self.cu_seqlens))
        if self.scale is not None:
            parts.append(f"scale{self.scale:g}")
        return "-".join(parts)


def params(cases):
    """pytest.param per case, with the case's readable id."""
    return [pytest.param(c, id=c.id) for c in cases]


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: Optional[torch.Tensor]
    sink_bias: Optional[torch.Tensor]
    cu_seqlens: Optional[torch.Tensor]
    do: torch.Tensor

    def grad_inputs(self) -> dict:
        """The tensors gradients are taken with respect to, by gradient name."""
        out = {"dq": self.q, "dk": self.k, "dv": self.v}
        if self.g is not None and self.g.requires_grad:
            out["dg"] = self.g
        if self.sink_bias is not None and self.sink_bias.requires_grad:
            out["dsink"] = self.sink_bias
        return out


def make_inputs(case: Case, device: str = DEVICE) -> Inputs:
    """Fresh normal(0, 1) q, k, v, do; g = logsigmoid(randn); sink_bias = randn(HQ) (or value + 0.5 * randn)."""
    B, T, HQ, H, K, V = case.B, case.T, case.HQ, case.H, case.K, case.Vd

    def randn(*shape, dtype):
        return torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)

    q = randn(B, T, HQ, K, dtype=case.dtype).requires_grad_()
    k = randn(B, T, H, K, dtype=case.dtype).requires_grad_()
    v = randn(B, T, H, V, dtype=case.dtype).requires_grad_()
    g = None
    if case.gate:
        g = F.logsigmoid(randn(B, T, HQ, dtype=torch.float32)).to(case.g_dtype).requires_grad_()
    sink = None
    if case.sink is not None:
        s = randn(HQ, dtype=torch.float32)
        if case.sink == case.sink:
            s = case.sink + 0.5 * s
        sink = s.to(case.sink_dtype).requires_grad_()
    cu = None
    if case.cu_seqlens is not None:
        cu = torch.tensor(case.cu_seqlens, dtype=torch.int32, device=device)
    do = randn(B, T, HQ, V, dtype=case.dtype)
    return Inputs(q, k, v, g, sink, cu, do)


def run_parallel(case: Case, x: Inputs, fn: Optional[Callable] = None) -> dict:
    """o and its gradients from the Triton op, by name ("o", "dq", ...)."""
    if fn is None:
        o = parallel_attn(x.q, x.k, x.v, g=x.g, scale=case.scale, window_size=case.window, cu_seqlens=x.cu_seqlens,
                          sink_bias=x.sink_bias)
    else:
        o = fn(x)
    wrt = x.grad_inputs()
    grads = torch.autograd.grad(o, list(wrt.values()), x.do)
    return {"o": o, **dict(zip(wrt, grads))}


def segments(case: Case):
    """[(bos, eos)] of the oracle's calls: each packed sequence (zero-length ones skipped), or the whole batch."""
    if case.cu_seqlens is None:
        return [(0, case.T)]
    cu = list(case.cu_seqlens)
    return [(a, b) for a, b in zip(cu, cu[1:]) if b > a]


def run_reference(case: Case, x: Inputs, oracle: Optional[Callable] = None) -> dict:
    """The fp32 oracle on the same tensors, one call per packed sequence, concatenated along T."""
    if oracle is None:
        def oracle(q, k, v, g, sink_bias):
            return naive_parallel_attn(q, k, v, scale=case.scale, window_size=case.window, g=g, sink_bias=sink_bias)
    wrt = x.grad_inputs()
    sink = x.sink_bias
    if "dsink" in wrt:  # an fp32 leaf: autograd would sum the sequences' dsink in sink_bias's dtype
        sink = wrt["dsink"] = sink.detach().float().requires_grad_()
    outs = []
    for bos, eos in segments(case):
        g = x.g[:, bos:eos] if x.g is not None else None
        outs.append(oracle(x.q[:, bos:eos], x.k[:, bos:eos], x.v[:, bos:eos], g, sink))
    assert outs, "every sequence is empty"
    o = torch.cat(outs, dim=1)
    grads = torch.autograd.grad(o, list(wrt.values()), x.do.float(), allow_unused=True)
    grads = [torch.zeros_like(t, dtype=torch.float32) if gr is None else gr for t, gr in zip(wrt.values(), grads)]
    return {"o": o, **dict(zip(wrt, grads))}


def compare(ref: dict, out: dict, ratio: float = 0.005, tag: str = "") -> None:
    """assert_close on every output (o first, then each gradient); collects all failures into one assertion."""
    assert ref.keys() == out.keys(), (ref.keys(), out.keys())
    errors = []
    for name in ref:
        try:
            assert_close(name + tag, ref[name], out[name], ratio)
        except AssertionError as e:
            errors.append(str(e))
    assert not errors, "; ".join(errors)


def check_against_oracle(case: Case, x: Optional[Inputs] = None, fn: Optional[Callable] = None,
                         oracle: Optional[Callable] = None) -> dict:
    """The whole protocol for one case; returns the Triton op's outputs."""
    x = make_inputs(case) if x is None else x
    out = run_parallel(case, x, fn)
    for name, t in out.items():
        if name != "o":
            src = x.grad_inputs()[name]
            assert t.dtype == src.dtype, f"{name} dtype {t.dtype} != input dtype {src.dtype}"
    assert out["o"].dtype == case.dtype
    ref = run_reference(case, x, oracle)
    compare(ref, out)
    return out


class DkvSpy:
    """Records the name of the dK/dV kernel of every seven-product backward (the plan's `route.dkv`,
    `host._backward_plan`) during a test."""

    def __init__(self, monkeypatch):
        self.paths = []
        original = host_module._backward_plan

        def spy(*args):
            plan = original(*args)
            if plan.route.dkv is not None:
                self.paths.append(plan.route.dkv.name)
            return plan

        monkeypatch.setattr(host_module, "_backward_plan", spy)


def run_isolated(module: str, func: str, *args, timeout: float = 600) -> None:
    """Run `module.func(*args)` in a fresh Python process (same conftest setup: interpreter without a GPU,
    poisoning on, a fixed seed) and fail with its output unless it exits cleanly.

    For inputs that made a kernel read or write out of bounds: that can abort the interpreter (or leave a GPU
    context unusable), which would take the whole session down instead of failing one test."""
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "\n".join([
        "import sys",
        f"sys.path[:0] = [{tests_dir!r}, {os.path.join(tests_dir, 'ops')!r}]",
        "import conftest",  # sets TRITON_INTERPRET before triton is imported
        "import torch",
        "import poison",
        "poison.install()",
        "torch.manual_seed(0)",
        f"import {module}",
        f"{module}.{func}(*{args!r})",
        "print('ISOLATED-OK')",
    ])
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    output = (proc.stdout + proc.stderr)[-6000:]
    if proc.returncode < 0:
        raise AssertionError(f"{module}.{func}{args!r} crashed the Python process "
                             f"(signal {signal.Signals(-proc.returncode).name}):\n{output}")
    assert proc.returncode == 0 and "ISOLATED-OK" in proc.stdout, \
        f"{module}.{func}{args!r} failed (exit status {proc.returncode}):\n{output}"
