# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Autograd for `parallel_attn`, which calls `EagerParallelAttn.apply` or, under torch.compile,
`parallel_attn_fwd_op`: both run `host.forward` and, in the backward, `host.backward`.

Two front ends over those two functions, one formula:
- under torch.compile, a pair of torch.library custom ops with fake (meta) implementations, so that
  `torch.compile(fullgraph=True)` sees two opaque ops instead of tracing into Triton launches; a custom op cannot
  return None, so absent optional tensors (the gate's cumsum, the user's lse and its gradient, dg, dsink) travel
  as empty tensors;
- in eager code, a plain autograd.Function: the custom-op machinery (schema default filling, dynamo guards,
  autograd redispatch) costs more host time per call than a short row's whole GPU time.
Neither supports a second differentiation: both raise a clear error instead of returning a silent zero.
"""

from typing import NamedTuple, Optional

import torch

from fla_bwd.ops.attn import host
from fla_bwd.ops.attn.call import check_tail_offsets
from fla_bwd.ops.attn.config import tail_alignment
from fla_bwd.ops.utils.index import own_offsets, varlen_tiles
from fla_bwd.utils import cdiv

_NOT_TWICE = ("parallel_attn does not support double backward (a gradient of its gradient); "
              "its backward is not differentiable")


class TailFrame(NamedTuple):
    """How a q shorter than k is laid on the tiles (`frame_tail`): `pad` zero query rows in front of q, and k, v, g
    taken from key position `start` on (negative: -start zero keys in front)."""
    pad: int = 0
    start: int = 0


def frame_tail(Tq: int, Tk: int, W: int, D: int, dtype: torch.dtype) -> TailFrame:
    """The frame of a dense call whose Tq queries sit at the last positions of Tk keys (offset Q0 = Tk - Tq) under
    a left window W (0: none), such that the kernels' tail queries start on a multiple of `host.tail_alignment`
    (every tile size) and the result is exactly the unframed call's:
    - an aligned Q0: as is;
    - else, where the first query's window reaches key 0 (W == 0 or W > Q0): zero query rows in front, whose dO and
      dlse are zeros (the caller drops their rows of o and lse). They add nothing (dP = 0 and delta = 0, so dS = 0)
      and, since every key they see the first real query sees too, a NaN/Inf input reaches through them only
      gradients that it reaches already;
    - else keys from `start` = Q0 - m * align on, m * align >= W - 1 the least: no query sees the keys before it, so
      they are dropped (their gradients are zeros) and any of the m * align - Q0 missing ones are zero keys that
      no query sees. The gate's cumsum then starts at `start`, which shifts every gc_i - gc_j by nothing."""
    align = tail_alignment(D, dtype)
    Q0 = Tk - Tq
    if Q0 % align == 0:
        return TailFrame()
    if W == 0 or W > Q0:
        return TailFrame(pad=Q0 % align)
    return TailFrame(start=Q0 - cdiv(W - 1, align) * align)


def _keys_from(x: Optional[torch.Tensor], start: int) -> Optional[torch.Tensor]:
    """x `[B, T, ...]` from position `start` on, or with -start zero rows in front (differentiable)."""
    if x is None:
        return None
    if start >= 0:
        return x[:, start:].contiguous()
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (-start, 0))


def apply_frame(frame: TailFrame, q, k, v, g):
    """q, k, v, g laid in `frame` (`frame_tail`)."""
    if frame.pad:
        q = torch.nn.functional.pad(q, (0, 0, 0, 0, frame.pad, 0))
    if frame.start:
        k, v, g = (_keys_from(x, frame.start) for x in (k, v, g))
    return q, k, v, g


class PackedFrame(NamedTuple):
    """Packed tail queries laid on the tiles (`frame_packed`): the framed offsets of q (`cu_q`) and of k (`cu_k`);
    each row of q's row in the framed q (`q_rows`); for each framed row of q and of k, the row of q or k it holds,
    or the row one past the end for a zero row (`q_from`, `k_from`; None: the same rows)."""
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    q_rows: Optional[torch.Tensor]
    q_from: Optional[torch.Tensor]
    k_from: Optional[torch.Tensor]


_FRAMES: dict = {}


@torch.compiler.disable  # reads the offsets: under torch.compile a graph break, as `varlen_tiles` inside the op
def frame_packed(cu_q: torch.Tensor, cu_k: torch.Tensor, Tq: int, Tk: int, W: int, D: int,
                 dtype: torch.dtype) -> Optional[PackedFrame]:
    """`frame_tail` for each packed sequence (q's offsets cu_q, k's cu_k, read and checked here; ValueError for
    another count of sequences or more queries than keys in one), as one gather of q's and of k's rows; None where
    every sequence has as many queries as keys (the ordinary packed call). Built once per set of offsets (the
    index tensors stay on the device, also for CUDA-graph capture after a first call)."""
    queries, keys = varlen_tiles(cu_q, Tq), varlen_tiles(cu_k, Tk, "cu_seqlens_k")
    key = (queries.offsets, keys.offsets, W, D, dtype, cu_q.device)
    if key in _FRAMES:
        return _FRAMES[key]
    check_tail_offsets(queries, keys)
    frame = None
    if queries.lengths != keys.lengths:
        cu_qf, cu_kf, q_rows, q_from, k_from = [0], [0], [], [], []
        for a, b, q0, k0 in zip(queries.lengths, keys.lengths, queries.offsets, keys.offsets):
            f = frame_tail(a, b, W, D, dtype)
            q_rows.extend(range(cu_qf[-1] + f.pad, cu_qf[-1] + f.pad + a))
            q_from.extend([Tq] * f.pad + list(range(q0, q0 + a)))
            cu_qf.append(cu_qf[-1] + f.pad + a)
            # from key `start` on; -start zero keys first where start < 0
            k_from.extend([Tk] * max(-f.start, 0) + list(range(k0 + max(f.start, 0), k0 + b)))
            cu_kf.append(cu_kf[-1] + b - f.start)

        def dev(x, dt=torch.int64):
            return torch.tensor(x, dtype=dt, device=cu_q.device)

        same_q = cu_qf == list(queries.offsets)
        same_k = cu_kf == list(keys.offsets)
        frame = PackedFrame(own_offsets(dev(cu_qf, cu_q.dtype), cu_qf), own_offsets(dev(cu_kf, cu_k.dtype), cu_kf),
                            None if same_q else dev(q_rows), None if same_q else dev(q_from),
                            None if same_k else dev(k_from))
    if len(_FRAMES) >= 64:
        _FRAMES.clear()
    _FRAMES[key] = frame
    return frame


def _gather(x: Optional[torch.Tensor], rows: torch.Tensor) -> Optional[torch.Tensor]:
    """x's rows `rows` along dim 1, the row one past its end a zero row (differentiable: one gather; its backward
    adds each real row's gradient once, so it is exact)."""
    if x is None:
        return None
    return torch.cat([x, x.new_zeros(1, 1, *x.shape[2:])], dim=1).index_select(1, rows)


def apply_packed_frame(frame: PackedFrame, q, k, v, g):
    """q, k, v, g laid in `frame` (`frame_packed`)."""
    if frame.q_from is not None:
        q = _gather(q, frame.q_from)
    if frame.k_from is not None:
        k, v, g = (_gather(x, frame.k_from) for x in (k, v, g))
    return q, k, v, g


def _empty_f32(device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=device)


# ----------------------------------------------------------------------------------------------------------------
# torch.compile: custom ops
# ----------------------------------------------------------------------------------------------------------------

@torch.library.custom_op("fla_bwd::parallel_attn_fwd", mutates_args=())
def parallel_attn_fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor], sink_bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor], scale: float, window_size: int, return_lse: bool = False,
    softcap: float = 0.0, window_right: Optional[int] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, lse, the gate's cumsum or empty, the user's lse `[B, T, HQ]` or empty). `window_size` 0 means full
    causal."""
    # No o_lo (`host.forward`'s for_backward): the op cannot tell whether a backward follows, so its gated calls
    # take seven products.
    o, lse, g_cumsum, _, _, lse_out = host.forward(q, k, v, g, sink_bias, cu_seqlens, scale, window_size,
                                                   return_lse=return_lse, softcap=softcap,
                                                   window_right=window_right, cu_seqlens_q=cu_seqlens_q)
    return (o, lse, g_cumsum if g_cumsum is not None else _empty_f32(q.device),
            lse_out if lse_out is not None else _empty_f32(q.device))


@parallel_attn_fwd_op.register_fake
def _fwd_fake(q, k, v, g, sink_bias, cu_seqlens, scale, window_size, return_lse=False, softcap=0.0,
              window_right=None, cu_seqlens_q=None):
    B, Tq, HQ, _ = q.shape
    T = k.shape[1]  # the kernels' lse and gc are over the keys' positions
    lse = q.new_empty(HQ, B * T, dtype=torch.float32)
    g_cumsum = q.new_empty(HQ, B * T, dtype=torch.float32) if g is not None else q.new_empty(0, dtype=torch.float32)
    lse_out = q.new_empty(B, Tq, HQ, dtype=torch.float32) if return_lse else q.new_empty(0, dtype=torch.float32)
    return q.new_empty(B, Tq, HQ, v.shape[3]), lse, g_cumsum, lse_out


@torch.library.custom_op("fla_bwd::parallel_attn_bwd", mutates_args=())
def parallel_attn_bwd_op(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    g_cumsum: torch.Tensor, g: Optional[torch.Tensor], sink_bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor], scale: float, window_size: int, dlse: Optional[torch.Tensor] = None,
    softcap: float = 0.0, window_right: Optional[int] = None, cu_seqlens_q: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg or empty, dsink or empty); dg and dsink in g's and sink_bias's dtypes. `dlse`: the gradient
    of the user's lse, or None."""
    grads = host.backward(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale, window_size, dlse=dlse,
                          softcap=softcap, window_right=window_right, cu_seqlens_q=cu_seqlens_q)
    return tuple(x if x is not None else _empty_f32(q.device) for x in grads)


@parallel_attn_bwd_op.register_fake
def _bwd_fake(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale, window_size, dlse=None, softcap=0.0,
              window_right=None, cu_seqlens_q=None):
    empty = q.new_empty(0, dtype=torch.float32)
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
            torch.empty_like(g) if g is not None else empty,
            torch.empty_like(sink_bias) if sink_bias is not None else empty)


def _save(ctx, inputs, output, call=None, o_lo=None):
    q, k, v, g, sink_bias, cu_seqlens, scale, window_size, return_lse, softcap, window_right, cu_seqlens_q = inputs
    o, lse, g_cumsum = output[:3]  # the custom op's 4th, the user's lse, is no input of the backward
    ctx.save_for_backward(q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, o_lo, cu_seqlens_q)
    ctx.scale, ctx.window_size, ctx.call, ctx.return_lse = scale, window_size, call, return_lse
    ctx.softcap, ctx.window_right = softcap, window_right


def _gradients(ctx, do, dlse, backward, *call):
    """The gradients of the forward's 12 inputs from `do` and `dlse` (the user's lse's, or None; either may be None
    where autograd hands none), through `backward` (the custom op, or `host.backward` with the forward's
    `host.Call` and o_lo)."""
    q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, o_lo, cu_seqlens_q = ctx.saved_tensors
    extra = (*call, o_lo) if call else ()
    # With the Call, its Shape has these.
    cap = {} if call else {"softcap": ctx.softcap, "window_right": ctx.window_right}
    # A loss of lse alone: o's gradient is zero (a rare call, so no kernel variant for it).
    do = torch.zeros_like(o) if do is None else do.contiguous()
    dlse = dlse.float().contiguous() if dlse is not None and ctx.return_lse else None
    dq, dk, dv, dg, dsink = backward(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, ctx.scale,
                                     ctx.window_size, *extra, dlse=dlse, cu_seqlens_q=cu_seqlens_q, **cap)
    return (dq, dk, dv, dg if g is not None else None, dsink if sink_bias is not None else None, None, None, None,
            None, None, None, None)


def _op_backward(ctx, do, lse, dgc, dlse):
    # `lse` is the kernels' own (base 2, head-major), never handed to the user: its gradient is zero.
    return _gradients(ctx, do, dlse, parallel_attn_bwd_op)


def _refuse_double_backward(ctx, *grads):
    raise RuntimeError(_NOT_TWICE)


def _no_context(ctx, inputs, output):
    pass


parallel_attn_fwd_op.register_autograd(_op_backward, setup_context=_save)
parallel_attn_bwd_op.register_autograd(_refuse_double_backward, setup_context=_no_context)


# ----------------------------------------------------------------------------------------------------------------
# Eager: autograd.Function
# ----------------------------------------------------------------------------------------------------------------

class EagerParallelAttn(torch.autograd.Function):
    """The custom ops' formula for eager calls (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, g, sink_bias, cu_seqlens, scale, window_size, return_lse=False, softcap=0.0,
                window_right=None, cu_seqlens_q=None):
        o, lse, g_cumsum, o_lo, call, lse_out = host.forward(q, k, v, g, sink_bias, cu_seqlens, scale, window_size,
                                                             any(ctx.needs_input_grad), return_lse, softcap,
                                                             window_right, cu_seqlens_q)
        _save(ctx, (q, k, v, g, sink_bias, cu_seqlens, scale, window_size, return_lse, softcap, window_right,
                    cu_seqlens_q), (o, lse, g_cumsum), call, o_lo)
        if not return_lse:
            return o
        # Unused outputs' gradients arrive as None, not zeros: an lse the loss does not use costs the backward
        # nothing, and a loss of lse alone needs no dO from autograd.
        ctx.set_materialize_grads(False)
        return o, lse_out

    @staticmethod
    def backward(ctx, do, dlse=None):
        if not torch.is_grad_enabled():  # a plain backward (autograd runs it without grad unless create_graph)
            return _gradients(ctx, do, dlse, host.backward, ctx.call)
        with torch.no_grad():
            grads = _gradients(ctx, do, dlse, host.backward, ctx.call)
        # create_graph=True: hand back gradients that refuse a second differentiation with a clear error (as the
        # custom op's backward does), rather than silently non-differentiable ones. The saved inputs (which
        # require grad) go in too, so that the outputs carry this node.
        live = [i for i, x in enumerate(grads) if x is not None]
        guarded = _NoDoubleBackward.apply(len(live), *(grads[i] for i in live), *ctx.saved_tensors[:3])
        out = list(grads)
        for i, x in zip(live, guarded):
            out[i] = x
        return tuple(out)


class _NoDoubleBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(x.view_as(x) for x in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_NOT_TWICE)


class NoKeyVisible(torch.autograd.Function):
    """`window_size=0` with a sink (FLA's meaning): no key is visible, the sink takes all the softmax mass, so o is
    0 whatever the inputs and every gradient is 0; with `return_lse`, lse is the sink's logit in every row, and the
    sink's gradient is the sum of lse's over its rows. No kernel runs."""

    @staticmethod
    def forward(ctx, q, k, v, g, sink_bias, return_lse=False):
        ctx.save_for_backward(q, k, v, g, sink_bias)
        o = q.new_zeros(*q.shape[:3], v.shape[3])
        if not return_lse:
            return o
        ctx.set_materialize_grads(False)
        return o, sink_bias.float().expand(*q.shape[:3]).contiguous()

    @staticmethod
    def backward(ctx, do, dlse=None):
        grads = [torch.zeros_like(x) if x is not None else None for x in ctx.saved_tensors]
        if dlse is not None:
            grads[4] = dlse.float().sum((0, 1)).to(grads[4].dtype)
        return (*grads, None)
