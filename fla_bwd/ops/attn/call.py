# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""What one call is, as the dispatch and the plans see it: its `Shape` (the sizes and flags a plan is built from) and
its `Call` (the plan key, the packed tiles read once at the forward, the inputs' alignment)."""

from typing import NamedTuple, Optional

import torch

from fla_bwd.ops.attn.config import tail_alignment
from fla_bwd.ops.utils.index import VarlenTiles, tail_tiles, varlen_tiles
from fla_bwd.ops.utils.launch import aligned


class Shape(NamedTuple):
    """The call's sizes and flags that a plan is built from (with `tiles` for packed calls)."""
    device: torch.device
    B: int
    T: int
    HQ: int
    H: int
    K: int
    V: int
    dtype: torch.dtype
    g_dtype: Optional[torch.dtype]  # None: no gate
    sink_dtype: Optional[torch.dtype]  # None: no sink
    scale: float
    W: int  # the window clamped to T (`window`)
    containment: str  # the FLA_BWD_CONTAINMENT setting at the call (`dispatch.knobs`)
    Q0: int = 0  # tail queries (q shorter than k): q holds positions [Q0, T) of the keys' sequence; 0: all of them
    softcap: float = 0.0  # logit soft-capping (`inner.scores`); 0: off
    WR: Optional[int] = None  # None: causal; else query i also sees keys up to i + WR (clamped to T, `right_window`)
    QP: bool = False  # packed tail queries: q's own offsets (cu_seqlens_q) give each sequence's last queries


class Call(NamedTuple):
    """What the forward of a call decided, which its backward reuses: the plan key (a `Shape`, the packed tile
    counts and the inputs' alignment), the packed offsets read at the forward (None when dense), whether q, k
    and v all start 16-byte aligned (the Hopper dK/dV kernel's TMA needs it, `dispatch.hopper_why_not`), and
    whether a packed batch runs as the dense batch it is laid out as (`make_call`; its outputs are then viewed
    back to the inputs' shapes, `host.forward`, `host.backward`)."""
    key: tuple
    shape: Shape
    tiles: Optional[VarlenTiles]
    qkv_aligned: bool
    packed_as_dense: bool = False


def window(window_size: int, T: int) -> int:
    """The window clamped to T (0: full causal): W == T already admits every causal pair, and the clamp keeps the
    kernels' int32 range arithmetic small."""
    return T if window_size == 0 else min(window_size, max(T, 1))


def right_window(window_right: Optional[int], T: int) -> Optional[int]:
    """The keys a query sees after itself, clamped to T (None: causal; -1: unbounded)."""
    if window_right is None:
        return None
    return T if window_right < 0 else min(window_right, T)


def make_call(q, k, v, g, sink_bias, cu_seqlens, scale: float, window_size: int, containment: str,
              softcap: float = 0.0, window_right: Optional[int] = None, cu_seqlens_q=None,
              on_tiles: bool = True) -> Call:
    """The `Call` of validated contiguous inputs under the containment setting `containment`; reads and checks
    `cu_seqlens`' values (`varlen_tiles`). A packed batch of N sequences of one length L > 0 is laid out exactly as
    the dense batch [N, L] (q `[1, N * L, HQ, K]`, and likewise k, v, g, o): it runs as that dense call, on every
    path the dense call has (`packed_as_dense`). A q shorter than k holds the last positions of each sequence
    (dense: Q0 = Tk - Tq, a multiple of `config.tail_alignment`, which `autograd.frame_tail` lays q and k in; packed:
    `cu_seqlens_q` gives q's own offsets, `cu_seqlens` k's, each sequence's offset such a multiple,
    `autograd.frame_packed`; `on_tiles` False: not checked, for `dispatch.select_backward`, which frames nothing)."""
    B, Tq, HQ, K = q.shape
    T = k.shape[1]
    Q0 = T - Tq  # before a packed batch's T becomes its sequences' length (packed calls have Tq == T)
    tiles = varlen_tiles(cu_seqlens, T) if cu_seqlens is not None else None
    if cu_seqlens_q is not None:
        align = tail_alignment(max(K, v.shape[3]), q.dtype) if on_tiles else 1
        tiles = tail_tiles(tiles, check_tail_offsets(varlen_tiles(cu_seqlens_q, Tq), tiles, align))
    as_dense = tiles is not None and B == 1 and tiles.one_length > 0 and cu_seqlens_q is None
    if as_dense:
        B, T, tiles = len(tiles.lengths), tiles.one_length, None
    shape = Shape(q.device, B, T, HQ, k.shape[2], K, v.shape[3], q.dtype, g.dtype if g is not None else None,
                  sink_bias.dtype if sink_bias is not None else None, scale, window(window_size, T), containment,
                  Q0=Q0, softcap=softcap, WR=right_window(window_right, T), QP=cu_seqlens_q is not None)
    qkv = (aligned(q), aligned(k), aligned(v))
    key = (shape, tiles.key if tiles is not None else None, *qkv, aligned(g), aligned(sink_bias), aligned(cu_seqlens))
    return Call(key, shape, tiles, all(qkv), as_dense)


def check_tail_offsets(queries: VarlenTiles, keys: VarlenTiles, align: int = 1) -> VarlenTiles:
    """q's offsets (`cu_seqlens`), checked against k's (`cu_seqlens_k`): one sequence each, at most as many queries as
    keys, each offset a multiple of `align` (`config.tail_alignment` once `autograd.frame_packed` has laid them on
    the tiles). Returns `queries`."""
    if len(queries.lengths) != len(keys.lengths):
        raise ValueError(f"cu_seqlens and cu_seqlens_k must hold one sequence each of q and k: {len(queries.lengths)} "
                         f"and {len(keys.lengths)} sequences")
    for n, (a, b) in enumerate(zip(queries.lengths, keys.lengths)):
        if a > b or (b - a) % align:
            raise ValueError(f"sequence {n} has {a} queries (cu_seqlens) and {b} keys (cu_seqlens_k): at most as "
                             f"many queries as keys (they are the sequence's last positions)"
                             + (f", the offset a multiple of {align}" if align > 1 else ""))
    return queries
