# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The dK/dV group sum against torch's, every output written (outputs NaN-poisoned by the conftest)."""

import pytest
import torch

from fla_bwd.ops.utils.group_sum import group_sum

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("B, T, H, S, K, V, dtype", [
    (1, 7, 1, 2, 64, 64, torch.bfloat16),
    (2, 33, 3, 4, 128, 128, torch.float16),
    (1, 5, 2, 8, 128, 64, torch.bfloat16),   # K != V, the legacy path's shapes
    (1, 9, 2, 3, 100, 60, torch.float32),    # non-power-of-2 widths and groups, fp32 (legacy)
    (2, 3, 1, 1, 32, 32, torch.float16),     # S = 1: a cast
    (1, 0, 2, 2, 64, 64, torch.bfloat16),    # no tokens
])
def test_group_sum_matches_torch(B, T, H, S, K, V, dtype):
    dk_part = torch.randn(B, T, H * S, K, device=DEVICE)
    dv_part = torch.randn(B, T, H * S, V, device=DEVICE)
    dk, dv = group_sum(dk_part, dv_part, H, dtype)
    for out, part, D in ((dk, dk_part, K), (dv, dv_part, V)):
        assert out.dtype == dtype and out.shape == (B, T, H, D)
        # the fp32 sum in the kernel's order (s = 0, 1, ...), rounded once to dtype: equal to the bit
        groups = part.view(B, T, H, S, D)
        ref = groups[:, :, :, 0]
        for s in range(1, S):
            ref = ref + groups[:, :, :, s]
        torch.testing.assert_close(out.float(), ref.to(dtype).float(), rtol=0, atol=0)
