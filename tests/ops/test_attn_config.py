# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The short-window tiles of the seven-product dK/dV kernels (`config.dkv_tiles`): where the rule takes them, that
the backward launches them there, and that such a call still matches the oracle."""

import pytest
import torch
from helpers import Case, check_against_oracle

from fla_bwd.ops.attn import config, host

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32


@pytest.mark.parametrize("D, dtype, W, T, gated, want", [
    (128, bf16, 512, 8192, False, "dkv_window"),  # g8-T8192-W512, measured faster
    (128, f16, 256, 16384, False, "dkv_window"),  # g8-T16384-W256
    (100, bf16, 1, 63, False, "dkv_window"),  # head dims 65-128, any window up to the bound
    (128, bf16, 513, 8192, False, "dkv"),  # a longer window
    (128, bf16, 8192, 8192, False, "dkv"),  # no window (W >= T)
    (128, bf16, 512, 512, False, "dkv"),  # a window that covers the sequence
    (128, bf16, 512, 8192, True, "dkv"),  # gated: lost at T = 2048 and not measured windowed
    (64, bf16, 256, 8192, False, "dkv"),  # D = 64: lost dense, not measured windowed
    (256, bf16, 256, 8192, False, "dkv"),  # the head-dim class above 128 has its own tiles
    (128, f32, 256, 8192, False, "dkv"),  # fp32 has its own tiles
])
def test_dkv_tiles_rule(D, dtype, W, T, gated, want):
    assert config.dkv_tiles(D, dtype, W, T, gated) == want


@pytest.mark.parametrize("window, gate, want", [(20, False, "dkv_window"), (None, False, "dkv"),
                                                 (20, True, "dkv")])
def test_backward_launches_the_rule_s_tiles(monkeypatch, window, gate, want):
    """The dK/dV launch of a backward takes `dkv_tiles`' config (a spy on the launches' tile lookup), and the call
    matches the oracle."""
    asked = []
    lookup = host.tile_config

    def spy(kernel, D, dtype=bf16):
        asked.append(kernel)
        return lookup(kernel, D, dtype)

    monkeypatch.setattr(host, "tile_config", spy)
    host.clear_plans()
    try:
        check_against_oracle(Case(B=1, T=70, HQ=4, H=2, K=128, dtype=bf16, window=window, gate=gate))
    finally:
        host.clear_plans()
    assert want in asked and ({"dkv", "dkv_window"} - {want}).isdisjoint(asked), asked
