# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The host side of `parallel_attn`: buffers, NaN/Inf containment, and one launch per kernel.

`forward` and `backward` are the whole computation of a call (the autograd layer calls nothing else); `attn_fwd`,
`attn_bwd_dq` and `attn_bwd_dkv` each launch one kernel of `parallel.py` through `launch_contained`, which runs it
once or twice (see there) through a `Launcher`. Tile configs and policies come from `config.py`.
"""

import contextlib
import functools
from typing import Optional

import torch

from fla_bwd import settings
from fla_bwd.ops.attn.config import DQ_PASSES, INLINE_CONTAINMENT_WORK, tile_config
from fla_bwd.ops.attn.inner import FIXUP, FLAG, INLINE
from fla_bwd.ops.attn.parallel import (
    DkvKernel,
    parallel_attn_bwd_kernel_dkv_per_kv_head,
    parallel_attn_bwd_kernel_dkv_per_query_head,
    parallel_attn_bwd_kernel_dq,
    parallel_attn_fwd_kernel,
    select_dkv_kernel,
)
from fla_bwd.ops.utils.checks import check_cu_seqlens_values
from fla_bwd.ops.utils.cumsum import gate_cumsum, gate_grad
from fla_bwd.ops.utils.group_sum import group_sum
from fla_bwd.ops.utils.index import chunk_indices
from fla_bwd.ops.utils.launch import Launcher
from fla_bwd.utils import cdiv, next_power_of_2

_fwd = Launcher(parallel_attn_fwd_kernel)
_dq = Launcher(parallel_attn_bwd_kernel_dq)
_dkv_per_query_head = Launcher(parallel_attn_bwd_kernel_dkv_per_query_head)
_dkv_per_kv_head = Launcher(parallel_attn_bwd_kernel_dkv_per_kv_head)


# ----------------------------------------------------------------------------------------------------------------
# Containment
# ----------------------------------------------------------------------------------------------------------------

def contain_inline(B: int, HQ: int, T: int, W: int, D: int) -> bool:
    """Whether the kernels of one call contain a NaN/Inf input inline (one launch) rather than in two launches
    (see `launch_contained`); both contain exactly. FLA_BWD_CONTAINMENT forces either (for A/B timing and the
    tests, which run every NaN/Inf case both ways)."""
    forced = settings.forced_containment()
    if forced != "auto":
        return forced == "inline"
    return B * HQ * T * min(T, W) * D < INLINE_CONTAINMENT_WORK


def launch_contained(launcher: Launcher, programs: int, args: dict) -> None:
    """Launch a kernel over `programs` programs so that a non-finite input reaches only the outputs that depend
    on it, in one of two ways, both exact (see `inner.any_nonfinite`):
    - two launches: a FLAG launch computes every tile plainly and stores per program whether its outputs are not
      finite; a FIXUP launch recomputes only the flagged tiles with containment and overwrites their outputs (the
      other programs read one byte and return);
    - inline: one launch; a program whose outputs are not finite recomputes its tile with containment at once.
    Inline keeps the contained copy of the loops in the kernel, which makes the compiler schedule the plain loops
    worse; two launches cost one more launch of host time (`Launcher.launch_each` binds the arguments once).
    `contain_inline` picks by the amount of work (PERF.md #17, #18, #31). `args` is the caller's fresh dict of
    launch arguments: completed in place and passed on whole (no copy per launch)."""
    if contain_inline(args["B"], args["HQ"], args["T"], args["W"], max(args["K"], args["V"])):
        args.update(nonfinite=None, CONTAIN=INLINE.value)
        launcher.launch((programs,), args)
        return
    args["nonfinite"] = torch.empty(programs, dtype=torch.int8, device=args["q"].device)
    launcher.launch_each((programs,), args, "CONTAIN", (FLAG.value, FIXUP.value))


# ----------------------------------------------------------------------------------------------------------------
# One kernel each
# ----------------------------------------------------------------------------------------------------------------

def _dims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict:
    """Head counts, head dims and their blocks, dot precision: launch arguments fixed by the inputs' shapes and
    dtype (read-only: callers spread it into launch arguments)."""
    return _dims_of(q.shape[2], k.shape[2], q.shape[3], v.shape[3], q.dtype)


@functools.lru_cache(maxsize=None)
def _dims_of(HQ: int, H: int, K: int, V: int, dtype: torch.dtype) -> dict:
    return dict(HQ=HQ, H=H, G=HQ // H, K=K, V=V, BK=max(16, next_power_of_2(K)), BV=max(16, next_power_of_2(V)),
                DOT_PREC="ieee" if dtype == torch.float32 else "tf32")


def _tiles(B: int, T: int, cu_seqlens: Optional[torch.Tensor], BT: int):
    """(number of tiles per head program, chunk_indices or None)."""
    if cu_seqlens is None:
        return cdiv(T, BT), None
    indices = chunk_indices(cu_seqlens, BT)
    return indices.shape[0], indices


def attn_fwd(q, k, v, g_cumsum, sink_bias, scale: float, W: int, cu_seqlens):
    """Returns o `[B, T, HQ, V]` (q's dtype) and the base-2 log-sum-exp `[HQ, B * T]` (fp32)."""
    B, T, HQ, _ = q.shape
    dims = _dims(q, k, v)
    cfg = tile_config("fwd", max(dims["K"], dims["V"]), q.dtype)
    o = torch.empty(B, T, HQ, dims["V"], dtype=q.dtype, device=q.device)
    lse = torch.empty(HQ, B * T, dtype=torch.float32, device=q.device)
    NT, indices = _tiles(B, T, cu_seqlens, cfg["BT"])
    if NT > 0:
        launch_contained(_fwd, NT * B * HQ, dict(
            q=q, k=k, v=v, o=o, lse=lse, g_cumsum=g_cumsum, sink_bias=sink_bias, cu_seqlens=cu_seqlens,
            chunk_indices=indices, scale=scale, T=T, W=W, NTOK=B * T, B=B, **dims, **cfg,
        ))
    return o, lse


def attn_bwd_dq(q, k, v, o, do, lse, g_cumsum, dgc_q, scale: float, W: int, cu_seqlens, delta_mode: str):
    """dq in q's dtype, and delta `[HQ, B * T]` fp32 for the dK/dV kernel. `delta_mode` (a key of
    `config.DQ_PASSES`) says how delta (rowsum(o * dO), from the rounded o) is computed and treated:
    - "rounded": used as is (no gate, no sink: its ~1e-3 relative error costs dq and dk little);
    - "refine": dq uses it, then overwrites it with the fp32 rowsum(P * dP) for the dK/dV kernel (gates: dgc is
      a reverse cumsum of dS sums, which turns delta's error into a random walk along the sequence); with gates
      it also stores the query side of dgc into `dgc_q` (see `inner.dkv_one_head`);
    - "exact": a first pass computes rowsum(P * dP) (two of dQ's three products), then dq uses it (sinks: with a
      sink, dP - delta = p_sink * dP on a row that sees few keys, a small difference that the rounded delta
      swamps; PERF.md #8).
    """
    B, T, HQ, _ = q.shape
    dims = _dims(q, k, v)
    cfg = tile_config("dq", max(dims["K"], dims["V"]), q.dtype)
    dq = torch.empty(*q.shape, dtype=q.dtype, device=q.device)
    delta = torch.empty(HQ, B * T, dtype=torch.float32, device=q.device)
    NT, indices = _tiles(B, T, cu_seqlens, cfg["BT"])
    for step in DQ_PASSES[delta_mode] if NT > 0 else ():
        launch_contained(_dq, NT * B * HQ, dict(
            q=q, k=k, v=v, o=o, do=do, dq=dq, dgc_q=dgc_q, lse=lse, delta=delta, g_cumsum=g_cumsum,
            cu_seqlens=cu_seqlens, chunk_indices=indices, scale=scale, T=T, W=W, NTOK=B * T, B=B,
            DELTA_FROM_O=step.delta_from_o, REFINE_DELTA=step.refine_delta, COMPUTE_DQ=step.compute_dq,
            **dims, **cfg,
        ))
    return dq, delta


def attn_bwd_dkv(q, k, v, do, lse, delta, g_cumsum, sink_bias, scale: float, W: int, cu_seqlens,
                 kernel: DkvKernel):
    """dk, dv in the inputs' dtypes; dgc_k `[HQ, B * T]` fp32, minus the key side of the gradient w.r.t. the
    gate's cumsum (None without a gate; the dQ kernel stored the query side, `gate_grad` adds the two); dsink
    `[HQ]` fp32 (None without a sink). `kernel` (from `select_dkv_kernel`) says which kernel computes them."""
    B, T, HQ, K = q.shape
    dims = _dims(q, k, v)
    H, V = dims["H"], dims["V"]
    cfg = tile_config("dkv", max(K, V), q.dtype)
    if kernel.per_kv_head:
        launcher, NH, extra = _dkv_per_kv_head, H * kernel.split, {"SPLIT": kernel.split}
    else:
        # One dK/dV per query head; with G > 1 they are summed in fp32 below.
        launcher, NH, extra = _dkv_per_query_head, HQ, {}
    acc_dtype = q.dtype if NH == H else torch.float32
    dk = torch.empty(B, T, NH, K, dtype=acc_dtype, device=q.device)
    dv = torch.empty(B, T, NH, V, dtype=acc_dtype, device=q.device)
    NT, indices = _tiles(B, T, cu_seqlens, cfg["BT"])
    partial = torch.empty(HQ, NT * B, dtype=torch.float32, device=q.device) if sink_bias is not None else None
    dgc_k = torch.empty(*lse.shape, dtype=torch.float32, device=q.device) if g_cumsum is not None else None
    if NT > 0:
        launch_contained(launcher, NT * B * NH, dict(
            q=q, k=k, v=v, do=do, dk=dk, dv=dv, dgc_k=dgc_k, dsink_partial=partial, lse=lse, delta=delta,
            g_cumsum=g_cumsum, sink_bias=sink_bias, cu_seqlens=cu_seqlens, chunk_indices=indices, scale=scale, T=T,
            W=W, NTOK=B * T, B=B, **dims, **cfg, **extra,
        ))
    if NH != H:
        dk, dv = group_sum(dk, dv, H, q.dtype)
    dsink = partial.sum(1) if partial is not None else None
    return dk, dv, dgc_k, dsink


# ----------------------------------------------------------------------------------------------------------------
# A whole forward, a whole backward
# ----------------------------------------------------------------------------------------------------------------

def _on_device(device: torch.device):
    """Triton launches on the current CUDA device (and its current stream): inputs on another GPU need it switched
    for the call (a tensor on cuda:1 while cuda:0 is current would otherwise be read from the wrong device)."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def _window(window_size: int, T: int) -> int:
    # W == T already admits every causal pair; clamping keeps the kernels' int32 range arithmetic small.
    return T if window_size == 0 else min(window_size, max(T, 1))


def forward(q, k, v, g, sink_bias, cu_seqlens, scale: float, window_size: int):
    """(o, lse, the gate's cumsum gc times log2 e or None), for validated contiguous inputs. `window_size` 0 means
    full causal."""
    with _on_device(q.device):
        if cu_seqlens is not None:
            check_cu_seqlens_values(cu_seqlens, q.shape[1])
        W = _window(window_size, q.shape[1])
        g_cumsum = gate_cumsum(g, cu_seqlens) if g is not None else None
        sink = sink_bias.float().contiguous() if sink_bias is not None else None
        o, lse = attn_fwd(q, k, v, g_cumsum, sink, scale, W, cu_seqlens)
        return o, lse, g_cumsum


def backward(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale: float, window_size: int):
    """(dq, dk, dv, dg or None, dsink or None): dg and dsink in g's and sink_bias's dtypes."""
    with _on_device(q.device):
        B, T = q.shape[:2]
        W = _window(window_size, T)
        gc = g_cumsum if g is not None else None
        sink = sink_bias.float().contiguous() if sink_bias is not None else None
        delta_mode = "exact" if sink is not None else "refine" if gc is not None else "rounded"
        # The gradient w.r.t. the gate's cumsum: the dQ kernel stores its query side, the dK/dV kernel minus its
        # key side, and the reverse cumsum adds them.
        dgc_q = torch.empty(*lse.shape, dtype=torch.float32, device=q.device) if gc is not None else None
        kernel = select_dkv_kernel(q, k, v, W, cu_seqlens)
        dq, delta = attn_bwd_dq(q, k, v, o, do, lse, gc, dgc_q, scale, W, cu_seqlens, delta_mode)
        dk, dv, dgc_k, dsink = attn_bwd_dkv(q, k, v, do, lse, delta, gc, sink, scale, W, cu_seqlens, kernel)
        dg = gate_grad(dgc_q, dgc_k, B, T, cu_seqlens, g.dtype) if g is not None else None
        dsink = dsink.to(sink_bias.dtype) if sink_bias is not None else None
        return dq, dk, dv, dg, dsink
