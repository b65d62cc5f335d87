# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Per-sequence cumulative sums over the token axis, forward (the gate's gc = cumsum(g)) and reverse (its gradient)."""

from typing import Optional

import torch
import triton
import triton.language as tl

from fla_bwd.ops.utils.launch import Plan, Ref, run_once
from fla_bwd.utils import cdiv, is_interpreter, next_power_of_2


@triton.heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
                    "HAS_X2": lambda args: args["x2"] is not None})
@triton.jit(do_not_specialize=["T"])
def segment_cumsum_kernel(
    x, x2, y, cu_seqlens, T, stride_x_t, stride_x_h, stride_y_t, stride_y_h,
    BT: tl.constexpr, REVERSE: tl.constexpr, SCALE: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_X2: tl.constexpr,
):
    """One program scans one (sequence, head), BT tokens at a time, carrying the running fp32 sum; the output is
    multiplied by SCALE. With x2 (same layout as x) it scans x + x2.
    One head a program and long chunks: the scan is a chain of dependent chunks, so its time is the chunk count
    times one chunk's latency."""
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        bos = i_n.to(tl.int64) * T
    i_h = i_h.to(tl.int64)
    b_carry = tl.zeros([1], dtype=tl.float32)
    for i_c in range(0, tl.cdiv(T, BT)):
        if REVERSE:
            o_t = T - (i_c + 1) * BT + tl.arange(0, BT)
        else:
            o_t = i_c * BT + tl.arange(0, BT)
        m_t = (o_t >= 0) & (o_t < T)
        o_tok = (bos + o_t).to(tl.int64)
        # [BT]
        p_x = o_tok * stride_x_t + i_h * stride_x_h
        b_x = tl.load(x + p_x, mask=m_t, other=0).to(tl.float32)
        if HAS_X2:
            b_x += tl.load(x2 + p_x, mask=m_t, other=0).to(tl.float32)
        b_y = tl.cumsum(b_x, axis=0, reverse=REVERSE) + b_carry
        b_carry += tl.sum(b_x, axis=0)
        p_y = o_tok * stride_y_t + i_h * stride_y_h
        tl.store(y + p_y, (b_y * SCALE).to(y.dtype.element_ty), mask=m_t)


def add_scan(plan: Plan, x: Ref, y: Ref, cu_seqlens: Optional[Ref], N: int, T: int, NH: int, x_strides, y_strides,
             reverse: bool, scale: float = 1.0, x2: Optional[Ref] = None) -> None:
    """Add the scan of x (+ x2) into y to `plan`: N sequences (B dense, the packed count varlen) of NH heads; T is
    one sequence's length when dense, the packed total when varlen."""
    # Chunks as long as an average sequence (up to 2048 tokens; at most 8 compiled sizes): many short packed
    # sequences keep short chunks rather than 2048-wide mostly-masked ones. Under the CPU interpreter short chunks
    # make the tests' sequences cross several.
    mean = T if cu_seqlens is None else cdiv(T, max(N, 1))
    BT = 16 if is_interpreter() else min(2048, max(16, next_power_of_2(mean)))
    plan.launch(
        segment_cumsum_kernel, (N, NH), x=x, x2=x2, y=y, cu_seqlens=cu_seqlens, T=T,
        stride_x_t=x_strides[0], stride_x_h=x_strides[1], stride_y_t=y_strides[0], stride_y_h=y_strides[1],
        BT=BT, REVERSE=reverse, SCALE=scale, num_warps=4,
    )


def add_gate_cumsum(plan: Plan, g: Ref, cu_seqlens: Optional[Ref], N: int, B: int, T: int, HQ: int,
                    g_strides) -> Ref:
    """`g` `[B, T, HQ]` (strides `g_strides` of its T and HQ axes) -> "gc": gc * log2(e), gc the per-sequence
    cumsum, fp32, in the kernels' head-major layout `[HQ, B * T]` (base-2 units, as the kernels keep scores)."""
    y = plan.empty("gc", (HQ, B * T), torch.float32)
    add_scan(plan, g, y, cu_seqlens, N, T, HQ, g_strides, (1, B * T), reverse=False, scale=1.4426950408889634)
    return y


def add_gate_grad(plan: Plan, dgc_q: Ref, dgc_k: Ref, cu_seqlens: Optional[Ref], N: int, B: int, T: int, HQ: int,
                  dtype: torch.dtype) -> Ref:
    """dgc = dgc_q + dgc_k, both `[HQ, B * T]` fp32 (gradient w.r.t. gc in natural units: the query side from the dQ
    kernel, minus the key side from the dK/dV kernel) -> "dg" `[B, T, HQ]` in `dtype`: the per-sequence reverse
    cumsum of dgc. Adding here in fp32 rounds exactly as the difference would have where it was computed."""
    y = plan.empty("dg", (B, T, HQ), dtype)
    add_scan(plan, dgc_q, y, cu_seqlens, N, T, HQ, (1, B * T), (HQ, 1), reverse=True, x2=dgc_k)
    return y


def _sequences(B: int, cu_seqlens: Optional[torch.Tensor]) -> int:
    return B if cu_seqlens is None else cu_seqlens.numel() - 1


def gate_cumsum(g: torch.Tensor, cu_seqlens: Optional[torch.Tensor]) -> torch.Tensor:
    """`add_gate_cumsum` as a function (one-off plan)."""
    B, T, HQ = g.shape
    cu = Ref("cu_seqlens") if cu_seqlens is not None else None
    return run_once(lambda p: add_gate_cumsum(p, Ref("g"), cu, _sequences(B, cu_seqlens), B, T, HQ,
                                              (g.stride(1), g.stride(2))),
                    g.device, dict(g=g, cu_seqlens=cu_seqlens))["gc"]


def gate_grad(dgc_q: torch.Tensor, dgc_k: torch.Tensor, B: int, T: int, cu_seqlens: Optional[torch.Tensor],
              dtype: torch.dtype) -> torch.Tensor:
    """`add_gate_grad` as a function (one-off plan)."""
    cu = Ref("cu_seqlens") if cu_seqlens is not None else None
    return run_once(lambda p: add_gate_grad(p, Ref("dgc_q"), Ref("dgc_k"), cu, _sequences(B, cu_seqlens), B, T,
                                            dgc_q.shape[0], dtype),
                    dgc_q.device, dict(dgc_q=dgc_q, dgc_k=dgc_k, cu_seqlens=cu_seqlens))["dg"]
