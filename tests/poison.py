# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""NaN-poisoned allocation for the tests. While `poisoned()` is active, every floating tensor `torch.empty` makes is
filled with NaN: the package allocates every buffer a kernel writes with `torch.empty`, so an element no kernel
writes shows up as a failed comparison instead of a stale value that happens to be close. Integer buffers cannot
hold NaN and are left as allocated. `tests/conftest.py` turns it on around every test."""

import contextlib

import torch

_real_empty = torch.empty


def _poisoned_empty(*args, **kwargs) -> torch.Tensor:
    x = _real_empty(*args, **kwargs)
    if x.is_floating_point():
        x.fill_(float("nan"))
    return x


@contextlib.contextmanager
def poisoned():
    """Poison `torch.empty` inside the block (restored on exit, also after an exception)."""
    previous, torch.empty = torch.empty, _poisoned_empty
    try:
        yield
    finally:
        torch.empty = previous


def install() -> None:
    """Poison `torch.empty` for the rest of the process (a subprocess of a test)."""
    torch.empty = _poisoned_empty
