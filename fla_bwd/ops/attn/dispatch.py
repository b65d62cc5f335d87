# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The one dispatch: which kernels run a call, and why.

`route(call, knobs, aligned, exact_o)` returns a frozen `Route` that holds a call's whole backward (five or seven
products, the dK/dV kernel's owner and split, the chunk of query heads whose dS tiles fit the scratch budget, the
Triton or the Hopper kernel, how delta is computed, which kernels sum the gate's gradient, NaN/Inf containment) and,
for the forward, whether it must store o's rounding residual. Each choice carries a one-line reason:
`print(select_backward(q, k, v).explain())`. The plans (`host.py`) are built from a `Route` alone; nothing else in
the package reads a setting or a threshold of `config.py`.

Settings (`fla_bwd.settings`, the FLA_BWD_* variables and their `with` blocks) are read once a call, into `Knobs`;
the plans are keyed on them, so a kind of call seen before skips the dispatch.
"""

import dataclasses
import functools
import math
from typing import NamedTuple, Optional

import torch

from fla_bwd import settings
from fla_bwd.ops.attn import config, gluon_dkv, gluon_fwd
from fla_bwd.ops.attn.call import make_call
from fla_bwd.ops.attn.from_ds import band_bytes, ds_layout
from fla_bwd.ops.utils.checks import check_attn_inputs, resolve_scale, resolve_softcap, resolve_window
from fla_bwd.ops.utils.index import sequence_lengths, varlen_tiles
from fla_bwd.settings import dkv_path, dq_path, ds_kernel  # noqa: F401  (re-exported: the `with` blocks users type)
from fla_bwd.utils import is_interpreter

# ----------------------------------------------------------------------------------------------------------------
# What the dispatch reads
# ----------------------------------------------------------------------------------------------------------------


class Knobs(NamedTuple):
    """The settings the dispatch reads, read once a call (`knobs`): each "auto" or a forced value."""
    dkv_path: str
    containment: str
    dq_path: str
    ds_kernel: str
    ds_budget: int  # bytes


def knobs() -> Knobs:
    """The settings now (environment variables and `with` blocks, `fla_bwd.settings`)."""
    return Knobs(settings.forced_dkv_path(), settings.forced_containment(), settings.forced_dq_path(),
                 settings.forced_ds_kernel(), settings.ds_budget_bytes())


def containment_knob() -> str:
    """FLA_BWD_CONTAINMENT now: the forward's only setting (`call.Shape.containment`)."""
    return settings.forced_containment()


# ----------------------------------------------------------------------------------------------------------------
# Containment
# ----------------------------------------------------------------------------------------------------------------

def contain_inline(s, forced: str) -> bool:
    """Whether the kernels of a call of Shape s contain a NaN/Inf input inline (one launch) rather than in two
    launches (`host.add_contained`); both exact. `forced` (FLA_BWD_CONTAINMENT) "inline"/"two-launch" wins;
    "auto": inline below `config.INLINE_CONTAINMENT_WORK`, where a second launch's host time equals what inline costs
    the GPU."""
    if forced != "auto":
        return forced == "inline"
    return s.B * s.HQ * s.T * min(s.T, s.W) * max(s.K, s.V) < config.INLINE_CONTAINMENT_WORK


def _containment(s, forced: str) -> tuple:
    inline = contain_inline(s, forced)
    if forced != "auto":
        return ("inline" if inline else "two-launch"), f"forced (FLA_BWD_CONTAINMENT={forced})"
    work = f"B * HQ * T * min(T, W) * D = {s.B * s.HQ * s.T * min(s.T, s.W) * max(s.K, s.V):.3g}"
    if inline:
        return "inline", f"{work} is below {config.INLINE_CONTAINMENT_WORK:.3g}: a second launch costs more host time"
    return "two-launch", f"{work}: inline containment would slow the plain loops more than a launch costs"


# ----------------------------------------------------------------------------------------------------------------
# The forward's kernel
# ----------------------------------------------------------------------------------------------------------------

def forward_knob() -> str:
    """FLA_BWD_FWD_KERNEL now (`settings.fwd_kernel`): the forward's kernel, "auto" or forced."""
    return settings.forced_fwd_kernel()


def hopper_fwd_why_not(s, device: torch.device, aligned: bool, dense: bool = True) -> Optional[str]:
    """None if the Hopper forward (`gluon_fwd`) can run a forward of Shape s, dense or packed (`dense`), whose q, k
    and v start 16-byte aligned or not (`aligned`), else why not."""
    BM = gluon_fwd.BM
    if is_interpreter() or device.type != "cuda":
        return "it runs on CUDA GPUs only (no CPU interpreter for Gluon)"
    if config.capability(device) != (9, 0):
        return "it needs an sm_90 (Hopper) GPU"
    if s.dtype not in (torch.float16, torch.bfloat16):
        return "it needs 16-bit q, k, v"
    if not (s.K == s.V and s.K in gluon_fwd.HEAD_DIMS):
        return f"it needs head dims K = V in {gluon_fwd.HEAD_DIMS}"
    if s.Q0 or s.QP:
        return "it needs q as long as k (no tail queries)"
    if s.WR is not None and min(s.W, s.WR) < s.T:
        return "it runs non-causal attention without a window only"
    if not dense and s.WR is not None:
        return "packed: it runs causal attention only"
    if dense and s.T % BM:  # packed sequences of any length: their tiles' rows are masked
        return f"it needs T to be a multiple of {BM}"
    if s.B * s.T >= 2**31:
        return "B * T must stay under 2**31 (TMA coordinates)"
    if not aligned:
        return "q, k and v must start at 16-byte aligned addresses (TMA)"
    return None


def forward_kernel(s, dense: bool, aligned: bool, forced: str, inline: bool) -> tuple:
    """(whether the Hopper kernel runs the forward of a call of Shape s, why): "auto" wherever it can
    (`hopper_fwd_why_not`; two-launch containment: it is the FLAG launch) from `config.HOPPER_FWD_MIN_T` tokens
    on at `config.HOPPER_FWD_HEAD_DIMS`, "hopper" wherever it can and ValueError elsewhere, "triton" never.
    `forced`: `forward_knob()`; `inline`: the call contains NaN/Inf inline."""
    if forced == "triton":
        return False, "forced (FLA_BWD_FWD_KERNEL=triton)"
    why = hopper_fwd_why_not(s, s.device, aligned, dense)
    if why is None and inline:
        why = "it is the first of two containment launches, and this call contains NaN/Inf inline"
    if forced == "hopper":
        if why is not None:
            raise ValueError(f"forward kernel 'hopper' (FLA_BWD_FWD_KERNEL) cannot run this forward: {why}")
        return True, "forced (FLA_BWD_FWD_KERNEL=hopper)"
    if why is not None:
        return False, f"triton: the Hopper kernel cannot run it ({why})"
    if s.T < config.HOPPER_FWD_MIN_T:
        return False, f"triton: T = {s.T} < {config.HOPPER_FWD_MIN_T}, where the Hopper kernel measured faster"
    if s.K not in config.HOPPER_FWD_HEAD_DIMS:
        return False, f"triton: head dim {s.K}, where the Triton forward measured faster"
    if s.softcap and not config.HOPPER_SOFTCAP:
        return False, ("triton: softcap, whose Hopper form has not run on a GPU yet (config.HOPPER_SOFTCAP; "
                       "FLA_BWD_FWD_KERNEL=hopper runs it)")
    return True, "hopper: the warp-specialized Gluon kernel runs this call"


# ----------------------------------------------------------------------------------------------------------------
# Seven products: the dK/dV kernel
# ----------------------------------------------------------------------------------------------------------------

class DkvKernel(NamedTuple):
    """The dK/dV kernel of one backward: KV-head-owned (`per_kv_head`; each group's query heads dealt to `split`
    programs whose fp32 partials are then summed) or query-head-owned (`split` 1; then a sum over each group)."""
    per_kv_head: bool
    split: int = 1

    @property
    def name(self) -> str:
        """The name users type for it (FLA_BWD_DKV_PATH, `dkv_path`)."""
        if not self.per_kv_head:
            return "per-query-head"
        return "gqa" if self.split == 1 else f"gqa-split{self.split}"


PER_QUERY_HEAD = DkvKernel(per_kv_head=False)
_BY_NAME = {"gqa": DkvKernel(True, 1), "gqa-split2": DkvKernel(True, 2), "gqa-split4": DkvKernel(True, 4),
            "per-query-head": PER_QUERY_HEAD, "legacy": PER_QUERY_HEAD}


@functools.lru_cache(maxsize=1024)
def dkv_kernel_for(B: int, T: int, HQ: int, H: int, K: int, V: int, dtype: torch.dtype, device: torch.device,
                   W: int, lengths: tuple, forced: str) -> DkvKernel:
    """The seven-product backward's dK/dV kernel for one call.

    KV-head-owned for fp16/bf16 GQA with K == V in {64, 128} and G in {2, 4, 8}: one program per KV head unless on
    a GPU the call is load-imbalanced for it, then the smallest split that balances it (`config.gqa_split`), and
    query-head-owned if none does. Everything else is query-head-owned: MHA has nothing to reduce, and fp32,
    K != V, other head dims and G > 8 have not been measured to win. `forced` (FLA_BWD_DKV_PATH, `dkv_path`) forces
    any kernel; all are correct for every input they accept, and a forced split that does not divide G raises
    ValueError here, before any backward kernel runs.
    """
    G = HQ // H
    if forced != "auto":
        kernel = _BY_NAME[forced]
        if G % kernel.split:
            raise ValueError(f"dK/dV path {forced!r} deals each group's query heads to {kernel.split} programs, so "
                             f"it needs HQ // H to be a multiple of {kernel.split}; got HQ // H = {G}")
        return kernel
    if not (dtype in (torch.float16, torch.bfloat16) and K == V and K in (64, 128) and G in (2, 4, 8)):
        return PER_QUERY_HEAD
    if device.type != "cuda":
        return _BY_NAME["gqa"]
    split = config.gqa_split(lengths, H, G, K, W, config.sm_count(device))
    return PER_QUERY_HEAD if split is None else DkvKernel(True, split)


def _dkv_reason(s, kernel: DkvKernel, forced: str) -> str:
    if forced != "auto":
        return f"forced (FLA_BWD_DKV_PATH={forced})"
    G = s.HQ // s.H
    if not kernel.per_kv_head:
        if s.dtype in (torch.float16, torch.bfloat16) and s.K == s.V and s.K in (64, 128) and G in (2, 4, 8):
            return "no split of a group's heads keeps the GPU busy with one program per KV head"
        return "MHA, fp32, K != V, head dims other than 64/128 or G > 8: query-head-owned (nothing measured better)"
    if kernel.split == 1:
        return "16-bit GQA: one program per KV head owns its dK/dV (no HQ-sized scratch, no reduction)"
    return f"one program per KV head would leave SMs idle: each group's heads dealt to {kernel.split} programs"


# ----------------------------------------------------------------------------------------------------------------
# Five products: dQ from the stored dS tiles
# ----------------------------------------------------------------------------------------------------------------

class FiveProduct(NamedTuple):
    """How a five-product backward runs: each group's query heads dealt to `split` programs a key tile (shares of
    G / split heads, as `config.gqa_split` deals them for the seven-product kernel), `chunk` heads of every
    share whose dS tiles are stored at once (the budget's unit, `ds_chunk`), and whether the Hopper kernel
    (`gluon_dkv`, one launch a chunk) or the Triton kernel (one or two heads a launch) computes dK/dV and dS;
    `dk_from_ds`: the Triton kernel computes dV and dS alone and dK comes from the stored tiles too (head dims above
    `config.DK_FROM_DS_ABOVE_D`)."""
    split: int
    chunk: int
    hopper: bool = False
    dk_from_ds: bool = False


def eligible(s) -> bool:
    """Whether the five-product backward can run a call of Shape s (dense is the caller's to check; a gated call
    also needs the forward's o_lo, `needs_exact_o`): 16-bit, every query (every head dim the API accepts)."""
    return s.dtype in (torch.float16, torch.bfloat16) and s.Q0 == 0


def needs_exact_o(s, lengths: Optional[tuple] = None) -> bool:
    """Whether a five-product backward of Shape s needs delta from o in fp32 (o + o_lo, `needs_o_lo`): a gate, whose
    gradient is a reverse cumsum that turns delta's rounding into a walk, or a sink on rows that see fewer than
    `config.SINK_EXACT_O_BELOW_KEYS` keys. A sink on longer rows does not: its gradient -sum_i p_sink_i * delta_i
    is made exact from the dK/dV kernels' fp32 dS sums (`from_ds.sink_grad_kernel`), and o_lo would cost the
    forward a second P V product (g8-T8192-sink forward 1174 -> 1481 us, H200). `lengths`: a packed call's sequence
    lengths, whose shortest bounds its rows' keys."""
    if s.g_dtype is not None or s.sink_dtype is None:  # decided without the lengths (read per forward)
        return s.g_dtype is not None
    keys = s.T if lengths is None else min((n for n in lengths if n), default=s.T)
    return min(keys, s.W) < config.SINK_EXACT_O_BELOW_KEYS


@functools.lru_cache(maxsize=256)  # asked at every plan build: 2.9 -> 0.1 us on the CPU machine
def hopper_split(B: int, T: int, H: int, G: int, sms: int) -> int:
    """The Hopper kernel's shares of each group: the fewest (1, 2, 4 dividing G) whose items balance the programs
    within `gluon_dkv.MAX_IMBALANCE` (G8 at T4096 and B2 T2048 need 2; B1 T8192, GQA4 and MHA at B2 T2048 run 1),
    else the best balanced."""
    splits = [s for s in (1, 2, 4) if G % s == 0]
    loads = {s: gluon_dkv.imbalance(B, T, H, s, gluon_dkv.programs_for(B, T, H, s, sms)) for s in splits}
    return next((s for s in splits if loads[s] <= gluon_dkv.MAX_IMBALANCE), min(splits, key=loads.get))


def hopper_why_not(s, device: torch.device, aligned: bool, dense: bool = True) -> Optional[str]:
    """None if the Hopper kernel (`gluon_dkv`) can run a five-product backward of Shape s, dense or packed (`dense`),
    whose q, k, v and dO start 16-byte aligned or not (`aligned`; the caller has checked `eligible`), else why
    not."""
    D, BT = gluon_dkv.D, gluon_dkv.BT
    if is_interpreter() or device.type != "cuda":
        return "it runs on CUDA GPUs only (no CPU interpreter for Gluon)"
    if config.capability(device) != (9, 0):
        return "it needs an sm_90 (Hopper) GPU"
    if not (s.K == s.V == D):
        return f"it needs head dims K = V = {D}"
    if s.W < s.T:
        return "it runs full causal attention only (no window)"
    if dense and s.T % BT:  # packed sequences of any length: their last tiles are masked
        return f"it needs T to be a multiple of {BT}"
    if s.HQ * s.B * s.T >= 2**31:
        return "HQ * B * T must stay under 2**31 (TMA coordinates of lse and delta)"
    if not aligned:
        return "q, k, v and dO must start at 16-byte aligned addresses (TMA)"
    return None


def _hopper(s, aligned: bool, k: Knobs, dense: bool = True) -> bool:
    """Whether this five-product backward (an `eligible` call, dense or packed) runs the Hopper dK/dV kernel.
    FLA_BWD_DS_KERNEL "auto": where it can (`hopper_why_not`, and two-launch containment: it is the FLAG launch) from
    `config.HOPPER_DKV_MIN_T` on (ungated: from `config.FIVE_PRODUCT_MIN_T_HOPPER`), softcap where
    `config.HOPPER_SOFTCAP`, dense calls only (packed ones have not run on a GPU yet); "hopper": wherever it can,
    and ValueError where it cannot; "triton": never."""
    if k.ds_kernel == "triton":
        return False
    why = hopper_why_not(s, s.device, aligned, dense)
    if why is None and contain_inline(s, k.containment):
        why = "it is the first of two containment launches, and this call contains NaN/Inf inline"
    if k.ds_kernel == "hopper" and why is not None:
        raise ValueError(f"ds kernel 'hopper' (FLA_BWD_DS_KERNEL) cannot run this backward: {why}")
    long_enough = s.T >= (config.HOPPER_DKV_MIN_T if s.g_dtype is not None else config.FIVE_PRODUCT_MIN_T_HOPPER)
    measured = config.HOPPER_SOFTCAP or not s.softcap
    return why is None and (k.ds_kernel == "hopper" or (dense and long_enough and measured))


@functools.lru_cache(maxsize=256)
def ds_chunk(B: int, T: int, H: int, G: int, W: int, D: int, budget: int, split: int = 1,
             gated: bool = False, lengths: Optional[tuple] = None) -> Optional[int]:
    """Query heads of each share (G / split heads) per chunk: the largest divisor of the share whose scratch
    (B * H * split * chunk bands, `from_ds.band_bytes`) fits in `budget` bytes, or None if one head of every share
    does not fit (then the seven-product backward runs). Packed (`lengths`, B = 1, ungated): a band is every
    sequence's."""
    cfg = config.tile_config("dkv_ds", D)
    # a band's rows in the dK/dV kernel's descriptor view, and its bytes
    if lengths is None:
        rows, band = ds_layout(T, W, cfg["BS"], cfg["BT"]) * cfg["BT"], band_bytes(T, W, D, gated)
    else:
        rows = sum(ds_layout(n, W, cfg["BS"], cfg["BT"]) for n in lengths) * cfg["BT"]
        band = sum(band_bytes(n, W, D, gated) for n in lengths)
    bands = B * H * split
    for chunk in range(G // split, 0, -1):
        if (G // split) % chunk == 0 and bands * chunk * band <= budget and bands * chunk * rows < 2**31:
            return chunk
    return None


def _busy_splits(s):
    """The splits of `config.FIVE_PRODUCT_SPLITS`, in order, that divide the group and whose launches keep the GPU
    busy (`config.group_fills_gpu`)."""
    G, D = s.HQ // s.H, max(s.K, s.V)
    sms = config.sm_count(s.device)
    return (split for split in config.FIVE_PRODUCT_SPLITS
            if G % split == 0 and config.group_fills_gpu((s.T,) * s.B, s.H, G, D, s.W, sms, split))


def _auto_five(s, aligned: bool, k: Knobs) -> tuple:
    """(FiveProduct or None, why) for "auto" on an eligible, dense call: five products where they measured faster
    (`config`): full causal, head dims above 64, long enough, gated calls only on the Hopper kernel and where
    `config.FIVE_PRODUCT_GATED` allows, ungated calls on the Triton kernel only on GPUs of at least
    `config.TRITON_FIVE_MIN_TBPS` (above head dim 128, dK from dS, on any GPU), shorter ungated calls
    (`config.FIVE_PRODUCT_MIN_T_HOPPER`) on the Hopper kernel only, and the first of `_busy_splits` whose dS tiles
    fit the budget."""
    D = max(s.K, s.V)
    if D <= 64:
        return None, f"head dim {D}: five products lost to seven at head dim 64"
    if s.W < s.T:
        return None, "a window: five products lost to seven on windows"
    shortest = min(config.FIVE_PRODUCT_MIN_T, config.FIVE_PRODUCT_MIN_T_HOPPER)
    if s.T < shortest:
        return None, f"T = {s.T} < {shortest}: too short for the dS round trip to pay"
    if s.g_dtype is not None and not config.FIVE_PRODUCT_GATED:
        return None, "gated calls take seven products (config.FIVE_PRODUCT_GATED)"
    hopper = _hopper(s, aligned, k)
    if s.T < config.FIVE_PRODUCT_MIN_T and not (hopper and s.g_dtype is None):
        return None, (f"T = {s.T} < {config.FIVE_PRODUCT_MIN_T}: shorter calls gain only ungated on the Hopper "
                      f"kernel, which does not run this one")
    if s.g_dtype is not None and not hopper:
        return None, "gated and the Hopper kernel does not run it: the gated Triton dS-store kernel lost to seven"
    G = s.HQ // s.H
    if hopper:
        split = hopper_split(s.B, s.T, s.H, G, config.sm_count(s.device))
        chunk = ds_chunk(s.B, s.T, s.H, G, s.W, D, k.ds_budget, split, s.g_dtype is not None)
        if chunk is None:
            return None, "one query head of every share does not fit the dS budget (FLA_BWD_DS_BUDGET_MIB)"
        return FiveProduct(split, chunk, True), "measured faster: long full-causal call on the Hopper kernel"
    wide = D > config.DK_FROM_DS_ABOVE_D
    if wide and not config.FIVE_PRODUCT_WIDE:
        return None, f"head dim {D}: five products with dK from dS are turned off (config.FIVE_PRODUCT_WIDE)"
    if not wide and config.hbm_tbps(s.device) < config.TRITON_FIVE_MIN_TBPS:
        return None, (f"memory bandwidth {config.hbm_tbps(s.device):.2f} TB/s < {config.TRITON_FIVE_MIN_TBPS}: the "
                      f"Triton kernel's dS round trip costs more than it saves")
    for split in _busy_splits(s):
        chunk = ds_chunk(s.B, s.T, s.H, G, s.W, D, k.ds_budget, split, s.g_dtype is not None)
        if chunk is not None:
            if wide:
                return FiveProduct(split, chunk, False, True), (
                    f"head dim {D}: dV and dS in one kernel, dK and dQ from the stored tiles (seven products' two "
                    f"fp32 sums a tile spill)")
            return FiveProduct(split, chunk), "measured faster: long full-causal call whose launches fill the GPU"
    return None, "no split keeps the GPU busy within the dS budget"


def _five(s, dense: bool, aligned: bool, exact_o: bool, k: Knobs, lengths: Optional[tuple] = None) -> tuple:
    """(FiveProduct or None for seven products, why) of a backward of Shape s; `aligned`: q, k, v and dO start
    16-byte aligned, which the Hopper kernel's TMA needs; `exact_o`: the forward made o_lo, which a gated call
    needs; `lengths`: a packed call's sequence lengths. Forced (FLA_BWD_DQ_PATH=from-ds) where it cannot run:
    ValueError, never a silent fallback. Packed calls run only forced (not measured on a GPU yet), on the Triton
    kernel, or on the Hopper one where FLA_BWD_DS_KERNEL=hopper too (its split: auto's first busy one)."""
    if k.dq_path == "recompute":
        return None, "forced (FLA_BWD_DQ_PATH=recompute)"
    G, D = s.HQ // s.H, max(s.K, s.V)
    runnable = dense and eligible(s)
    inexact = needs_exact_o(s, lengths) and not exact_o
    # The gate's gradient sums the scores' dS; the stored tiles hold the q.k products' (times the cap's derivative).
    capped_gate = s.softcap > 0 and s.g_dtype is not None
    if k.dq_path == "auto":
        if not dense:
            return None, ("packed tail queries (q shorter than k): five products run dense calls of every query only"
                          if s.QP else "packed sequences: five products run them only where forced (FLA_BWD_DQ_PATH="
                          "from-ds: the Triton kernel; not yet measured)")
        if not runnable:
            return None, "fp32 or tail queries: five products do not run them"
        if capped_gate:
            return None, "softcap with a gate: its gradient needs dS of the scores, the stored tiles hold another"
        if s.WR is not None:
            return None, "not causal: five products store the causal band of dS tiles only"
        if k.dkv_path != "auto":
            return None, f"a dK/dV kernel is forced (FLA_BWD_DKV_PATH={k.dkv_path})"
        if inexact:
            return None, ("a gate or a sink on short rows without o's rounding residual from the forward "
                          "(torch.compile, or settings changed)")
        return _auto_five(s, aligned, k)
    if k.dkv_path == "auto":
        split = next(_busy_splits(s), 1)  # auto's split where one keeps the GPU busy, else 1
    else:
        # The forced path's kernel (`dkv_kernel_for` raises for a split that does not divide the group).
        kernel = dkv_kernel_for(s.B, s.T, s.HQ, s.H, s.K, s.V, s.dtype, s.device, s.W, (s.T,) * s.B, k.dkv_path)
        if not kernel.per_kv_head:
            raise ValueError(f"dq path 'from-ds' runs the KV-head-owned dK/dV kernel ('gqa', 'gqa-split2' or "
                             f"'gqa-split4'); dK/dV path {k.dkv_path!r} is forced too")
        split = kernel.split
    if not eligible(s):
        raise ValueError("dq path 'from-ds' (the five-product backward) needs 16-bit q, k, v and every query (q as "
                         "long as k)")
    if not dense and s.QP:
        raise ValueError("dq path 'from-ds' (the five-product backward) runs packed sequences (cu_seqlens) of every "
                         "query; this call has tail queries (q shorter than k)")
    if capped_gate:
        raise ValueError("dq path 'from-ds' (the five-product backward) does not run softcap with a gate g: the "
                         "gate's gradient needs dS of the capped scores, and the stored tiles hold dS of q.k")
    if s.WR is not None:
        raise ValueError("dq path 'from-ds' (the five-product backward) runs causal attention only (it stores the "
                         "causal band of dS tiles): pass causal=True, or use FLA_BWD_DQ_PATH=recompute")
    hopper = _hopper(s, aligned, k, dense)
    if hopper and dense and k.dkv_path == "auto":
        split = hopper_split(s.B, s.T, s.H, G, config.sm_count(s.device))
    chunk = ds_chunk(s.B, s.T, s.H, G, s.W, D, k.ds_budget, split, s.g_dtype is not None, None if dense else lengths)
    if chunk is None:
        raise ValueError(f"dq path 'from-ds': one query head of every KV head's share needs more dS scratch than "
                         f"FLA_BWD_DS_BUDGET_MIB = {k.ds_budget / 2**20:g} MiB allows")
    # Last: the forward's `needs_o_lo` swallows the reasons above, so they must reach the backward first.
    if inexact:
        raise ValueError("dq path 'from-ds' with a gate, or a sink on rows of fewer than "
                         f"{config.SINK_EXACT_O_BELOW_KEYS} keys, needs o's rounding residual from the forward, which "
                         "it makes only in eager calls (not under torch.compile) where FLA_BWD_DQ_PATH was already "
                         "'from-ds' at the forward")
    return FiveProduct(split, chunk, hopper, D > config.DK_FROM_DS_ABOVE_D), "forced (FLA_BWD_DQ_PATH=from-ds)"


def five_product(s, dense: bool, aligned: bool, exact_o: bool = False, k: Optional[Knobs] = None):
    """The FiveProduct of a backward of Shape s, or None for seven products (`_five`; settings read now unless
    given)."""
    return _five(s, dense, aligned, exact_o, knobs() if k is None else k)[0]


def needs_o_lo(call, k: Knobs) -> bool:
    """Whether the forward of `call` must store o's rounding residual o_lo: a call whose backward, with these
    settings, takes five products and needs it (`needs_exact_o`: a gate, or a sink on short rows). Its delta must
    then be rowsum(dO * o) with o in fp32 (the value the forward accumulates before rounding): from the rounded o,
    dk and dg came out about twice as far from the oracle (past the 5e-3 bar on sharp rows). The cost is one more
    store of o's shape in the forward, in int8, and the product of P's rounding with V."""
    lengths = None if call.tiles is None else call.tiles.lengths
    if not needs_exact_o(call.shape, lengths):
        return False
    try:
        return _five(call.shape, call.tiles is None, call.qkv_aligned, True, k, lengths)[0] is not None
    except ValueError:
        return False  # the backward raises it


# ----------------------------------------------------------------------------------------------------------------
# The route
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Route:
    """The whole route of a call's backward (and what its forward must store for it). Built by `route` or
    `tail_route`; the plans are built from it alone. `reasons`: (choice, one-line reason) pairs, `explain()`."""
    five: Optional[FiveProduct]  # five products (split, chunk, Hopper kernel), or None: seven
    dkv: Optional[DkvKernel]  # seven products: the dK/dV kernel (owner and split), else None
    heads_per_launch: int  # five products: query heads of each share a dK/dV launch (0 in seven)
    dkv_tiles: str  # the dK/dV kernel's tile config (`config.tile_config` key)
    delta: str  # seven: a key of `config.DELTA_MODES`; five: "o" or "o+o_lo" (the delta kernel's input)
    gate_grad: Optional[str]  # None (no gate), "halves" (seven), "by-band" or "key-side" (five)
    containment: str  # "inline" or "two-launch"
    exact_o: bool  # the forward stores o_lo (a five-product call with a gate, or a sink on short rows)
    reasons: tuple = ()

    @property
    def products(self) -> int:
        return 7 if self.five is None else 5

    def explain(self) -> str:
        """The route, one line a choice with its reason."""
        return "\n".join(f"{name}: {why}" for name, why in self.reasons)


def seven_route(s, kernel: DkvKernel, k: Knobs, reasons: Optional[list] = None) -> Route:
    """The seven-product route of a call of Shape s whose dK/dV kernel is `kernel` (`dkv_kernel_for`)."""
    reasons = list(reasons or [])
    D = max(s.K, s.V)
    gated = s.g_dtype is not None
    tiles = config.dkv_tiles(D, s.dtype, s.W, s.T, gated)
    delta = "exact" if s.sink_dtype is not None else "refine" if gated else "rounded"
    containment, why = _containment(s, k.containment)
    reasons += [
        ("dK/dV kernel", f"{kernel.name}: {_dkv_reason(s, kernel, k.dkv_path)}"),
        ("dK/dV tiles", tiles + (": a short window, whose key tiles see few query blocks" if tiles != "dkv" else "")),
        ("delta", {"exact": "exact: a sink needs rowsum(P * dP) itself, computed by a first loop over the keys",
                   "refine": "refine: the gate's gradient is a reverse cumsum, which turns delta's rounding into a "
                             "walk; rowsum(P * dP) is stored for the dK/dV kernel",
                   "rounded": "rounded: rowsum(o * dO) from the rounded o, whose ~1e-3 error costs dq and dk little"
                   }[delta]),
        ("containment", f"{containment}: {why}")]
    if gated:
        reasons.append(("gate gradient", "halves: the dQ kernel's query side and the dK/dV kernel's key side, then "
                                         "a reverse cumsum"))
    return Route(None, kernel, 0, tiles, delta, "halves" if gated else None, containment, False, tuple(reasons))


def route(call, k: Knobs, aligned: bool, exact_o: bool) -> Route:
    """The route of a backward of `call` (`call.Call`) under settings `k`; `aligned`: q, k, v and dO start 16-byte
    aligned; `exact_o`: the forward stored o_lo. ValueError for a forced path that cannot run this call."""
    s = call.shape
    five, why = _five(s, call.tiles is None, aligned, exact_o, k, None if call.tiles is None else call.tiles.lengths)
    reasons = [("products", f"{'seven' if five is None else 'five'}: {why}")]
    if call.packed_as_dense:
        reasons.insert(0, ("packed", f"{s.B} sequences of {s.T} tokens: run as the dense batch they are laid out as"))
    if five is None:
        kernel = dkv_kernel_for(s.B, s.T, s.HQ, s.H, s.K, s.V, s.dtype, s.device, s.W,
                                sequence_lengths(s.B, s.T, call.tiles), k.dkv_path)
        return seven_route(s, kernel, k, reasons)
    return five_route(s, five, k, reasons, None if call.tiles is None else call.tiles.lengths)


def five_route(s, five: FiveProduct, k: Knobs, reasons: Optional[list] = None,
               lengths: Optional[tuple] = None) -> Route:
    """The five-product route of a call of Shape s that runs as `five` (`five_product`); `lengths`: a packed
    call's."""
    reasons = list(reasons or [])
    gated = s.g_dtype is not None
    # The Hopper kernel runs a chunk a launch; the Triton kernel one or two heads (a head loop spilled 5x more).
    heads = five.chunk if five.hopper else math.gcd(five.chunk, 2 if s.T < config.DS_TWO_HEADS_BELOW_T else 1)
    # Packed: the key side per sequence (`from_ds.key_side_kernel`); the by-band kernel scans dense bands only.
    by_band = s.T <= config.GATE_GRAD_BY_BAND_MAX_T and lengths is None
    gate_grad = None if not gated else "by-band" if by_band else "key-side"
    containment, cwhy = _containment(s, k.containment)
    reasons += [
        ("dK/dV + dS kernel", ("hopper: the warp-specialized Gluon kernel runs this call" if five.hopper else
                               "triton: the KV-head-owned kernel with the dS store, dV alone (dK from dS)"
                               if five.dk_from_ds else "triton: the KV-head-owned kernel with the dS store")
         + f"; each group's heads dealt to {five.split} program(s) a key tile"),
        ("dS chunk", f"{five.chunk} query head(s) of each share at once, within the {k.ds_budget / 2**20:g} MiB "
                     f"budget"),
        ("heads a launch", f"{heads}" + ("" if five.hopper else ": two below config.DS_TWO_HEADS_BELOW_T, where the "
                                                                "second head saves an fp32 dK/dV round trip")),
        ("delta", "o+o_lo: rowsum(dO * o) with o in fp32 (a gate's gradient, or a sink on short rows, needs it)"
                  if needs_exact_o(s, lengths) else
                  "o: rowsum(o * dO) by the delta kernel, before the dK/dV kernel"),
        ("containment", f"{containment}: {cwhy}")]
    if s.sink_dtype is not None:
        reasons.append(("sink gradient", "-sum_i p_sink_i * delta_i made exact from the dK/dV kernels' fp32 sums of "
                                         "p_sink_i * dS_ij (`from_ds.sink_grad_kernel`)"))
    if gated:
        reasons.append(("gate gradient", {"by-band": "by-band: one launch sums the key side and scans dg (short "
                                                     "calls, whose partial sums grow as T^2)",
                                          "key-side": "key-side: the dQ kernel's partial key sums added up, then a "
                                                      "reverse cumsum"}[gate_grad]))
    exact_o = needs_exact_o(s, lengths)
    return Route(five, None, heads, "dkv_ds", "o+o_lo" if exact_o else "o", gate_grad, containment, exact_o,
                 tuple(reasons))


@functools.lru_cache(maxsize=256)  # asked at every tail backward (context parallelism): once per kind of call
def tail_route(s, k: Knobs) -> Route:
    """The route of a tail-query backward (`host.tail_backward`, context parallelism): seven products (five need
    every query position), the dK/dV kernel of the call's dense shape."""
    kernel = dkv_kernel_for(s.B, s.T, s.HQ, s.H, s.K, s.V, s.dtype, s.device, s.W, sequence_lengths(s.B, s.T, None),
                            k.dkv_path)
    return seven_route(s, kernel, k, [("products", "seven: tail queries")])


# ----------------------------------------------------------------------------------------------------------------
# "Why did it pick this?"
# ----------------------------------------------------------------------------------------------------------------

def _user_call(q, k, v, g, window_size, cu_seqlens, sink_bias, causal: bool, softcap: Optional[float],
               cu_seqlens_k: Optional[torch.Tensor]):
    """The `call.Call` of a user's inputs (checked as `parallel_attn` checks them), as `select_backward` and
    `select_forward` see it."""
    check_attn_inputs(q, k, v, g, None, window_size, cu_seqlens, sink_bias, None, {}, softcap=softcap, causal=causal,
                      cu_seqlens_k=cu_seqlens_k)
    W, WR = resolve_window(window_size, causal)
    cu_q = None
    if cu_seqlens_k is not None:  # packed queries shorter than keys: k's offsets key the call, q's its queries
        if varlen_tiles(cu_seqlens, q.shape[1]).lengths != varlen_tiles(cu_seqlens_k, k.shape[1]).lengths:
            cu_q = cu_seqlens
        cu_seqlens = cu_seqlens_k
    return make_call(q, k, v, g, sink_bias, cu_seqlens, resolve_scale(None, q.shape[-1]), W, containment_knob(),
                     resolve_softcap(softcap), WR, cu_q, on_tiles=False)


def select_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor] = None,
                    window_size: Optional[int] = None, cu_seqlens: Optional[torch.Tensor] = None,
                    sink_bias: Optional[torch.Tensor] = None, *, causal: bool = True,
                    softcap: Optional[float] = None, cu_seqlens_k: Optional[torch.Tensor] = None) -> Route:
    """The `Route` that a backward of these inputs takes with the settings now (as an eager call: a gated forward
    stores o_lo where five products need it). `print(select_backward(q, k, v).explain())` says why."""
    c = _user_call(q, k, v, g, window_size, cu_seqlens, sink_bias, causal, softcap, cu_seqlens_k)
    now = knobs()
    return route(c, now, c.qkv_aligned, needs_o_lo(c, now))


class ForwardRoute(NamedTuple):
    """The forward's kernel ("hopper": `gluon_fwd`, or "triton") and why (`forward_kernel`)."""
    kernel: str
    why: str

    def explain(self) -> str:
        return f"forward kernel: {self.why}"


def select_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Optional[torch.Tensor] = None,
                   window_size: Optional[int] = None, cu_seqlens: Optional[torch.Tensor] = None,
                   sink_bias: Optional[torch.Tensor] = None, *, causal: bool = True,
                   softcap: Optional[float] = None, cu_seqlens_k: Optional[torch.Tensor] = None) -> ForwardRoute:
    """The kernel that a forward of these inputs runs with the settings now, and why:
    `print(select_forward(q, k, v).explain())`. ValueError where FLA_BWD_FWD_KERNEL forces one that cannot run it."""
    c = _user_call(q, k, v, g, window_size, cu_seqlens, sink_bias, causal, softcap, cu_seqlens_k)
    s = c.shape
    hopper, why = forward_kernel(s, c.tiles is None, c.qkv_aligned, forward_knob(), contain_inline(s, s.containment))
    return ForwardRoute("hopper" if hopper else "triton", why)


def select_dkv_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window_size: Optional[int] = None,
                      cu_seqlens: Optional[torch.Tensor] = None) -> DkvKernel:
    """The dK/dV kernel that a seven-product backward of these inputs uses (settings read now). A five-product
    backward (`select_backward(...).five`: long dense calls by default) runs the KV-head-owned dS-storing kernel.
    `cu_seqlens`: the keys' offsets (`parallel_attn`'s cu_seqlens_k where q is shorter)."""
    B, _, HQ, K = q.shape
    T = k.shape[1]  # the keys' length: q may be shorter
    W = T if window_size is None else window_size
    lengths = sequence_lengths(B, T, varlen_tiles(cu_seqlens, T) if cu_seqlens is not None else None)
    return dkv_kernel_for(B, T, HQ, k.shape[2], K, v.shape[3], q.dtype, q.device, W, lengths,
                          settings.forced_dkv_path())
