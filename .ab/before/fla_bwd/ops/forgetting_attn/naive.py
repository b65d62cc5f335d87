# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""fp32 reference for forgetting attention, written out from its definition (not through naive_parallel_attn)."""

from typing import Optional

import torch
from einops import rearrange, repeat


def naive_forgetting_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: Optional[float] = None,
    window_size: Optional[int] = None,
) -> torch.Tensor:
    """`[B, T, HQ, V]` fp32: softmax_j(scale * q_i . k_j + sum_{t=j+1}^{i} g_t) over visible j, times v.

    The decay is summed pairwise over a [T, T] matrix (a masked cumulative sum of g), so it does not share the
    gc_i - gc_j trick of `naive_parallel_attn` that it is used to check.
    """
    B, T, HQ, K = q.shape
    G = HQ // k.shape[2]
    scale = K ** -0.5 if scale is None else scale
    qf = rearrange(q.float(), "b t hq k -> b hq t k")
    kf = repeat(k.float(), "b t h k -> b (h g) t k", g=G)  # KV head h serves query heads h * G .. h * G + G - 1
    vf = repeat(v.float(), "b t h v -> b (h g) t v", g=G)
    gf = rearrange(g.float(), "b t hq -> b hq t")
    i = torch.arange(T, device=q.device)
    # decay[i, j] = sum of g_t for j < t <= i: a lower-triangular (t <= i) and strictly-after-j (t > j) mask.
    between = (i[None, :, None] <= i[:, None, None]) & (i[None, :, None] > i[None, None, :])  # [T(i), T(t), T(j)]
    decay = torch.einsum("bht,itj->bhij", gf, between.float())
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale + decay
    visible = i[:, None] >= i[None, :]
    if window_size is not None:
        visible = visible & (i[:, None] - i[None, :] < window_size)
    s = s.masked_fill(~visible, float("-inf"))
    return rearrange(torch.matmul(torch.softmax(s, dim=-1), vf), "b hq t v -> b t hq v")
