# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`benchmarks/tools/graph_paths.py` on the CPU: each forced path reaches the backward it names (through the
candidates' context), every candidate is measured each round, and the gradients of every path are compared with
auto's. Graph replays and CUDA-event timing are stubbed (they need a GPU); the kernels run under the interpreter."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks.ops import registry  # noqa: E402
from benchmarks.ops.timing import Timer  # noqa: E402
from benchmarks.tools import graph_paths as G  # noqa: E402
from fla_bwd import settings  # noqa: E402
from fla_bwd.ops.attn import host  # noqa: E402


def test_measure_row_forces_each_path(monkeypatch):
    seen = []

    def fake_paired(builds, calls, flush):
        out = {}
        for i, (name, build) in enumerate(builds.items()):
            build("fwdbwd")()  # runs the call inside its candidate's context, as a capture would
            out[name] = {"graph_step_us": 100.0 + i, "graph_fwd_us": 40.0}
        return out

    def fake_median(fn, device, timer=None):
        seen.append((settings.forced_dq_path(), settings.forced_dkv_path()))  # outside every context: auto
        fn()
        return 1.0

    five = []
    real_chunk = host.five_product_chunk

    def spy_chunk(*a, **k):
        got = real_chunk(*a, **k)
        five.append(got is not None)
        return got

    monkeypatch.setattr(host, "five_product_chunk", spy_chunk)
    monkeypatch.setattr(G, "paired_graphs_us", fake_paired)
    monkeypatch.setattr(G, "median_us", fake_median)
    paths = ["auto", "legacy", "five-hopper", "five-triton"]
    rec = G.measure_row(registry.get_op("parallel_attn"), "smoke", paths, None, rounds=2, calls=3,
                        timer=Timer(torch.device("cpu")), device="cpu")
    assert [list(r) for r in rec["rounds"]] == [["fla_bwd[auto]", "fla_bwd[legacy]", "fla_bwd[five-triton]"]] * 2
    assert rec["rounds"][0]["fla_bwd[legacy]"]["graph_bwd_us"] == pytest.approx(61.0)
    assert seen == [("auto", "auto")] * 3
    assert rec["max_grad_diff"]["fla_bwd[auto]"] == 0.0
    assert list(rec["errors"]) == ["fla_bwd[five-hopper]"] and "CUDA" in rec["errors"]["fla_bwd[five-hopper]"]
    assert five[:3] == [False, False, True]  # auto, legacy, five-triton's first backwards (hopper's raised inside)
    assert max(rec["max_grad_diff"].values()) < 5e-2


def test_forcing_enters_every_setting_of_a_path():
    with G.forcing("five-hopper")():
        assert (settings.forced_dq_path(), settings.forced_ds_kernel()) == ("from-ds", "hopper")
    with G.forcing("legacy")():
        assert settings.forced_dkv_path() == "legacy"
    assert (settings.forced_dq_path(), settings.forced_ds_kernel(), settings.forced_dkv_path()) == ("auto",) * 3
