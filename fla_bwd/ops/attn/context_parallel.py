# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Context parallelism: `parallel_attn` over a sequence whose tokens are split across the ranks of a
torch.distributed group (NCCL on GPUs, gloo on a CPU), built on the kernels' tail queries (`host.tail_forward`).

Layouts (tokens on dim 1, every rank the same local length C; N ranks, rank r):
- "contiguous": rank r holds tokens [r * C, (r + 1) * C).
- "balanced": the sequence is cut into 2N chunks of C / 2 tokens; rank r holds chunk r then chunk 2N - 1 - r, so
  every rank has the same causal work (a late chunk sees many keys, an early one few).
`shard` / `unshard` convert a full tensor to a rank's piece and back.

Forward: each local chunk of queries is one tail-query call against the keys up to its end (with a window, from
the first tile the window reaches). K and V (G times smaller than Q under GQA) move, not Q: one all_to_all each
sends a rank only the chunks its calls read (none after its last query; with a window, none before the window).
The gate is all-gathered whole (HQ numbers a token), so its cumsum is the one-process scan, bit for bit.
Backward: K, V and the gate are exchanged again (nothing is kept between the two); each chunk's dK/dV and
key-side gate gradient are fp32 partials over the keys it saw, sent to the tokens' owners with one all-to-all and
summed there in rank order; the gate gradient's reverse cumsum continues over the later chunks' totals
(all-gathered, summed in chunk order); dsink is the sum of every rank's fp32 partial in rank order. Every sum
that crosses ranks has a fixed order, so the backward is deterministic.

Bad input raises ValueError on every rank before any collective that could hang: local checks first, then one
small all-gather of every rank's shapes and verdict, then the same error everywhere.
"""

from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from fla_bwd.ops.attn import host
from fla_bwd.ops.utils.checks import check_attn_inputs, resolve_scale
from fla_bwd.ops.utils.cumsum import gate_cumsum

LAYOUTS = ("contiguous", "balanced")
_DTYPES = {torch.float16: 1, torch.bfloat16: 2, torch.float32: 3, torch.float64: 4}


# ----------------------------------------------------------------------------------------------------------------
# Layouts
# ----------------------------------------------------------------------------------------------------------------

def _group_info(group) -> Tuple[int, int]:
    """(rank in group, group size); ValueError when torch.distributed is not initialised or this rank is not in
    the group."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("context parallelism needs torch.distributed initialised (dist.init_process_group)")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of the group passed")
    return rank, dist.get_world_size(group)


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")


def _chunks_of(rank: int, N: int, layout: str) -> List[int]:
    """The global chunks a rank holds, in local order (chunks of T / N tokens contiguous, T / 2N balanced)."""
    return [rank] if layout == "contiguous" else [rank, 2 * N - 1 - rank]


def shard(x: torch.Tensor, layout: str = "contiguous", group=None) -> torch.Tensor:
    """This rank's piece (tokens on dim 1) of a full tensor `x` `[B, T, ...]` that every rank holds, in `layout`.
    T must be a multiple of N (contiguous) or 2N (balanced). No collective."""
    _check_layout(layout)
    rank, N = _group_info(group)
    parts = N if layout == "contiguous" else 2 * N
    if x.dim() < 2 or x.shape[1] % parts:
        raise ValueError(f"shard: dim 1 of x (shape {tuple(x.shape)}) must be a multiple of {parts} for the "
                         f"{layout} layout over {N} ranks")
    pieces = x.chunk(parts, dim=1)
    return torch.cat([pieces[m] for m in _chunks_of(rank, N, layout)], dim=1).contiguous()


def _gather(x: torch.Tensor, rank: int, N: int, layout: str, group) -> torch.Tensor:
    """The full tensor from every rank's piece (tokens on dim 1): one all_gather."""
    x = x.contiguous()
    pieces = [torch.empty_like(x) for _ in range(N)]
    dist.all_gather(pieces, x, group=group)
    if layout == "contiguous":
        return torch.cat(pieces, dim=1)
    c = x.shape[1] // 2
    chunks = [None] * (2 * N)
    for r, p in enumerate(pieces):
        a, b = _chunks_of(r, N, layout)
        chunks[a], chunks[b] = p[:, :c], p[:, c:]
    return torch.cat(chunks, dim=1)


def unshard(x: torch.Tensor, layout: str = "contiguous", group=None) -> torch.Tensor:
    """The full tensor `[B, T, ...]` from every rank's piece `x` `[B, T / N, ...]` in `layout` (an all_gather; every
    rank gets it). Every rank must call it with pieces of the same shape."""
    _check_layout(layout)
    rank, N = _group_info(group)
    return _gather(x, rank, N, layout, group)


# ----------------------------------------------------------------------------------------------------------------
# Checks: locally, then one exchange, then the same verdict on every rank
# ----------------------------------------------------------------------------------------------------------------

def _local_error(q, k, v, g, scale, window_size, sink_bias, cu_seqlens, layout, N) -> Optional[str]:
    if cu_seqlens is not None:
        return ("context_parallel_attn does not support packed sequences: cu_seqlens must be None (shard each "
                "sequence, or run packed batches with parallel_attn on one rank)")
    if layout not in LAYOUTS:
        return f"layout must be one of {LAYOUTS}; got {layout!r}"
    try:
        check_attn_inputs(q, k, v, g, scale, window_size, None, sink_bias, None, {})
    except (ValueError, TypeError) as e:
        return str(e)
    if isinstance(window_size, (tuple, list)):
        return (f"context_parallel_attn takes window_size as an int or None (causal attention only), got "
                f"{window_size!r}: flash-attn's (left, 0) is window_size=left + 1, (-1, 0) is None")
    if window_size == 0:
        return "context_parallel_attn: window_size=0 (no key visible) is not supported; use None for full causal"
    if k.shape[1] != q.shape[1]:
        return (f"context_parallel_attn: q and k must hold the same local length (q {q.shape[1]}, k {k.shape[1]} "
                f"tokens): queries shorter than keys are parallel_attn's, on one rank")
    C = q.shape[1]
    align = host.tail_alignment(max(q.shape[3], v.shape[3]), q.dtype)
    per = align if layout == "contiguous" else 2 * align
    if C == 0 or C % per:
        return (f"context_parallel_attn: the local length {C} must be a positive multiple of {per} for the {layout} "
                f"layout ({'two chunks' if layout == 'balanced' else 'one chunk'} of a multiple of {align}, every "
                f"tile size the kernels use at this head dim and dtype)")
    return None


def _check(q, k, v, g, scale, window_size, sink_bias, cu_seqlens, layout, group) -> Tuple[int, int]:
    """(rank, N) after every rank agreed that the inputs are valid and alike; else ValueError on every rank."""
    rank, N = _group_info(group)  # the same on every rank of a group, or not a collective's concern
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))

    def dims(x):
        return list(x.shape) + [0] * (4 - x.dim()) if x.dim() <= 4 else [-1] * 4

    size, error = 23, None
    try:  # nothing may raise before the exchange: the other ranks would wait in it forever
        error = _local_error(q, k, v, g, scale, window_size, sink_bias, cu_seqlens, layout, N)
        sc = float(scale) if isinstance(scale, (int, float)) else -1.0
        scale_bits = int(torch.tensor(sc, dtype=torch.float64).view(torch.int64))
        desc = [error is not None, N, hash(tuple(ranks)) % (1 << 61),
                LAYOUTS.index(layout) if layout in LAYOUTS else -1, *dims(q), *dims(k), *dims(v),
                _DTYPES.get(q.dtype, 0), g is not None, _DTYPES.get(g.dtype, 0) if g is not None else 0,
                sink_bias is not None, _DTYPES.get(sink_bias.dtype, 0) if sink_bias is not None else 0,
                -1 if window_size is None else int(window_size), scale_bits]
        assert len(desc) == size
    except Exception as e:  # noqa: BLE001 (any failure: the verdict is exchanged, then raised)
        error = error or f"context_parallel_attn: invalid input: {e}"
        desc = [1] + [0] * (size - 1)
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    mine = torch.tensor(desc, dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(N)]
    dist.all_gather(every, mine, group=group)
    every = torch.stack(every).cpu()
    if error is not None:
        raise ValueError(error)
    bad = every[:, 0].nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"context_parallel_attn: rank(s) {bad} of the group rejected their inputs (see the error "
                         f"there); every rank raises")
    differ = (every[:, 1:] != every[rank, 1:]).any(1).nonzero().flatten().tolist()
    if differ:
        raise ValueError(f"context_parallel_attn: rank(s) {differ} called with a different group, layout, shapes, "
                         f"dtypes, window, scale or optional inputs than rank {rank}; every rank must hold a shard of "
                         f"the same length of the same call")
    return rank, N


# ----------------------------------------------------------------------------------------------------------------
# The computation
# ----------------------------------------------------------------------------------------------------------------

def _calls(rank: int, N: int, layout: str, C: int, W: int, align: int) -> list:
    """Per local chunk: (local rows l0, l1, first key K0, query offset Q0, key end Tk), global positions. K0: the
    first key the window reaches (0 without a window), rounded down to `align` (`host.tail_alignment`) so that the
    key slice keeps every tile boundary: the tail call then does exactly the arithmetic of the full one."""
    u = C if layout == "contiguous" else C // 2
    out = []
    for i, m in enumerate(_chunks_of(rank, N, layout)):
        Q0, Tk = m * u, (m + 1) * u
        K0 = max(0, Q0 - W + 1) // align * align if W else 0
        out.append((i * u, (i + 1) * u, K0, Q0, Tk))
    return out


def _owners(N: int, layout: str, u: int) -> dict:
    """Global chunk -> (rank holding it, its first local row)."""
    return {m: (r, i * u) for r in range(N) for i, m in enumerate(_chunks_of(r, N, layout))}


def _needed(calls: list, u: int) -> list:
    """The global chunks (of u tokens) that these calls' key ranges [K0, Tk) reach."""
    return sorted({m for _, _, K0, _, Tk in calls for m in range(K0 // u, -(-Tk // u))})


def _exchange(x: torch.Tensor, rank: int, N: int, layout: str, W: int, align: int, group) -> dict:
    """The chunks of x (tokens on dim 1) that this rank's calls read, by global chunk, from one all_to_all: each
    rank sends only what another's key ranges reach (causality: no key after a rank's last query; a window: none
    before its first tile)."""
    x = x.contiguous()
    B, C = x.shape[:2]
    u = C if layout == "contiguous" else C // 2
    owner = _owners(N, layout, u)
    needs = [_needed(_calls(r, N, layout, C, W, align), u) for r in range(N)]
    pieces, send_sizes = [], []
    for r in range(N):
        mine = [m for m in needs[r] if owner[m][0] == rank]
        pieces += [x[:, owner[m][1]:owner[m][1] + u].reshape(-1) for m in mine]
        send_sizes.append(len(mine))
    numel = B * u * x[0, 0].numel()
    recv_sizes = [sum(owner[m][0] == j for m in needs[rank]) for j in range(N)]
    send = torch.cat(pieces) if pieces else x.new_empty(0)
    recv = x.new_empty(sum(recv_sizes) * numel)
    dist.all_to_all_single(recv, send, [n * numel for n in recv_sizes], [n * numel for n in send_sizes],
                           group=group)
    out, offset = {}, 0
    for j in range(N):  # rank j's pieces arrive in increasing chunk order
        for m in needs[rank]:
            if owner[m][0] == j:
                out[m] = recv[offset:offset + numel].view(B, u, *x.shape[2:])
                offset += numel
    return out


def _keys(chunks: dict, u: int, K0: int, Tk: int) -> torch.Tensor:
    """Tokens [K0, Tk) from the exchanged chunks, contiguous."""
    first = K0 // u
    x = torch.cat([chunks[m] for m in range(first, -(-Tk // u))], dim=1)
    return x[:, K0 - first * u:Tk - first * u].contiguous()


def _gc_slice(gc: Optional[torch.Tensor], B: int, T: int, K0: int, Tk: int) -> Optional[torch.Tensor]:
    if gc is None:
        return None
    return gc.view(-1, B, T)[:, :, K0:Tk].reshape(-1, B * (Tk - K0)).contiguous()


class _ContextParallelAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, sink_bias, scale, W, group, layout, rank, N):
        B, C = q.shape[:2]
        align = host.tail_alignment(max(q.shape[3], v.shape[3]), q.dtype)
        calls = _calls(rank, N, layout, C, W, align)
        u, T = calls[0][1], C * N
        kc, vc = (_exchange(x, rank, N, layout, W, align, group) for x in (k, v))
        # The gate is all-gathered whole (HQ numbers a token): its scan is then the one-process scan, bit for bit.
        gc = gate_cumsum(_gather(g, rank, N, layout, group), None) if g is not None else None
        os, lses = [], []
        for l0, l1, K0, _, Tk in calls:
            o, lse = host.tail_forward(q[:, l0:l1].contiguous(), _keys(kc, u, K0, Tk), _keys(vc, u, K0, Tk),
                                       _gc_slice(gc, B, T, K0, Tk), sink_bias, scale, W)
            os.append(o)
            lses.append(lse)
        o = torch.cat(os, dim=1) if len(os) > 1 else os[0]
        ctx.save_for_backward(q, k, v, g, sink_bias, o, *lses)
        ctx.args = (scale, W, group, layout, rank, N, calls)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, g, sink_bias, o, *lses = ctx.saved_tensors
        scale, W, group, layout, rank, N, calls = ctx.args
        do = do.contiguous()
        B, C, HQ, K = q.shape
        H, V = k.shape[2], v.shape[3]
        align = host.tail_alignment(max(K, V), q.dtype)
        u, T = calls[0][1], C * N
        kc, vc = (_exchange(x, rank, N, layout, W, align, group) for x in (k, v))
        gc = gate_cumsum(_gather(g, rank, N, layout, group), None) if g is not None else None
        owner = _owners(N, layout, u)
        # Per owner: fp32 partials of dk, dv and (gates) the key side of dgc, for its C tokens, packed on the last
        # dim.
        F = H * K + H * V + (HQ if g is not None else 0)
        send = torch.zeros(N, B, C, F, dtype=torch.float32, device=q.device)
        dqs, dgc_q, dsink = [], [], None
        for (l0, l1, K0, _, Tk), lse in zip(calls, lses):
            dq, dk, dv, dgcq, dgck, ds = host.tail_backward(
                do[:, l0:l1].contiguous(), q[:, l0:l1].contiguous(), _keys(kc, u, K0, Tk),
                _keys(vc, u, K0, Tk), o[:, l0:l1].contiguous(), lse, _gc_slice(gc, B, T, K0, Tk), sink_bias,
                scale, W, dkv_dtype=torch.float32)
            dqs.append(dq)
            parts = [dk.reshape(B, Tk - K0, H * K), dv.reshape(B, Tk - K0, H * V)]
            if g is not None:
                parts.append(dgck.permute(1, 2, 0))
                dgc_q.append(dgcq.permute(1, 2, 0))
            part = torch.cat(parts, dim=-1)
            for m in range(K0 // u, -(-Tk // u)):
                lo, hi = max(m * u, K0), min((m + 1) * u, Tk)
                r, off = owner[m]
                off += lo - m * u
                send[r, :, off:off + hi - lo] += part[:, lo - K0:hi - K0]
            if ds is not None:
                dsink = ds if dsink is None else dsink + ds
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        total = recv[0].clone()
        for i in range(1, N):  # rank order: the same sum on every run
            total += recv[i]
        dq = torch.cat(dqs, dim=1) if len(dqs) > 1 else dqs[0]
        dk = total[..., :H * K].reshape(B, C, H, K).to(k.dtype)
        dv = total[..., H * K:H * K + H * V].reshape(B, C, H, V).to(v.dtype)
        dg = None
        if g is not None:
            dgc = total[..., H * K + H * V:].clone()  # [B, C, HQ], natural units
            for (l0, l1, *_), part in zip(calls, dgc_q):
                dgc[:, l0:l1] += part
            dg = _reverse_cumsum(dgc, u, rank, N, layout, group).to(g.dtype)
        dsink_out = None
        if sink_bias is not None:
            every = [torch.empty_like(dsink) for _ in range(N)]
            dist.all_gather(every, dsink.contiguous(), group=group)
            acc = every[0].clone()
            for x in every[1:]:
                acc += x
            dsink_out = acc.to(sink_bias.dtype)
        return dq, dk, dv, dg, dsink_out, None, None, None, None, None, None


def _reverse_cumsum(dgc: torch.Tensor, u: int, rank: int, N: int, layout: str, group) -> torch.Tensor:
    """dg = the reverse cumsum of dgc over the global sequence, for this rank's chunks of u tokens `[B, C, HQ]`
    fp32: each chunk's own reverse cumsum plus the sum of every later chunk's total (all-gathered, summed from the
    last chunk backwards: a fixed order)."""
    mine = _chunks_of(rank, N, layout)
    totals = torch.stack([dgc[:, i * u:(i + 1) * u].sum(1) for i in range(len(mine))])  # [chunks, B, HQ]
    every = [torch.empty_like(totals) for _ in range(N)]
    dist.all_gather(every, totals.contiguous(), group=group)
    by_chunk = {}
    for r, t in enumerate(every):
        for i, m in enumerate(_chunks_of(r, N, layout)):
            by_chunk[m] = t[i]
    out = torch.empty_like(dgc)
    for i, m in enumerate(mine):
        later = torch.zeros_like(totals[0])
        for m2 in range(len(by_chunk) - 1, m, -1):
            later += by_chunk[m2]
        x = dgc[:, i * u:(i + 1) * u]
        out[:, i * u:(i + 1) * u] = x.flip(1).cumsum(1).flip(1) + later[:, None]
    return out


def context_parallel_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    window_size: Optional[int] = None,
    *,
    sink_bias: Optional[torch.Tensor] = None,
    group=None,
    layout: str = "contiguous",
    cu_seqlens: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`parallel_attn` over a sequence split by tokens across the ranks of `group` (default: the whole world).

    Every rank calls it with its shard, `[B, C, HQ, K]` q, `[B, C, H, K]` k, `[B, C, H, V]` v, optional `[B, C, HQ]`
    g (all in `layout`, module docstring; `shard` makes them from full tensors), the same `sink_bias` `[HQ]`, scale
    and window. Returns this rank's `[B, C, HQ, V]` o: the rows `parallel_attn` gives for these tokens on the
    gathered sequence; gradients likewise (dk, dv, dg for this rank's tokens; dsink the whole sum on every rank).
    C must be the same on every rank and a multiple of `host.tail_alignment` (two of them for "balanced"): 32
    under the interpreter, 128 on a GPU in 16 bits. Packed sequences (`cu_seqlens`) are not supported, nor are
    `parallel_attn`'s `causal=False`, window pairs, `softcap` and `return_lse` (not arguments here).
    Invalid input raises ValueError on every rank before any collective can hang."""
    rank, N = _check(q, k, v, g, scale, window_size, sink_bias, cu_seqlens, layout, group)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    g = g.contiguous() if g is not None else None
    sink_bias = sink_bias.contiguous() if sink_bias is not None else None
    return _ContextParallelAttn.apply(q, k, v, g, sink_bias, resolve_scale(scale, q.shape[-1]), window_size or 0,
                                      group, layout, rank, N)
