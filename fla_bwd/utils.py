# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Package-wide helpers: buffer allocation (NaN-poisoned under test), host integer arithmetic, interpreter detection
and its bf16 fix."""

import functools
import os

import torch

# Every buffer the package hands to a kernel comes from `empty`. With poisoning on (tests turn it on through
# `set_poison(True)` or FLA_BWD_POISON=1) floating buffers are filled with NaN, so an element no kernel
# writes shows up as a failed comparison instead of a stale value that happens to be close.
_POISON = os.environ.get("FLA_BWD_POISON", "0") == "1"


def set_poison(enabled: bool) -> None:
    global _POISON
    _POISON = bool(enabled)


def poison_enabled() -> bool:
    return _POISON


# Host-side integer helpers. `triton.cdiv` and `triton.next_power_of_2` are constexpr functions (usable inside
# kernels); called from Python they unwrap their arguments first and cost ~1.5 us each, several per launch.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def empty(*shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if _POISON and dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


@functools.cache
def is_interpreter() -> bool:
    # Read once: Triton decides interpreted or compiled when a kernel is decorated (at import), so the answer cannot
    # change in a process; the launch path asks on every launch, and os.environ.get costs ~0.8 us here.
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def install_interpreter_bf16_fix() -> bool:
    """Make bf16 arithmetic under Triton's CPU interpreter match the GPU; returns True once installed.

    Two interpreter defects (triton-lang/triton issue 11584; both still present in Triton 3.9):
    - it stores bf16 tensors as their raw uint16 bit patterns and `create_dot` hands them to `np.matmul`
      unchanged, so a bf16 `tl.dot` multiplies integers. We widen bf16 operands to fp32 first (a 16-bit left
      shift of the bit pattern, exact).
    - its fp32 -> bf16 cast truncates the mantissa, where the GPU rounds to nearest even; truncation biases every
      rounded P and every stored output (o's error ratio against the fp32 oracle doubled, 1.9e-3 -> 3.9e-3).
      We round to nearest even, as `torch.Tensor.to(torch.bfloat16)` does.
    Only the interpreter's builder is patched, only for bf16; compiled GPU kernels never run this code. Every
    launch through `fla_bwd.ops.utils.launch.Launcher` calls this when `TRITON_INTERPRET=1`; `tests/test_utils.py`
    shows each fix is needed.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - a triton without the interpreter module
        return False
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_fla_bwd_fix", False):
        return True
    original_dot, original_cast = builder.create_dot, builder.cast_impl

    def widen(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            nan = np.isnan(src.data)
            rounded[nan] = 0x7FC0
            return interpreter.TensorHandle(rounded, tl.bfloat16)
        return original_cast(self, src, dst_type)

    create_dot._fla_bwd_fix = True
    builder.create_dot, builder.cast_impl = create_dot, cast_impl
    builder._fla_bwd_originals = (original_dot, original_cast)
    return True
