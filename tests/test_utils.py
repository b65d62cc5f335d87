# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The interpreter's fixes (`fla_bwd.ops.utils.triton_private`, importable from fla_bwd.utils): the bf16 fix (each of
its two patches is shown needed, and shown not to leak to another library's kernels; on an interpreter it does not
recognise it changes nothing and warns) and the index fix (on a simulated Triton 3.6 interpreter)."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE
from triton.runtime.errors import InterpreterError

import fla_bwd.utils as U
from fla_bwd.ops.utils import triton_private as P
from fla_bwd.ops.utils.cumsum import gate_cumsum
from fla_bwd.utils import interpreter_bf16_fix, interpreter_index_fix, is_interpreter

interpreter_only = pytest.mark.skipif(
    DEVICE == "cuda", reason="the bf16 fix patches Triton's CPU interpreter, which is not in use on the GPU")


@triton.jit
def _dot_kernel(a, b, c, N: tl.constexpr):
    o = tl.arange(0, N)
    p = o[:, None] * N + o[None, :]
    b_a = tl.load(a + p)
    b_b = tl.load(b + p)
    tl.store(c + p, tl.dot(b_a, b_b))


@triton.jit
def _count_kernel(y, n):
    b_y = tl.zeros([1], dtype=tl.int32)
    for _ in range(0, tl.cdiv(n, 4)):  # a run-time bound: range() takes the tensor's __index__
        b_y += 1
    tl.store(y + tl.arange(0, 1), b_y)


@triton.jit
def _cast_kernel(x, y, N: tl.constexpr):
    o = tl.arange(0, N)
    tl.store(y + o, tl.load(x + o).to(tl.bfloat16))


def _builder():
    from triton.runtime.interpreter import InterpreterBuilder
    return InterpreterBuilder


def _rel(ref, out):
    return ((ref.double() - out.double()).norm() / ref.double().norm()).item()


def _dot(a, b):
    c = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32, device=DEVICE)
    _dot_kernel[(1,)](a, b, c, N=a.shape[0])
    return c


def _cast(x):
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=DEVICE)
    _cast_kernel[(1,)](x, y, N=x.numel())
    return y


def _cast_inputs():
    """Normals at several magnitudes, values exactly half-way between two bf16 numbers (ties to even both ways),
    just above/below half-way, and the specials."""
    x = torch.randn(1024) * torch.logspace(-30, 30, 1024)
    ulp_half = torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -(1.0 + 2 ** -8), 3.0 + 2 ** -7])
    near = torch.tensor([1.0 + 2 ** -8 + 2 ** -20, 1.0 + 2 ** -8 - 2 ** -20, 0.1, 1 / 3, -2 / 3])
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.3895e38, 1e-40, -1e-45])
    tail = torch.cat([ulp_half, near, special])
    x[: tail.numel()] = tail
    return x.to(DEVICE)


def _bits(t):
    return t.view(torch.int16)


def _originals():
    """The builder's two methods as they are outside the fix."""
    return _builder().create_dot, _builder().cast_impl


@interpreter_only
def test_interpreter_in_use():
    assert is_interpreter()
    original_dot, original_cast = _originals()
    assert not getattr(original_dot, "_fla_bwd_fix", False), "the fix leaked out of a previous block"
    with interpreter_bf16_fix() as active:
        assert active is True
        assert _builder().create_dot is not original_dot and _builder().cast_impl is not original_cast
        with interpreter_bf16_fix() as inner:  # nests
            assert inner is True
        assert _builder().create_dot is not original_dot, "leaving an inner block must keep the fix"
    assert _builder().create_dot is original_dot and _builder().cast_impl is original_cast
    with pytest.raises(KeyError):
        with interpreter_bf16_fix():
            raise KeyError("inside the block")
    assert _builder().create_dot is original_dot and _builder().cast_impl is original_cast, "restored on error"


@interpreter_only
def test_bf16_dot_fix_is_needed(monkeypatch):
    a = torch.randn(16, 16, device=DEVICE).to(torch.bfloat16)
    b = torch.randn(16, 16, device=DEVICE).to(torch.bfloat16)
    ref = a.float() @ b.float()
    original_dot, _ = _originals()
    with interpreter_bf16_fix():
        assert _rel(ref, _dot(a, b)) < 1e-5
        monkeypatch.setattr(_builder(), "create_dot", original_dot)
        err = _rel(ref, _dot(a, b))
        assert err > 0.1, f"without the fix the bf16 dot should be wrong (integer bit patterns), error {err:.3g}"
        monkeypatch.undo()
        assert _rel(ref, _dot(a, b)) < 1e-5
    err = _rel(ref, _dot(a, b))
    assert err > 0.1, f"outside the block the interpreter's own dot must run again, error {err:.3g}"


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_dot_other_dtypes_unchanged(dtype):
    a = torch.randn(16, 16, device=DEVICE).to(dtype)
    b = torch.randn(16, 16, device=DEVICE).to(dtype)
    with interpreter_bf16_fix():
        assert _rel(a.float() @ b.float(), _dot(a, b)) < 1e-5


@interpreter_only
def test_bf16_rounding_fix_is_needed(monkeypatch):
    x = _cast_inputs()
    ref = x.to(torch.bfloat16)
    _, original_cast = _originals()
    nan = torch.isnan(x)
    with interpreter_bf16_fix():
        out = _cast(x)
        assert torch.isnan(out[nan]).all()
        # NaN payloads differ between implementations (torch gives 0xFFFF here): everything else bit for bit.
        assert torch.equal(_bits(out[~nan]), _bits(ref[~nan])), "fp32 -> bf16 must round to nearest even, bit for bit"
        monkeypatch.setattr(_builder(), "cast_impl", original_cast)
        unfixed = _cast(x)
        monkeypatch.undo()
    mismatched = (_bits(unfixed[~nan]) != _bits(ref[~nan])).sum().item()
    assert mismatched > 0, "without the fix the cast truncates, so some inputs must round differently"
    # Truncation never rounds away from zero: every mismatch among normal numbers lies towards zero.
    normal = (x.abs() >= torch.finfo(torch.float32).tiny) & torch.isfinite(x) & (_bits(unfixed) != _bits(ref))
    assert normal.any() and (unfixed[normal].float().abs() <= ref[normal].float().abs()).all()
    assert torch.equal(_bits(_cast(x)), _bits(unfixed)), "outside the block the interpreter's own cast runs again"


_FOREIGN = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder

    @triton.jit  # another library's kernel: a bf16 dot and an fp32 -> bf16 cast
    def foreign(a, b, c, x, y, N: tl.constexpr):
        o = tl.arange(0, N)
        p = o[:, None] * N + o[None, :]
        tl.store(c + p, tl.dot(tl.load(a + p), tl.load(b + p)))
        tl.store(y + p, tl.load(x + p).to(tl.bfloat16))

    def run():
        g = torch.Generator().manual_seed(0)
        a = torch.randn(16, 16, generator=g).bfloat16()
        b = torch.randn(16, 16, generator=g).bfloat16()
        x = torch.randn(16, 16, generator=g) * (1 + 2 ** -8)
        c = torch.empty(16, 16)
        y = torch.empty(16, 16, dtype=torch.bfloat16)
        foreign[(1,)](a, b, c, x, y, N=16)
        return c, y

    def methods():
        return dict(vars(InterpreterBuilder))

    before, c0, y0 = methods(), *run()  # fla_bwd not even imported: the interpreter as Triton ships it
    import fla_bwd.ops.attn
    from fla_bwd.ops.attn import parallel_attn
    c1, y1 = run()
    q = torch.randn(1, 20, 2, 16).bfloat16().requires_grad_()
    kv = torch.randn(1, 20, 1, 16).bfloat16().requires_grad_()
    parallel_attn(q, kv, kv).float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()
    c2, y2 = run()
    after = methods()
    changed = sorted(n for n in set(before) | set(after) if before.get(n) is not after.get(n))
    assert not changed, f"fla_bwd left InterpreterBuilder changed: {changed}"
    for name, c, y in (("import", c1, y1), ("call", c2, y2)):
        assert torch.equal(c, c0), f"another library's bf16 dot changed after fla_bwd's {name}"
        assert torch.equal(y.view(torch.int16), y0.view(torch.int16)), f"its bf16 cast changed after the {name}"
    # The comparison has teeth: Triton's own bf16 dot multiplies bit patterns (far from the true product), which
    # the fix, had it stayed, would have changed.
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=g).bfloat16(), torch.randn(16, 16, generator=g).bfloat16()
    true = a.float() @ b.float()
    assert ((c0 - true).norm() / true.norm()).item() > 0.1, "the unpatched interpreter's bf16 dot should be wrong"
    print("OK")
""")


@interpreter_only
def test_fix_does_not_leak_to_other_kernels():
    """A tiny non-fla_bwd bf16 kernel gives bitwise the same results before fla_bwd is imported, after the import,
    and after an fla_bwd forward + backward (which runs its bf16 kernels under the fix), and the interpreter's
    builder holds the same method objects: nothing of the fix stays in the process. In a fresh interpreter, so that
    no earlier test's state counts."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", _FOREIGN], cwd=root, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@pytest.fixture
def triton36_index(monkeypatch):
    """The interpreter as Triton 3.6 behaves under NumPy >= 2.4: a scalar's `__index__` converts its 1-element
    array, which raises (here by `operator.index`, which raises so under every NumPy)."""
    import operator

    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: operator.index(self.handle.data))

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", patch_lang_tensor)
    P.index_fix_needed.cache_clear()
    yield patch_lang_tensor
    monkeypatch.undo()
    P.index_fix_needed.cache_clear()


def _count(n):
    y = torch.full((1,), -1, dtype=torch.int32, device=DEVICE)
    _count_kernel[(1,)](y, n)
    return y.item()


@interpreter_only
def test_index_fix_is_needed_and_scoped(triton36_index):
    from triton.runtime import interpreter
    with pytest.raises(InterpreterError, match="integer"):
        _count(10)
    with interpreter_index_fix() as active:
        assert active is True
        with interpreter_index_fix() as inner:  # nests
            assert inner is True
        assert _count(10) == 3, "leaving an inner block must keep the fix"
    assert interpreter._patch_lang_tensor is triton36_index, "the interpreter's own function must be put back"
    with pytest.raises(KeyError):
        with interpreter_index_fix():
            raise KeyError("inside the block")
    assert interpreter._patch_lang_tensor is triton36_index, "restored on error"
    with pytest.raises(InterpreterError, match="integer"):
        _count(10)


@interpreter_only
def test_launcher_enters_index_fix(triton36_index):
    """The package's launches run under the fix: the gate scan's loop over 16-token chunks has a run-time bound."""
    g = torch.randn(1, 40, 2, device=DEVICE)  # 3 chunks
    ref = (g.cumsum(1) * 1.4426950408889634).permute(2, 0, 1).reshape(2, 40)  # gc in base-2 units, [HQ, B * T]
    torch.testing.assert_close(gate_cumsum(g, None), ref)  # fp32 defaults: rtol 1.3e-6, atol 1e-5


@interpreter_only
def test_index_fix_idle_where_not_needed():
    P.index_fix_needed.cache_clear()
    needed = P.index_fix_needed()
    from triton.runtime import interpreter
    before = interpreter._patch_lang_tensor
    with interpreter_index_fix() as active:
        assert active is needed
        assert (interpreter._patch_lang_tensor is before) is not needed
    assert interpreter._patch_lang_tensor is before


def test_fixes_importable_from_utils_without_importing_triton():
    """`fla_bwd.utils` hands out the very fixes of `triton_private`, and importing it alone imports no triton."""
    assert U.interpreter_bf16_fix is P.interpreter_bf16_fix and U.interpreter_index_fix is P.interpreter_index_fix
    with pytest.raises(AttributeError):
        U.no_such_name  # noqa: B018
    code = "import sys, fla_bwd.utils; assert 'triton' not in sys.modules, 'triton imported'; print('OK')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@interpreter_only
def test_bf16_fix_recognises_this_interpreter():
    assert P.bf16_fix_applies() is True


@pytest.fixture
def other_interpreter(monkeypatch):
    """An interpreter whose builder's `create_dot` takes other parameters than the one the bf16 fix was written for."""
    def create_dot(self, lhs, rhs, acc, precision, max_imprecise):
        raise AssertionError("never called here")

    monkeypatch.setattr(_builder(), "create_dot", create_dot)
    P.bf16_fix_applies.cache_clear()
    P._warn_bf16_unfixed.cache_clear()
    yield create_dot
    monkeypatch.undo()
    P.bf16_fix_applies.cache_clear()
    P._warn_bf16_unfixed.cache_clear()


@interpreter_only
def test_bf16_fix_leaves_an_unknown_interpreter_alone_and_says_so(other_interpreter):
    assert P.bf16_fix_applies() is False
    cast = _builder().cast_impl
    with pytest.warns(RuntimeWarning, match="bf16 results under the interpreter may differ"):
        with interpreter_bf16_fix() as active:
            assert active is False
            assert _builder().create_dot is other_interpreter and _builder().cast_impl is cast
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with interpreter_bf16_fix() as active:  # warned once a process
            assert active is False
