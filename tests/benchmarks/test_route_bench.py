# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`benchmarks/tools/route_bench.py` (GPU only) on a CPU: its routes set the settings they name, its rows are the
registry's shapes of those names, and its packed rows hold as many tokens as their dense twins, of mixed lengths."""

import importlib.util
import os

import pytest

from benchmarks.ops import registry
from fla_bwd import settings

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "tools", "route_bench.py")


def _tool():
    spec = importlib.util.spec_from_file_location("route_bench", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name,hopper,D,expected", [
    ("cap-old", True, 128, ("triton", "recompute", "auto")), ("cap", True, 128, ("hopper", "auto", "hopper")),
    ("cap", True, 64, ("hopper", "auto", "auto")), ("plain", False, 128, ("auto", "auto", "auto")),
    ("seven", False, 128, ("auto", "recompute", "auto")), ("five", False, 128, ("auto", "from-ds", "auto"))])
def test_routes_set_their_settings(name, hopper, D, expected, monkeypatch):
    for var in ("FLA_BWD_FWD_KERNEL", "FLA_BWD_DQ_PATH", "FLA_BWD_DS_KERNEL"):
        monkeypatch.delenv(var, raising=False)
    with _tool().route(name, hopper, D):
        got = (settings.forced_fwd_kernel(), settings.forced_dq_path(), settings.forced_ds_kernel())
    assert got == expected
    assert (settings.forced_fwd_kernel(), settings.forced_dq_path()) == ("auto", "auto")


def test_rows_are_the_registrys():
    shapes = {s.name: s for s in registry.SHAPES}
    for name, (B, T, HQ, H, D) in _tool().ROWS.items():
        s = shapes[name]
        assert (s.B, s.T, s.HQ, s.H, s.K) == (B, T, HQ, H, D), name


def test_packed_rows_are_mixed_and_as_long_as_their_twins():
    for name, (lengths, *_, (B, T)) in _tool().PACKED.items():
        assert sum(lengths) == B * T and len(set(lengths)) > 1, name
