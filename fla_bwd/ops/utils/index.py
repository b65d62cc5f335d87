# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Packed variable-length sequences: validation of `cu_seqlens` and the (sequence, tile) work list of a launch."""

import torch

# The last few `cu_seqlens` tensors seen, with the host copy of their offsets and their work lists. A training
# step calls forward and backward (4 launches) with one `cu_seqlens`; validating it and building the tile list
# costs a device-to-host copy, so it is done once per tensor. Entries hold the tensor itself (so its storage
# cannot be reused by another tensor while cached) and its version counter (so an in-place edit is seen).
_CACHE: list = []
_CACHE_SIZE = 8


def _entry(cu_seqlens: torch.Tensor) -> dict:
    for e in _CACHE:
        if e["tensor"] is cu_seqlens and e["version"] == cu_seqlens._version:
            return e
    e = {"tensor": cu_seqlens, "version": cu_seqlens._version, "offsets": cu_seqlens.tolist(), "chunks": {}}
    _CACHE.insert(0, e)
    del _CACHE[_CACHE_SIZE:]
    return e


def seqlen_offsets(cu_seqlens: torch.Tensor) -> list:
    """Host copy of `cu_seqlens` (cached per tensor)."""
    return _entry(cu_seqlens)["offsets"]


def chunk_indices(cu_seqlens: torch.Tensor, BT: int) -> torch.Tensor:
    """`[NT, 2]` int32 on the device: for every tile of BT tokens of every sequence, (sequence index, tile index
    inside the sequence). Zero-length sequences have no tile."""
    e = _entry(cu_seqlens)
    if BT not in e["chunks"]:
        offsets = e["offsets"]
        rows = [(i_n, i_t) for i_n in range(len(offsets) - 1)
                for i_t in range((offsets[i_n + 1] - offsets[i_n] + BT - 1) // BT)]
        e["chunks"][BT] = torch.tensor(rows, dtype=torch.int32).reshape(-1, 2).to(cu_seqlens.device)
    return e["chunks"][BT]
