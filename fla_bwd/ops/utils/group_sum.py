# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The dK/dV group sum: per-program fp32 partials `[B, T, H * S, D]` (S programs wrote one KV head's gradient,
each from some of its query heads) -> `[B, T, H, D]` in the inputs' dtype, dK and dV in one launch that reads each
partial once and casts once. torch's `view(...).sum(3).to(dtype)` took four kernels for the pair (two sums, two
casts) and wrote an fp32 intermediate."""

import torch
import triton
import triton.language as tl

from fla_bwd.ops.utils.launch import Plan, Ref, run_once
from fla_bwd.utils import cdiv, next_power_of_2


@triton.jit
def _sum_rows(x, y, i_r, R, S: tl.constexpr, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """Rows [i_r * BR, i_r * BR + BR) of y `[R, D]` = the sum over s of x `[R, S, D]` (in order s = 0, 1, ...)."""
    o_r = i_r * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    m = (o_r < R)[:, None] & (o_d < D)[None, :]
    p_x = x + o_r.to(tl.int64)[:, None] * (S * D) + o_d[None, :]
    # [BR, BD]
    b_y = tl.zeros([BR, BD], dtype=tl.float32)
    for i_s in range(S):
        b_y += tl.load(p_x + i_s * D, mask=m, other=0)
    tl.store(y + o_r.to(tl.int64)[:, None] * D + o_d[None, :], b_y.to(y.dtype.element_ty), mask=m)


@triton.jit(do_not_specialize=["R"])
def group_sum_kernel(dk_part, dv_part, dk, dv, R, S: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BR: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Grid (cdiv(R, BR), 2): axis 1 picks dK (0) or dV (1)."""
    i_r = tl.program_id(0)
    if tl.program_id(1) == 0:
        _sum_rows(dk_part, dk, i_r, R, S=S, D=K, BR=BR, BD=BK)
    else:
        _sum_rows(dv_part, dv, i_r, R, S=S, D=V, BR=BR, BD=BV)


def add_group_sum(plan: Plan, dk_part: Ref, dv_part: Ref, B: int, T: int, H: int, S: int, K: int, V: int,
                  dtype: torch.dtype) -> tuple:
    """Add to `plan`: `[B, T, H * S, K]` and `[B, T, H * S, V]` contiguous fp32 partials -> ("dk", "dv")
    `[B, T, H, *]` in `dtype`."""
    dk = plan.empty("dk", (B, T, H, K), dtype)
    dv = plan.empty("dv", (B, T, H, V), dtype)
    R = B * T * H
    BK, BV = next_power_of_2(K), next_power_of_2(V)
    BR = max(1, 4096 // max(BK, BV))  # 4096 elements a program: 32 rows of 128
    if R > 0:
        plan.launch(group_sum_kernel, (cdiv(R, BR), 2), dk_part=dk_part, dv_part=dv_part, dk=dk, dv=dv, R=R, S=S,
                    K=K, V=V, BR=BR, BK=BK, BV=BV)
    return dk, dv


def group_sum(dk_part: torch.Tensor, dv_part: torch.Tensor, H: int, dtype: torch.dtype):
    """`add_group_sum` as a function (one-off plan)."""
    B, T, NH, K = dk_part.shape
    env = run_once(lambda p: add_group_sum(p, Ref("dk_part"), Ref("dv_part"), B, T, H, NH // H, K,
                                           dv_part.shape[3], dtype),
                   dk_part.device, dict(dk_part=dk_part, dv_part=dv_part))
    return env["dk"], env["dv"]
