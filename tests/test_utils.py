# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""fla_bwd.utils: buffer poisoning, and the interpreter's bf16 fix (each of its two patches is shown needed)."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

from fla_bwd.utils import empty, install_interpreter_bf16_fix, is_interpreter, poison_enabled, set_poison

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


@interpreter_only
def test_interpreter_in_use():
    assert is_interpreter()
    assert install_interpreter_bf16_fix() is True
    assert install_interpreter_bf16_fix() is True  # idempotent
    originals = _builder()._fla_bwd_originals
    assert len(originals) == 2
    assert _builder().create_dot is not originals[0] and _builder().cast_impl is not originals[1]


@interpreter_only
def test_bf16_dot_fix_is_needed(monkeypatch):
    install_interpreter_bf16_fix()
    a = torch.randn(16, 16, device=DEVICE).to(torch.bfloat16)
    b = torch.randn(16, 16, device=DEVICE).to(torch.bfloat16)
    ref = a.float() @ b.float()
    assert _rel(ref, _dot(a, b)) < 1e-5
    original_dot, _ = _builder()._fla_bwd_originals
    monkeypatch.setattr(_builder(), "create_dot", original_dot)
    err = _rel(ref, _dot(a, b))
    assert err > 0.1, f"without the fix the bf16 dot should be wrong (integer bit patterns), error {err:.3g}"
    monkeypatch.undo()
    assert _rel(ref, _dot(a, b)) < 1e-5


@interpreter_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_dot_other_dtypes_unchanged(dtype):
    install_interpreter_bf16_fix()
    a = torch.randn(16, 16, device=DEVICE).to(dtype)
    b = torch.randn(16, 16, device=DEVICE).to(dtype)
    assert _rel(a.float() @ b.float(), _dot(a, b)) < 1e-5


@interpreter_only
def test_bf16_rounding_fix_is_needed(monkeypatch):
    install_interpreter_bf16_fix()
    x = _cast_inputs()
    ref = x.to(torch.bfloat16)
    out = _cast(x)
    nan = torch.isnan(x)
    assert torch.isnan(out[nan]).all()
    # NaN payloads differ between implementations (torch gives 0xFFFF here): everything else bit for bit.
    assert torch.equal(_bits(out[~nan]), _bits(ref[~nan])), "fp32 -> bf16 must round to nearest even, bit for bit"
    _, original_cast = _builder()._fla_bwd_originals
    monkeypatch.setattr(_builder(), "cast_impl", original_cast)
    unfixed = _cast(x)
    mismatched = (_bits(unfixed[~nan]) != _bits(ref[~nan])).sum().item()
    assert mismatched > 0, "without the fix the cast truncates, so some inputs must round differently"
    # Truncation never rounds away from zero: every mismatch among normal numbers lies towards zero.
    normal = (x.abs() >= torch.finfo(torch.float32).tiny) & torch.isfinite(x) & (_bits(unfixed) != _bits(ref))
    assert normal.any() and (unfixed[normal].float().abs() <= ref[normal].float().abs()).all()


def test_empty_is_poisoned_when_on():
    assert poison_enabled()  # the autouse fixture turned it on
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        t = empty(3, 5, dtype=dtype, device=DEVICE)
        assert t.shape == (3, 5) and t.dtype == dtype and t.device.type == torch.device(DEVICE).type
        assert torch.isnan(t).all()
    t = empty(4, dtype=torch.int32, device=DEVICE)  # integer buffers cannot hold NaN: plain allocation
    assert t.shape == (4,) and t.dtype == torch.int32


def test_set_poison_toggles():
    try:
        set_poison(False)
        assert not poison_enabled()
        t = empty(2, 2, dtype=torch.float32, device=DEVICE)
        assert t.shape == (2, 2) and t.dtype == torch.float32
        set_poison(1)
        assert poison_enabled() is True
        assert torch.isnan(empty(2, 2, dtype=torch.float32, device=DEVICE)).all()
    finally:
        set_poison(True)
