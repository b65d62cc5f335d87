# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`fla_bwd.ops.utils.launch.Plan`: a plan's launch compiles through Triton's path once, then hands the compiled
kernel every parameter in signature order; the plan key (`host.call_of`) separates every kind of call a plan or a
kernel specialisation depends on. The direct path itself runs only on a GPU (the GPU suite exercises it on every
repeated call, and `tests/ops/test_attn_launch_paths.py` compares it with Triton's path); here a stand-in compiled
kernel checks its calls. Under the CPU interpreter every launch takes Triton's public path (`kernel[grid](...)`).

The fallback: `fla_bwd.ops.utils.triton_private` refuses internals that are not as it expects (stand-ins of other
layouts here), and with every internal made unavailable a representative set of calls (forward + backward, gated
with a window, sinks over packed sequences, the five-product backward) gives bitwise what the default path gives,
on the GPU as on the CPU."""

import types
from typing import NamedTuple

import pytest
import torch
from conftest import DEVICE, assert_close
from triton import JITFunction

import fla_bwd.ops.utils.launch as launch
from fla_bwd import settings
from fla_bwd.ops.utils import triton_private


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


@pytest.mark.parametrize("internal", [True, False], ids=["context-var", "public-set-allocator"])
def test_scratch_launch_sets_torch_allocator_and_restores_the_callers(internal, monkeypatch):
    """A `scratch` launch (a kernel with device-side tensor descriptors) runs with torch's caching allocator as
    Triton's scratch allocator, and leaves the caller's allocator in place afterwards, also when the launch raises:
    through Triton's allocator variable, and through `triton.set_allocator` in a copied context where that
    variable is not found."""
    import triton

    var = triton_private._allocator_var()
    assert var is not None, "Triton 3.6-3.9 keep the allocator in a ContextVar"
    if not internal:
        monkeypatch.setattr(triton_private, "_allocator_var", lambda: None)
    seen = []

    class _Kernel:
        def __getitem__(self, grid):
            def run(**kwargs):
                seen.append(var.get())
                if kwargs["fail"]:
                    raise RuntimeError("launch failed")
            return run

    def mine(size, alignment, stream):
        raise AssertionError("not for our launches")

    token = var.set(mine)
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
            assert var.get() is mine
    finally:
        var.reset(token)
    assert triton.set_allocator is not None


# ----------------------------------------------------------------------------------------------------------------
# What `triton_private` accepts of Triton's internals, and the public path otherwise
# ----------------------------------------------------------------------------------------------------------------

class _Launcher36:
    """Triton 3.6's CUDA launcher names five parameters, then `*args`."""

    def __call__(self, gridX, gridY, gridZ, stream, function, *args):
        pass


class _Launcher39:
    """Triton 3.9's names all nine."""

    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata, launch_metadata, launch_enter_hook,
                 launch_exit_hook, *args):
        pass


class _Reordered:
    def __call__(self, gridX, gridY, gridZ, function, stream, *args):
        pass


class _Fixed:
    def __call__(self, gridX, gridY, gridZ, stream, function, kernel_metadata):
        pass


class _KeywordOnly:
    def __call__(self, *args, grid):
        pass


@pytest.mark.parametrize("run,ok", [(_Launcher36(), True), (_Launcher39(), True), (lambda *args: None, True),
                                    (_Reordered(), False), (_Fixed(), False), (_KeywordOnly(), False), (len, False)],
                         ids=["3.6", "3.9", "star-args", "reordered", "no-star-args", "keyword-only", "builtin"])
def test_direct_launcher_takes_only_the_known_argument_layout(run, ok):
    """`direct_launcher` hands out a compiled kernel's `run` only where it takes the grid, stream, function, packed
    metadata, launch metadata and two hooks, then the parameters (named so or not named at all)."""
    compiled = types.SimpleNamespace(run=run, function="fn", packed_metadata="packed")
    found = triton_private.direct_launcher(_Wrapped(), compiled)
    if ok:
        assert found == (run, "fn", "packed", ("x", "y", "n", "scale", "C"))
    else:
        assert found is None


def test_direct_launcher_needs_the_compiled_kernels_fields_and_a_jit_function():
    compiled = _Compiled()
    assert triton_private.direct_launcher(_Wrapped(), compiled) is not None
    for missing in ("function", "packed_metadata"):
        partial = type("Partial", (), {k: getattr(compiled, k) for k in ("run", "function", "packed_metadata")
                                       if k != missing})()
        assert triton_private.direct_launcher(_Wrapped(), partial) is None, missing
    assert triton_private.direct_launcher(type("NoJit", (), {"fn": _toy})(), compiled) is None


def test_hooks_of_another_shape_count_as_installed(monkeypatch):
    assert triton_private.launch_hooks_empty()
    monkeypatch.setattr(launch.knobs.runtime, "launch_exit_hook", object(), raising=False)
    assert not triton_private.launch_hooks_empty()
    monkeypatch.setattr(triton_private, "knobs", None)
    assert not triton_private.launch_hooks_empty()


def test_unrecognised_internals_keep_every_launch_on_tritons_path(fast, monkeypatch):
    """Where `direct_launcher` finds no launcher it knows, every call takes Triton's path, and it is asked once."""
    asked = []
    monkeypatch.setattr(triton_private, "direct_launcher", lambda kernel, compiled: asked.append(1))
    kernel = _Wrapped()
    plan = _plan(kernel)
    for _ in range(3):
        plan.run(dict(y=torch.zeros(8)))
    assert len(kernel.normal) == 3 and not kernel.compiled.direct and len(asked) == 1


@pytest.mark.skipif(DEVICE == "cuda", reason="the interpreter's launches")
def test_interpreter_never_reads_the_launch_internals(monkeypatch):
    """Under the CPU interpreter no launch takes the direct path or even asks for it: every one is Triton's public
    `kernel[grid](...)`, so every CPU test runs the fallback."""
    from fla_bwd.ops.attn import parallel_attn

    asked = []
    monkeypatch.setattr(triton_private, "direct_launcher", lambda kernel, compiled: asked.append(kernel))
    q = torch.randn(1, 20, 2, 16, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):
        parallel_attn(q, q[:, :, :1], q[:, :, :1]).float().sum().backward()
    assert not asked and launch._direct_stream(torch.device("cpu")) is None


def _internals_unavailable(m: pytest.MonkeyPatch) -> None:
    """Every internal of Triton made unavailable to the launch path, as on a Triton `triton_private` does not
    recognise: no direct launcher, no 3.6 descriptor launcher, no allocator variable, hooks of unknown shape."""
    from fla_bwd.ops.utils import descriptor_launch

    m.setattr(triton_private, "direct_launcher", lambda kernel, compiled: None)
    m.setattr(triton_private, "descriptor_launcher", lambda run: None)
    m.setattr(triton_private, "_allocator_var", lambda: None)
    m.setattr(launch, "_hooks_empty", lambda: False)
    m.setattr(descriptor_launch, "descriptor_launcher", lambda run: None)  # imported by name there


# (B, T, HQ, H, D, gate, window, sink, cu_seqlens, dq path): forward + backward of each through both paths
_FALLBACK_CASES = {
    "gqa-gated-window": (2, 70, 4, 2, 32, True, 24, False, None, "auto"),
    "sink-varlen": (1, 90, 4, 1, 32, False, None, True, (0, 17, 60, 90), "auto"),
    "five-product-gated": (1, 64, 4, 2, 64, True, None, False, None, "from-ds"),
}
if DEVICE == "cuda":  # sizes at which the GPU's own tiles and more than one program per axis come in
    _FALLBACK_CASES = {
        "gqa-gated-window": (2, 600, 8, 2, 128, True, 200, False, None, "auto"),
        "sink-varlen": (1, 900, 8, 1, 64, False, None, True, (0, 137, 600, 900), "auto"),
        "five-product-gated": (2, 512, 8, 2, 128, True, None, False, None, "from-ds"),
    }


def _forward_backward(case: tuple, inputs: dict) -> dict:
    from fla_bwd.ops.attn import parallel_attn

    *_, window, _, _, path = case
    leaves = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.requires_grad}
    with settings.dq_path(path):
        o = parallel_attn(inputs["q"], inputs["k"], inputs["v"], g=inputs["g"], window_size=window,
                          cu_seqlens=inputs["cu"], sink_bias=inputs["sink"])
        grads = torch.autograd.grad(o, list(leaves.values()), inputs["do"])
    return {"o": o, **{f"d{k}": g for k, g in zip(leaves, grads)}}


def _fallback_inputs(case: tuple) -> dict:
    B, T, HQ, H, D, gate, _, sink, cu, _ = case
    dt = torch.bfloat16

    def randn(*shape, dtype=dt):
        return torch.randn(*shape, device=DEVICE).to(dtype).requires_grad_()

    return dict(q=randn(B, T, HQ, D), k=randn(B, T, H, D), v=randn(B, T, H, D),
                g=torch.nn.functional.logsigmoid(torch.randn(B, T, HQ, device=DEVICE)).requires_grad_()
                if gate else None,
                sink=randn(HQ, dtype=torch.float32) if sink else None,
                cu=torch.tensor(cu, dtype=torch.int32, device=DEVICE) if cu else None,
                do=torch.randn(B, T, HQ, D, device=DEVICE).to(dt))


@pytest.mark.parametrize("name", list(_FALLBACK_CASES))
def test_public_path_gives_bitwise_the_same(name, monkeypatch):
    """Forward + backward by the default path (called twice: the second call of a plan launches directly on a GPU),
    with FLA_BWD_FAST_LAUNCH=0's switch, and with every internal made unavailable (`_internals_unavailable`, plans
    built anew): bitwise equal, and o close to the fp32 oracle (per packed sequence)."""
    from fla_bwd.ops.attn import host as host_module
    from fla_bwd.ops.attn import naive_parallel_attn

    case = _FALLBACK_CASES[name]
    x = _fallback_inputs(case)
    _forward_backward(case, x)
    default = _forward_backward(case, x)
    settings.set_fast_launch(False)
    try:
        switched = _forward_backward(case, x)
    finally:
        settings.set_fast_launch(True)
    host_module.clear_plans()  # plans built anew, their launches probing Triton's internals again
    with monkeypatch.context() as m:
        _internals_unavailable(m)
        without = _forward_backward(case, x)
        without_again = _forward_backward(case, x)
    for other in (switched, without, without_again):
        assert set(other) == set(default)
        for key in default:
            assert torch.equal(default[key], other[key]), key
    *_, window, _, cu, _ = case
    bounds = list(zip(cu[:-1], cu[1:])) if cu else [(0, x["q"].shape[1])]
    for a, b in bounds:
        part = {k: None if x[k] is None else x[k][:, a:b].detach().float() for k in ("q", "k", "v", "g")}
        sink = None if x["sink"] is None else x["sink"].detach()
        ref = naive_parallel_attn(part["q"], part["k"], part["v"], window_size=window, g=part["g"], sink_bias=sink)
        assert_close("o", ref, default["o"][:, a:b])



def test_rebased_descriptor_copies_fields_over_a_new_base():
    """`triton_private.rebased_descriptor`: the template's fields over another tensor, the template untouched (the
    Hopper step's descriptors from the second call of a plan on, which the GPU tests check end to end)."""
    from fla_bwd.ops.utils.triton_private import launch_head, rebased_descriptor

    class Descriptor:
        def __init__(self, base):
            self.base, self.shape, self.strides, self.block_shape = base, [4, 8], [8, 1], [2, 8]

    a, b = torch.zeros(4, 8), torch.ones(4, 8)
    template = rebased_descriptor(Descriptor(a), None)
    moved = rebased_descriptor(template, b)
    assert type(moved) is Descriptor and moved.base is b and template.base is None
    assert (moved.shape, moved.strides, moved.block_shape) == ([4, 8], [8, 1], [2, 8])

    class Found(NamedTuple):
        cooperative: bool = False
        pdl: bool = True

    assert launch_head(Found(), "fn", "packed") == ("fn", False, True, None, None, "packed", None, None, None)
