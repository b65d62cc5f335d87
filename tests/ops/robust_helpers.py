# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Two small helpers shared by the robustness tests split out of test_attn_robust.py (test_attn_inputs.py,
test_attn_autograd.py, test_attn_gate_sink_extremes.py, test_attn_past_int32.py): the GPU-only skip marker and a
leaf copy of a tensor."""

import pytest
import torch

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="GPU-only: needs a CUDA GPU; run on the H200")


def leaf(t: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    return t.detach().requires_grad_(requires_grad)
