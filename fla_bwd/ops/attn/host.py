# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The host side of `parallel_attn`: a call's plans, built once per kind of call and replayed.

`forward` and `backward` are the whole computation of a call (the autograd layer calls nothing else). Each looks up
the call's `Plan` (`fla_bwd.ops.utils.launch`), keyed on everything the plan is built from: the call (`call.Call`),
the settings (`dispatch.Knobs`) and, for a backward, dO's alignment and whether the forward stored o_lo. A plan is
built once per key from the call's `dispatch.Route` alone, by one function per kernel launch (`add_fwd`, `add_dq`,
`add_dkv`, `add_five_product`: buffers, launch arguments, NaN/Inf containment). So a call's host work is its key,
one dict lookup, its buffers and its launches.

It imports the kernels (`kernels.py`) and is imported by `autograd` alone: imports run one way.
"""

import contextlib
import functools
from typing import Optional

import torch

from fla_bwd.ops.attn import dispatch
from fla_bwd.ops.attn.call import Call, Shape, make_call, window
from fla_bwd.ops.attn.config import (
    DELTA_MODES,
    DK_FROM_DS_ABOVE_D,
    DK_FROM_DS_LAUNCH,
    DQ_FROM_DS_LAUNCH,
    DQ_FROM_DS_LAUNCH_WIDE,
    tail_alignment,
    tile_config,
)
from fla_bwd.ops.attn.from_ds import (
    delta_kernel,
    ds_layout,
    gate_grad_of_band_kernel,
    key_side_kernel,
    parallel_attn_bwd_kernel_dk_from_ds,
    parallel_attn_bwd_kernel_dq_from_ds,
    sink_grad_kernel,
)
from fla_bwd.ops.attn.gluon_dkv import BT as HOPPER_DKV_BT
from fla_bwd.ops.attn.gluon_dkv import HopperDkvLaunch, packed_schedule
from fla_bwd.ops.attn.gluon_fwd import HopperFwdLaunch
from fla_bwd.ops.attn.inner import DS_BY_DESCRIPTOR, FIXUP, FLAG, INLINE
from fla_bwd.ops.attn.kernels import (
    ds_store_mode,
    parallel_attn_bwd_kernel_dkv_ds_per_kv_head,
    parallel_attn_bwd_kernel_dkv_per_kv_head,
    parallel_attn_bwd_kernel_dkv_per_query_head,
    parallel_attn_bwd_kernel_dq,
    parallel_attn_fwd_kernel,
)
from fla_bwd.ops.utils.cumsum import add_gate_cumsum, add_gate_grad
from fla_bwd.ops.utils.group_sum import add_group_sum
from fla_bwd.ops.utils.index import VarlenTiles
from fla_bwd.ops.utils.launch import Empty, Plan, Ref, aligned
from fla_bwd.utils import cdiv, is_interpreter, next_power_of_2

_F32 = torch.float32

# Plans by key. Cleared when full: a process that keeps changing shapes rebuilds, one that trains reuses.
_PLANS: dict = {}
_MAX_PLANS = 512


def clear_plans() -> None:
    """Drop every cached plan: after a change to the tables they were built from or that the dispatch reads
    (`config`; the tune harness)."""
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
        for BT in plan.query_tile_sizes:  # packed tail queries (`index.TailTiles`): the query kernels' tiles
            env[f"qchunks{BT}"] = tiles.queries.chunk_indices(BT)
        if plan.ds_bands is not None:  # packed five products: where each sequence's dS bands start
            env["ds_offsets"] = band_offsets(tiles, *plan.ds_bands)[1]
        if plan.ks_bands is not None:  # and its gate's partial key sums
            env["ks_offsets"] = key_offsets(tiles, plan.ks_bands)[1]
        if plan.hopper_sched is not None:  # the Hopper dK/dV kernel's items and 64-key tiles
            env["hopper_sched"] = packed_schedule(tiles, *plan.hopper_sched)
            env["k64_offsets"] = tiles.band_offsets(("keys64",), lambda n: cdiv(n, 64))[1]
    with _on_device(plan.device):
        return plan.run(env)


def _on_device(device: torch.device):
    """Triton launches on the current CUDA device (and its current stream): inputs on another GPU need it switched
    for the call (a tensor on cuda:1 while cuda:0 is current would otherwise be read from the wrong device)."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def band_offsets(tiles: VarlenTiles, W: int, BQ: int, BT: int, on_device: bool = True) -> tuple:
    """`tiles.band_offsets` of the five-product backward's dS bands (`from_ds.ds_layout`) at window W and tiles BQ x
    BT: (the tiles of one band of every sequence, their offsets by sequence on the device, or None)."""
    return tiles.band_offsets(("ds", W, BQ, BT), lambda n: ds_layout(n, W, BQ, BT), on_device)


def key_offsets(tiles: VarlenTiles, BQ: int, on_device: bool = True) -> tuple:
    """`tiles.band_offsets` of a gated five-product backward's partial key sums (`from_ds.key_side_kernel`):
    cdiv(n, 2 BQ) dQ-from-dS programs of n keys each, for a sequence of n tokens."""
    return tiles.band_offsets(("keys", BQ), lambda n: cdiv(n, 2 * BQ) * n, on_device)


def _bands_key(call: Call) -> Optional[tuple]:
    """What a packed backward's plan depends on beyond the call's key (tile counts): the sizes of its dS bands and
    its gate's key sums and the key side's blocks, which a five-product route allocates and launches
    (`add_five_product`); None for a dense call and for calls five products cannot run (fp32: no "dkv_ds" tiles)."""
    s = call.shape
    if call.tiles is None or s.QP or not dispatch.eligible(s):
        return None
    cfg = tile_config("dkv_ds", max(s.K, s.V), s.dtype)
    return (band_offsets(call.tiles, s.W, cfg["BS"], cfg["BT"], on_device=False)[0],
            key_offsets(call.tiles, cfg["BS"], on_device=False)[0], call.tiles.num_tiles(max(cfg["BT"], 256)))


def _sequences(s: Shape, tiles: Optional[VarlenTiles]) -> int:
    return s.B if tiles is None else len(tiles.lengths)


def call_of(q, k, v, g, sink_bias, cu_seqlens, scale: float, window_size: int, softcap: float = 0.0,
            window_right: Optional[int] = None, cu_seqlens_q=None) -> Call:
    """The `Call` of validated contiguous inputs, under the containment setting now."""
    return make_call(q, k, v, g, sink_bias, cu_seqlens, scale, window_size, dispatch.containment_knob(), softcap,
                     window_right, cu_seqlens_q)


# ----------------------------------------------------------------------------------------------------------------
# One function per kernel launch (the route's choices passed in; nothing here decides)
# ----------------------------------------------------------------------------------------------------------------

def new_plan(s, inline: bool) -> Plan:
    """An empty plan for a call of Shape s whose kernels contain NaN/Inf inline or in two launches (`inline`)."""
    plan = Plan(s.device)
    plan.tile_sizes = set()  # the BTs whose packed tile lists `host._run` binds ("chunks{BT}")
    plan.query_tile_sizes = set()  # and of the query tiles of packed tail queries ("qchunks{BT}")
    plan.flags = 0  # programs of the largest two-launch pair (`add_contained`)
    plan.ds_bands = None  # packed five products: (W, BQ, BT) of their dS bands, whose offsets `_run` binds
    plan.ks_bands = None  # and, gated, BQ of their key sums' (`key_offsets`)
    plan.hopper_sched = None  # and on the Hopper kernel: (H, split, programs) of its schedule (`packed_schedule`)
    plan.inline = inline
    return plan


def finish(plan: Plan) -> Plan:
    if plan.flags:
        plan.steps.insert(0, Empty("flags", (plan.flags,), torch.int8))
    plan.allocate_late()
    return plan


def add_contained(plan: Plan, kernel, programs: int, args: dict) -> None:
    """Launch a kernel over `programs` programs so that a non-finite input reaches only the outputs that depend
    on it, in one of two ways, both exact (see `inner.any_nonfinite`):
    - two launches: a FLAG launch computes every tile plainly and stores per program whether its outputs are not
      finite; a FIXUP launch recomputes only the flagged tiles with containment and overwrites their outputs (the
      other programs read one byte and return);
    - inline (`plan.inline`): one launch; a program whose outputs are not finite recomputes its tile with
      containment at once.
    Inline keeps the contained copy of the loops in the kernel, which makes the compiler schedule the plain loops
    worse; two launches cost one more launch of host time (`dispatch.contain_inline` picks)."""

    def scratch(mode) -> bool:  # a launch that stores dS through a tensor descriptor: Triton's scratch at launch
        return ds_store_mode(args.get("ds"), mode.value) == DS_BY_DESCRIPTOR.value

    if plan.inline:
        plan.launch(kernel, (programs,), scratch(INLINE), nonfinite=None, CONTAIN=INLINE.value, **args)
        return
    # One flag buffer for every pair of the call (`finish` allocates it): each FLAG launch writes all the flags
    # its FIXUP reads, and the pairs run in stream order. One allocation less per pair on the host.
    plan.flags = max(plan.flags, programs)
    for mode in (FLAG, FIXUP):
        plan.launch(kernel, (programs,), scratch(mode), nonfinite=Ref("flags"), CONTAIN=mode.value, **args)


@functools.lru_cache(maxsize=None)
def _dims_of(HQ: int, H: int, K: int, V: int, dtype: torch.dtype) -> dict:
    """Head counts, head dims and their blocks, dot precision: launch arguments fixed by the inputs' shapes and
    dtype (read-only: callers spread it into launch arguments)."""
    return dict(HQ=HQ, H=H, G=HQ // H, K=K, V=V, BK=max(16, next_power_of_2(K)), BV=max(16, next_power_of_2(V)),
                DOT_PREC="ieee" if dtype == torch.float32 else "tf32")


def _common(plan: Plan, s, tiles, kernel: str):
    """(tile config, tiles per head program, launch arguments every attention kernel takes) for `kernel`."""
    cfg = tile_config(kernel, max(s.K, s.V), s.dtype)
    BT = cfg["BT"]
    queries = not kernel.startswith("dkv")
    if tiles is None:
        # Query-tiled kernels (fwd, dq) cover the query positions [Q0, T), the dK/dV kernels every key.
        NT, chunks = cdiv(s.T - (s.Q0 if queries else 0), BT), None
    elif s.QP and queries:  # packed tail queries: the tiles of q's own sequences
        NT, chunks = tiles.queries.num_tiles(BT), Ref(f"qchunks{BT}")
        plan.query_tile_sizes.add(BT)
    else:
        NT, chunks = tiles.num_tiles(BT), Ref(f"chunks{BT}")
        plan.tile_sizes.add(BT)
    args = dict(q=Ref("q"), k=Ref("k"), v=Ref("v"), cu_seqlens=Ref("cu_seqlens") if tiles is not None else None,
                cu_seqlens_q=Ref("cu_seqlens_q") if s.QP else None, chunk_indices=chunks, scale=s.scale,
                softcap=s.softcap or None, T=s.T, W=s.W, WR=s.WR, NTOK=s.B * s.T, B=s.B,
                Q0=s.Q0 if s.Q0 and not s.QP else None, **_dims_of(s.HQ, s.H, s.K, s.V, s.dtype), **cfg)
    return cfg, NT, args


# ----------------------------------------------------------------------------------------------------------------
# The forward and the seven-product backward
# ----------------------------------------------------------------------------------------------------------------

def add_fwd(plan: Plan, s, tiles, gc: Optional[Ref], sink: Optional[Ref], exact_o: bool = False,
            lse_out: bool = False, hopper: bool = False) -> None:
    """o `[B, T - Q0, HQ, V]` (q's dtype) and the base-2 log-sum-exp lse `[HQ, B * T]` (fp32; with tail queries
    only the query positions are written); with `exact_o`, also "o_lo" (o's shape, int8): o's rounding, for a gated
    five-product backward (`dispatch.needs_o_lo`, `inner.o_lo_encode`); with `lse_out`, also "lse_out" `[B, T, HQ]`
    fp32, the natural-log lse that `return_lse` hands the user."""
    o = plan.empty("o", (s.B, s.T - s.Q0, s.HQ, s.V), s.dtype)
    o_lo = plan.empty("o_lo", (s.B, s.T - s.Q0, s.HQ, s.V), torch.int8) if exact_o else None
    lse = plan.empty("lse", (s.HQ, s.B * s.T), _F32)
    lse_user = plan.empty("lse_out", (s.B, s.T - s.Q0, s.HQ), _F32) if lse_out else None
    _, NT, args = _common(plan, s, tiles, "fwd")
    if NT == 0:
        return
    args = dict(args, o=o, o_lo=o_lo, lse=lse, lse_out=lse_user, g_cumsum=gc, sink_bias=sink)
    if not hopper:
        add_contained(plan, parallel_attn_fwd_kernel, NT * s.B * s.HQ, args)
        return
    # The Gluon kernel (`gluon_fwd`) is the FLAG launch of two-launch containment, over the Triton forward's tiles.
    plan.flags = max(plan.flags, NT * s.B * s.HQ)
    plan.add(HopperFwdLaunch(s, dict(args, nonfinite=Ref("flags"), NT=NT)))
    plan.launch(parallel_attn_fwd_kernel, (NT * s.B * s.HQ,), nonfinite=Ref("flags"), CONTAIN=FIXUP.value, **args)


def add_dq(plan: Plan, s, tiles, gc: Optional[Ref], dgc_q: Optional[Ref], delta_mode: str,
           dlse: Optional[Ref] = None) -> int:
    """dq in q's dtype, and delta `[HQ, B * T]` fp32 for the dK/dV kernel, in one launch (two with containment).
    `delta_mode` (a key of `config.DELTA_MODES`, `dispatch.Route.delta`) says how delta (rowsum(o * dO), from the
    rounded o) is computed and treated:
    - "rounded": used as is;
    - "refine": dq uses it, then overwrites it with the fp32 rowsum(P * dP) for the dK/dV kernel; with gates it also
      stores the query side of dgc into `dgc_q` (see `inner.dkv_one_head`);
    - "exact": a first loop over the keys computes rowsum(P * dP) (two of dQ's three products), then dq uses it.
    With a sink it also stores "dsink_partial" `[HQ, partials]` fp32 for the dK/dV kernel, which sums them into
    dsink. `dlse`: the gradient of the user's lse (`return_lse`), which every delta here subtracts. Returns the
    number of partials per head.
    """
    dq = plan.empty("dq", (s.B, s.T - s.Q0, s.HQ, s.K), s.dtype)
    delta = plan.empty("delta", (s.HQ, s.B * s.T), _F32)
    _, NT, args = _common(plan, s, tiles, "dq")
    mode = DELTA_MODES[delta_mode]
    sink = s.sink_dtype is not None
    partial = plan.empty("dsink_partial", (s.HQ, NT * s.B), _F32) if sink else None
    if NT > 0:
        add_contained(plan, parallel_attn_bwd_kernel_dq, NT * s.B * s.HQ, dict(
            args, o=Ref("o"), do=Ref("do"), dq=dq, dgc_q=dgc_q, lse=Ref("lse"), dlse=dlse, delta=delta, g_cumsum=gc,
            sink_bias=Ref("sink_bias") if sink else None, dsink_partial=partial, REFINE_DELTA=mode.refine,
            EXACT_DELTA=mode.exact))
    return NT * s.B


def add_dkv(plan: Plan, s, tiles, gc: Optional[Ref], kernel, dkv_tiles: str, partials: int,
            out_dtype: Optional[torch.dtype] = None) -> None:
    """dk, dv in the inputs' dtypes; "dgc_k" `[HQ, B * T]` fp32, minus the key side of the gradient w.r.t. the
    gate's cumsum (gates only; the dQ kernel stored the query side, `add_gate_grad` adds the two); "dsink" `[HQ]` in
    sink_bias's dtype (sinks only: the sum of the dQ kernel's `partials` per head). `kernel` (a `dispatch.DkvKernel`)
    says which kernel computes them, `dkv_tiles` its tile config. `out_dtype` (default the inputs' dtype): dk's and
    dv's dtype (fp32 for partials that are summed further, `host.tail_backward`)."""
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
    _, NT, args = _common(plan, s, tiles, dkv_tiles)
    sink = s.sink_dtype is not None
    dsink = None
    if sink:
        # No tile, no program to sum: zeros (the gradient of a sink that no token saw).
        dsink = plan.empty("dsink", (s.HQ,), s.sink_dtype) if NT > 0 else plan.apply("dsink", torch.zeros_like,
                                                                                        Ref("sink_bias"))
    dgc_k = plan.empty("dgc_k", (s.HQ, s.B * s.T), _F32) if gc is not None else None
    if NT > 0:
        add_contained(plan, launched, NT * s.B * NH, dict(
            args, do=Ref("do"), dk=dk, dv=dv, dgc_k=dgc_k, lse=Ref("lse"), delta=Ref("delta"), g_cumsum=gc,
            dsink_partial=Ref("dsink_partial") if sink else None, dsink=dsink, NUM_PARTIALS=partials, **extra))
    if split:
        add_group_sum(plan, dk, dv, s.B, s.T, s.H, NH // s.H, s.K, s.V, out_dtype)


# ----------------------------------------------------------------------------------------------------------------
# The five-product backward
# ----------------------------------------------------------------------------------------------------------------

def _add_dkv_ds(plan: Plan, s, tiles: Optional[VarlenTiles], out: Optional[tuple], split: int, hopper: bool,
                **five) -> None:
    """One chunk's dK/dV + dS launch: `parallel_attn_bwd_kernel_dkv_ds_per_kv_head`, `split` programs a key tile
    (packed: of `tiles`' list); `out` its fp32 buffers `[B, T, H * split, *]`, or None for the last launch of an
    unsplit call ("dk", "dv" in the inputs' dtype). `hopper`: the Gluon kernel (`gluon_dkv`, dense or packed)
    computes the chunk as the FLAG launch of two-launch containment, and the Triton kernel's FIXUP launch recomputes
    the tiles it flagged."""
    if five["DK_FROM_DS"]:  # dV alone: dK is `_add_dk_from_ds`'s
        dk, dv = None, out[1] if out is not None else plan.empty("dv", (s.B, s.T, s.H, s.V), s.dtype)
    else:
        dk, dv = out if out is not None else (plan.empty("dk", (s.B, s.T, s.H, s.K), s.dtype),
                                              plan.empty("dv", (s.B, s.T, s.H, s.V), s.dtype))
    _, NT, args = _common(plan, s, tiles, "dkv_ds")
    if NT == 0:
        return
    programs = NT * s.B * s.H * split
    gated = s.g_dtype is not None
    for unused in ("cu_seqlens_q", "Q0"):  # every query: the kernel takes neither
        del args[unused]
    sink = Ref("sink_bias") if five["sink_part"] is not None else None
    args = dict(args, do=Ref("do"), dk=dk, dv=dv, lse=Ref("lse"), delta=Ref("delta"),
                g_cumsum=Ref("gc") if gated else None, sink_bias=sink, SPLIT=split, **five)
    if not hopper:
        add_contained(plan, parallel_attn_bwd_kernel_dkv_ds_per_kv_head, programs, args)
        return
    plan.flags = max(plan.flags, programs)
    step = HopperDkvLaunch(s, split, five["CHUNK"], five["G0"], five["NTILE"], dict(
        q=Ref("q"), k=Ref("k"), v=Ref("v"), do=Ref("do"), lse=Ref("lse"), delta=Ref("delta"), ds=five["ds"], dk=dk,
        dv=dv, dk_in=five["dk_in"], dv_in=five["dv_in"], nonfinite=Ref("flags"), acc_out=five["ACC_OUT"],
        gc=args["g_cumsum"], sink_bias=sink, sink_part=five["sink_part"], ds_offsets=five["ds_offsets"]), tiles)
    if tiles is not None:  # its items per call (`_run`), of the 128-key tiles
        plan.hopper_sched = (s.H, split, step.programs)
        plan.tile_sizes.add(HOPPER_DKV_BT)
    plan.add(step)
    plan.launch(parallel_attn_bwd_kernel_dkv_ds_per_kv_head, (programs,), nonfinite=Ref("flags"),
                CONTAIN=FIXUP.value, **args)


def _add_dk_from_ds(plan: Plan, s, tiles: Optional[VarlenTiles], dk: Ref, dk_in: Optional[Ref], acc_out: bool,
                    heads_of: dict, varlen: dict) -> None:
    """dk of one chunk's heads from its stored dS tiles (`parallel_attn_bwd_kernel_dk_from_ds`), a program a key tile
    (packed: of `tiles`' list) of each share: into `dk` (`[B, T, H * split, K]`), from the earlier chunks' fp32 sums
    `dk_in`; fp32 unscaled with `acc_out`. `varlen`: the packed call's cu_seqlens and band offsets (or Nones)."""
    BT, NUM_PARTS = heads_of["BT"], heads_of["NUM_BANDS"] // heads_of["CHUNK"]
    key_tiles, chunks = cdiv(s.T, BT), None
    if tiles is not None:
        key_tiles, chunks = tiles.num_tiles(BT), Ref(f"chunks{BT}")
        plan.tile_sizes.add(BT)
    plan.launch(parallel_attn_bwd_kernel_dk_from_ds, (key_tiles * NUM_PARTS,), q=Ref("q"), ds=heads_of["ds"],
                dk=dk, dk_in=dk_in, chunk_indices=chunks, **varlen, scale=s.scale, T=s.T, W=s.W,
                NTILE=heads_of["NTILE"], G0=heads_of["G0"],
                HQ=s.HQ, H=s.H, G=heads_of["G"], SPLIT=heads_of["SPLIT"], CHUNK=heads_of["CHUNK"], K=s.K, BT=BT,
                BQ=heads_of["BQ"], BK=max(16, next_power_of_2(s.K)), NUM_PARTS=NUM_PARTS, ACC_OUT=acc_out,
                **DK_FROM_DS_LAUNCH)


def add_gate_grad_by_band(plan: Plan, dgk_part: Ref, dgc_q: Ref, dg: Ref, s, heads_of: dict) -> None:
    """Add `gate_grad_of_band_kernel` for the bands of one chunk (`heads_of`: the chunk's launch arguments) into
    dg: keys a block as many as fill 8 warps' registers with one load of the partials (under the interpreter
    one key tile, so that the tests' sequences cross several blocks)."""
    BT = heads_of["BT"]
    BR = BT if is_interpreter() else max(BT, min(1024, next_power_of_2(s.T)))
    plan.launch(gate_grad_of_band_kernel, (heads_of["NUM_BANDS"],), dgk_part=dgk_part, dgc_q=dgc_q, dg=dg,
                HQ=s.HQ, BR=BR, BP=max(1, min(16, 8192 // BR)), **heads_of, num_warps=8 if BR >= 1024 else 4)


def add_sink_grad(plan: Plan, s, delta, sink_part, NP: int, dlse: Optional[Ref]) -> None:
    """"dsink" `[HQ]` in sink_bias's dtype (`sink_grad_kernel`, one program a query head) from lse, delta and the
    dK/dV kernels' partial sums `sink_part` `[HQ, NP]`; zeros where no query row exists (the gradient of a
    sink that no token saw); with `dlse` (`return_lse`), its gradient through the user's lse too."""
    NTOK = s.B * s.T
    if NTOK == 0:
        plan.apply("dsink", torch.zeros_like, Ref("sink_bias"))
        return
    plan.launch(sink_grad_kernel, (s.HQ,), lse=Ref("lse"), delta=delta, dlse=dlse, sink_bias=Ref("sink_bias"),
                sink_part=sink_part, dsink=plan.empty("dsink", (s.HQ,), s.sink_dtype), NTOK=NTOK, NP=NP, HQ=s.HQ,
                BN=min(1024, next_power_of_2(NTOK)), BP=min(1024, next_power_of_2(NP)))


def add_five_product(plan: Plan, s, route, dlse: Optional[Ref] = None, tiles: Optional[VarlenTiles] = None) -> None:
    """The five-product backward of `route` (`dispatch.Route` with `five`): delta, then per chunk of query heads its
    dK/dV + dS launches (`route.heads_per_launch` heads of each share a launch) and its dQ-from-dS launch; with a
    split, the shares' fp32 dK/dV partials summed last (`add_group_sum`). Buffers: "dq", "delta", "ds" (the chunk's
    tiles, reused by every chunk), and two fp32 dK/dV sum buffers when there are several launches (ping-pong: a
    FIXUP launch re-reads the sums its FLAG launch started from). `dlse` as in `add_dq`: delta subtracts it. Packed
    (`tiles`): each sequence's bands hold its own length's tiles (`band_offsets`)."""
    G = s.HQ // s.H
    split, chunk, hopper, dk_from_ds = route.five
    cfg = tile_config("dkv_ds", max(s.K, s.V), s.dtype)
    BT, BQ = cfg["BT"], cfg["BS"]
    packed = tiles is not None
    NTOK = s.B * s.T
    dq = plan.empty("dq", (s.B, s.T, s.HQ, s.K), s.dtype)
    delta = plan.empty("delta", (s.HQ, NTOK), torch.float32)
    R = NTOK * s.HQ
    BV = next_power_of_2(s.V)
    BR = max(1, 4096 // BV)
    gated = s.g_dtype is not None
    if R:
        plan.launch(delta_kernel, (cdiv(R, BR),), o=Ref("o"), o_lo=Ref("o_lo") if route.delta == "o+o_lo" else None,
                    do=Ref("do"), dlse=dlse, delta=delta, R=R, NTOK=NTOK, HQ=s.HQ, V=s.V, BR=BR, BV=BV)
    # With a sink: each head's fp32 sums of p_sink * dS, a (batch, key tile) each (`_dkv_heads`).
    sink_tiles = tiles.num_tiles(BT) if packed else s.B * cdiv(s.T, BT)
    sink_part = plan.empty("sink_part", (s.HQ, sink_tiles), torch.float32) if s.sink_dtype is not None else None
    NP = s.H * split  # programs a key tile
    bands = s.B * NP * chunk  # packed (B = 1): the bands of each sequence
    if packed:  # each sequence's bands, of its own length's tiles (`band_offsets`: their offsets, bound by `_run`)
        ntile = 0
        plan.ds_bands = (s.W, BQ, BT)
        tiles_total = bands * band_offsets(tiles, *plan.ds_bands)[0]
    else:
        ntile = ds_layout(s.T, s.W, BQ, BT)
        tiles_total = bands * ntile
    ds = plan.empty("ds", (tiles_total * BT * BQ,), s.dtype)
    varlen = dict(cu_seqlens=Ref("cu_seqlens"), ds_offsets=Ref("ds_offsets"), ks_offsets=None) if packed else dict(
        cu_seqlens=None, ds_offsets=None, ks_offsets=None)
    # The gate's gradient: dQ from dS stores its query side, and partial sums of its key side, which
    # `key_side_kernel` adds up, then the reverse scan; or `gate_grad_of_band_kernel` both at once (all from the
    # stored tiles; the dK/dV kernels compute no gate gradient here).
    dgc_q = dgc_k = dgk_part = dg = None
    by_band = route.gate_grad == "by-band"
    if gated:
        dgc_q = plan.empty("dgc_q", (s.HQ, NTOK), torch.float32)
        if packed:  # each sequence's [its programs, bands, its length] (`key_offsets`, bound by `_run`)
            plan.ks_bands = BQ
            dgk_part = plan.empty("dgk_part", (key_offsets(tiles, BQ)[0] * bands,), torch.float32)
            varlen["ks_offsets"] = Ref("ks_offsets")
        else:
            dgk_part = plan.empty("dgk_part", (cdiv(s.T, 2 * BQ), bands, s.T), torch.float32)
        if by_band:
            dg = plan.empty("dg", (s.B, s.T, s.HQ), s.g_dtype)
        else:
            dgc_k = plan.empty("dgc_k", (s.HQ, NTOK), torch.float32)
    heads = route.heads_per_launch
    launches = G // split // heads
    dq_launch = DQ_FROM_DS_LAUNCH_WIDE if s.K > DK_FROM_DS_ABOVE_D else DQ_FROM_DS_LAUNCH  # its sums are [BQ, K]

    def fp32_pair(name, with_dk):
        return (plan.empty(f"dk_{name}", (s.B, s.T, NP, s.K), torch.float32) if with_dk else None,
                plan.empty(f"dv_{name}", (s.B, s.T, NP, s.V), torch.float32))

    # (dk, dv) fp32 sum pairs (dv alone with dK from dS): launch n writes pair n % 2 and the next launch reads it.
    sums = [fp32_pair(f"sum{i}", not dk_from_ds) for i in range(min(launches - 1, 2))]
    # Scaled partials, or None: "dk", "dv" in the inputs' dtype.
    last_out = fp32_pair("part", True) if split > 1 else None
    # dK from dS: one fp32 sum over the chunks, read and rewritten in place by each program (no FIXUP re-reads it).
    dk_sum = plan.empty("dk_sum", (s.B, s.T, NP, s.K), torch.float32) if dk_from_ds and chunk < G // split else None
    dk_out = None  # dK from dS: the last chunk's output, made here so that it exists also for T = 0
    if dk_from_ds:
        dk_out = last_out[0] if last_out is not None else plan.empty("dk", (s.B, s.T, s.H, s.K), s.dtype)
    for n in range(launches):
        last = n == launches - 1
        dk_in, dv_in = sums[(n - 1) % 2] if n > 0 else (None, None)
        _add_dkv_ds(plan, s, tiles, last_out if last else sums[n % 2], split, hopper, ds=ds, NTILE=ntile,
                    G0=n * heads, CHUNK=chunk, HEADS=heads, dk_in=dk_in, dv_in=dv_in, sink_part=sink_part,
                    ACC_OUT=not last, DK_FROM_DS=dk_from_ds, TILES=tiles_total if packed else None,
                    ds_offsets=varlen["ds_offsets"])
        done = (n + 1) * heads  # query heads of each share whose dS tiles are stored
        if done % chunk == 0 and s.T:  # a whole chunk: its dq rows (and the key side of its dgc)
            heads_of = dict(T=s.T, W=s.W, G0=done - chunk, H=s.H, G=G, SPLIT=split, CHUNK=chunk, BT=BT, BQ=BQ,
                            NUM_BANDS=bands)
            pairs, chunks = cdiv(s.T, 2 * BQ), None  # programs a band: pairs of query blocks (packed: listed)
            if packed:
                pairs, chunks = tiles.num_tiles(2 * BQ), Ref(f"chunks{2 * BQ}")
                plan.tile_sizes.add(2 * BQ)
            plan.launch(parallel_attn_bwd_kernel_dq_from_ds, (pairs * bands,), k=Ref("k"), ds=ds, dq=dq, dgc_q=dgc_q,
                        dgk_part=dgk_part, chunk_indices=chunks, scale=s.scale, NTILE=ntile,
                        NTOK=NTOK if packed else None, HQ=s.HQ, K=s.K, BK=max(16, next_power_of_2(s.K)), **varlen,
                        **heads_of, **dq_launch)
            if dk_from_ds:
                _add_dk_from_ds(plan, s, tiles, dk_out if last else dk_sum, dk_sum if done > chunk else None,
                                not last, dict(heads_of, ds=ds, NTILE=ntile), varlen)
            if by_band:
                add_gate_grad_by_band(plan, dgk_part, dgc_q, dg, s, heads_of)
            elif gated:
                keys = max(BT, 256)  # a program's keys: whole key tiles; 1024 gave 2 programs a band, 9.8 us
                blocks, chunks = cdiv(s.T, keys), None
                if packed:
                    blocks, chunks = tiles.num_tiles(keys), Ref(f"chunks{keys}")
                    plan.tile_sizes.add(keys)
                plan.launch(key_side_kernel, (blocks, bands), dgk_part=dgk_part, dgc_k=dgc_k,
                            cu_seqlens=varlen["cu_seqlens"], chunk_indices=chunks, ks_offsets=varlen["ks_offsets"],
                            NTOK=NTOK if packed else None, BR=keys, BP=16, **heads_of, num_warps=4)
    if last_out is not None:
        add_group_sum(plan, *last_out, s.B, s.T, s.H, split, s.K, s.V, s.dtype)
    if sink_part is not None:
        add_sink_grad(plan, s, delta, sink_part, sink_tiles, dlse)
    if gated and not by_band:
        add_gate_grad(plan, dgc_q, dgc_k, Ref("cu_seqlens") if packed else None, _sequences(s, tiles), s.B, s.T,
                      s.HQ, s.g_dtype)


# ----------------------------------------------------------------------------------------------------------------
# A whole forward, a whole backward
# ----------------------------------------------------------------------------------------------------------------

def _build_forward(call: Call, exact_o: bool, lse_out: bool, forced: str) -> Plan:
    """The forward's plan of `call`: o_lo where `exact_o`, the user's lse where `lse_out`; the kernel by
    `dispatch.forward_kernel` under the forward's setting `forced`."""
    s, tiles = call.shape, call.tiles
    plan = new_plan(s, dispatch.contain_inline(s, s.containment))
    cu = Ref("cu_seqlens") if tiles is not None else None
    gc = None
    if s.g_dtype is not None:
        gc = add_gate_cumsum(plan, Ref("g"), cu, _sequences(s, tiles), s.B, s.T, s.HQ, (s.HQ, 1))
    plan.forward = dispatch.forward_kernel(s, tiles is None, call.qkv_aligned, forced, plan.inline)  # (hopper, why)
    add_fwd(plan, s, tiles, gc, Ref("sink_bias") if s.sink_dtype is not None else None, exact_o, lse_out,
            plan.forward[0])
    return finish(plan)


def _build_exact_o_forward(call: Call, k: dispatch.Knobs, lse_out: bool, forced: str) -> Plan:
    """The forward's plan of a call that may need o_lo (`dispatch.needs_exact_o`), with o_lo where its backward under
    settings `k` takes five products."""
    return _build_forward(call, dispatch.needs_o_lo(call, k), lse_out, forced)


def _forward_plan(call: Call, may_need_o_lo: bool, lse_out: bool = False) -> Plan:
    """The forward's plan; `may_need_o_lo`: a call with a gate (or a sink on short rows) whose backward may follow,
    which makes o_lo where that backward would take five products (`dispatch.needs_o_lo`), so its key holds the
    settings. `lse_out`: it also makes the user's lse (`return_lse`). The key holds the forward's kernel setting."""
    forced = dispatch.forward_knob()
    if not may_need_o_lo:
        return _plan((call.key, False, lse_out, forced), _build_forward, call, False, lse_out, forced)
    k = dispatch.knobs()
    return _plan(("fwd", call.key, k, lse_out, forced), _build_exact_o_forward, call, k, lse_out, forced)


def forward(q, k, v, g, sink_bias, cu_seqlens, scale: float, window_size: int, for_backward: bool = False,
            return_lse: bool = False, softcap: float = 0.0, window_right: Optional[int] = None, cu_seqlens_q=None):
    """(o, lse, the gate's cumsum gc times log2 e or None, o's rounding residual o_lo or None, the `Call` for the
    backward, the user's lse or None), for validated contiguous inputs. `window_size` 0 means full causal.
    `for_backward`: a backward may follow, so make o_lo where it would need it (`dispatch.needs_o_lo`: a call with a
    gate, or a sink on short rows, that takes five products). `return_lse`: also the user's lse `[B, T, HQ]` fp32,
    natural log, the sink included (the kernels' own lse is base 2 and head-major). `softcap` > 0: logits
    softcap * tanh(scale * q.k / softcap); 0: off. `window_right`: None causal, else query i also sees the keys up to
    i + window_right (-1: all). `cu_seqlens_q`: packed tail queries, q's own offsets (`cu_seqlens` then k's)."""
    call = call_of(q, k, v, g, sink_bias, cu_seqlens, scale, window_size, softcap, window_right, cu_seqlens_q)
    lengths = None if call.tiles is None else call.tiles.lengths
    plan = _forward_plan(call, for_backward and dispatch.needs_exact_o(call.shape, lengths),  # others: never o_lo
                         return_lse)
    env = _run(plan, dict(q=q, k=k, v=v, g=g, sink_bias=sink_bias, cu_seqlens=cu_seqlens, cu_seqlens_q=cu_seqlens_q),
               call.tiles)
    o, o_lo, lse_out = env["o"], env.get("o_lo"), env.get("lse_out")
    if call.packed_as_dense:  # the dense batch's o in the packed call's shape (the same memory; lse, gc: [HQ, B * T])
        o = o.view(*q.shape[:-1], v.shape[-1])
        o_lo = o_lo.view(o.shape) if o_lo is not None else None
        lse_out = lse_out.view(q.shape[:-1]) if lse_out is not None else None
    return o, env["lse"], env.get("gc"), o_lo, call, lse_out


def _build_backward(s: Shape, tiles: Optional[VarlenTiles], route: dispatch.Route, with_dlse: bool = False) -> Plan:
    """The backward's plan, from its route alone; `with_dlse`: the user's lse has a gradient ("dlse")."""
    plan = new_plan(s, route.containment == "inline")
    plan.route = route  # the dispatch's decision, which the plan's key does not hold
    dlse = Ref("dlse") if with_dlse else None
    if route.five is not None:
        add_five_product(plan, s, route, dlse, tiles)
        return finish(plan)
    gc = Ref("gc") if s.g_dtype is not None else None
    # The gradient w.r.t. the gate's cumsum: the dQ kernel stores its query side, the dK/dV kernel minus its key
    # side, and the reverse cumsum adds them.
    dgc_q = None
    if gc is not None:  # no query before Q0 (tail queries): zeros there, for the reverse cumsum
        dgc_q = (plan.empty("dgc_q", (s.HQ, s.B * s.T), _F32) if s.Q0 == 0 else
                 plan.apply("dgc_q", torch.zeros_like, Ref("lse")))
    partials = add_dq(plan, s, tiles, gc, dgc_q, route.delta, dlse)
    add_dkv(plan, s, tiles, gc, route.dkv, route.dkv_tiles, partials)
    if gc is not None:
        cu = Ref("cu_seqlens") if tiles is not None else None
        add_gate_grad(plan, dgc_q, Ref("dgc_k"), cu, _sequences(s, tiles), s.B, s.T, s.HQ, s.g_dtype)
    return finish(plan)


def _build_routed_backward(call: Call, k: dispatch.Knobs, aligned_qkv_do: bool, exact_o: bool,
                           with_dlse: bool) -> Plan:
    # The plan's Shape keeps the forward's containment setting, which only keys plans: the route reads the
    # setting of the backward (`k`; it may change between a forward and its backward, and the key has it).
    return _build_backward(call.shape, call.tiles, dispatch.route(call, k, aligned_qkv_do, exact_o), with_dlse)


def _backward_plan(call: Call, do_aligned: bool, exact_o: bool, with_dlse: bool = False) -> Plan:
    """The plan of a backward of `call` (q, k, v and dO 16-byte aligned or not, the forward's o_lo or not, a
    gradient of the user's lse or not), keyed on the settings now (`dispatch.knobs`). `plan.route` is the route it
    was built from."""
    k = dispatch.knobs()
    key = ("bwd", call.key, _bands_key(call), do_aligned, exact_o, with_dlse, k)
    return _plan(key, _build_routed_backward, call, k, call.qkv_aligned and do_aligned, exact_o, with_dlse)


def backward(do, q, k, v, o, lse, g_cumsum, g, sink_bias, cu_seqlens, scale: float, window_size: int,
             call: Optional[Call] = None, o_lo: Optional[torch.Tensor] = None, dlse: Optional[torch.Tensor] = None,
             softcap: float = 0.0, window_right: Optional[int] = None, cu_seqlens_q=None):
    """(dq, dk, dv, dg or None, dsink or None): dg and dsink in g's and sink_bias's dtypes. `call` is the forward's
    (`forward` returns it); without it (the custom-op path) it is made again from the inputs. `o_lo`: the forward's
    (None where it made none; a gated call then takes seven products). `dlse`: the gradient of the user's lse
    (`return_lse`), contiguous fp32 `[B, T, HQ]`, or None. `softcap`, `window_right`: the forward's (read only
    without `call`); `cu_seqlens_q` as in `forward`."""
    if call is None:
        call = call_of(q, k, v, g, sink_bias, cu_seqlens, scale, window_size, softcap, window_right, cu_seqlens_q)
    if call.shape.QP and cu_seqlens_q is None:
        raise ValueError("the backward of packed tail queries needs the forward's cu_seqlens_q")
    plan = _backward_plan(call, aligned(do), o_lo is not None, dlse is not None)
    env = _run(plan, dict(q=q, k=k, v=v, o=o, o_lo=o_lo, do=do, lse=lse, gc=g_cumsum, sink_bias=sink_bias,
                          cu_seqlens=cu_seqlens, cu_seqlens_q=cu_seqlens_q, dlse=dlse), call.tiles)
    dq, dk, dv, dg = env["dq"], env["dk"], env["dv"], env.get("dg")
    if call.packed_as_dense:
        dq, dk, dv = dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
        dg = dg.view(g.shape) if dg is not None else None
    return dq, dk, dv, dg, env.get("dsink")


# ----------------------------------------------------------------------------------------------------------------
# Tail queries: the building block of context parallelism (`context_parallel.py`)
# ----------------------------------------------------------------------------------------------------------------

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
                 _F32 if sink_bias is not None else None, scale, window(window_size, Tk),
                 dispatch.containment_knob(), Tk - Tq)


def _tail_key(s: Shape, *tensors) -> tuple:
    # The sink's own dtype too: the kernels read sink_bias in it, and the Shape says fp32 (dsink's dtype here).
    return (s, tuple(aligned(x) for x in tensors), tensors[-1].dtype if tensors[-1] is not None else None)


def _build_tail_forward(s: Shape) -> Plan:
    plan = new_plan(s, dispatch.contain_inline(s, s.containment))
    add_fwd(plan, s, None, Ref("gc") if s.g_dtype is not None else None,
            Ref("sink_bias") if s.sink_dtype is not None else None)
    return finish(plan)


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


def _build_tail_backward(s: Shape, route: dispatch.Route, dkv_dtype: Optional[torch.dtype]) -> Plan:
    plan = new_plan(s, route.containment == "inline")
    gc = Ref("gc") if s.g_dtype is not None else None
    dgc_q = plan.empty("dgc_q", (s.HQ, s.B * s.T), _F32) if gc is not None else None
    partials = add_dq(plan, s, None, gc, dgc_q, route.delta)
    add_dkv(plan, s, None, gc, route.dkv, route.dkv_tiles, partials, dkv_dtype)
    return finish(plan)


def tail_backward(do, q, k, v, o, lse, gc, sink_bias, scale: float, window_size: int, cu_seqlens=None,
                  dkv_dtype: Optional[torch.dtype] = None):
    """Backward of `tail_forward` (same q, k, v, gc, sink_bias, scale, window_size; its o and lse).
    Returns (dq `[B, Tq, HQ, K]`; dk `[B, Tk, H, K]` and dv `[B, Tk, H, V]`, these queries' contributions only, in
    the inputs' dtype or `dkv_dtype` (fp32 for partials that are summed further); dgc_q `[HQ, B, Tq]` and dgc_k
    `[HQ, B, Tk]`, fp32, gates only, else None; dsink `[HQ]` fp32, sinks only). The gradient w.r.t. the gate's
    cumsum (natural units) at position p is dgc_k[p] plus dgc_q[p] where p is a query (the two halves of
    `inner.dkv_one_head`); the gate's gradient is its reverse cumsum."""
    s = _tail_shape(q, k, v, gc, sink_bias, scale, window_size, cu_seqlens)
    route = dispatch.tail_route(s, dispatch.knobs())
    plan = _plan(("tail_bwd", route, dkv_dtype, _tail_key(s, do, q, k, v, o, gc, sink_bias)), _build_tail_backward,
                 s, route, dkv_dtype)
    env = _run(plan, dict(q=q, k=k, v=v, o=o, do=do, lse=lse, gc=gc, sink_bias=sink_bias), None)
    dgc_q = dgc_k = None
    if gc is not None:
        dgc_q = env["dgc_q"].view(s.HQ, s.B, s.T)[:, :, s.Q0:]
        dgc_k = env["dgc_k"].view(s.HQ, s.B, s.T)
    return env["dq"], env["dk"], env["dv"], dgc_q, dgc_k, env.get("dsink")
