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


def _bf16_fixed_methods() -> dict:
    """{method name: fixed method} for the two bf16 corrections of `interpreter_bf16_fix`, built from the
    interpreter builder's current methods (cheap: two closures) when the fix is entered."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

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
    return {"create_dot": create_dot, "cast_impl": cast_impl}


_FIX_DEPTH = {"bf16": 0, "index": 0}  # nesting depth of each interpreter fix


@contextlib.contextmanager
def _scoped_patch(fix: str, target, make_fixed):
    """The interpreter fixes' one mechanism. In the outermost block of `fix`, `target`'s attributes become
    `make_fixed()`'s {name: value} (values marked `_fla_bwd_fix`; one already ours is left); when that block exits
    (also on an exception), the very objects that were there are put back, an inherited one by removing the
    override, except where someone else replaced ours inside the block: theirs stays. Nests."""
    saved = {}  # name -> target's own attribute before the outermost entry (None: it was inherited)
    if _FIX_DEPTH[fix] == 0:
        for name, value in make_fixed().items():
            if not getattr(getattr(target, name, None), "_fla_bwd_fix", False):
                saved[name] = vars(target).get(name)
                setattr(target, name, value)
    _FIX_DEPTH[fix] += 1
    try:
        yield
    finally:
        _FIX_DEPTH[fix] -= 1
        for name, original in saved.items():
            if not getattr(vars(target).get(name), "_fla_bwd_fix", False):
                continue
            if original is None:
                delattr(target, name)
            else:
                setattr(target, name, original)


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
    replaced only inside the outermost block (`_scoped_patch`): another library's interpreted kernel, run outside
    our calls, behaves exactly as without fla_bwd. Under the interpreter a launch runs the whole grid
    synchronously, so the launcher enters this around each interpreted launch (`fla_bwd.ops.utils.launch.Launch`).
    Nests (a depth count); not thread-safe beyond that: a kernel of another library run by another thread while
    one of ours runs sees the fix. Yields True when the fix is in place, False on a Triton without the interpreter
    module. Compiled GPU kernels never run this code. `tests/test_utils.py` shows each correction is needed and
    that nothing leaks.
    """
    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError:  # pragma: no cover - a triton without the interpreter module
        yield False
        return
    with _scoped_patch("bf16", InterpreterBuilder, _bf16_fixed_methods):
        yield True


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


@contextlib.contextmanager
def interpreter_index_fix():
    """Inside the block, where the interpreter needs it (`_index_fix_needed`), its tensors' `__index__` reads the
    one element of a scalar's array, as later Tritons do: the interpreter's `_patch_lang_tensor`, which installs the
    tensor methods at each launch, is wrapped for the block (`_scoped_patch`). Yields whether the fix is in place."""
    if not _index_fix_needed():
        yield False
        return
    from triton.runtime import interpreter

    def make_fixed():
        original = interpreter._patch_lang_tensor

        def patch_lang_tensor(tensor, scope):
            original(tensor, scope)
            scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(())))

        patch_lang_tensor._fla_bwd_fix = True
        return {"_patch_lang_tensor": patch_lang_tensor}

    with _scoped_patch("index", interpreter, make_fixed):
        yield True
