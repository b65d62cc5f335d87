# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Package-wide helpers: host integer arithmetic, interpreter detection and its bf16 and index fixes."""

import contextlib
import functools
import os


# Host-side integer helpers. `triton.cdiv` and `triton.next_power_of_2` are constexpr functions (usable inside
# kernels); called from Python they unwrap their arguments first, several times per launch.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


@functools.cache
def is_interpreter() -> bool:
    # Read once: Triton decides interpreted or compiled when a kernel is decorated (at import), so the answer cannot
    # change in a process; the launch path asks on every launch, where an environment read is not free.
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _bf16_fix_patches():
    """(InterpreterBuilder, {method name: fixed method}) for the two bf16 corrections of `interpreter_bf16_fix`, or
    None on a Triton without the interpreter module. Built on each call from the builder's current methods (cheap:
    two closures); the originals they wrap are the ones present when the fix is entered."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - a triton without the interpreter module
        return None
    builder = interpreter.InterpreterBuilder
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

    create_dot._fla_bwd_fix = cast_impl._fla_bwd_fix = True
    return builder, {"create_dot": create_dot, "cast_impl": cast_impl}


_BF16_FIX_DEPTH = 0  # nesting depth of `interpreter_bf16_fix`
_BF16_FIX_SAVED: dict = {}  # method name -> the builder's own attribute before the outermost entry (absent: None)


def _bf16_fix_active(builder) -> bool:
    return getattr(builder.create_dot, "_fla_bwd_fix", False)


@contextlib.contextmanager
def interpreter_bf16_fix():
    """Make bf16 arithmetic under Triton's CPU interpreter match the GPU inside the block, and only there.

    Two interpreter defects (triton-lang/triton issue 11584; both still present in Triton 3.9):
    - it stores bf16 tensors as their raw uint16 bit patterns and `create_dot` hands them to `np.matmul`
      unchanged, so a bf16 `tl.dot` multiplies integers. We widen bf16 operands to fp32 first (a 16-bit left
      shift of the bit pattern, exact).
    - its fp32 -> bf16 cast truncates the mantissa, where the GPU rounds to nearest even; truncation biases every
      rounded P and every stored output (o's error ratio against the fp32 oracle doubled, 1.9e-3 -> 3.9e-3).
      We round to nearest even, as `torch.Tensor.to(torch.bfloat16)` does.
    The interpreter's builder is a class shared by every interpreted kernel in the process, so the two methods are
    replaced when the outermost block is entered and the very objects that were there are put back when it exits
    (also on an exception): another library's interpreted kernel, run outside our calls, behaves exactly as
    without fla_bwd. Under the interpreter a launch runs the whole grid synchronously, so the launcher enters this
    around each interpreted launch (`fla_bwd.ops.utils.launch.Launch`). Nests (a depth count); not thread-safe
    beyond that: a kernel of another library run by another thread while one of ours runs sees the fix. Yields
    True when the fix is in place, False on a Triton without the interpreter module. Compiled GPU kernels never
    run this code. `tests/test_utils.py` shows each correction is needed and that nothing leaks.
    """
    global _BF16_FIX_DEPTH
    patches = _bf16_fix_patches() if _BF16_FIX_DEPTH == 0 else None
    if _BF16_FIX_DEPTH == 0:
        if patches is None:
            yield False
            return
        builder, fixed = patches
        _BF16_FIX_SAVED.clear()
        if not _bf16_fix_active(builder):  # not already fixed (by another caller)
            for name, method in fixed.items():
                _BF16_FIX_SAVED[name] = vars(builder).get(name)
                setattr(builder, name, method)
    _BF16_FIX_DEPTH += 1
    try:
        yield True
    finally:
        _BF16_FIX_DEPTH -= 1
        if _BF16_FIX_DEPTH == 0 and _BF16_FIX_SAVED:
            from triton.runtime.interpreter import InterpreterBuilder as builder
            for name, original in _BF16_FIX_SAVED.items():
                if not getattr(vars(builder).get(name), "_fla_bwd_fix", False):
                    continue  # replaced by someone else inside the block: theirs stays
                if original is None:
                    delattr(builder, name)  # it was inherited, not the class's own
                else:
                    setattr(builder, name, original)
            _BF16_FIX_SAVED.clear()


@functools.cache
def _index_fix_needed() -> bool:
    """Whether the interpreter's own `__index__` of a scalar fails: Triton 3.6 converts the scalar's 1-element array
    with `int()`, which NumPy >= 2.4 refuses (triton-lang/triton issue 9171, fixed after 3.6), so every
    `range(0, n)` over a run-time bound raises. Asked of the interpreter itself, on a stand-in class."""
    try:
        import numpy as np
        from triton.runtime import interpreter
        patch, scope = interpreter._patch_lang_tensor, interpreter._LangPatchScope()
    except (ImportError, AttributeError):  # pragma: no cover - a triton without these interpreter internals
        return False

    class Scalar:
        handle = type("Handle", (), {"data": np.zeros(1, dtype=np.int32)})

    patch(Scalar, scope)
    try:
        Scalar().__index__()
        return False
    except TypeError:
        return True
    finally:
        scope.restore()


_INDEX_FIX_DEPTH = 0  # nesting depth of `interpreter_index_fix`


@contextlib.contextmanager
def interpreter_index_fix():
    """Inside the block, where the interpreter needs it (`_index_fix_needed`), its tensors' `__index__` reads the
    one element of a scalar's array, as later Tritons do: the interpreter's `_patch_lang_tensor`, which installs the
    tensor methods at each launch, is wrapped for the block and the very function that was there is put back when
    the outermost block exits (also on an exception). Nests. Yields whether the fix is in place."""
    global _INDEX_FIX_DEPTH
    if not _index_fix_needed():
        yield False
        return
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor if _INDEX_FIX_DEPTH == 0 else None
    if original is not None:
        def patch_lang_tensor(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

        patch_lang_tensor._fla_bwd_fix = True
        interpreter._patch_lang_tensor = patch_lang_tensor
    _INDEX_FIX_DEPTH += 1
    try:
        yield True
    finally:
        _INDEX_FIX_DEPTH -= 1
        # Replaced by someone else inside the block: theirs stays.
        if original is not None and getattr(interpreter._patch_lang_tensor, "_fla_bwd_fix", False):
            interpreter._patch_lang_tensor = original
