# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Package-wide helpers: buffer allocation (NaN-poisoned under test), interpreter detection and its bf16 fix."""

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


def empty(*shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if _POISON and dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def is_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.cache
def install_interpreter_bf16_dot_fix() -> bool:
    """Make `tl.dot` on bf16 operands correct under Triton's CPU interpreter; returns True if installed.

    The interpreter stores bf16 tensors as their raw uint16 bit patterns and `create_dot` hands them to
    `np.matmul` unchanged, so a bf16 dot multiplies integers (triton-lang/triton issue 11584; still present in
    Triton 3.9). We widen bf16 operands to fp32 (a 16-bit left shift of the bit pattern is exact) before the
    original `create_dot` runs. Only the interpreter's builder is touched, and only for bf16 operands; compiled
    GPU kernels never see this code. Called lazily by the launchers when `TRITON_INTERPRET=1`.
    """
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton without the interpreter module
        return False
    builder_cls = interpreter.InterpreterBuilder
    original = builder_cls.create_dot
    if getattr(original, "_fla_bwd_bf16_fix", False):
        return True

    def widen(handle):
        if handle.dtype.scalar != tl.bfloat16:
            return handle
        bits = handle.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._fla_bwd_bf16_fix = True
    create_dot._fla_bwd_original = original
    builder_cls.create_dot = create_dot
    return True
