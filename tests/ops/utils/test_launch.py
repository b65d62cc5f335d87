# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`fla_bwd.ops.utils.launch.Plan`: a plan's launch compiles through Triton's path once, then hands the compiled
kernel every parameter in signature order; the plan key (`host.call_of`) separates every kind of call a plan or a
kernel specialisation depends on. The direct path itself runs only on a GPU (the GPU suite exercises it on every
repeated call, and `tests/ops/test_attn_launch_paths.py` compares it with Triton's path); here a stand-in compiled
kernel checks its calls."""

import pytest
import torch
from conftest import DEVICE
from triton.runtime.jit import JITFunction

import fla_bwd.ops.utils.launch as launch
from fla_bwd import settings


def _toy(x, y, n, scale, C: "tl.constexpr"):  # noqa: F821 - a constexpr annotation, never evaluated
    pass


class _Compiled:
    """A stand-in compiled kernel with what Triton's CompiledKernel exposes for a direct launch."""

    def __init__(self):
        self.direct = []
        self.function, self.packed_metadata = "fn-handle", "packed"

    @property
    def run(self):
        return lambda *args: self.direct.append(args)


class _Wrapped:
    """A stand-in for triton.heuristics: `.fn` holds the JITFunction; `[grid](**kwargs)` is Triton's normal path
    (counted), which returns the compiled kernel."""

    def __init__(self):
        self.fn = JITFunction(_toy)
        self.compiled = _Compiled()
        self.normal = []

    def __getitem__(self, grid):
        def run(**kwargs):
            self.normal.append((grid, kwargs))
            return self.compiled
        return run


@pytest.fixture
def fast(monkeypatch):
    """Launches as on a GPU: not interpreted, the current stream 1234, allocations stand-ins."""
    monkeypatch.setattr(launch, "is_interpreter", lambda: False)
    monkeypatch.setattr(torch, "empty", lambda shape, dtype, device: ("buffer", shape))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    settings.set_fast_launch(True)
    yield
    settings.set_fast_launch(True)


def _plan(kernel, n=300):
    plan = launch.Plan(torch.device("cuda", 0))
    x = plan.empty("x", (8,), torch.float32)
    plan.launch(kernel, (5, 2), x=x, y=launch.Ref("y"), n=n, scale=0.25, C=4)
    return plan


def test_plan_compiles_once_then_launches_every_parameter_in_signature_order(fast):
    kernel = _Wrapped()
    plan = _plan(kernel)
    y1, y2 = torch.zeros(8), torch.ones(8)
    plan.run(dict(y=y1))  # Triton's path: compiles (here: returns the stand-in)
    assert len(kernel.normal) == 1 and kernel.normal[0][1]["y"] is y1 and kernel.normal[0][0] == (5, 2, 1)
    env = plan.run(dict(y=y2))
    assert len(kernel.normal) == 1
    # A tensor goes to the C launcher as its address (an int: no data_ptr() call and no driver query there); what
    # was not a tensor at the first launch (here the stand-in buffer) goes as it is.
    assert kernel.compiled.direct == [(5, 2, 1, 1234, "fn-handle", "packed", None, None, None,
                                       ("buffer", (8,)), y2.data_ptr(), 300, 0.25, 4)]
    assert env["x"] == ("buffer", (8,))
    y3 = torch.arange(8.0)[2:]
    plan.run(dict(y=y3))
    assert kernel.compiled.direct[-1][10] == y3.data_ptr() != y2.data_ptr()


def test_a_plans_own_tensor_goes_by_address(fast):
    """A tensor the plan holds itself (not a `Ref`, e.g. the Hopper kernel's schedule) is passed as its address
    too, and the plan keeps it alive."""
    kernel = _Wrapped()
    plan = launch.Plan(torch.device("cuda", 0))
    own = torch.arange(4)
    plan.launch(kernel, (3,), x=own, y=launch.Ref("y"), n=7, scale=1.0, C=2)
    y = torch.zeros(8)
    plan.run(dict(y=y))
    plan.run(dict(y=y))
    assert kernel.compiled.direct == [(3, 1, 1, 1234, "fn-handle", "packed", None, None, None, own.data_ptr(),
                                       y.data_ptr(), 7, 1.0, 2)]
    assert plan.steps[0].args["x"] is own


def test_fast_launch_off_or_a_hook_takes_tritons_path(fast):
    kernel = _Wrapped()
    plan = _plan(kernel)
    settings.set_fast_launch(False)
    for _ in range(3):
        plan.run(dict(y=torch.zeros(8)))
    settings.set_fast_launch(True)
    assert len(kernel.normal) == 3 and not kernel.compiled.direct
    hook = lambda *a, **k: None  # noqa: E731
    launch.knobs.runtime.launch_enter_hook.add(hook)
    try:
        plan.run(dict(y=torch.zeros(8)))
    finally:
        launch.knobs.runtime.launch_enter_hook.remove(hook)
    assert len(kernel.normal) == 4 and not kernel.compiled.direct
    plan.run(dict(y=torch.zeros(8)))
    assert len(kernel.normal) == 4 and len(kernel.compiled.direct) == 1


def test_plan_key_separates_what_a_plan_is_built_from(monkeypatch):
    """`host.call_of`'s key differs for every input property a plan (or Triton's specialisation of a kernel it
    launches) depends on, and is equal for other tensors of the same kind."""
    from fla_bwd.ops.attn.host import call_of

    def key(q=None, k=None, v=None, g=None, sink=None, cu=None, scale=0.125, window=0, T=32):
        q = torch.zeros(1, T, 4, 16) if q is None else q
        k = torch.zeros(1, T, 2, 16) if k is None else k
        return call_of(q, k, k if v is None else v, g, sink, cu, scale, window).key

    base = key()
    assert key() == base  # other tensors, same kind
    assert key(q=torch.zeros(1, 32, 4, 16, dtype=torch.float16), k=torch.zeros(1, 32, 2, 16,
                                                                               dtype=torch.float16)) != base
    assert key(q=torch.zeros(1 * 32 * 4 * 16 + 1)[1:].view(1, 32, 4, 16)) != base  # 4-byte offset: not aligned
    assert key(g=torch.zeros(1, 32, 4)) != base
    assert key(sink=torch.zeros(4)) != base
    assert key(scale=0.25) != base
    assert key(window=8) != base
    assert key(T=48) != base
    assert key(v=torch.zeros(1, 32, 2, 32)) != base
    assert key(cu=torch.tensor([0, 10, 32])) != base
    assert key(cu=torch.tensor([0, 10, 32])) == key(cu=torch.tensor([0, 22, 32]))  # same tile counts
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "inline")
    assert key() != base


@pytest.mark.parametrize("dtype,gate,sink", [(torch.float16, False, False), (torch.bfloat16, True, False),
                                             (torch.bfloat16, True, True)])
def test_partial_tiles_warn_nothing_and_leave_numpy_flags(dtype, gate, sink):
    """T not a multiple of any tile (rows past the end compute 0 / 0 in the forward unless a sink adds to l): no
    warning at all (as errors), and numpy's floating-point flags are what they were after the call (the launcher
    changes them only around its own interpreted launches)."""
    import warnings

    import numpy as np

    from fla_bwd.ops.attn import parallel_attn

    before = np.geterr()
    q = torch.randn(2, 37, 4, 32, device=DEVICE, dtype=dtype, requires_grad=True)
    k = torch.randn(2, 37, 2, 32, device=DEVICE, dtype=dtype, requires_grad=True)
    g = torch.nn.functional.logsigmoid(torch.randn(2, 37, 4, device=DEVICE)).requires_grad_() if gate else None
    s = torch.randn(4, device=DEVICE, requires_grad=True) if sink else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o = parallel_attn(q, k, k, g=g, window_size=5 if gate else None, sink_bias=s)
        o.float().sum().backward()
    assert np.geterr() == before
    assert torch.isfinite(o).all() and torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_scratch_launch_sets_torch_allocator_and_restores_the_callers():
    """A `scratch` launch (a kernel with device-side tensor descriptors) runs with torch's caching allocator as
    Triton's scratch allocator, and leaves the caller's allocator in place afterwards, also when the launch raises."""
    from triton.runtime import _allocation

    seen = []

    class _Kernel:
        def __getitem__(self, grid):
            def run(**kwargs):
                seen.append(_allocation._allocator.get())
                if kwargs["fail"]:
                    raise RuntimeError("launch failed")
            return run

    def mine(size, alignment, stream):
        raise AssertionError("not for our launches")

    previous = _allocation._allocator.get()
    _allocation._allocator.set(mine)
    try:
        for fail in (False, True):
            plan = launch.Plan(torch.device("cpu"))
            plan.launch(_Kernel(), (1,), scratch=True, fail=fail)
            if fail:
                with pytest.raises(RuntimeError, match="launch failed"):
                    plan.run({})
            else:
                plan.run({})
            assert seen[-1] is launch._torch_scratch
            assert _allocation._allocator.get() is mine
    finally:
        _allocation._allocator.set(previous)
