# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Every use fla_bwd makes of Triton's private interfaces, each behind a check that the internal is what it was
written for, with Triton's public path as the fallback.

Triton promises `kernel[grid](**kwargs)`, `triton.set_allocator`, `triton.JITFunction` and `triton.language`; the
rest of its modules change between releases without notice. This module is the one place in the package that reads
them (`scripts/compile_sm90.py`, a script, has its own). Each function below checks the internal by its shape
(attributes present, parameters and closure variables named as expected: no version numbers) and otherwise answers
so that the caller takes the public path: a launch through `kernel[grid](**kwargs)`, a scratch allocator set
through `triton.set_allocator` in a copied context, an interpreter left as it is (with a warning where that changes
results). None of them is ever silently wrong on a Triton it does not recognise.

Checked against Triton 3.6 (the GPU machine's, CUDA) and 3.9 (CPU interpreter; its CUDA driver module read too).

Each internal, what it is for, and the fallback where it is not as expected:
- `knobs.runtime.launch_enter_hook` / `launch_exit_hook` (no profiler hook installed; `launch_hooks_empty`): a
  hook is assumed, so every launch takes Triton's path.
- `.fn` of the `triton.heuristics` / `autotune` wrappers, `JITFunction.arg_names` (a kernel's parameters in order;
  `jit_function`, `direct_launcher`): Triton's path.
- `CompiledKernel.run` / `.function` / `.packed_metadata` and the argument layout of `run` (the direct launch;
  `direct_launcher`): Triton's path.
- Triton 3.6's launcher closure in `triton.backends.nvidia.driver` (`co_freevars`, `_BASE_ARGS_FORMAT_LEN`,
  `make_tensordesc_arg`; the Hopper kernel's memoised descriptor launch, `descriptor_launcher`): `CompiledKernel.run`.
- `triton.runtime._allocation._allocator` (a scratch allocator for one launch; `call_with_allocator`):
  `triton.set_allocator` inside a copied context.
- `triton.runtime.interpreter`'s `InterpreterBuilder`, `TensorHandle`, `_get_np_dtype` (the interpreter's bf16 fix;
  `interpreter_bf16_fix`): the interpreter as it is, with a RuntimeWarning.
- `triton.runtime.interpreter._patch_lang_tensor` / `_LangPatchScope` (the interpreter's index fix;
  `interpreter_index_fix`): none needed (without the fix such a kernel raises, it never computes a wrong value).
- `triton.runtime.interpreter.InterpretedFunction`, `triton.experimental.gluon._runtime.GluonJITFunction` (which
  kernels are interpreted; `kernel_types`): None / ().
- `triton.runtime.driver.active.utils.get_device_properties` (a GPU's memory clock and bus width;
  `driver_device_properties`): None.
"""

import contextlib
import contextvars
import functools
import inspect
import warnings
from typing import Any, Callable, NamedTuple, Optional

import triton

try:  # a public module since Triton 3.4; its hook chains are not documented
    from triton import knobs
except ImportError:  # pragma: no cover - a triton without knobs
    knobs = None


# ----------------------------------------------------------------------------------------------------------------
# Kernels and their parameters
# ----------------------------------------------------------------------------------------------------------------

def jit_function(kernel) -> triton.JITFunction:
    """The JITFunction under any wrappers: `triton.heuristics` and `triton.autotune` keep the wrapped kernel in `.fn`
    (Triton 3.6-3.9). Raises AttributeError for an object with no JITFunction inside (e.g. an interpreted kernel)."""
    while not isinstance(kernel, triton.JITFunction):
        kernel = kernel.fn
    return kernel


def kernel_types() -> tuple:
    """(KernelInterface, JITFunction, InterpretedFunction or None, GluonJITFunction or ()): the classes Triton 3.6-3.9
    make kernel objects of, for telling interpreted from compiled kernels (`fla_bwd.ops.utils.checks`). The last two
    are private (`triton.runtime.interpreter`, `triton.experimental.gluon._runtime`); None / () where absent."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # pragma: no cover - a triton without the interpreter
        InterpretedFunction = None
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:  # pragma: no cover - a triton without Gluon
        GluonJITFunction = ()
    return triton.KernelInterface, triton.JITFunction, InterpretedFunction, GluonJITFunction


def driver_device_properties(index: int) -> Optional[dict]:
    """Triton's own device query (`triton.runtime.driver.active.utils.get_device_properties`, Triton 3.6-3.9: a dict
    with "mem_clock_rate", "mem_bus_width", ...) for CUDA device `index`, or None where that interface is not there
    (the caller then has only torch's properties)."""
    try:
        return triton.runtime.driver.active.utils.get_device_properties(index)
    except AttributeError:
        return None


# ----------------------------------------------------------------------------------------------------------------
# Launch hooks and the direct launch
# ----------------------------------------------------------------------------------------------------------------

def launch_hooks_empty() -> bool:
    """Whether no launch hook is installed (a profiler such as proton installs some): only then may a launch skip the
    compiled kernel's runner, which builds the hooks' metadata. Triton 3.6-3.9: `knobs.runtime.launch_enter_hook` and
    `launch_exit_hook` are HookChains whose `calls` list the hooks (None in older releases). Anything else counts as
    a hook installed, so every launch takes Triton's path."""
    rt = getattr(knobs, "runtime", None)
    hooks = (getattr(rt, "launch_enter_hook", False), getattr(rt, "launch_exit_hook", False))
    return all(h is None or not getattr(h, "calls", True) for h in hooks)


# The compiled kernel's `run` takes these, then every kernel parameter in signature order: Triton 3.6-3.9's
# `CompiledKernel.__getitem__` calls it so. Its launchers' `__call__` name a prefix of them, then take `*args`
# (3.6's CUDA launcher names the first five, 3.9's all nine).
RUN_PARAMETERS = ("gridX", "gridY", "gridZ", "stream", "function", "kernel_metadata", "launch_metadata",
                  "launch_enter_hook", "launch_exit_hook")


def _takes_run_arguments(run) -> bool:
    """Whether `run` may be called as `RUN_PARAMETERS` then the kernel's parameters: its named positional parameters
    are a prefix of those (none: a forwarding wrapper or a test's stand-in), then `*args`, and no required keyword.
    A callable without a readable signature (a C function) is not assumed to be one."""
    try:
        parameters = inspect.signature(run).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    named = tuple(p.name for p in parameters if p.kind in positional)
    var = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    required = any(p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty for p in parameters)
    return var and not required and named == RUN_PARAMETERS[:len(named)]


class DirectLauncher(NamedTuple):
    """What `direct_launcher` finds of a compiled kernel: call `run(gridX, gridY, gridZ, stream, function, packed,
    None, None, None, *values)` with `values` every parameter of `names` in order (tensors may go as addresses)."""
    run: Callable
    function: Any
    packed: Any
    names: tuple


def direct_launcher(kernel, compiled) -> Optional[DirectLauncher]:
    """How to launch `compiled` (what `kernel[grid](...)` returned) without Triton's runner, or None to keep Triton's
    path. Triton 3.6-3.9: a `CompiledKernel` whose `run` (a property that loads the module, after which `function`
    is valid) takes `RUN_PARAMETERS` then every parameter of the JITFunction (`jit_function(kernel).arg_names`);
    the runner adds only the launch metadata, which only launch hooks read. None when any of that is not so."""
    if not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        return None
    try:
        names = jit_function(kernel).arg_names
    except AttributeError:
        return None
    if not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
        return None
    run = compiled.run  # loads the module: `function` is valid after this
    if not _takes_run_arguments(run):
        return None
    return DirectLauncher(run, compiled.function, compiled.packed_metadata, tuple(names))


class DescriptorLauncher(NamedTuple):
    """What `descriptor_launcher` finds under a compiled kernel's `run`."""
    launch: Callable  # the C launcher: (grid x, y, z, stream, function, cooperative, PDL, 2 scratch buffers, packed
    # metadata, launch metadata, 2 hooks, then every parameter with each descriptor expanded)
    positions: frozenset  # the parameters (signature positions) that are host tensor descriptors
    metas: tuple  # their metadata, in parameter order
    expand: Callable  # (descriptor, its metadata) -> what replaces it in the C launcher's arguments
    cooperative: bool
    pdl: bool


def _takes_two(fn) -> bool:
    """Whether `fn(a, b)` binds (3.6's `make_tensordesc_arg(arg, metadata)`; 3.9's takes a third)."""
    try:
        inspect.signature(fn).bind(None, None)
    except (TypeError, ValueError):
        return False
    return True


def descriptor_launcher(run) -> Optional[DescriptorLauncher]:
    """The C launcher under Triton 3.6's wrapper for kernels that take host tensor descriptors, where a caller may
    reuse a descriptor's expansion instead of letting the wrapper make it again at every launch.

    Triton 3.6 (`triton.backends.nvidia.driver`: `CudaLauncher`, `wrap_handle_tensordesc`) hands each launch to a
    Python closure named `inner` over `launcher`, `tensordesc_indices`, `tensordesc_meta` that replaces every
    descriptor by `make_tensordesc_arg(descriptor, metadata)` (a `cuTensorMapEncodeTiled`, then the shape and
    strides) before calling the C launcher with 13 leading arguments (`_BASE_ARGS_FORMAT_LEN`). That expansion
    depends on nothing but the descriptor's fields and base address. None for any other build (Triton 3.9's driver
    has neither that constant nor that closure; a kernel that needs scratch buffers allocated at launch): its
    launches then go through `run`. Read at each call (once a plan step), not at import."""
    try:
        from triton.backends.nvidia import driver as nv
    except ImportError:
        return None
    inner = getattr(run, "launch", None)
    code = getattr(inner, "__code__", None)
    if (code is None or code.co_name != "inner" or getattr(nv, "_BASE_ARGS_FORMAT_LEN", None) != 13
            or set(code.co_freevars) != {"launcher", "tensordesc_indices", "tensordesc_meta"}
            or getattr(run, "global_scratch_size", None) != 0 or getattr(run, "profile_scratch_size", None) != 0
            or not callable(getattr(nv, "make_tensordesc_arg", None)) or not _takes_two(nv.make_tensordesc_arg)
            or not all(hasattr(run, a) for a in ("launch_cooperative_grid", "launch_pdl"))):
        return None
    cells = {name: cell.cell_contents for name, cell in zip(code.co_freevars, inner.__closure__)}
    positions, metas = frozenset(cells["tensordesc_indices"]), tuple(cells["tensordesc_meta"] or ())
    if len(metas) != len(positions) or any(m is None for m in metas):
        return None
    return DescriptorLauncher(cells["launcher"], positions, metas, nv.make_tensordesc_arg,
                              run.launch_cooperative_grid, run.launch_pdl)


def launch_head(found: DescriptorLauncher, function, packed) -> tuple:
    """The C launcher's arguments between the stream and the kernel's parameters, as Triton 3.6's wrapper passes them
    (`descriptor_launcher`): function, cooperative, PDL, the two scratch buffers (none: `descriptor_launcher` accepts
    only kernels without), packed metadata, launch metadata and the two hooks (none: the direct path runs only
    without launch hooks, `launch_hooks_empty`)."""
    return function, found.cooperative, found.pdl, None, None, packed, None, None, None


def rebased_descriptor(template, base):
    """A copy of a host tensor descriptor (Gluon's or Triton's `TensorDescriptor`, a plain object whose fields are
    its base tensor, shape, strides, block shape and layout in 3.6-3.9) over tensor `base`, without the validating
    constructor (0.7 us against 5 here): for a plan's descriptors, whose shapes, dtypes and alignment its key fixes.
    `base` None: a template holding no tensor."""
    d = object.__new__(type(template))
    d.__dict__.update(template.__dict__)
    d.base = base
    return d


# ----------------------------------------------------------------------------------------------------------------
# Scratch allocator
# ----------------------------------------------------------------------------------------------------------------

def _allocator_var():
    """Triton's allocator variable (`triton.runtime._allocation._allocator`, a ContextVar in 3.6-3.9, which
    `triton.set_allocator` sets and the launcher reads at each launch), or None where it is not one."""
    try:
        from triton.runtime import _allocation
    except ImportError:
        return None
    var = getattr(_allocation, "_allocator", None)
    return var if isinstance(var, contextvars.ContextVar) else None


def call_with_allocator(allocator: Callable, fn: Callable, *args):
    """`fn(*args)` with `allocator` as Triton's scratch allocator (`triton.set_allocator`), the previous one in place
    again afterwards (also on an exception) in the calling thread, which is all that one sees of it.

    Triton 3.6-3.9 keep the allocator in a ContextVar, set and restored here directly (a get and two sets). Where
    it is not one, the public path: `triton.set_allocator` inside a copy of the current context, which confines it to
    the call as long as Triton keeps a context variable (otherwise our allocator stays installed afterwards: a
    working allocator, torch's, but the caller's is replaced)."""
    var = _allocator_var()
    if var is not None:
        previous = var.get()
        var.set(allocator)
        try:
            return fn(*args)
        finally:
            var.set(previous)
    return contextvars.copy_context().run(_set_then_call, allocator, fn, args)


def _set_then_call(allocator: Callable, fn: Callable, args: tuple):
    triton.set_allocator(allocator)
    return fn(*args)


def current_allocator() -> Optional[Callable]:
    """Triton's scratch allocator in this context (tests), or None where `_allocator_var` finds no ContextVar."""
    var = _allocator_var()
    return None if var is None else var.get()


# ----------------------------------------------------------------------------------------------------------------
# The CPU interpreter's bf16 and index fixes
# ----------------------------------------------------------------------------------------------------------------

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


def _parameter_names(fn) -> Optional[tuple]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


@functools.cache
def bf16_fix_applies() -> bool:
    """Whether the interpreter is the one `interpreter_bf16_fix` was written for (Triton 3.6-3.9): bf16 values held as
    their uint16 bit patterns (`_get_np_dtype`), `InterpreterBuilder.create_dot(self, a, b, d, input_precision,
    max_num_imprecise_acc)` and `cast_impl(self, src, dst_type)`, and `TensorHandle(data, dtype)`. Asked once."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
        builder, handle = interpreter.InterpreterBuilder, interpreter.TensorHandle
        stored = interpreter._get_np_dtype(tl.bfloat16)
    except (ImportError, AttributeError, KeyError, TypeError):
        return False
    return (stored == np.dtype(np.uint16)
            and _parameter_names(builder.create_dot) == ("self", "a", "b", "d", "input_precision",
                                                         "max_num_imprecise_acc")
            and _parameter_names(builder.cast_impl) == ("self", "src", "dst_type")
            and (_parameter_names(handle) or ())[:2] == ("data", "dtype"))


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


@functools.cache
def _warn_bf16_unfixed() -> None:
    warnings.warn(f"fla_bwd: Triton {triton.__version__}'s CPU interpreter is not the one its bf16 fix was written for "
                  f"(Triton 3.6-3.9); bf16 results under the interpreter may differ from the GPU's", RuntimeWarning,
                  stacklevel=4)


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
    one of ours runs sees the fix. Yields True when the fix is in place; False, with a RuntimeWarning once, on an
    interpreter `bf16_fix_applies` does not recognise (left as it is). Compiled GPU kernels never run this code.
    `tests/test_utils.py` shows each correction is needed and that nothing leaks.
    """
    if not bf16_fix_applies():
        _warn_bf16_unfixed()
        yield False
        return
    from triton.runtime.interpreter import InterpreterBuilder

    with _scoped_patch("bf16", InterpreterBuilder, _bf16_fixed_methods):
        yield True


@functools.cache
def index_fix_needed() -> bool:
    """Whether the interpreter's own `__index__` of a scalar fails: Triton 3.6 converts the scalar's 1-element array
    with `int()`, which NumPy >= 2.4 refuses (triton-lang/triton issue 9171, fixed after 3.6), so every
    `range(0, n)` over a run-time bound raises. Asked of the interpreter itself, on a stand-in class; False where
    its `_patch_lang_tensor` / `_LangPatchScope` are not there (then a failing `__index__` raises in the kernel,
    never computes a wrong value)."""
    try:
        import numpy as np
        from triton.runtime import interpreter
        patch, scope = interpreter._patch_lang_tensor, interpreter._LangPatchScope()
    except (ImportError, AttributeError):  # pragma: no cover - a triton without these interpreter internals
        return False

    class Scalar:
        handle = type("Handle", (), {"data": np.zeros(1, dtype=np.int32)})

    try:
        patch(Scalar, scope)
    except Exception:  # a patcher that works otherwise than 3.6's: leave that interpreter alone
        return False
    try:
        Scalar().__index__()
        return False
    except TypeError:
        return True
    finally:
        scope.restore()


@contextlib.contextmanager
def interpreter_index_fix():
    """Inside the block, where the interpreter needs it (`index_fix_needed`), its tensors' `__index__` reads the
    one element of a scalar's array, as later Tritons do: the interpreter's `_patch_lang_tensor`, which installs the
    tensor methods at each launch, is wrapped for the block (`_scoped_patch`). Yields whether the fix is in place."""
    if not index_fix_needed():
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
