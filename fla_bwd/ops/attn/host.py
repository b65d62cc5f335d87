# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The host side of `parallel_attn`: buffers, NaN/Inf containment, and the launches of a forward and a backward.

`forward` and `backward` are the whole computation of a call (the autograd layer calls nothing else). Each looks up
the call's `Plan` (`fla_bwd.ops.utils.launch`), keyed on everything the plan is built from, and runs it; a plan is
built once per kind of call by `_build_forward` / `_build_backward`, which add one kernel's launches each through
`add_fwd`, `add_dq`, `add_dkv` and `add_contained` (see there). So a call's host work is its key, its buffers
and its launches (issue 19). Tile configs and policies come from `config.py`.
"""

import contextlib
import functools
import math
from typing import NamedTuple, Optional

import torch

from fla_bwd import settings
from fla_bwd.ops.attn.config import DELTA_MODES, contain_inline, dkv_tiles, tile_config
from fla_bwd.ops.attn.from_ds import FiveProduct, add_five_product_backward, five_product_chunk, needs_exact_o
from fla_bwd.ops.attn.gluon_dkv import HopperDkvLaunch
from fla_bwd.ops.attn.inner import DS_BY_DESCRIPTOR, FIXUP, FLAG, INLINE
from fla_bwd.ops.attn.parallel import (
    DkvKernel,
    dkv_kernel_for,
    ds_store_mode,
    parallel_attn_bwd_kernel_dkv_per_kv_head,
    parallel_attn_bwd_kernel_dkv_per_query_head,
    parallel_attn_bwd_kernel_dq,
    parallel_attn_fwd_kernel,
)
from fla_bwd.ops.utils.cumsum import add_gate_cumsum, add_gate_grad
from fla_bwd.ops.utils.group_sum import add_group_sum
from fla_bwd.ops.utils.index import VarlenTiles, sequence_lengths, varlen_tiles
from fla_bwd.ops.utils.launch import Empty, Plan, Ref, aligned
from fla_bwd.utils import cdiv, next_power_of_2

_F32 = torch.float32


# ----------------------------------------------------------------------------------------------------------------
# What a plan is built from
# ----------------------------------------------------------------------------------------------------------------

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
    W: int  # the window clamped to T (`_window`)
    containment: str  # settings.forced_containment() at the call
    Q0: int = 0  # tail queries (`tail_forward`): q holds positions [Q0, T) of the keys' sequence; 0: all of them


class Call(NamedTuple):
    """What the forward of a call decided, which its backward reuses: the plan key (a `Shape`, the packed tile
    counts and the inputs' alignment), the packed offsets read at the forward (None when dense), and whether q, k
    and v all start 16-byte aligned (the Hopper dK/dV kernel's TMA needs it, `gluon_dkv.why_not`)."""
    key: tuple
    shape: Shape
    tiles: Optional[VarlenTiles]
    qkv_aligned: bool


def _window(window_size: int, T: int) -> int:
    # W == T already admits every causal pair; clamping keeps the kernels' int32 range arithmetic small.
    return T if window_size == 0 else min(window_size, max(T, 1))


def call_of(q, k, v, g, sink_bias, cu_seqlens, scale: float, window_size: int) -> Call:
    """The `Call` of validated contiguous inputs; reads and checks `cu_seqlens`' values (`varlen_tiles`)."""
    B, T, HQ, K = q.shape
    tiles = varlen_tiles(cu_seqlens, T) if cu_seqlens is not None else None
    shape = Shape(q.device, B, T, HQ, k.shape[2], K, v.shape[3], q.dtype, g.dtype if g is not None else None,
                  sink_bias.dtype if sink_bias is not None else None, scale, _window(window_size, T),
                  settings.forced_containment())
    qkv = (aligned(q), aligned(k), aligned(v))
    key = (shape, tiles.key if tiles is not None else None, *qkv, aligned(g), aligned(sink_bias), aligned(cu_seqlens))
    return Call(key, shape, tiles, all(qkv))


# Plans by key. Cleared when full: a process that keeps changing shapes rebuilds, one that trains reuses.
_PLANS: dict = {}
_MAX_PLANS = 512


def clear_plans() -> None:
    """Drop every cached plan: after a change to the tables they were built from or that the backward's dispatch
    reads (`config`; the tune harness)."""
    _PLANS.clear()


def _plan(key: tuple, build, *args) -> Plan:
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = build(*args)
    return plan


def _run(plan: Plan, env: dict, tiles: Optional[VarlenTiles]) -> dict:
    if tiles is not None:
        for BT in plan.tile_sizes:
            env[f"chunks{BT}"] = tiles.chunk_indices(BT)
    with _on_device(plan.device):
        return plan.run(env)


def _on_device(device: torch.device):
    """Triton launches on the current CUDA device (and its current stream): inputs on another GPU need it switched
    for the call (a tensor on cuda:1 while cuda:0 is current would otherwise be read from the wrong device)."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------------------------
# Containment
# ----------------------------------------------------------------------------------------------------------------

def add_contained(plan: Plan, s: Shape, kernel, programs: int, args: dict) -> None:
    """Launch a kernel over `programs` programs so that a non-finite input reaches only the outputs that depend
    on it, in one of two ways, both exact (see `inner.any_nonfinite`):
    - two launches: a FLAG launch computes every tile plainly and stores per program whether its outputs are not
      finite; a FIXUP launch recomputes only the flagged tiles with containment and overwrites their outputs (the
      other programs read one byte and return);
    - inline: one launch; a program whose outputs are not finite recomputes its tile with containment at once.
    Inline keeps the contained copy of the loops in the kernel, which makes the compiler schedule the plain loops
    worse; two launches cost one more launch of host time. `contain_inline` picks by the amount of work (PERF.md
    #17, #18, #31)."""

    def scratch(mode) -> bool:  # a launch that stores dS through a tensor descriptor: Triton's scratch at launch
        return ds_store_mode(args.get("ds"), mode.value) == DS_BY_DESCRIPTOR.value

    if contain_inline(s.B, s.HQ, s.T, s.W, max(s.K, s.V)):
        plan.launch(kernel, (programs,), scratch(INLINE), nonfinite=None, CONTAIN=INLINE.value, **args)
        return
    # One flag buffer for every pair of the call (`_finish` allocates it): each FLAG launch writes all the flags
    # its FIXUP reads, and the pairs run in stream order. One allocation less per pair on the host.
    plan.flags = max(plan.flags, programs)
    for mode in (FLAG, FIXUP):
        plan.launch(kernel, (programs,), scratch(mode), nonfinite=Ref("flags"), CONTAIN=mode.value, **args)


# ----------------------------------------------------------------------------------------------------------------
# One kernel each
# ----------------------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _dims_of(HQ: int, H: int, K: int, V: int, dtype: torch.dtype) -> dict:
    """Head counts, head dims and their blocks, dot precision: launch arguments fixed by the inputs' shapes and
    dtype (read-only: callers spread it into launch arguments)."""
    return dict(HQ=HQ, H=H, G=HQ // H, K=K, V=V, BK=max(16, next_power_of_2(K)), BV=max(16, next_power_of_2(V)),
                DOT_PREC="ieee" if dtype == torch.float32 else "tf32")


def _common(plan: Plan, s: Shape, tiles: Optional[VarlenTiles], kernel: str):
    """(tile config, tiles per head program, launch arguments every attention kernel takes) for `kernel`."""
    cfg = tile_config(kernel, max(s.K, s.V), s.dtype)
    BT = cfg["BT"]
    if tiles is None:
        # Query-tiled kernels (fwd, dq) cover the query positions [Q0, T), the dK/dV kernels every key.
        NT, chunks = cdiv(s.T - (s.Q0 if not kernel.startswith("dkv") else 0), BT), None
    else:
        NT, chunks = tiles.num_tiles(BT), Ref(f"chunks{BT}")
        plan.tile_sizes.add(BT)
    args = dict(q=Ref("q"), k=Ref("k"), v=Ref("v"), cu_seqlens=Ref("cu_seqlens") if tiles is not None else None,
                chunk_indices=chunks, scale=s.scale, T=s.T, W=s.W, NTOK=s.B * s.T, B=s.B, Q0=s.Q0 or None,
                **_dims_of(s.HQ, s.H, s.K, s.V, s.dtype), **cfg)
    return cfg, NT, args


def add_fwd(plan: Plan, s: Shape, tiles, gc: Optional[Ref], sink: Optional[Ref], exact_o: bool = False) -> None:
    """o `[B, T - Q0, HQ, V]` (q's dtype) and the base-2 log-sum-exp lse `[HQ, B * T]` (fp32; with tail queries
    only the query positions are written); with `exact_o`, also "o_lo" (o's shape, int8): o's rounding, for a gated
    five-product backward (`from_ds.needs_exact_o`, `inner.o_lo_encode`)."""
    o = plan.empty("o", (s.B, s.T - s.Q0, s.HQ, s.V), s.dtype)
    o_lo = plan.empty("o_lo", (s.B, s.T - s.Q0, s.HQ, s.V), torch.int8) if exact_o else None
    lse = plan.empty("lse", (s.HQ, s.B * s.T), _F32)
    _, NT, args = _common(plan, s, tiles, "fwd")
    if NT > 0:
        add_contained(plan, s, parallel_attn_fwd_kernel, NT * s.B * s.HQ,
                       dict(args, o=o, o_lo=o_lo, lse=lse, g_cumsum=gc, sink_bias=sink))


def add_dq(plan: Plan, s: Shape, tiles, gc: Optional[Ref], dgc_q: Optional[Ref], delta_mode: str) -> int:
    """dq in q's dtype, and delta `[HQ, B * T]` fp32 for the dK/dV kernel, in one launch (two with containment).
    `delta_mode` (a key of `config.DELTA_MODES`) says how delta (rowsum(o * dO), from the rounded o) is computed
    and treated:
    - "rounded": used as is (no gate, no sink: its ~1e-3 relative error costs dq and dk little);
    - "refine": dq uses it, then overwrites it with the fp32 rowsum(P * dP) for the dK/dV kernel (gates: dgc is
      a reverse cumsum of dS sums, which turns delta's error into a random walk along the sequence); with gates
      it also stores the query side of dgc into `dgc_q` (see `inner.dkv_one_head`);
    - "exact": a first loop over the keys computes rowsum(P * dP) (two of dQ's three products), then dq uses it
      (sinks: with a sink, dP - delta = p_sink * dP on a row that sees few keys, a small difference that the
      rounded delta swamps; PERF.md #8). One launch with both loops since issue 19 (was two launches).
    With a sink it also stores "dsink_partial" `[HQ, partials]` fp32 for the dK/dV kernel, which sums them into
    dsink. Returns the number of partials per head.
    """
    dq = plan.empty("dq", (s.B, s.T - s.Q0, s.HQ, s.K), s.dtype)
    delta = plan.empty("delta", (s.HQ, s.B * s.T), _F32)
    _, NT, args = _common(plan, s, tiles, "dq")
    mode = DELTA_MODES[delta_mode]
    sink = s.sink_dtype is not None
    partial = plan.empty("dsink_partial", (s.HQ, NT * s.B), _F32) if sink else None
    if NT > 0:
        add_contained(plan, s, parallel_attn_bwd_kernel_dq, NT * s.B * s.HQ, dict(
            args, o=Ref("o"), do=Ref("do"), dq=dq, dgc_q=dgc_q, lse=Ref("lse"), delta=delta, g_cumsum=gc,
            sink_bias=Ref("sink_bias") if sink else None, dsink_partial=partial, REFINE_DELTA=mode.refine,
            EXACT_DELTA=mode.exact))
    return NT * s.B


def add_dkv(plan: Plan, s: Shape, tiles, gc: Optional[Ref], kernel: DkvKernel, partials: int,
            out_dtype: Optional[torch.dtype] = None) -> None:
    """dk, dv in the inputs' dtypes; "dgc_k" `[HQ, B * T]` fp32, minus the key side of the gradient w.r.t. the
    gate's cumsum (gates only; the dQ kernel stored the query side, `add_gate_grad` adds the two); "dsink" `[HQ]` in
    sink_bias's dtype (sinks only: the sum of the dQ kernel's `partials` per head). `kernel` (from
    `dkv_kernel_for`) says which kernel computes them. `out_dtype` (default the inputs' dtype): dk's and dv's dtype
    (fp32 for partials that are summed further, `tail_backward`)."""
    out_dtype = s.dtype if out_dtype is None else out_dtype
    if kernel.per_kv_head:
        launched, NH, extra = parallel_attn_bwd_kernel_dkv_per_kv_head, s.H * kernel.split, {"SPLIT": kernel.split}
    else:
        # One dK/dV per query head; with G > 1 they are summed in fp32 below.
        launched, NH, extra = parallel_attn_bwd_kernel_dkv_per_query_head, s.HQ, {}
    split = NH != s.H
    acc_dtype = _F32 if split else out_dtype
    dk = plan.empty("dk_part" if split else "dk", (s.B, s.T, NH, s.K), acc_dtype)
    dv = plan.empty("dv_part" if split else "dv", (s.B, s.T, NH, s.V), acc_dtype)
    _, NT, args = _common(plan, s, tiles, dkv_tiles(max(s.K, s.V), s.dtype, s.W, s.T, s.g_dtype is not None))
    if kernel.per_kv_head:
        extra.update(ds=None, dk_in=None, dv_in=None, NTILE=None, G0=None, CHUNK=None, HEADS=None, ACC_OUT=False)
    sink = s.sink_dtype is not None
    dsink = None
    if sink:
        # No tile, no program to sum: zeros (the gradient of a sink that no token saw).
        dsink = plan.empty("dsink", (s.HQ,), s.sink_dtype) if NT > 0 else plan.apply("dsink", torch.zeros_like,
                                                                                        Ref("sink_bias"))
    dgc_k = plan.empty("dgc_k", (s.HQ, s.B * s.T), _F32) if gc is not None else None
    if NT > 0:
        add_contained(plan, s, launched, NT * s.B * NH, dict(
            args, do=Ref("do"), dk=dk, dv=dv, dgc_k=dgc_k, lse=Ref("lse"), delta=Ref("delta"), g_cumsum=gc,
            dsink_partial=Ref("dsink_partial") if sink else None, dsink=dsink, NUM_PARTIALS=partials, **extra))
    if split:
        add_group_sum(plan, dk, dv, s.B, s.T, s.H, NH // s.H, s.K, s.V, out_dtype)


def add_dkv_chunk(plan: Plan, s: Shape, out: Optional[tuple], split: int, hopper: bool, **five) -> None:
    """One chunk's dK/dV launch of the five-product backward (`from_ds.add_five_product_backward`): the
    KV-head-owned kernel with the dS store, `split` programs a key tile; `out` its fp32 buffers `[B, T, H * split,
    *]`, or None for the last launch of an unsplit call ("dk", "dv" in the inputs' dtype). `hopper`: the Gluon
    kernel (`gluon_dkv`) computes the chunk as the FLAG launch of two-launch containment, and the Triton kernel's
    FIXUP launch recomputes the tiles it flagged."""
    dk, dv = out if out is not None else (plan.empty("dk", (s.B, s.T, s.H, s.K), s.dtype),
                                          plan.empty("dv", (s.B, s.T, s.H, s.V), s.dtype))
    _, NT, args = _common(plan, s, None, "dkv")
    if NT == 0:
        return
    programs = NT * s.B * s.H * split
    gated = s.g_dtype is not None
    args = dict(args, do=Ref("do"), dk=dk, dv=dv, dgc_k=None, lse=Ref("lse"),
                delta=Ref("delta"), g_cumsum=Ref("gc") if gated else None, dsink_partial=None, dsink=None,
                NUM_PARTIALS=0, SPLIT=split, **five)
    if not hopper:
        add_contained(plan, s, parallel_attn_bwd_kernel_dkv_per_kv_head, programs, args)
        return
    plan.flags = max(plan.flags, programs)
    plan.add(HopperDkvLaunch(s, split, five["CHUNK"], five["G0"], five["NTILE"], dict(
        q=Ref("q"), k=Ref("k"), v=Ref("v"), do=Ref("do"), lse=Ref("lse"), delta=Ref("delta"), ds=five["ds"], dk=dk,
        dv=dv, dk_in=five["dk_in"], dv_in=five["dv_in"], nonfinite=Ref("flags"), acc_out=five["ACC_OUT"],
        gc=args["g_cumsum"])))
    plan.launch(parallel_attn_bwd_kernel_dkv_per_kv_head, (programs,), nonfinite=Ref("flags"), CONTAIN=FIXUP.value,
                **args)


# ----------------------------------------------------------------------------------------------------------------
# A whole forward, a whole backward
# ----------------------------------------------------------------------------------------------------------------

def _sequences(s: Shape, tiles: Optional[VarlenTiles]) -> int:
    return s.B if tiles is None else len(tiles.lengths)


def _new_plan(s: Shape) -> Plan:
    plan = Plan(s.device)
    plan.tile_sizes = set()  # the BTs whose packed tile lists `_run` binds ("chunks{BT}")
    plan.flags = 0  # programs of the largest two-launch pair (`add_contained`)
    return plan


def _finish(plan: Plan) -> Plan:
    if plan.flags:
        plan.steps.insert(0, Empty("flags", (plan.flags,), torch.int8))
    plan.allocate_late()
    return plan


def _build_forward(s: Shape, tiles: Optional[VarlenTiles], exact_o: bool) -> Plan:
    plan = _new_plan(s)
    cu = Ref("cu_seqlens") if tiles is not None else None
    gc = None
    if s.g_dtype is not None:
        gc = add_gate_cumsum(plan, Ref("g"), cu, _sequences(s, tiles), s.B, s.T, s.HQ, (s.HQ, 1))
    add_fwd(plan, s, tiles, gc, Ref("sink_bias") if s.sink_dtype is not None else None, exact_o)
    return _finish(plan)


def _dispatch_settings() -> tuple:
    """The settings that the backward's dispatch reads (`five_product_chunk`, `dkv_kernel`), read now: with the call,
    they key a plan whose building ran the dispatch, so that a kind of call seen before skips it (PERF.md #62).
    `config`'s tables are not in it: `clear_plans` after changing them."""
    return (settings.forced_dkv_path(), settings.forced_containment(), settings.forced_dq_path(),
            settings.forced_ds_kernel(), settings.ds_budget_bytes())


def _build_gated_forward(call: Call) -> Plan:
    """A gated forward's plan, with o_lo where a backward under the settings now would take five products."""
    return _build_forward(call.shape, call.tiles, needs_exact_o(call.shape, call.tiles is None,
                                                                settings.forced_dkv_path(), call.qkv_aligned))


def _forward_plan(call: Call, gated_for_backward: bool) -> Plan:
    """The forward's plan; `gated_for_backward`: a gated call whose backward may follow, which makes o_lo where
    that backward would take five products (`needs_exact_o`), so its key holds the dispatch's settings."""
    if not gated_for_backward:
        return _plan((call.key, False), _build_forward, call.shape, call.tiles, False)
    return _plan(("fwd", call.key, _dispatch_settings()), _build_gated_forward, call)


def forward(q, k, v, g, sink_bias, cu_seqlens, scale: float, window_size: int, for_backward: bool = False):
    """(o, lse, the gate's cumsum gc times log2 e or None, o's rounding residual o_lo or None, the `Call` for the
    backward), for validated contiguous inputs. `window_size` 0 means full causal. `for_backward`: a backward may
    follow, so make o_lo where it would need it (`from_ds.needs_exact_o`: a gated call that takes five products)."""
    call = call_of(q, k, v, g, sink_bias, cu_seqlens, scale, window_size)
    plan = _forward_plan(call, for_backward and g is not None)  # ungated calls never need o_lo
    env = _run(plan, dict(q=q, k=k, v=v, g=g, sink_bias=sink_bias, cu_seqlens=cu_seqlens), call.tiles)
    return env["o"], env["lse"], env.get("gc"), env.get("o_lo"), call


def _delta_mode(s: Shape) -> str:
    return "exact" if s.sink_dtype is not None else "refine" if s.g_dtype is not None else "rounded"


def _build_backward(s: Shape, tiles: Optional[VarlenTiles], kernel: Optional[DkvKernel],
                    five: Optional[FiveProduct]) -> Plan:
    plan = _new_plan(s)
    plan.five, plan.dkv = five, kernel  # the dispatch's decision, which the plan's key does not hold
    if five is not None:
        add_five_product_backward(plan, s, five, add_dkv_chunk)
        return _finish(plan)
    gc = Ref("gc") if s.g_dtype is not None else None
    # The gradient w.r.t. the gate's cumsum: the dQ kernel stores its query side, the dK/dV kernel minus its key
    # side, and the reverse cumsum adds them.
    dgc_q = plan.empty("dgc_q", (s.HQ, s.B * s.T), _F32) if gc is not None else None
    partials = add_dq(plan, s, tiles, gc, dgc_q, _delta_mode(s))
    add_dkv(plan, s, tiles, gc, kernel, partials)
    if gc is not None:
        cu = Ref("cu_seqlens") if tiles is not None else None
        add_gate_grad(plan, dgc_q, Ref("dgc_k"), cu, _sequences(s, tiles), s.B, s.T, s.HQ, s.g_dtype)
    return _finish(plan)


def dkv_kernel(call: Call, forced: str) -> DkvKernel:
    """The dK/dV kernel of this call's seven-product backward (`parallel.dkv_kernel_for`; `forced`:
    `settings.forced_dkv_path()`)."""
    s = call.shape
    return dkv_kernel_for(s.B, s.T, s.HQ, s.H, s.K, s.V, s.dtype, s.device, s.W,
                          sequence_lengths(s.B, s.T, call.tiles), forced)


def _build_dispatched_backward(call: Call, aligned_qkv_do: bool, exact_o: bool, forced_dkv: str) -> Plan:
    """The dispatch (five products or which seven-product dK/dV kernel), then the backward's plan."""
    five = five_product_chunk(call.shape, call.tiles is None, forced_dkv, aligned_qkv_do, exact_o)
    kernel = dkv_kernel(call, forced_dkv) if five is None else None  # five products launch their own dK/dV kernel
    # The plan's Shape keeps the forward's containment setting, which only keys plans: `contain_inline` reads the
    # setting now, when the plan is built (it may change between a forward and its backward; the key has it).
    return _build_backward(call.shape, call.tiles, kernel, five)


def _backward_plan(call: Call, do_aligned: bool, exact_o: bool) -> Plan:
    """The plan of a backward of `call` (q, k, v and dO 16-byte aligned or not, the forward's o_lo or not), keyed on
    the dispatch's inputs (`_dispatch_settings`). It records the dispatch: `five` (the five-product backward's
    `FiveProduct`, or None) and `dkv` (the seven-product backward's `DkvKernel`, or None)."""
    dispatch = _dispatch_settings()
    return _plan(("bwd", call.key, do_aligned, exact_o, dispatch), _build_dispatched_backward, call,
                 call.qkv_aligned and do_aligned, exact_o, dispatch[0])


def backward(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale: float, window_size: int,
             call: Optional[Call] = None, o_lo: Optional[torch.Tensor] = None):
    """(dq, dk, dv, dg or None, dsink or None): dg and dsink in g's and sink_bias's dtypes. `call` is the forward's
    (`forward` returns it); without it (the custom-op path) it is made again from the inputs. `o_lo`: the forward's
    (None where it made none; a gated call then takes seven products)."""
    if call is None:
        call = call_of(q, k, v, g, sink_bias, cu_seqlens, scale, window_size)
    plan = _backward_plan(call, aligned(do), o_lo is not None)
    env = _run(plan, dict(q=q, k=k, v=v, o=o, o_lo=o_lo, do=do, lse=lse, gc=g_cumsum, sink_bias=sink_bias,
                          cu_seqlens=cu_seqlens), call.tiles)
    return env["dq"], env["dk"], env["dv"], env.get("dg"), env.get("dsink")


# ----------------------------------------------------------------------------------------------------------------
# Tail queries: the building block of context parallelism (`context_parallel.py`)
# ----------------------------------------------------------------------------------------------------------------

def tail_alignment(D: int, dtype: torch.dtype) -> int:
    """What the query offset Q0 of a tail-query call must be a multiple of: every tile size (query tile, key tile,
    inner block) that the three kernels use at head dim D and `dtype` here (128 on a GPU in 16 bits, 64 in fp32;
    32 under the interpreter), so that no tile or block straddles Q0."""
    sizes = [cfg[k] for name in ("fwd", "dq", "dkv") for cfg in (tile_config(name, D, dtype),) for k in ("BT", "BS")]
    return math.lcm(*sizes)


def _tail_shape(q, k, v, gc, sink_bias, scale: float, window_size: int, cu_seqlens) -> Shape:
    """The `Shape` of a tail-query call (checked): q `[B, Tq, HQ, K]` holds the last Tq positions of the sequence of
    k `[B, Tk, H, K]`, v `[B, Tk, H, V]`; gc `[HQ, B * Tk]` fp32 (base-2 units) or None."""
    if cu_seqlens is not None:
        raise ValueError("tail queries (a q shorter than k, at the end of the sequence) do not support packed "
                         "sequences: cu_seqlens must be None")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"tail queries: q, k, v must be 4-D [B, T, heads, dim]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, Tq, HQ, K = q.shape
    Tk = k.shape[1]
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != K:
        raise ValueError(f"tail queries: k {tuple(k.shape)} and v {tuple(v.shape)} do not match q {tuple(q.shape)}")
    if not 0 < Tq <= Tk:
        raise ValueError(f"tail queries: q's length {Tq} must be in [1, k's length {Tk}]")
    align = tail_alignment(max(K, v.shape[3]), q.dtype)
    if (Tk - Tq) % align:
        raise ValueError(f"tail queries: the query offset Tk - Tq = {Tk - Tq} must be a multiple of {align} (every "
                         f"tile size the kernels use for this head dim and dtype)")
    if gc is not None and (gc.dtype != _F32 or tuple(gc.shape) != (HQ, B * Tk)):
        raise ValueError(f"tail queries: gc must be fp32 [HQ, B * Tk] = {[HQ, B * Tk]}; got {gc.dtype} "
                         f"{list(gc.shape)}")
    # dsink comes back in fp32 (sink_dtype below): the context-parallel caller sums it over ranks before the cast.
    return Shape(q.device, B, Tk, HQ, k.shape[2], K, v.shape[3], q.dtype, _F32 if gc is not None else None,
                 _F32 if sink_bias is not None else None, scale, _window(window_size, Tk),
                 settings.forced_containment(), Tk - Tq)


def _tail_key(s: Shape, *tensors) -> tuple:
    # The sink's own dtype too: the kernels read sink_bias in it, and the Shape says fp32 (dsink's dtype here).
    return (s, tuple(aligned(x) for x in tensors), tensors[-1].dtype if tensors[-1] is not None else None)


def _build_tail_forward(s: Shape) -> Plan:
    plan = _new_plan(s)
    add_fwd(plan, s, None, Ref("gc") if s.g_dtype is not None else None,
            Ref("sink_bias") if s.sink_dtype is not None else None)
    return _finish(plan)


def tail_forward(q, k, v, gc, sink_bias, scale: float, window_size: int, cu_seqlens=None):
    """Forward of tail queries: q `[B, Tq, HQ, K]` are the last Tq positions (Q0 = Tk - Tq on, a multiple of
    `tail_alignment`) of the Tk-long sequence of k and v (bottom-right causal alignment, as FlashAttention for
    seqlen_q < seqlen_k); dense only. gc: the gate's cumsum over the Tk positions, `[HQ, B * Tk]` fp32 in base-2
    units (`cumsum.gate_cumsum` times log2 e), or None. `window_size` 0: full causal.
    Returns (o `[B, Tq, HQ, V]`, lse `[HQ, B * Tk]`, written at the query positions only, for `tail_backward`)."""
    s = _tail_shape(q, k, v, gc, sink_bias, scale, window_size, cu_seqlens)
    plan = _plan(("tail_fwd", _tail_key(s, q, k, v, gc, sink_bias)), _build_tail_forward, s)
    env = _run(plan, dict(q=q, k=k, v=v, gc=gc, sink_bias=sink_bias), None)
    return env["o"], env["lse"]


def _build_tail_backward(s: Shape, kernel: DkvKernel, dkv_dtype: Optional[torch.dtype]) -> Plan:
    plan = _new_plan(s)
    gc = Ref("gc") if s.g_dtype is not None else None
    dgc_q = plan.empty("dgc_q", (s.HQ, s.B * s.T), _F32) if gc is not None else None
    partials = add_dq(plan, s, None, gc, dgc_q, _delta_mode(s))
    add_dkv(plan, s, None, gc, kernel, partials, dkv_dtype)
    return _finish(plan)


def tail_backward(do, q, k, v, o, lse, gc, sink_bias, scale: float, window_size: int, cu_seqlens=None,
                  dkv_dtype: Optional[torch.dtype] = None):
    """Backward of `tail_forward` (same q, k, v, gc, sink_bias, scale, window_size; its o and lse).
    Returns (dq `[B, Tq, HQ, K]`; dk `[B, Tk, H, K]` and dv `[B, Tk, H, V]`, these queries' contributions only, in
    the inputs' dtype or `dkv_dtype` (fp32 for partials that are summed further); dgc_q `[HQ, B, Tq]` and dgc_k
    `[HQ, B, Tk]`, fp32, gates only, else None; dsink `[HQ]` fp32, sinks only). The gradient w.r.t. the gate's
    cumsum (natural units) at position p is dgc_k[p] plus dgc_q[p] where p is a query (the two halves of
    `inner.dkv_one_head`); the gate's gradient is its reverse cumsum."""
    s = _tail_shape(q, k, v, gc, sink_bias, scale, window_size, cu_seqlens)
    kernel = dkv_kernel_for(s.B, s.T, s.HQ, s.H, s.K, s.V, s.dtype, s.device, s.W, sequence_lengths(s.B, s.T, None),
                            settings.forced_dkv_path())
    plan = _plan(("tail_bwd", kernel, dkv_dtype, _tail_key(s, do, q, k, v, o, gc, sink_bias)), _build_tail_backward,
                 s, kernel, dkv_dtype)
    env = _run(plan, dict(q=q, k=k, v=v, o=o, do=do, lse=lse, gc=gc, sink_bias=sink_bias), None)
    dgc_q = dgc_k = None
    if gc is not None:
        dgc_q = env["dgc_q"].view(s.HQ, s.B, s.T)[:, :, s.Q0:]
        dgc_k = env["dgc_k"].view(s.HQ, s.B, s.T)
    return env["dq"], env["dk"], env["dv"], dgc_q, dgc_k, env.get("dsink")
