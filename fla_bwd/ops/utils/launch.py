# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Kernel launches with less host time than `kernel[grid](**kwargs)`.

Every `kernel[grid](...)` call re-derives the kernel's specialisation from all its arguments (the heuristics
wrapper rebuilds a dict of every argument once per flag, the binder specialises each argument, the cache key is
a tuple of all of them plus `str(options)`), then launches: on the H200 machine's host more time than a short
row's whole backward takes on the GPU (PERF.md #13).

`Launcher` keys the compiled kernel on what Triton specialises on (each tensor's dtype and 16-byte alignment,
each integer's width, None-ness, constexpr values, launch options, device) and, on a hit, launches it through the
compiled kernel's C launcher directly (`run`, with the current stream), skipping the runner's per-call
launch-metadata dict, which only launch hooks read (PERF.md #20). With a launch hook installed (a profiler), the
runner is used. The first call for a key goes through Triton's normal path, which compiles (or finds the kernel in
Triton's own cache) and returns the compiled kernel. The key over-approximates Triton's: a key that distinguishes
too much only costs one more normal launch. Under the CPU interpreter every call takes the normal path (there is
no compiled kernel).
FLA_BWD_FAST_LAUNCH=0 (or `fla_bwd.settings.set_fast_launch(False)`) sends every call through the normal path, for
A/B measurements or a Triton whose compiled-kernel interface differs.
"""

import contextlib
import warnings
from typing import Any, Dict, Optional, Tuple

import torch
from triton import knobs
from triton.runtime.jit import JITFunction

from fla_bwd import settings
from fla_bwd.utils import interpreter_bf16_fix, is_interpreter

_INT32 = (-2 ** 31, 2 ** 31)
def _jit_function(kernel) -> JITFunction:
    """The JITFunction under any wrappers (triton.heuristics keeps it in `.fn`)."""
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def _scalar_key(value: Any) -> Any:
    """The key of a non-tensor runtime argument (tensors are keyed inline in `Launcher.key`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "u1", value
    if isinstance(value, int):
        # i32 or i64 by range; == 1 and % 16 == 0 are specialised for integers without do_not_specialize.
        return "i", _INT32[0] <= value < _INT32[1], value == 1, value % 16 == 0
    if isinstance(value, float):
        return "f"
    raise TypeError(f"launch: unsupported argument type {type(value).__name__}")


def _hooks_empty() -> bool:
    """Whether no launch hook is installed (a profiler such as proton installs some): only then may a launch skip
    the compiled kernel's runner, which builds the hooks' metadata."""
    rt = knobs.runtime
    return all(h is None or not getattr(h, "calls", True) for h in (rt.launch_enter_hook, rt.launch_exit_hook))


@contextlib.contextmanager
def _interpreted():
    """Around this package's interpreted launches only: the interpreter's bf16 fix (`interpreter_bf16_fix`), and
    numpy's floating-point warnings off. Lanes past a sequence's end compute 0 / 0 and log2(0) as they do on the
    GPU, silently there; no such lane is ever stored (every store is masked), and the tests compare every stored
    element. The interpreter's max/min reductions are numpy's nanmax/nanmin, which warn on a row that is all NaN:
    a NaN input does that by design (containment, tests/ops/test_attn_nan.py), silently on the GPU too."""
    import numpy as np

    with interpreter_bf16_fix(), np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN (slice|axis) encountered", category=RuntimeWarning)
        yield


class Launcher:
    """`Launcher(kernel)(grid, **kwargs)` launches like `kernel[grid](**kwargs)`; every parameter by keyword."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.names: Tuple[str, ...] = ()
        self.name_set: frozenset = frozenset()
        self.constexpr: Tuple[bool, ...] = ()
        self.cache: Dict[tuple, Any] = {}

    def _bind(self) -> None:
        """Parameter names and constexpr flags, read once, at the first compiled launch (under the interpreter the
        kernel is no JITFunction)."""
        jit = _jit_function(self.kernel)
        self.names = tuple(jit.arg_names)
        self.name_set = frozenset(self.names)
        self.constexpr = tuple(p.is_constexpr for p in jit.params)
        self._const_idx = tuple(i for i, c in enumerate(self.constexpr) if c)
        self._runtime_idx = tuple(i for i, c in enumerate(self.constexpr) if not c)
        self._index = {n: i for i, n in enumerate(self.names)}

    def key(self, kwargs: dict, values: Optional[list] = None) -> tuple:
        """The cache key of a launch; `values` are the parameters in signature order (taken from kwargs if None).
        A plain loop with tensors keyed inline (dtype, 16-byte alignment): a third cheaper than a function call
        per argument (PERF.md, "Figures moved out of the code")."""
        if values is None:
            values = [kwargs.get(n) for n in self.names]
        runtime = []
        for i in self._runtime_idx:
            x = values[i]
            if x is None:
                runtime.append(None)
            elif isinstance(x, torch.Tensor):
                runtime.append((x.dtype, x.data_ptr() % 16 == 0))
            else:
                runtime.append(_scalar_key(x))
        options = tuple(sorted((k, kwargs[k]) for k in kwargs.keys() - self.name_set))
        return torch.cuda.current_device(), tuple(runtime), tuple([values[i] for i in self._const_idx]), options

    def __call__(self, grid: tuple, **kwargs) -> None:
        self.launch(grid, kwargs)

    def launch(self, grid: tuple, kwargs: dict) -> None:
        """`__call__` with the arguments as one dict, which callers that launch the same arguments twice (or add
        a few to a prepared set) pass without copying it at every call level."""
        self.launch_each(grid, kwargs, None, (None,))

    def launch_each(self, grid: tuple, kwargs: dict, name: Optional[str], values_of_name: tuple) -> None:
        """Launch once for each value of the constexpr parameter `name` in `values_of_name`, in order, with the
        other arguments unchanged (`name` None: launch once). The arguments are bound and keyed once: a second
        launch costs the C launcher alone (PERF.md #31), which is what makes a two-launch kernel pair
        cheap enough for short calls."""
        if not settings.fast_launch() or is_interpreter():
            with _interpreted() if is_interpreter() else contextlib.nullcontext():
                for value in values_of_name:
                    if name is not None:
                        kwargs[name] = value
                    self.kernel[grid](**kwargs)
            return
        if not self.names:
            self._bind()
        # Parameters left to the heuristics wrapper are absent (None here): they are constexprs, which the
        # compiled launcher skips.
        if name is not None:
            kwargs[name] = values_of_name[0]
        values = [kwargs.get(n) for n in self.names]
        key = self.key(kwargs, values)
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        if len(values_of_name) > 1:
            index = self._index.get(name)
            if index is None or not self.constexpr[index]:
                raise ValueError(f"launch_each: {name!r} must be a constexpr parameter (the key is rebuilt for it "
                                 f"alone)")
        for n, value in enumerate(values_of_name):
            if n > 0:  # only `name` changed: it is a constexpr, so only the key's constexpr part moves
                kwargs[name] = value
                values[index] = value
                key = key[:2] + (tuple([values[j] for j in self._const_idx]),) + key[3:]
            self._launch_one(grid, grid3, key, kwargs, values)

    def _launch_one(self, grid: tuple, grid3: tuple, key: tuple, kwargs: dict, values: list) -> None:
        hit = self.cache.get(key)
        if hit is not None:
            compiled, direct = hit
            if direct is not None and _hooks_empty():
                # What the runner below does, less the launch-metadata dict it builds for hooks on every call
                # (PERF.md #20).
                run, function, packed = direct
                run(*grid3, torch._C._cuda_getCurrentRawStream(key[0]), function, packed, None, None, None,
                    *values)
            else:
                compiled[grid3](*values)  # the runner indexes three grid dimensions
            return
        compiled = self.kernel[grid](**kwargs)
        if hasattr(compiled, "__getitem__") and hasattr(compiled, "run"):
            direct = None
            if all(hasattr(compiled, a) for a in ("function", "packed_metadata")):
                run = compiled.run  # loads the module: `function` is valid after this
                direct = (run, compiled.function, compiled.packed_metadata)
            self.cache[key] = (compiled, direct)
