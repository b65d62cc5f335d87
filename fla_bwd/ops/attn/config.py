# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tile sizes and the thresholds of the dispatch's rules (`dispatch.py`, which alone reads the thresholds), each with
its reason in one line; PERF.md lists the decisions that stand and where their measurements are.
`tests/ops/test_kernel_resources.py` compiles every tile config for sm_90 and checks it fits.
"""

import functools
import math
from typing import NamedTuple

import torch

from fla_bwd.ops.utils.triton_private import driver_device_properties
from fla_bwd.utils import cdiv, is_interpreter


def _tiles(BT: int, BS: int, num_warps: int, num_stages: int) -> dict:
    """A tile config as the launch arguments it becomes: BT rows of the tile a program owns (queries for fwd/dq,
    keys for dkv), BS rows of each block its inner loop steps over."""
    return dict(BT=BT, BS=BS, num_warps=num_warps, num_stages=num_stages)


# (16-bit inputs, head dim > 128) -> kernel -> tile config; the head dim is the larger of K and V. Read-only: the
# launchers spread these dicts into their launch arguments.
TILE_CONFIGS = {
    (True, False): {
        "fwd": _tiles(128, 128, 8, 2),  # fewest K/V reloads among the configs that do not spill
        "dq": _tiles(64, 64, 4, 2),  # every larger tile or deeper pipeline measured slower
        "dkv": _tiles(64, 64, 4, 2),  # same sweeps; two resident programs per SM
        # Short windows (`dkv_tiles`): 32-row blocks fit three stages beside a second program, so each block's loads
        # are issued a block ahead (at two stages the loop issues them at its end and waits at its top).
        "dkv_window": _tiles(64, 32, 4, 3),
        "dkv_ds": _tiles(64, 64, 4, 2),  # the five-product dK/dV kernel's: "dkv"'s, measured with it
    },
    (True, True): {
        "fwd": _tiles(128, 64, 8, 2),  # two warpgroups of 64 rows: D = 256 B2 T2048 G4 381 against 1002 us at 64 x 32
        "dq": _tiles(64, 32, 8, 2),  # D up to 256 doubles each row's registers and shared memory; not swept
        "dkv": _tiles(64, 32, 8, 2),  # same reason
        # dV and dS alone (`dispatch.FiveProduct.dk_from_ds`): 1023 against 1336 us at 64 x 32 (D = 256 B2 T2048 G4)
        "dkv_ds": _tiles(64, 64, 8, 2),
    },
    (False, False): {
        "fwd": _tiles(64, 32, 4, 2),  # fp32 operands: fwd 128x128 needs 256 KB of the 227 KB a block may use
        "dq": _tiles(64, 32, 8, 2),  # same limit
        "dkv": _tiles(64, 32, 8, 2),  # same limit
    },
    (False, True): {
        "fwd": _tiles(64, 32, 4, 2),  # fits at D up to 256 in fp32
        "dq": _tiles(32, 32, 4, 2),  # halved again to fit 227 KB
        "dkv": _tiles(32, 32, 4, 2),  # same limit
    },
}
# The dQ-from-dS kernel (`from_ds.py`; its tiles are the dK/dV kernel's, two query blocks a program): a memory-bound
# loop, 3 stages deep; 4 warps: 622 against 819 us at 8 on g8-T8192.
DQ_FROM_DS_LAUNCH = dict(num_warps=4, num_stages=3)
# Above head dim 128: 8 warps, where 4 spill its two [BQ, D] fp32 sums (D = 256: 248 B of stack at 4, none at 8).
DQ_FROM_DS_LAUNCH_WIDE = dict(num_warps=8, num_stages=3)
# Head dims above this take dK from the stored dS tiles in five products (`dispatch.FiveProduct.dk_from_ds`): the
# dK/dV kernel's two [BT, D] fp32 sums take 128 registers a thread at D = 256 and spill (FLAG mode: 192-944 B of
# stack at every tile tried; dV and dS alone: none, `scripts/compile_sm90.py --five --dims 256`).
DK_FROM_DS_ABOVE_D = 128
# Whether "auto" takes that route (five products above head dim 128): D = 256 B2 T2048 G4 backward 1745 against
# 3419 us in seven products (H100).
FIVE_PRODUCT_WIDE = True
# The dK-from-dS kernel (head dims above 128, `dispatch.five_route`): a [BT, D] fp32 sum a program, 8 warps to hold
# it at D = 256 without spills (4 warps: 528 B of stack); 3 stages as dQ from dS, the same kind of loop.
DK_FROM_DS_LAUNCH = dict(num_warps=8, num_stages=3)
# Where "auto" takes the five-product backward (`dispatch.route`): dense full-causal calls at head dims
# above 64 from this length on whose launches keep the GPU busy (`group_fills_gpu`, with a split if needed). They won
# there on the H200; D = 64 and windows lost. Shorter: `FIVE_PRODUCT_MIN_T_HOPPER`.
FIVE_PRODUCT_MIN_T = 2048
# Whether "auto" takes it for gated calls too (where the Hopper kernel runs them, in eager calls whose forward then
# stores o's rounding residual, `dispatch.needs_o_lo`): faster than seven products on the H200, backward alone and
# forward + backward.
FIVE_PRODUCT_GATED = True
# From this length on "auto" runs the five-product backward's dK/dV on the Hopper kernel (`gluon_dkv`, where it can):
# its kernels win on every row (33-96 us at T = 2048), and eager T = 2048 calls follow them: interleaved with
# Triton's blocks, no Hopper block stalled on the host more than Triton's.
HOPPER_DKV_MIN_T = 2048
# Ungated calls shorter than both lengths above take five products from this length on where the Hopper kernel runs
# them: 13-21% less graph kernel time at T = 512 on the H100, for 8-24 us more host time, still under it.
FIVE_PRODUCT_MIN_T_HOPPER = 512
# "auto" runs the Gluon forward (`gluon_fwd`) from this length on: 1.15-1.47x the Triton forward on every row from
# T = 2048 on (H100), while mha-short (B4 T512) took 75.5 against 66.2 us eager; between them nothing was measured.
HOPPER_FWD_MIN_T = 2048
# ... and at these head dims: at 256 (64-key tiles, two stages) it took 399 against 365 us on B2 T2048 G4 and 2327
# against 2220 on g8-T8192 (H100); at 64, 1.06-1.24x the Triton forward.
HOPPER_FWD_HEAD_DIMS = (64, 128)
# Whether "auto" runs softcap on the Hopper kernels (both; forced, they run it regardless): off until their softcap
# forms have run on a GPU (compiled for sm_90 only, session 45: no machine was lent).
HOPPER_SOFTCAP = False
# The splits of each group's query heads (programs a key tile) "auto" tries for five products, in order: 1 where it
# keeps the GPU busy, else 4 (won on every imbalanced row measured), else 2 (G = 2; won at g8-T4096).
FIVE_PRODUCT_SPLITS = (1, 4, 2)
# Five-product calls with a sink whose rows see fewer keys than this (min(T, W)) take delta from o in fp32 (o_lo,
# `dispatch.needs_exact_o`): with a sink P is not exactly 1 on a one-key row, and the rounded o's delta cost dq
# 4.6e-2 at W = 1 and 1.2e-2 at T = 8 (fp64 study; 5.3e-3 against 5.2e-3 without a sink from W = 4 on).
SINK_EXACT_O_BELOW_KEYS = 16
# The five-product backward's dK/dV launches run two query heads of each group (unrolled) below this length, one from
# it on: the second head saves an fp32 dK/dV round trip, which paid at T = 2048 and not at T = 8192.
DS_TWO_HEADS_BELOW_T = 4096
# Gated five-product calls up to this length sum the key side of the gate's gradient and scan it in one launch, a
# program a band (`from_ds.gate_grad_of_band_kernel`): one launch less; a band's partial key sums grow as T^2.
GATE_GRAD_BY_BAND_MAX_T = 2048
# "auto" takes five products on the Triton dS-store kernel (where the Hopper kernel does not run: K != V, head dims
# other than 128) only on GPUs with at least this peak memory bandwidth (TB/s, `hbm_tbps`): its dS round trip won
# ctl-K128-V64-g8-T2048 on the H200 (4.8 TB/s) and lost it on the H100 (3.35 TB/s) by 2.2%.
TRITON_FIVE_MIN_TBPS = 4.0
# SMs of the GPU the dispatch rules were measured on (H200): `sm_count` of a device that has none (the CPU).
REFERENCE_SMS = 132
# That GPU's peak memory bandwidth in TB/s: `hbm_tbps` of a device that has none (the CPU).
REFERENCE_TBPS = 4.8
# Under the CPU interpreter small tiles make the tests' short sequences cross every range of the loops.
INTERPRETER_CONFIG = _tiles(32, 16, 4, 1)


# Windows up to this size take the "dkv_window" tiles in the seven-product dK/dV kernels (`dkv_tiles`): measured
# faster at W = 256 and 512 (16-bit, D = 128, ungated); dense T = 2048 gained ~2%, gated T = 2048 and D = 64 lost.
DKV_WINDOW_MAX_W = 512


def dkv_tiles(D: int, dtype: torch.dtype, W: int, T: int, gated: bool) -> str:
    """The seven-product dK/dV kernels' tile config at head dim D (the larger of K and V), dtype, window W (W >= T:
    none) and sequence length T: "dkv_window" for ungated 16-bit calls at head dims 65-128 with a window of at most
    DKV_WINDOW_MAX_W, whose key tiles each see few query blocks; else "dkv"."""
    short = W < T and W <= DKV_WINDOW_MAX_W
    return "dkv_window" if short and dtype != torch.float32 and 64 < D <= 128 and not gated else "dkv"


def tile_config(kernel: str, D: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The tile config of `kernel` ("fwd", "dq", "dkv" or, from `dkv_tiles`, "dkv_window") at head dim D (the larger
    of K and V) and input dtype."""
    if is_interpreter():
        return INTERPRETER_CONFIG
    return TILE_CONFIGS[(dtype != torch.float32, D > 128)][kernel]


def tail_alignment(D: int, dtype: torch.dtype) -> int:
    """What the query offset Q0 of a tail-query call must be a multiple of: every tile size (query tile, key tile,
    inner block) that the three kernels use at head dim D and `dtype` here (128 on a GPU in 16 bits, 64 in fp32;
    32 under the interpreter), so that no tile or block straddles Q0."""
    sizes = [cfg[k] for name in ("fwd", "dq", "dkv") for cfg in (tile_config(name, D, dtype),) for k in ("BT", "BS")]
    return math.lcm(*sizes)


# Calls with less work than this (B * HQ * T * min(T, W) * max(K, V)) contain NaN/Inf inline, larger ones in two
# launches: where a second launch's host time equals what inline costs the GPU.
INLINE_CONTAINMENT_WORK = 2**29


class DeltaMode(NamedTuple):
    """How the dQ kernel computes delta, the per-row sum that dS subtracts (see `host.add_dq`)."""
    refine: bool  # dq from rowsum(o * dO), then rowsum(P * dP) stored for the dK/dV kernel
    exact: bool  # rowsum(P * dP) from a first loop over the keys, for dq and the dK/dV kernel alike


DELTA_MODES = {
    "rounded": DeltaMode(False, False),  # no gate, no sink: delta's ~1e-3 rounding costs little
    "refine": DeltaMode(True, False),  # gates: dgc is a reverse cumsum, which turns delta's error into a walk
    "exact": DeltaMode(False, True),  # sinks: dq needs the exact delta itself
}


@functools.cache
def sm_count(device: torch.device) -> int:
    """The SMs of a CUDA device, else `REFERENCE_SMS`. Read once per device: the dispatch runs on every backward."""
    if device.type != "cuda":
        return REFERENCE_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def hbm_tbps(device: torch.device) -> float:
    """Peak memory bandwidth of a CUDA device in TB/s (memory clock x bus width x 2, double data rate), else
    `REFERENCE_TBPS`. Read once per device, as `sm_count`."""
    if device.type != "cuda":
        return REFERENCE_TBPS
    props = torch.cuda.get_device_properties(device)
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0), getattr(props, "memory_bus_width", 0)
    if not (clock_khz and bus_bits):  # a torch without these fields: Triton's driver reports the same two
        index = device.index if device.index is not None else torch.cuda.current_device()
        driver = driver_device_properties(index) or {}
        clock_khz, bus_bits = driver.get("mem_clock_rate", 0), driver.get("mem_bus_width", 0)
        if not (clock_khz and bus_bits):  # no figure from either: the reference GPU's, as on a device without one
            return REFERENCE_TBPS
    return clock_khz * 1e3 * 2 * bus_bits / 8 / 1e12


@functools.cache
def capability(device: torch.device) -> tuple:
    """The compute capability of a CUDA device, read once per device, as `sm_count`."""
    return torch.cuda.get_device_capability(device)


def _tile_work(lengths: tuple, H: int, G: int, D: int, W: int):
    """(query-block iterations of the longest key tile for one query head, iterations of all tiles and heads) of the
    KV-head-owned dK/dV kernel for sequences of these lengths, at the GPU's 16-bit tiles (also under the CPU
    interpreter, so that the dispatch rules decide there as on the GPU)."""
    cfg = TILE_CONFIGS[(True, D > 128)]["dkv"]
    BT, BS = cfg["BT"], cfg["BS"]
    ratio = BT // BS
    span = cdiv(BT + W - 1, BS)  # query blocks one key tile can see
    total = longest = 0
    for length in lengths:
        blocks = cdiv(length, BS)
        seen = [min(blocks - i * ratio, span) for i in range(cdiv(length, BT))]
        total += H * G * sum(seen)
        longest = max(longest, seen[0] if seen else 0)
    return longest, total


def _balanced(critical: int, total: int, sms: int) -> bool:
    """A launch's critical path (iterations of its longest program) within 1.25x the mean work per resident program
    (two per SM)."""
    return critical <= 1.25 * total / (2 * sms)


@functools.lru_cache(maxsize=256)
def gqa_split(lengths: tuple, H: int, G: int, D: int, W: int, sms: int):
    """The fewest programs (1, 2 or 4, below G) that can share a group's query heads in the KV-head-owned dK/dV
    kernel and keep the GPU busy, or None (then the query-head-owned kernel balances better).

    A program's longest run is the first key tile of the longest sequence: G / split times the query blocks that
    tile sees. When that critical path is much longer than the average work per resident program, programs of
    short tiles finish and leave SMs idle while it runs; splitting the heads shortens it at the price of fp32
    partials and their sum. Counted in query-block iterations; below 64 iterations a split saves less kernel time
    than its extra launch costs the host.
    """
    longest, total = _tile_work(lengths, H, G, D, W)
    for split in (1, 2, 4):
        critical = G // split * longest
        if split < G and (critical <= 64 or _balanced(critical, total, sms)):
            return split
    return None


@functools.lru_cache(maxsize=256)
def group_fills_gpu(lengths: tuple, H: int, G: int, D: int, W: int, sms: int, split: int = 1) -> bool:
    """Whether programs that each run G / split query heads of a group on one key tile keep the GPU busy
    (`gqa_split`'s balance rule). A launch of any fixed number of each share's heads, as the five-product
    backward's, has the same ratio of critical path to mean work, so the rule holds for it too."""
    longest, total = _tile_work(lengths, H, G, D, W)
    return _balanced(G // split * longest, total, sms)
