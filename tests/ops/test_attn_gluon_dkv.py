# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The five-product backward's Hopper dK/dV kernel (`fla_bwd.ops.attn.gluon_dkv`, Gluon, sm_90 only).

On every machine: its static schedule (each item once, longest first, balanced), its split rule, its dispatch
(`dispatch.five_product` with the kernel's scope faked on), and that a forced "hopper" raises where it cannot
run. On an sm_90 GPU, the five-product backward's contract (tests/ops/test_attn_five_product.py) on this kernel:
o and every gradient against the fp32 oracle with poisoned buffers, at every split and with chunks of heads
(bitwise the one-launch result, and deterministic), NaN/Inf containment through its flags and the Triton FIXUP
launch, and a whole-step CUDA graph capture. Gluon has no CPU interpreter; tests/ops/test_kernel_resources.py
compiles it for sm_90 on the CPU.
"""

import math

import pytest
import test_attn_nan
import test_attn_softcap
import torch
from conftest import DEVICE
from helpers import Case, check_against_oracle, make_inputs, run_parallel
from test_attn_cuda_graph import test_whole_step_capture_replays_bitwise_like_eager as _capture_replays_like_eager
from test_attn_five_product import ChunkSpy, _band_bytes, _shape

import fla_bwd.ops.attn.dispatch as dispatch
import fla_bwd.ops.attn.from_ds as from_ds
import fla_bwd.ops.attn.gluon_dkv as gluon_dkv
from fla_bwd.ops.attn import config
from fla_bwd.ops.utils.index import VarlenTiles
from fla_bwd.settings import dkv_path, dq_path, ds_kernel

bf16, f16 = torch.bfloat16, torch.float16
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only (no CPU interpreter)")
_SPLIT_PATHS = {1: "gqa", 2: "gqa-split2", 4: "gqa-split4"}


class HopperSpy(ChunkSpy):
    """ChunkSpy that also records whether each five-product backward ran the Hopper kernel."""

    def __init__(self, monkeypatch):
        self.hopper = []
        super().__init__(monkeypatch)

    def record(self, five) -> None:
        super().record(five)
        self.hopper.append(None if five is None else five.hopper)


@pytest.mark.parametrize("B,T,H,split,programs", [(1, 8192, 4, 1, 132), (1, 4096, 4, 2, 132), (2, 2048, 8, 1, 132),
                                                  (2, 2048, 32, 1, 132), (1, 384, 2, 4, 3), (3, 128, 1, 1, 5)])
def test_schedule_covers_each_item_once(B, T, H, split, programs):
    tab, L = gluon_dkv.schedule(B, T, H, split, programs, torch.device("cpu"))
    assert tab.shape == (programs, 1 + L)
    items = [int(x) for p in range(programs) for x in tab[p, 1:1 + int(tab[p, 0])]]
    expected = [item for item, _ in gluon_dkv._item_blocks(B, T, H, split)]
    assert sorted(items) == sorted(expected) and len(items) == len(set(items))
    blocks = dict(gluon_dkv._item_blocks(B, T, H, split))
    loads = [sum(blocks[int(x)] for x in tab[p, 1:1 + int(tab[p, 0])]) for p in range(programs)]
    assert max(loads) * programs / sum(loads) == pytest.approx(gluon_dkv.imbalance(B, T, H, split, programs))
    assert max(loads) <= sum(loads) / programs + max(blocks.values())  # LPT's bound


@pytest.mark.parametrize("B,T,H,G,split", [(1, 8192, 4, 8, 1), (1, 4096, 4, 8, 2), (2, 2048, 8, 4, 1),
                                           (2, 2048, 4, 8, 2), (2, 2048, 32, 1, 1), (2, 2048, 16, 2, 1),
                                           (2, 2048, 2, 16, 4)])
def test_split_rule(B, T, H, G, split):
    """At the H200's 132 SMs: the splits measured fastest (G8 T4096 and B2 T2048: 2; the others 1)."""
    assert dispatch.hopper_split(B, T, H, G, 132) == split


def test_out_of_scope_calls_say_why():
    s = _shape()
    assert "CUDA" in dispatch.hopper_why_not(s, torch.device("cpu"), True)
    if HOPPER:
        cuda = torch.device("cuda")
        assert dispatch.hopper_why_not(_shape(device=cuda), cuda, True) is None
        assert "K = V = 128" in dispatch.hopper_why_not(_shape(device=cuda, K=64, V=64), cuda, True)
        assert "multiple of 128" in dispatch.hopper_why_not(_shape(device=cuda, T=2000, W=2000), cuda, True)
        assert "window" in dispatch.hopper_why_not(_shape(device=cuda, W=512), cuda, True)
        assert "16-byte aligned" in dispatch.hopper_why_not(_shape(device=cuda), cuda, False)


def _fake_hopper_scope(monkeypatch) -> None:
    """The dispatch's settings at their defaults and the Hopper kernel's scope faked on (at 132 SMs, on inputs TMA
    can read), on any machine; Triton's five products allowed too (the H200's bandwidth)."""
    for name in ("FLA_BWD_DQ_PATH", "FLA_BWD_DS_BUDGET_MIB", "FLA_BWD_DS_KERNEL", "FLA_BWD_CONTAINMENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(dispatch, "hopper_why_not",
                        lambda s, device, aligned, dense=True: None if aligned else "unaligned")
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    monkeypatch.setattr(config, "hbm_tbps", lambda device: config.REFERENCE_TBPS)


@pytest.mark.parametrize("kw,auto,forced", [  # (split, chunk, hopper) under "auto", and with "hopper" forced
    (dict(), (1, 1, True), (1, 1)),  # MHA B2 T2048 (HOPPER_DKV_MIN_T)
    (dict(H=8), (1, 4, True), (1, 4)),  # gqa4-long: balanced unsplit
    (dict(H=4), (2, 4, True), (2, 4)),  # G8 B2 T2048: two shares balance the Hopper kernel's items
    (dict(H=2), (4, 4, True), (4, 4)),  # G16
    (dict(B=1, T=4096, W=4096, H=4), (2, 4, True), (2, 4)),
    (dict(B=1, T=8192, W=8192, H=4), (1, 2, True), (1, 2)),  # two heads of each group fit the default budget
], ids=["mha", "g4", "g8-T2048", "g16", "g8-T4096", "g8-T8192"])
def test_hopper_dispatch(kw, auto, forced, monkeypatch):
    """Where the kernel can run (faked on here, at 132 SMs): "auto" takes it from `config.HOPPER_DKV_MIN_T` on with
    its own split, "hopper" at any length, "triton" never; inline containment (it is a FLAG launch) keeps Triton
    under "auto" and makes a forced "hopper" raise."""
    _fake_hopper_scope(monkeypatch)
    assert dispatch.five_product(_shape(**kw), True, True) == dispatch.FiveProduct(*auto)
    with ds_kernel("hopper"):
        assert dispatch.five_product(_shape(**kw), True, True) == dispatch.FiveProduct(*forced, True)
    with ds_kernel("triton"):
        assert not dispatch.five_product(_shape(**kw), True, True).hopper
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "inline")
    assert not dispatch.five_product(_shape(**kw), True, True).hopper
    with ds_kernel("hopper"), pytest.raises(ValueError, match="contains NaN/Inf inline"):
        dispatch.five_product(_shape(**kw), True, True)
    monkeypatch.delenv("FLA_BWD_CONTAINMENT")  # inputs TMA cannot read: Triton under "auto", a forced "hopper" raises
    assert not dispatch.five_product(_shape(**kw), True, False).hopper
    with ds_kernel("hopper"), pytest.raises(ValueError, match="unaligned"):
        dispatch.five_product(_shape(**kw), True, False)


@pytest.mark.parametrize("measured", [False, True])
def test_softcap_on_the_hopper_kernel(measured, monkeypatch):
    """softcap runs on the Hopper kernel where forced, and under "auto" only where `config.HOPPER_SOFTCAP` says its
    form was measured (else auto keeps the Triton kernel, here at 3.35 TB/s: seven products)."""
    _fake_hopper_scope(monkeypatch)
    monkeypatch.setattr(config, "HOPPER_SOFTCAP", measured)
    s = _shape(softcap=30.0)
    five = dispatch.five_product(s, True, True)
    assert (five is not None and five.hopper) if measured else (five is None or not five.hopper), five
    with ds_kernel("hopper"):
        assert dispatch.five_product(s, True, True).hopper
    assert dispatch.five_product(_shape(softcap=30.0, g_dtype=torch.float32), True, True) is None  # with a gate


@pytest.mark.parametrize("kw,auto", [  # (split, chunk) of "auto" on the Hopper kernel, or None for seven products
    (dict(B=4, T=512, W=512), (1, 1)),  # mha-short: five products from `config.FIVE_PRODUCT_MIN_T_HOPPER`
    (dict(B=4, T=512, W=512, H=8), (2, 2)),  # gqa4-short: two shares balance its items (`gluon_dkv.split_for`)
    (dict(T=1024, W=1024, dtype=f16), (1, 1)),
    (dict(T=384, W=384), None),  # under it
    (dict(T=1024, W=1024, g_dtype=torch.float32), None),  # gated: from `config.FIVE_PRODUCT_MIN_T` only
    (dict(T=1024, W=512), None),  # windows: not measured faster
], ids=["mha-T512", "g4-T512", "fp16-T1024", "T384", "gated-T1024", "window"])
def test_shorter_ungated_calls_on_the_hopper_kernel(kw, auto, monkeypatch):
    """Below `config.FIVE_PRODUCT_MIN_T`, "auto" takes five products for ungated dense calls only where the Hopper
    kernel runs them (faked on here): not on the Triton kernel, nor under inline NaN/Inf containment, nor on
    inputs TMA cannot read."""
    _fake_hopper_scope(monkeypatch)
    s = _shape(**kw)
    expected = None if auto is None else dispatch.FiveProduct(*auto, True)
    assert dispatch.five_product(s, True, True) == expected
    assert dispatch.five_product(s, True, False) is None  # unaligned: no Hopper kernel, seven
    with ds_kernel("triton"):
        assert dispatch.five_product(s, True, True) is None
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "inline")
    assert dispatch.five_product(s, True, True) is None


@needs_hopper
@pytest.mark.parametrize("case", [Case(B=2, T=1024, HQ=8, H=2, K=128, dtype=bf16),
                                  Case(B=2, T=512, HQ=16, H=16, K=128, dtype=f16)], ids=["g4-T1024", "mha-T512"])
def test_auto_takes_it_on_shorter_ungated_rows(case, monkeypatch):
    """"auto" on ungated calls from `config.FIVE_PRODUCT_MIN_T_HOPPER` on (two-launch containment): five products on
    the Hopper kernel, against the oracle."""
    monkeypatch.delenv("FLA_BWD_DS_KERNEL", raising=False)
    monkeypatch.delenv("FLA_BWD_CONTAINMENT", raising=False)
    assert not dispatch.contain_inline(_shape(B=case.B, T=case.T, W=case.T, HQ=case.HQ, H=case.H), "auto")
    spy = HopperSpy(monkeypatch)
    check_against_oracle(case)
    assert spy.hopper == [True], spy.hopper


@pytest.mark.parametrize("kernel", ["auto", "triton"])
def test_default_budget_keeps_g8_t16384_on_seven_products(kernel, monkeypatch):
    """Issue 18's peak-memory bar: a G8 B1 T16384 dense backward at the default budget stores no dS tiles (one head
    of every KV head would take 4 x 256.5 MiB, past the bar's 932 MiB), with either dK/dV kernel. A budget of that
    scratch would store them, so the default must stay below it."""
    monkeypatch.delenv("FLA_BWD_DQ_PATH", raising=False)
    monkeypatch.delenv("FLA_BWD_DS_BUDGET_MIB", raising=False)
    monkeypatch.setattr(dispatch, "hopper_why_not", lambda s, device, aligned, dense=True: None)
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    monkeypatch.setattr(config, "hbm_tbps", lambda device: config.REFERENCE_TBPS)
    s = _shape(B=1, T=16384, W=16384, H=4)
    one_head_each = s.B * s.H * from_ds.band_bytes(s.T, s.W, s.K, False)
    assert one_head_each > 932 << 20
    with ds_kernel(kernel):
        assert dispatch.five_product(s, True, True) is None
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(one_head_each / 2**20))
        assert dispatch.five_product(s, True, True) == dispatch.FiveProduct(1, 1, kernel == "auto")


def test_forced_hopper_raises_where_it_cannot_run(monkeypatch):
    case = Case(B=1, T=100, HQ=4, H=2, K=128, dtype=bf16)  # T not a multiple of 128 (and, on the CPU, no GPU)
    x = make_inputs(case)
    with dq_path("from-ds"), ds_kernel("hopper"), pytest.raises(ValueError, match="ds kernel 'hopper'"):
        run_parallel(case, x)
    with pytest.raises(ValueError, match="ds_kernel must be one of"):
        with ds_kernel("gluon"):
            pass


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("acc_in", [False, True])
def test_plan_step_passes_every_kernel_parameter(acc_in, gated):
    """The plan step launches through `launch.Launch`, whose direct path after the first launch passes its arguments
    in the kernel's parameter order: every parameter must be among them (one left out would be passed as None)."""
    from fla_bwd.ops.utils.launch import Launch, Ref, jit_function

    s = _shape(B=1, T=512, W=512, HQ=8, H=2, device=torch.device("cpu"))
    args = {name: Ref(name) for name in ("q", "k", "v", "do", "lse", "delta", "ds", "dk", "dv")}
    args.update(dk_in=Ref("dk_in") if acc_in else None, dv_in=Ref("dv_in") if acc_in else None,
                nonfinite=Ref("flags"), acc_out=acc_in, gc=Ref("gc") if gated else None,
                sink_bias=None if gated else Ref("sink_bias"), sink_part=None if gated else Ref("sink_part"))
    step = gluon_dkv.HopperDkvLaunch(s, 2, 4, 0, 8, args)
    assert isinstance(step.launch, Launch)
    params = jit_function(gluon_dkv.parallel_attn_bwd_kernel_dkv_ds_hopper).arg_names
    assert set(step.launch.args) == set(params) | {"num_warps"}
    assert step.launch.args["ACC_IN"] == int(acc_in)
    assert step.launch.args["dk_in"] == (Ref("dk_in") if acc_in else Ref("dk"))
    gate_args = ("gc_desc", "gc")
    if gated:
        assert [step.launch.args[n] for n in gate_args] == [Ref(gluon_dkv._DESC + "gc"), Ref("gc")]
    else:
        assert [step.launch.args[n] for n in gate_args] == [None] * 2
    sink = [step.launch.args[n] for n in ("sink_bias", "sink_part")]  # the plain case passes a sink
    assert sink == ([None] * 2 if gated else [Ref("sink_bias"), Ref("sink_part")])


def test_plan_step_describes_the_inputs():
    """The step's TMA descriptors (made on the CPU here; Gluon's TensorDescriptor is host data): each input viewed
    as the kernel indexes it, with the kernel's block shapes and shared-memory layouts."""
    from fla_bwd.ops.utils.launch import Ref

    B, T, HQ, H, D = 1, 256, 4, 2, 128
    s = _shape(B=B, T=T, W=T, HQ=HQ, H=H, device=torch.device("cpu"))
    args = dict({n: Ref(n) for n in ("q", "k", "v", "do", "lse", "delta", "ds", "dk", "dv", "gc")},
                dk_in=None, dv_in=None, nonfinite=Ref("flags"), acc_out=False)
    step = gluon_dkv.HopperDkvLaunch(s, 1, 2, 0, 8, args)
    env = dict(q=torch.zeros(B, T, HQ, D, dtype=bf16), do=torch.zeros(B, T, HQ, D, dtype=bf16),
               k=torch.zeros(B, T, H, D, dtype=bf16), v=torch.zeros(B, T, H, D, dtype=bf16),
               lse=torch.zeros(HQ, B * T), delta=torch.zeros(HQ, B * T), ds=torch.zeros(8 * 64 * 64, dtype=bf16),
               gc=torch.zeros(HQ, B * T))
    step._descriptors(env)
    expected = {"q": ([B * T, HQ * D], [64, D], gluon_dkv.Q_SMEM), "do": ([B * T, HQ * D], [64, D], gluon_dkv.Q_SMEM),
                "k": ([B * T, H * D], [64, D], gluon_dkv.KV_SMEM), "v": ([B * T, H * D], [64, D], gluon_dkv.KV_SMEM),
                "lse": ([HQ * B * T], [64], gluon_dkv.ROW_SMEM), "delta": ([HQ * B * T], [64], gluon_dkv.ROW_SMEM),
                "ds": ([8 * 64, 64], [64, 64], gluon_dkv.DS_TILE), "gc": ([HQ * B * T], [64], gluon_dkv.ROW_SMEM)}
    for name, (shape, block, layout) in expected.items():
        d = env[gluon_dkv._DESC + name]
        assert d.base.data_ptr() == env[name].data_ptr(), name
        assert list(d.shape) == shape and list(d.strides) == shape[1:] + [1], name
        assert list(d.block_shape) == block and d.layout == layout.value, name
    assert set(step.launch.args) >= {f"{name}_desc" for name in expected}
    assert all(t.base is None for *_, t in step.templates)  # the plan keeps no call's tensor alive
    other = {name: torch.zeros_like(t) for name, t in env.items() if not name.startswith(gluon_dkv._DESC)}
    step._descriptors(other)  # a later call: the first call's fields over its own tensors
    for name in expected:
        d, first = other[gluon_dkv._DESC + name], env[gluon_dkv._DESC + name]
        assert type(d) is type(first) and d.base is other[name], name
        assert {k: v for k, v in vars(d).items() if k != "base"} == {k: v for k, v in vars(first).items()
                                                                      if k != "base"}, name


@pytest.mark.parametrize("lengths,H,split,programs", [((1, 0, 300, 128, 1000), 2, 1, 7), ((2048,) * 4, 8, 1, 132),
                                                     ((2227, 869, 1233, 3863), 4, 2, 132), ((5,), 1, 4, 3)])
def test_packed_schedule_covers_each_item_once(lengths, H, split, programs):
    """A packed call's table (`gluon_dkv.packed_schedule`): its row length first, then a row a program; every item
    (128-key tile of `chunk_indices(128)`, KV head, share) once, each of a tile that exists, with cdiv(n, 64) - 2m
    query blocks; LPT's bound on the loads; made once per offsets value."""
    offsets = tuple(int(x) for x in torch.tensor((0,) + lengths).cumsum(0))
    tiles = VarlenTiles(offsets, torch.device("cpu"))
    tab = gluon_dkv.packed_schedule(tiles, H, split, programs)
    L = int(tab[0])
    rows = tab[1:].view(programs, 1 + L)
    items = [int(x) for p in range(programs) for x in rows[p, 1:1 + int(rows[p, 0])]]
    blocks = dict(gluon_dkv.packed_items(lengths, H, split))
    assert sorted(items) == sorted(blocks) and len(items) == len(set(items))
    chunks = tiles.chunk_indices(gluon_dkv.BT).tolist()
    assert len(blocks) == len(chunks) * H * split
    for item in items:
        i_n, m = chunks[item // (H * split)]
        assert blocks[item] == math.ceil(lengths[i_n] / 64) - 2 * m >= 1
    loads = [sum(blocks[int(x)] for x in rows[p, 1:1 + int(rows[p, 0])]) for p in range(programs)]
    assert max(loads) <= sum(loads) / programs + max(blocks.values())
    assert gluon_dkv.packed_schedule(tiles, H, split, programs) is tab
    assert gluon_dkv.programs_for(1, offsets[-1], H, split, 132, tiles) == min(132, len(chunks) * H * split)


def test_packed_runs_on_the_hopper_kernel_where_forced(monkeypatch):
    """Packed calls (any lengths) take the Hopper kernel where FLA_BWD_DS_KERNEL=hopper with five products forced
    (faked on here), at auto's split; the Triton kernel under "auto" (not yet measured); a forced "hopper" raises on
    inputs TMA cannot read."""
    _fake_hopper_scope(monkeypatch)
    s = _shape(B=1, T=3000, W=3000, HQ=16, H=2)
    lengths = (1, 0, 999, 2000)
    with dq_path("from-ds"):
        assert dispatch._five(s, False, True, True, dispatch.knobs(), lengths)[0].hopper is False
        with ds_kernel("hopper"):
            five = dispatch._five(s, False, True, True, dispatch.knobs(), lengths)[0]
            assert five.hopper and (G := s.HQ // s.H) % five.split == 0 and five.chunk <= G // five.split
            with pytest.raises(ValueError, match="unaligned"):
                dispatch._five(s, False, False, True, dispatch.knobs(), lengths)
    assert dispatch._five(s, False, True, True, dispatch.knobs(), lengths)[0] is None  # "auto": seven products


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_packed_plan_step_passes_every_kernel_parameter(gated):
    """The packed step: every parameter passed; the schedule, tile list and 64-key offsets from the call's env
    (`host._run`), lse, delta and the gate cumsum by pointer, TMA descriptors of q, dO, K, V and dS only."""
    from fla_bwd.ops.utils.launch import Launch, Ref, jit_function

    tiles = VarlenTiles((0, 1, 1, 300, 1000), torch.device("cpu"))
    s = _shape(B=1, T=1000, W=1000, HQ=8, H=2, device=torch.device("cpu"))
    args = {name: Ref(name) for name in ("q", "k", "v", "do", "lse", "delta", "ds", "dk", "dv", "ds_offsets")}
    args.update(dk_in=None, dv_in=None, nonfinite=Ref("flags"), acc_out=False, gc=Ref("gc") if gated else None,
                sink_bias=Ref("sink_bias"), sink_part=Ref("sink_part"))
    step = gluon_dkv.HopperDkvLaunch(s, 2, 4, 0, 0, args, tiles)
    assert isinstance(step.launch, Launch)
    params = jit_function(gluon_dkv.parallel_attn_bwd_kernel_dkv_ds_hopper).arg_names
    assert set(step.launch.args) == set(params) | {"num_warps"}
    a = step.launch.args
    assert (a["sched"], a["L"], a["cu_seqlens"], a["chunks"], a["k64_offsets"]) == (
        Ref("hopper_sched"), 0, Ref("cu_seqlens"), Ref(f"chunks{gluon_dkv.BT}"), Ref("k64_offsets"))
    assert (a["ds_offsets"], a["lse"], a["delta"], a["NT64"]) == (Ref("ds_offsets"), Ref("lse"), Ref("delta"),
                                                                   tiles.num_tiles(64))
    assert a["lse_desc"] is None and a["delta_desc"] is None and a["gc_desc"] is None
    assert a["gc"] == (Ref("gc") if gated else None)
    assert {name for _, name, *_ in step.views} == {"q", "do", "k", "v", "ds"}
    assert step.programs == gluon_dkv.programs_for(1, 1000, 2, 2, config.sm_count(s.device), tiles)


PACKED_GPU_CASES = [
    Case(B=1, T=3000, HQ=16, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1, 1000, 2200, 3000)),  # empty, one token
    Case(B=1, T=2500, HQ=8, H=8, K=128, dtype=f16, cu_seqlens=(0, 777, 2500)),  # MHA
    Case(B=1, T=2100, HQ=16, H=2, K=128, dtype=bf16, cu_seqlens=(0, 9, 1000, 2100), sink=float("nan")),
    Case(B=1, T=3000, HQ=16, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1, 1000, 2200, 3000), gate=True),
    Case(B=1, T=1300, HQ=4, H=1, K=128, dtype=bf16, cu_seqlens=(0, 64, 65, 1300), gate=True, sink=1.0),
]


@needs_hopper
@pytest.mark.parametrize("case,split", [pytest.param(c, s, id=f"{c.id}-split{s}") for c in PACKED_GPU_CASES
                                        for s in (1, 2) if (c.HQ // c.H) % s == 0])
def test_packed_matches_oracle(case, split, monkeypatch):
    """Packed batches on the Hopper kernel: sequences of any length (masked key and query tiles, lse and delta by
    cp.async), each sequence's own dS bands, flags and sink sums at packed 64-key tiles; and a second call
    bitwise."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    spy = HopperSpy(monkeypatch)
    x = make_inputs(case)
    with dq_path("from-ds"), ds_kernel("hopper"), dkv_path(_SPLIT_PATHS[split]):
        first = check_against_oracle(case, x)
        again = run_parallel(case, x)
    assert spy.hopper == [True, True] and spy.splits == [split, split], (spy.hopper, spy.splits)
    for name, t in first.items():
        assert torch.equal(t, again[name]), name


@needs_hopper
@pytest.mark.parametrize("which,value", [("q", math.nan), ("v", math.inf)], ids=["q_nan", "v_inf"])
def test_packed_nan_stays_in_its_sequence(which, value, monkeypatch):
    """A non-finite q or v element of the second sequence, on the Hopper kernel: the other sequences' outputs and
    gradients are bitwise the clean run's (the next sequence's rows reach a tile only in masked pairs, and the
    flag sends it to the exact FIXUP launch)."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    case = Case(B=1, T=1500, HQ=8, H=2, K=128, dtype=bf16, cu_seqlens=(0, 300, 1100, 1500))
    x = make_inputs(case)
    with dq_path("from-ds"), ds_kernel("hopper"):
        clean = run_parallel(case, x)
        bad = getattr(x, which).detach().clone()
        bad[0, 700, 0, :] = value  # sequence 1, position 400, head 0
        setattr(x, which, bad.requires_grad_())
        out = run_parallel(case, x)
    for name, t in out.items():
        rest = torch.cat([t[:, :300], t[:, 1100:]], 1)
        assert torch.equal(rest, torch.cat([clean[name][:, :300], clean[name][:, 1100:]], 1)), name


GPU_CASES = [Case(B=1, T=256, HQ=2, H=2, K=128, dtype=bf16), Case(B=2, T=384, HQ=8, H=2, K=128, dtype=f16),
             Case(B=1, T=512, HQ=8, H=1, K=128, dtype=bf16), Case(B=3, T=128, HQ=4, H=4, K=128, dtype=bf16,
                                                                  scale=0.3),
             Case(B=1, T=256, HQ=2, H=2, K=128, dtype=bf16, gate=True),
             Case(B=2, T=384, HQ=8, H=2, K=128, dtype=f16, gate=True, g_dtype=bf16),
             Case(B=1, T=1024, HQ=8, H=1, K=128, dtype=bf16, gate=True),
             Case(B=2, T=512, HQ=8, H=2, K=128, dtype=bf16, sink=float("nan")),
             Case(B=1, T=384, HQ=4, H=1, K=128, dtype=f16, sink=2.0, sink_dtype=bf16, gate=True)]


@needs_hopper
@pytest.mark.parametrize("case,split", [pytest.param(c, s, id=f"{c.id}-split{s}") for c in GPU_CASES
                                        for s in (1, 2, 4) if (c.HQ // c.H) % s == 0])
def test_matches_oracle(case, split, monkeypatch):
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")  # these small calls would contain inline (Triton then)
    spy = HopperSpy(monkeypatch)
    with dq_path("from-ds"), ds_kernel("hopper"), dkv_path(_SPLIT_PATHS[split]):
        check_against_oracle(case)
    assert spy.hopper == [True] and spy.splits == [split], (spy.hopper, spy.splits)


SOFTCAP_CASES = [Case(B=1, T=256, HQ=2, H=2, K=128, dtype=bf16), Case(B=2, T=384, HQ=8, H=2, K=128, dtype=f16),
                 Case(B=2, T=512, HQ=8, H=2, K=128, dtype=bf16, sink=1.0),
                 Case(B=1, T=384, HQ=4, H=1, K=128, dtype=bf16, sink=float("nan"))]


@needs_hopper
@pytest.mark.parametrize("case,split", [pytest.param(c, s, id=f"{c.id}-split{s}") for c in SOFTCAP_CASES
                                        for s in (1, 2) if (c.HQ // c.H) % s == 0])
def test_softcap_matches_oracle(case, split, monkeypatch):
    """softcap on the Hopper kernel (tests/ops/test_attn_softcap.py's sharp inputs, which the cap bends): the stored
    tiles and dK take the q.k products' dS, the sink's sums the scores'."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    spy = HopperSpy(monkeypatch)
    with dq_path("from-ds"), ds_kernel("hopper"), dkv_path(_SPLIT_PATHS[split]):
        check_against_oracle(case, test_attn_softcap._sharp(case), test_attn_softcap._ours(case),
                             test_attn_softcap._oracle(case))
    assert spy.hopper == [True] and spy.splits == [split], (spy.hopper, spy.splits)


@needs_hopper
@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("split,chunk", [(1, 8), (1, 2), (1, 1), (2, 2), (4, 1)])
def test_chunks_are_bitwise_one_launch(split, chunk, gate, monkeypatch):
    """A budget of `chunk` heads of every share: the same dq, dk, dv (and dg) bitwise as one chunk (the same
    additions in the same order: fp32 sums carried from launch to launch) and as a second call."""
    case = Case(B=2, T=512, HQ=16, H=2, K=128, dtype=bf16, gate=gate)
    x = make_inputs(case)
    spy = HopperSpy(monkeypatch)
    with dq_path("from-ds"), ds_kernel("hopper"), dkv_path(_SPLIT_PATHS[split]):
        whole = check_against_oracle(case, x)
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.B * case.H * split * chunk * _band_bytes(case) / 2**20))
        chunked = run_parallel(case, x)
        again = run_parallel(case, x)
    assert spy.chunks == [8 // split, chunk, chunk] and spy.hopper == [True] * 3, (spy.chunks, spy.hopper)
    for name in ("dq", "dk", "dv") + (("dg",) if gate else ()):
        assert torch.equal(chunked[name], whole[name]), name
        assert torch.equal(again[name], chunked[name]), name


@needs_hopper
def test_gated_hopper_matches_triton_kernel(monkeypatch):
    """The gated Hopper kernel against the gated Triton kernel at the same split: dq, dk, dv, dg within the 16-bit
    rounding of dS (their scores add the gate in the same order, but the products' fp32 sums may differ in order)."""
    case = Case(B=1, T=1024, HQ=8, H=2, K=128, dtype=bf16, gate=True)
    x = make_inputs(case)
    out = {}
    for kernel in ("hopper", "triton"):
        with dq_path("from-ds"), ds_kernel(kernel), dkv_path("gqa"):
            out[kernel] = run_parallel(case, x)
    for name in ("dq", "dk", "dv", "dg"):
        a, b = out["hopper"][name].double(), out["triton"][name].double()
        assert ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item() < 2e-3, name


@needs_hopper
@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("which,value", [("q", math.nan), ("k", math.inf), ("v", math.nan), ("q", math.inf)],
                         ids=["q_nan", "k_inf", "v_nan", "q_inf"])
def test_nan_inf_propagation(which, value, gate, monkeypatch):
    """tests/ops/test_attn_nan.py's check at a size this kernel runs: the flags it writes send exactly the tiles
    with a non-finite dK/dV to the Triton FIXUP launch, and a non-finite input reaches only what depends on it."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    for name, value_ in dict(NAN_T=256, NAN_D=128).items():
        monkeypatch.setattr(test_attn_nan, name, value_)
    spy = HopperSpy(monkeypatch)
    with dq_path("from-ds"), ds_kernel("hopper"):
        out, clean, dep = test_attn_nan._poisoned_run(which, value, None, gate=gate)
    assert spy.hopper == [True, True], spy.hopper
    test_attn_nan._check_poisoned(out, clean, dep)


@needs_hopper
def test_whole_step_capture(monkeypatch):
    """Forward + backward in one CUDA graph replays bitwise like eager calls (the kernel's TMA descriptors are made
    at each run of the plan, so a capture holds the captured tensors'), with two chunks of heads."""
    case = Case(B=2, T=512, HQ=8, H=2, K=128)
    monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.B * case.H * 2 * _band_bytes(case) / 2**20))
    spy = HopperSpy(monkeypatch)
    with dq_path("from-ds"), ds_kernel("hopper"):
        _capture_replays_like_eager(case)
    assert set(spy.hopper) == {True} and set(spy.chunks) == {2}, (spy.hopper, spy.chunks)


def _wrapped_like_triton_3_6(launcher, tensordesc_indices, tensordesc_meta):
    """A stand-in for Triton 3.6's `driver.wrap_handle_tensordesc`: a closure named `inner` over these three."""
    def inner(*args):
        return launcher, tensordesc_indices, tensordesc_meta
    return inner


class _Run:
    """A stand-in for Triton 3.6's `CudaLauncher` (what `descriptor_launcher` reads of it)."""

    def __init__(self, launch, scratch=0):
        self.launch, self.global_scratch_size, self.profile_scratch_size = launch, scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.called = []

    def __call__(self, *args):
        self.called.append(args)


@pytest.fixture
def triton_3_6_driver(monkeypatch):
    """The driver module made to look like 3.6's (whatever Triton runs the tests); expansions recorded."""
    from triton.backends.nvidia import driver as nv

    expanded = []

    def make_tensordesc_arg(desc, meta):
        expanded.append((desc.base.data_ptr(), meta))
        return [("map", desc.base.data_ptr(), meta), *desc.shape, *desc.strides]

    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT_LEN", 13, raising=False)
    monkeypatch.setattr(nv, "make_tensordesc_arg", make_tensordesc_arg, raising=False)
    return expanded


def test_descriptor_launcher_only_for_triton_3_6s_build(triton_3_6_driver, monkeypatch):
    """`launch.descriptor_launcher` takes the C launcher from under 3.6's wrapper, and refuses anything else: a
    wrapper over other variables, a kernel that needs scratch allocated at launch, another driver module."""
    from triton.backends.nvidia import driver as nv

    from fla_bwd.ops.utils.launch import descriptor_launcher

    raw = object()
    found = descriptor_launcher(_Run(_wrapped_like_triton_3_6(raw, {0, 2}, ["m0", "m2"])))
    assert found.launch is raw and found.positions == {0, 2} and found.metas == ("m0", "m2")
    assert (found.cooperative, found.pdl) == (False, True)
    assert descriptor_launcher(_Run(_wrapped_like_triton_3_6(raw, {0, 2}, ["m0", "m2"]), scratch=128)) is None
    assert descriptor_launcher(_Run(_wrapped_like_triton_3_6(raw, {0, 2}, ["m0"]))) is None
    assert descriptor_launcher(_Run(lambda *args: raw)) is None
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT_LEN", 14)
    assert descriptor_launcher(_Run(_wrapped_like_triton_3_6(raw, {0, 2}, ["m0", "m2"]))) is None


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_plan_step_reuses_descriptors_by_address(gated, triton_3_6_driver, monkeypatch):
    """Under Triton 3.6's launcher, after its first (compiling) launch the step calls the C launcher itself with
    every argument 3.6's wrapper would give it (descriptors expanded in parameter order, tensors by address), and
    expands a descriptor again only for an input address it has not seen."""
    import fla_bwd.ops.utils.launch as launch
    from fla_bwd.ops.utils.launch import Ref, jit_function

    monkeypatch.setattr(launch, "is_interpreter", lambda: False)
    B, T, HQ, H, D = 1, 256, 4, 2, 128
    s = _shape(B=B, T=T, W=T, HQ=HQ, H=H, device=torch.device("cpu"))
    inputs = ("q", "k", "v", "do", "lse", "delta", "ds") + (("gc",) if gated else ())
    args = dict({n: Ref(n) for n in inputs + ("dk", "dv")}, gc=Ref("gc") if gated else None, dk_in=None,
                dv_in=None, nonfinite=Ref("flags"), acc_out=False)
    # Two chunks' steps of one call: the second finds the first's descriptors in the call's env and makes none.
    steps = [gluon_dkv.HopperDkvLaunch(s, 1, 2, G0, 8, args) for G0 in (0, 1)]
    names = jit_function(steps[0].launch.kernel).arg_names
    positions = [names.index(f"{n}_desc") for n in ("q", "k", "v", "do", "lse", "delta", "ds", "gc")
                 if n in inputs]
    raw = []
    run = _Run(_wrapped_like_triton_3_6(lambda *a: raw.append(a), set(positions), [f"m{i}" for i in positions]))

    class _Compiled:
        function, packed_metadata = "fn", "packed"

    _Compiled.run = run
    normal = []

    class _Kernel:  # Triton's path: records the launch, returns the compiled stand-in
        fn = steps[0].launch.kernel

        def __getitem__(self, grid):
            return lambda **kwargs: normal.append(kwargs) or _Compiled()

    for step in steps:
        step.launch.kernel = _Kernel()

    def env_of():
        return dict(q=torch.zeros(B, T, HQ, D, dtype=bf16), do=torch.zeros(B, T, HQ, D, dtype=bf16),
                    k=torch.zeros(B, T, H, D, dtype=bf16), v=torch.zeros(B, T, H, D, dtype=bf16),
                    lse=torch.zeros(HQ, B * T), delta=torch.zeros(HQ, B * T),
                    ds=torch.zeros(8 * 64 * 64, dtype=bf16), gc=torch.zeros(HQ, B * T),
                    dk=torch.zeros(B, T, H, D), dv=torch.zeros(B, T, H, D), flags=torch.zeros(64, dtype=torch.int8))

    first = env_of()
    for step in steps:
        step(first, torch.device("cpu"), 1234)
    assert len(normal) == 2 and not raw and all(step.memo for step in steps)  # Triton's path, then memoized

    def expected(step, kwargs, env):
        """What 3.6's wrapper passes the C launcher for this call of `step` (whose first launch took kwargs)."""
        out = [*step.launch.grid, 1234, "fn", False, True, None, None, "packed", None, None, None]
        for i, name in enumerate(names):
            if i in positions:
                base = name[:-len("_desc")]
                d = kwargs[name]
                out += [("map", env[base].data_ptr(), f"m{i}"), *d.shape, *d.strides]
            else:
                x = kwargs[name]
                x = env[step.launch.args[name].name] if isinstance(step.launch.args.get(name), Ref) else x
                out.append(x.data_ptr() if isinstance(x, torch.Tensor) else x)
        return out

    step, kwargs = steps[0], normal[0]
    second = env_of()
    step(second, torch.device("cpu"), 1234)
    assert len(normal) == 2 and len(raw) == 1
    assert list(raw[0]) == expected(step, kwargs, second)
    assert len(triton_3_6_driver) == len(positions)  # each descriptor expanded once
    step(second, torch.device("cpu"), 1234)  # the same addresses: nothing expanded again
    assert list(raw[1]) == expected(step, kwargs, second) and len(triton_3_6_driver) == len(positions)
    third = dict(second, q=torch.zeros_like(second["q"]))  # one new address: that descriptor only
    step(third, torch.device("cpu"), 1234)
    assert list(raw[2]) == expected(step, kwargs, third)
    assert triton_3_6_driver[len(positions):] == [(third["q"].data_ptr(), f"m{positions[0]}")]
    steps[1](third, torch.device("cpu"), 1234)  # the second chunk's step: its own G0, the same inputs
    assert list(raw[3]) == expected(steps[1], normal[1], third) and raw[3] != raw[2]
    step(third, torch.device("cpu"), None)  # no direct launch (a hook, or fast launch off): Triton's path
    assert len(normal) == 3 and len(raw) == 4


@needs_hopper
def test_second_call_launches_direct(monkeypatch):
    """After its first launch the kernel goes through the compiled kernel's C launcher (`launch.Launch`'s direct
    path: Gluon's `kernel[grid]` binding cost 519 us of host time a launch; on Triton 3.6 with its
    descriptors' expansions kept by address, `HopperDkvLaunch._launch_memoized`), with the same results: for the
    same inputs again, and for copies of them at other addresses (descriptors expanded anew)."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    import dataclasses

    import fla_bwd.ops.attn.host as host

    host.clear_plans()
    case = Case(B=2, T=512, HQ=8, H=2, K=128, dtype=bf16)
    x = make_inputs(case)
    copies = dataclasses.replace(x, **{n: getattr(x, n).detach().clone().requires_grad_(getattr(x, n).requires_grad)
                                       for n in ("q", "k", "v", "do")})
    with dq_path("from-ds"), ds_kernel("hopper"):
        first = run_parallel(case, x)
        second = run_parallel(case, x)
        third = run_parallel(case, copies)
    steps = [st for plan in host._PLANS.values() for st in plan.steps if isinstance(st, gluon_dkv.HopperDkvLaunch)]
    assert steps and all(st.launch.direct is not None for st in steps)
    for name in ("dq", "dk", "dv"):
        assert torch.equal(first[name], second[name]), name
        assert torch.equal(first[name], third[name]), name


@needs_hopper
@pytest.mark.parametrize("name", ["q", "k", "do"])
def test_unaligned_input_runs_triton(name, monkeypatch):
    """One input contiguous but 2 bytes past a 16-byte boundary (TMA cannot read it): "auto" runs the Triton kernel,
    against the oracle; a forced "hopper" raises instead of failing in the descriptor."""
    monkeypatch.delenv("FLA_BWD_DS_KERNEL", raising=False)
    case = Case(B=1, T=config.HOPPER_DKV_MIN_T, HQ=8, H=2, K=128, dtype=bf16)
    x = make_inputs(case)
    t = getattr(x, name).detach()
    shifted = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view_as(t).copy_(t)
    assert shifted.data_ptr() % 16 == 2 and shifted.is_contiguous()
    setattr(x, name, shifted if name == "do" else shifted.requires_grad_())
    with ds_kernel("triton"):  # what "auto" runs without the Hopper kernel here: Triton's five products, or seven
        triton = dispatch.five_product(_shape(device=t.device, B=1, T=case.T, W=case.T, HQ=8, H=2), True, True)
    spy = HopperSpy(monkeypatch)
    check_against_oracle(case, x)
    assert spy.hopper == [None if triton is None else False], (spy.hopper, triton)
    with ds_kernel("hopper"), pytest.raises(ValueError, match="16-byte aligned"):
        run_parallel(case, x)


@needs_hopper
def test_descriptors_follow_each_call(monkeypatch):
    """From the second call on the descriptors are the first call's fields over the new call's tensors
    (`triton_private.rebased_descriptor`): a call on other tensors of the same shapes gets their gradients, bitwise
    those of a fresh plan."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    import fla_bwd.ops.attn.host as host

    case = Case(B=1, T=512, HQ=8, H=2, K=128, dtype=bf16)
    x, y = make_inputs(case), make_inputs(case)
    with dq_path("from-ds"), ds_kernel("hopper"):
        host.clear_plans()
        run_parallel(case, x)
        second = run_parallel(case, y)
        host.clear_plans()
        fresh = run_parallel(case, y)
    for name in ("o", "dq", "dk", "dv"):
        assert torch.equal(second[name], fresh[name]), name


@needs_hopper
def test_auto_takes_it_on_long_rows(monkeypatch):
    """"auto" on a long GQA call (T = HOPPER_DKV_MIN_T): the Hopper kernel, against the oracle."""
    monkeypatch.delenv("FLA_BWD_DS_KERNEL", raising=False)
    spy = HopperSpy(monkeypatch)
    check_against_oracle(Case(B=1, T=config.HOPPER_DKV_MIN_T, HQ=8, H=2, K=128, dtype=bf16))
    assert spy.hopper == [True], spy.hopper
