# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Kernel launches with less host time than `kernel[grid](**kwargs)`.

Every `kernel[grid](...)` call re-derives the kernel's specialisation from all its arguments (the heuristics
wrapper rebuilds a dict of every argument once per flag, the binder specialises each argument, the cache key is
a tuple of all of them plus `str(options)`), then launches. On the H200 machine's host that path costs 35-42 us
for an empty kernel with 20 arguments and 26-70 us for this package's kernels (`scripts/profile_host.py`,
PERF.md #13), while a short row's whole backward runs ~160 us on the GPU: the host, not the GPU, set its time.

`launch` keys the compiled kernel on what Triton specialises on (each tensor's dtype and 16-byte alignment,
each integer's width, None-ness, constexpr values, launch options, device) and, on a hit, calls the compiled
kernel directly. The first call for a key goes through Triton's normal path, which compiles (or finds the
kernel in Triton's own cache) and returns the compiled kernel. The key over-approximates Triton's: a key that
distinguishes too much only costs one more normal launch. Under the CPU interpreter every call takes the normal
path (there is no compiled kernel). FLA_BWD_FAST_LAUNCH=0 (or `set_fast_launch(False)`) sends every call
through the normal path, for A/B measurements or a Triton whose compiled-kernel interface differs.
"""

import os
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from triton.runtime.jit import JITFunction

from fla_bwd.utils import is_interpreter

_INT32 = (-2 ** 31, 2 ** 31)
_FAST = os.environ.get("FLA_BWD_FAST_LAUNCH", "1") != "0"


def set_fast_launch(enabled: bool) -> None:
    global _FAST
    _FAST = bool(enabled)


def _jit_function(kernel) -> JITFunction:
    """The JITFunction under any wrappers (triton.heuristics keeps it in `.fn`)."""
    while not isinstance(kernel, JITFunction):
        kernel = kernel.fn
    return kernel


def _arg_key(value: Any, constexpr: bool) -> Any:
    if constexpr:
        return value
    if isinstance(value, torch.Tensor):
        # Triton assumes 16-byte alignment in the compiled code when the pointer had it at compile time.
        return value.dtype, value.data_ptr() % 16 == 0
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


class Launcher:
    """`Launcher(kernel)(grid, **kwargs)` launches like `kernel[grid](**kwargs)`; every parameter by keyword."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.names: Tuple[str, ...] = ()
        self.name_set: frozenset = frozenset()
        self.constexpr: Tuple[bool, ...] = ()
        self.cache: Dict[tuple, Callable] = {}

    def _bind(self) -> None:
        """Parameter names and constexpr flags, read once, at the first compiled launch (under the interpreter the
        kernel is no JITFunction)."""
        jit = _jit_function(self.kernel)
        self.names = tuple(jit.arg_names)
        self.name_set = frozenset(self.names)
        self.constexpr = tuple(p.is_constexpr for p in jit.params)

    def key(self, kwargs: dict, values: Optional[list] = None) -> tuple:
        """The cache key of a launch; `values` are the parameters in signature order (taken from kwargs if None)."""
        if values is None:
            values = [kwargs.get(n) for n in self.names]
        args = tuple(map(_arg_key, values, self.constexpr))
        options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in self.name_set))
        return torch.cuda.current_device(), args, options

    def __call__(self, grid: tuple, **kwargs) -> None:
        if not _FAST or is_interpreter():
            self.kernel[grid](**kwargs)
            return
        if not self.names:
            self._bind()
        # Parameters left to the heuristics wrapper are absent (None here): they are constexprs, which the
        # compiled launcher skips.
        values = [kwargs.get(n) for n in self.names]
        key = self.key(kwargs, values)
        compiled = self.cache.get(key)
        if compiled is not None:
            # The compiled kernel's launcher indexes three grid dimensions (`kernel[grid]` pads them itself).
            compiled[tuple(grid) + (1,) * (3 - len(grid))](*values)
            return
        compiled = self.kernel[grid](**kwargs)
        if hasattr(compiled, "__getitem__") and hasattr(compiled, "run"):
            self.cache[key] = compiled
