# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`fla_bwd.ops.utils.launch.Launcher`: the cache key separates every specialisation Triton compiles apart, and a
cached compiled kernel receives every parameter in signature order. The fast path itself runs only on a GPU (the
GPU suite exercises it on every repeated call); here a stand-in compiled kernel checks its calls."""

import pytest
import torch
from conftest import DEVICE
from triton.runtime.jit import JITFunction

import fla_bwd.ops.utils.launch as launch
from fla_bwd import settings


def _toy(x, y, n, scale, C: "tl.constexpr"):  # noqa: F821 - a constexpr annotation, never evaluated
    pass


class _Compiled:
    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        x, y, z = grid  # like triton's CompiledKernel runner, which reads grid[0], grid[1] and grid[2]
        return lambda *args: self.calls.append((grid, args))

    def run(self, *args):  # present on a real compiled kernel; the launcher only checks that it exists
        raise AssertionError("not called directly")


class _Wrapped:
    """A stand-in for triton.heuristics: `.fn` holds the JITFunction; a launch compiles (counted) and returns."""

    def __init__(self):
        self.fn = JITFunction(_toy)
        self.compiled = _Compiled()
        self.launches = 0

    def __getitem__(self, grid):
        def run(**kwargs):
            self.launches += 1
            return self.compiled
        return run


@pytest.fixture
def launcher(monkeypatch):
    monkeypatch.setattr(launch, "is_interpreter", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    settings.set_fast_launch(True)
    return launch.Launcher(_Wrapped())


def _key(launcher, **kwargs):
    if not launcher.names:
        launcher._bind()
    base = dict(x=torch.zeros(8), y=None, n=100, scale=0.5, C=4, num_warps=4)
    return launcher.key({**base, **kwargs})


def test_key_separates_specialisations(launcher):
    base = _key(launcher)
    assert _key(launcher, n=200) == base  # neither 1 nor a multiple of 16, both int32: one kernel
    assert _key(launcher, x=torch.zeros(8, dtype=torch.float16)) != base  # dtype
    assert _key(launcher, x=torch.zeros(9)[1:]) != base  # 4-byte offset: not 16-byte aligned
    assert _key(launcher, y=torch.zeros(8)) != base  # None vs a tensor
    assert _key(launcher, n=2 ** 31) != base  # int64
    assert _key(launcher, n=1) != base  # == 1
    assert _key(launcher, n=32) != base  # multiple of 16
    assert _key(launcher, C=8) != base  # constexpr value
    assert _key(launcher, num_warps=8) != base  # launch option


def test_cached_kernel_gets_every_parameter_in_order(launcher):
    x, y = torch.zeros(8), torch.zeros(8)
    launcher((3,), x=x, y=y, n=100, scale=0.5, C=4)
    assert launcher.kernel.launches == 1 and not launcher.kernel.compiled.calls
    launcher((5,), x=x, y=y, n=300, scale=0.25, C=4)
    assert launcher.kernel.launches == 1
    assert launcher.kernel.compiled.calls == [((5, 1, 1), (x, y, 300, 0.25, 4))]
    launcher((5,), x=x, y=y, n=300, scale=0.25, C=8)  # a new constexpr: Triton's path again
    assert launcher.kernel.launches == 2


def test_fast_launch_off_always_takes_tritons_path(launcher):
    settings.set_fast_launch(False)
    try:
        for _ in range(3):
            launcher((1,), x=torch.zeros(8), y=None, n=100, scale=0.5, C=4)
    finally:
        settings.set_fast_launch(True)
    assert launcher.kernel.launches == 3 and not launcher.kernel.compiled.calls


def test_unsupported_argument_type_is_named(launcher):
    with pytest.raises(TypeError, match="unsupported argument type list"):
        _key(launcher, n=[1])


class _CompiledWithLauncher(_Compiled):
    """A stand-in that also has what Triton's CompiledKernel exposes for a direct launch."""

    def __init__(self):
        super().__init__()
        self.direct = []
        self.function, self.packed_metadata = "fn-handle", "packed"

    @property
    def run(self):
        return lambda *args: self.direct.append(args)


def test_direct_launch_skips_the_runner_unless_a_hook_is_installed(launcher, monkeypatch):
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    launcher.kernel.compiled = compiled = _CompiledWithLauncher()
    x, y = torch.zeros(8), torch.zeros(8)
    launcher((3,), x=x, y=y, n=100, scale=0.5, C=4)  # Triton's path: compiles, caches
    launcher((5, 2), x=x, y=y, n=300, scale=0.25, C=4)
    assert compiled.direct == [(5, 2, 1, 1234, "fn-handle", "packed", None, None, None, x, y, 300, 0.25, 4)]
    assert not compiled.calls
    hook = lambda *a, **k: None  # noqa: E731
    launch.knobs.runtime.launch_enter_hook.add(hook)
    try:
        launcher((7,), x=x, y=y, n=300, scale=0.25, C=4)
    finally:
        launch.knobs.runtime.launch_enter_hook.remove(hook)
    assert compiled.calls == [((7, 1, 1), (x, y, 300, 0.25, 4))] and len(compiled.direct) == 1


def test_launch_each_launches_every_value_in_order_under_the_key_of_each(launcher):
    x, y = torch.zeros(8), torch.zeros(8)
    args = dict(x=x, y=y, n=100, scale=0.5)
    launcher.launch_each((3,), dict(args, C=None), "C", (4, 8))  # both values compile once, through Triton's path
    assert launcher.kernel.launches == 2 and not launcher.kernel.compiled.calls
    launcher.launch_each((3,), dict(args, C=None), "C", (4, 8))
    assert launcher.kernel.launches == 2
    assert launcher.kernel.compiled.calls == [((3, 1, 1), (x, y, 100, 0.5, 4)), ((3, 1, 1), (x, y, 100, 0.5, 8))]
    # the key launch_each derived for C=8 is the one a plain launch computes: a cache hit, not a third compile
    launcher((3,), **args, C=8)
    assert launcher.kernel.launches == 2 and len(launcher.kernel.compiled.calls) == 3


def test_launch_each_refuses_a_runtime_parameter(launcher):
    args = dict(x=torch.zeros(8), y=torch.zeros(8), n=100, scale=0.5, C=4)
    with pytest.raises(ValueError, match="'n' must be a constexpr"):
        launcher.launch_each((3,), args, "n", (100, 200))


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
