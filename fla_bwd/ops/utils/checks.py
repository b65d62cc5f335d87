# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Argument validation for the attention ops: every bad input gets a ValueError/TypeError naming the argument."""

import math
import numbers
from typing import Optional

import torch

from fla_bwd.ops.utils.index import seqlen_offsets

MAX_HEAD_DIM = 256
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _tensor(name: str, x, ndim: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    return x


def _float(name: str, x: torch.Tensor) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")


def check_attn_inputs(q, k, v, g, scale, window_size, cu_seqlens, sink_bias) -> None:
    """Validate `parallel_attn`'s arguments (see its docstring for the shapes)."""
    _tensor("q", q, 4)
    _tensor("k", k, 4)
    _tensor("v", v, 4)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _float(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    B, T, HQ, K = q.shape
    H, V = k.shape[2], v.shape[3]
    if k.shape != (B, T, H, K):
        raise ValueError(f"k must be [B, T, H, K] = [{B}, {T}, H, {K}] to match q {tuple(q.shape)}, "
                         f"got {tuple(k.shape)}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be [B, T, H, V] = [{B}, {T}, {H}, V] to match k {tuple(k.shape)}, "
                         f"got {tuple(v.shape)}")
    if H == 0 or HQ % H != 0:
        raise ValueError(f"the number of query heads HQ={HQ} (q.shape[2]) must be a multiple of the number of "
                         f"key/value heads H={H} (k.shape[2])")
    for name, d in (("K (q.shape[3])", K), ("V (v.shape[3])", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"head dim {name} must be in [1, {MAX_HEAD_DIM}], got {d}")
    devices = {("q", q.device), ("k", k.device), ("v", v.device)}
    if g is not None:
        _tensor("g", g, 3)
        if not g.dtype.is_floating_point:
            raise TypeError(f"g must be a floating-point tensor, got {g.dtype}")
        if g.shape != (B, T, HQ):
            raise ValueError(f"g must be [B, T, HQ] = [{B}, {T}, {HQ}], got {tuple(g.shape)}")
        devices.add(("g", g.device))
    if sink_bias is not None:
        _tensor("sink_bias", sink_bias, 1)
        if not sink_bias.dtype.is_floating_point:
            raise TypeError(f"sink_bias must be a floating-point tensor, got {sink_bias.dtype}")
        if sink_bias.shape != (HQ,):
            raise ValueError(f"sink_bias must be [HQ] = [{HQ}], got {tuple(sink_bias.shape)}")
        devices.add(("sink_bias", sink_bias.device))
    if len({d for _, d in devices}) > 1:
        raise ValueError("q, k, v, g and sink_bias must be on one device, got "
                         + ", ".join(f"{n} on {d}" for n, d in sorted(devices, key=lambda x: x[0])))
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale must be a Python float or None, got {type(scale).__name__}")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
    if window_size is not None:
        if isinstance(window_size, bool) or not isinstance(window_size, int):
            raise TypeError(f"window_size must be a positive int or None, got {type(window_size).__name__}")
        if window_size < 1:
            raise ValueError(f"window_size must be >= 1, got {window_size}")
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, q.device)


def check_cu_seqlens(cu_seqlens, B: int, device: torch.device) -> None:
    """Structure of `cu_seqlens` (type, rank, dtype, device, B == 1); its values: `check_cu_seqlens_values`."""
    _tensor("cu_seqlens", cu_seqlens, 1)
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if B != 1:
        raise ValueError(f"cu_seqlens requires packed inputs with batch size B == 1, got B = {B}")
    if cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens must be on the inputs' device {device}, got {cu_seqlens.device}")
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must hold at least 2 offsets [0, ..., T], got {cu_seqlens.numel()}")


def check_cu_seqlens_values(cu_seqlens: torch.Tensor, T: int) -> None:
    """The checks that read the offsets (a device-to-host copy, cached per tensor): run inside the op, so that
    `torch.compile` traces none of it."""
    offsets = seqlen_offsets(cu_seqlens)
    if offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offsets[0]}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        raise ValueError("cu_seqlens must be non-decreasing")
    if offsets[-1] != T:
        raise ValueError(f"cu_seqlens must end at the packed length T = {T}, got {offsets[-1]}")


def resolve_scale(scale: Optional[float], K: int) -> float:
    return K ** -0.5 if scale is None else float(scale)
