# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Forgetting Transformer attention: causal softmax attention whose scores decay with a learned forget gate."""

from typing import Optional

import torch

from fla_bwd.ops.attn.parallel import parallel_attn


def parallel_forgetting_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: Optional[float] = None,
    window_size: Optional[int] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    *,
    return_lse: bool = False,
    cu_seqlens_k: Optional[torch.Tensor] = None,
):
    """Forgetting attention (Lin et al., 2025): score(i, j) = scale * q_i . k_j + sum_{t = j + 1}^{i} g_t.

    Args:
        q: `[B, T, HQ, K]`; k: `[B, T, H, K]`; v: `[B, T, H, V]` (HQ a multiple of H). q may be shorter than k
            (the last positions; packed: with cu_seqlens_k), as in `parallel_attn`.
        g: `[B, T, HQ]` log forget gate (e.g. `F.logsigmoid` of a projection) over k's positions, required.
        scale, window_size, cu_seqlens, return_lse, cu_seqlens_k: as in `fla_bwd.ops.attn.parallel_attn` (which
            has the other variants; causal=False does not apply: the gate is causal).

    Returns:
        o: `[B, T, HQ, V]` in q's dtype (with `return_lse`, (o, lse) as `parallel_attn`'s); differentiable with
        respect to q, k, v and g.
    """
    if g is None:
        raise ValueError("g (the [B, T, HQ] log forget gate) is required for forgetting attention; "
                         "use fla_bwd.ops.attn.parallel_attn for ungated attention")
    return parallel_attn(q, k, v, g=g, scale=scale, window_size=window_size, cu_seqlens=cu_seqlens,
                         return_lse=return_lse, cu_seqlens_k=cu_seqlens_k)
