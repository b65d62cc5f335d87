# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The tests' NaN-poisoned allocation (`tests/poison.py`): on inside every test, off outside, and the package's
buffers go through it."""

import torch
from conftest import DEVICE
from poison import poisoned

from fla_bwd.ops.attn import host


def test_empty_is_poisoned_in_a_test():
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        t = torch.empty(3, 5, dtype=dtype, device=DEVICE)
        assert t.shape == (3, 5) and t.dtype == dtype and t.device.type == torch.device(DEVICE).type
        assert torch.isnan(t).all()
    t = torch.empty(4, dtype=torch.int32, device=DEVICE)  # integer buffers cannot hold NaN: plain allocation
    assert t.shape == (4,) and t.dtype == torch.int32


def test_poisoning_nests_and_restores():
    inside = torch.empty
    with poisoned():
        assert torch.isnan(torch.empty(2, 2, device=DEVICE)).all()
    assert torch.empty is inside
    try:
        with poisoned():
            raise KeyError("x")
    except KeyError:
        pass
    assert torch.empty is inside


def test_package_buffers_are_poisoned():
    """A kernel output the package allocates starts as NaN (nothing launched here: only the allocation)."""
    q = torch.zeros(1, 4, 2, 16, device=DEVICE)
    calls = []

    def record(step, env, device, stream):
        calls.append(step)

    import pytest

    from fla_bwd.ops.utils import launch
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(launch.Launch, "__call__", record)
        o, lse, _, _, _, _ = host.forward(q, q, q, None, None, None, 0.25, 4)
    finally:
        mp.undo()
    assert len(calls) == 1 and torch.isnan(o).all() and torch.isnan(lse).all()
