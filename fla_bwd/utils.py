# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Package-wide helpers: host integer arithmetic and interpreter detection. The interpreter's bf16 and index fixes,
which patch Triton's internals, live in `fla_bwd.ops.utils.triton_private` and are importable from here too."""

import functools
import importlib
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


# Names importable from here that live in `triton_private`: imported on first use, so that importing this module
# does not import triton (TRITON_INTERPRET may still be set until the first op is touched, `fla_bwd/__init__.py`).
_PRIVATE = ("interpreter_bf16_fix", "interpreter_index_fix")


def __getattr__(name):
    if name not in _PRIVATE:
        raise AttributeError(f"module 'fla_bwd.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module("fla_bwd.ops.utils.triton_private"), name)
    globals()[name] = value  # later look-ups skip this function
    return value
