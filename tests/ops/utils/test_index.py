# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`fla_bwd.ops.utils.index`: packed offsets are read and checked on every call, tiles are cached by value, and
under CUDA-graph capture (when nothing can be read from the GPU) a call finds the offsets of its tensor's last call
outside the capture, or raises. The capture path is exercised here through its two functions (no GPU: a CPU tensor
stands for the GPU one); tests/ops/test_attn_cuda_graph.py captures varlen calls on a GPU."""

import pytest
import torch

from fla_bwd.ops.utils import index


def test_tiles_follow_the_values_not_the_tensor():
    cu = torch.tensor([0, 5, 40, 40, 64], dtype=torch.int32)
    first = index.varlen_tiles(cu, 64)
    assert first.lengths == (5, 35, 0, 24)
    assert first.chunk_indices(16).tolist() == [[0, 0], [1, 0], [1, 1], [1, 2], [3, 0], [3, 1]]
    assert index.varlen_tiles(cu.clone(), 64) is first  # same values: the cached tiles
    cu.numpy()[1] = 30  # no version bump
    second = index.varlen_tiles(cu, 64)
    assert second is not first and second.lengths == (30, 10, 0, 24)
    with pytest.raises(ValueError, match="must end at the packed length T = 70"):
        index.varlen_tiles(cu, 70)  # cached values, another T: checked again


def test_under_capture_uses_the_last_call_outside_it_or_raises():
    cu = torch.tensor([0, 7, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="cannot be read during CUDA-graph capture"):
        index._under_capture(cu)
    tiles = index.varlen_tiles(cu, 9)
    index._remember(cu, tiles)
    assert index._under_capture(cu) is tiles
    cu.add_(0)  # a visible in-place edit: the remembered offsets no longer count
    with pytest.raises(ValueError, match="cannot be read during CUDA-graph capture"):
        index._under_capture(cu)
