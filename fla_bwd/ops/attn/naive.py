# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Plain-torch fp32 oracle for causal softmax attention. Slow and O(T^2) memory by design: it is the reference."""

from typing import Optional

import torch
from einops import rearrange, repeat


def naive_parallel_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: Optional[float] = None,
    window_size: Optional[int] = None,
    *,
    g: Optional[torch.Tensor] = None,
    sink_bias: Optional[torch.Tensor] = None,
    causal: bool = True,
    softcap: Optional[float] = None,
    return_lse: bool = False,
):
    """Causal attention computed in fp32 on one batch of equal-length sequences (no packing).

    Args:
        q: `[B, Tq, HQ, K]`, Tq <= T: the queries sit at the last Tq key positions (bottom-right, query i at key
            position T - Tq + i).
        k: `[B, T, H, K]`, HQ a multiple of H (query head h reads KV head h // (HQ // H)).
        v: `[B, T, H, V]`; V may differ from K.
        scale: defaults to K ** -0.5.
        window_size: W; query i sees keys [i - W + 1, i]. None means full causal. Or a pair (left, right): keys
            i - left .. i + right, -1 for no bound (right 0 or -1 when causal).
        causal: False: keys after the query too (within a pair window_size).
        g: `[B, T, HQ]` log forget gate, over the key positions; score(i, j) += gc_i - gc_j with gc the cumulative
            sum of g over T.
        sink_bias: `[HQ]`; one extra logit per head in the softmax denominator only.

        softcap: logits softcap * tanh(scale * q.k / softcap) before the gate's bias and the sink (None or 0: off).
        return_lse: also return lse.

    Returns:
        o: `[B, Tq, HQ, V]` in fp32, or with `return_lse` (o, lse), lse `[B, Tq, HQ]` fp32: the natural log of each
        row's softmax denominator (visible keys and the sink). Differentiable with respect to every tensor argument.
    """
    B, Tq, HQ, K = q.shape
    T, H = k.shape[1], k.shape[2]
    G = HQ // H
    if scale is None:
        scale = K ** -0.5
    # Heads first; KV head h serves query heads h * G .. h * G + G - 1 (GQA).
    qf = rearrange(q.float(), "b t hq k -> b hq t k")
    kf = repeat(k.float(), "b t h k -> b (h g) t k", g=G)
    vf = repeat(v.float(), "b t h v -> b (h g) t v", g=G)
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale  # [B, HQ, Tq(query), T(key)]
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if g is not None:
        gc = rearrange(g.float().cumsum(1), "b t hq -> b hq t")  # gc, the gate's cumsum over T
        s = s + gc[..., T - Tq:, None] - gc[..., None, :]
    i = torch.arange(T - Tq, T, device=q.device)  # the queries' positions
    j = torch.arange(T, device=q.device)
    d = i[:, None] - j[None, :]  # query - key
    if isinstance(window_size, (tuple, list)):
        left, right = window_size
        visible = torch.ones_like(d, dtype=torch.bool)
        if left >= 0:
            visible = visible & (d <= left)
        if right >= 0 and not causal:
            visible = visible & (d >= -right)
        if causal:
            visible = visible & (d >= 0)
    else:
        visible = d >= 0 if causal else torch.ones_like(d, dtype=torch.bool)
        if window_size is not None:
            visible = visible & (d < window_size)
    s = s.masked_fill(~visible, float("-inf"))
    if sink_bias is not None:
        sink = repeat(sink_bias.float(), "hq -> b hq t 1", b=B, t=Tq)  # one more logit per row
        s = torch.cat([s, sink], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :T]
    o = rearrange(torch.matmul(p, vf), "b hq t v -> b t hq v")
    if not return_lse:
        return o
    return o, rearrange(torch.logsumexp(s, dim=-1), "b hq t -> b t hq")
