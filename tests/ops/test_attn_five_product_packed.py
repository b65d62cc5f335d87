# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The five-product backward of packed batches (`cu_seqlens`, issue 60; forced: FLA_BWD_DQ_PATH=from-ds, which
"auto" does not take for them until measured on a GPU).

Each sequence's dS tiles in bands of its own length (`index.VarlenTiles.band_offsets`, `host.band_offsets`): the
dS-storing dK/dV kernel over the packed key tiles, dQ from dS over the packed pairs of query blocks. Held to the
five-product contract: o and every gradient against the fp32 oracle with poisoned buffers (an unwritten dS tile or
dq row shows up as NaN), at every split and chunk of heads, empty and one-token sequences, windows, K != V, sinks
(o_lo where a sequence is shorter than 16 keys), gates (the key side and the scan per sequence), head dims above
128 (dK from the stored tiles); dK/dV
bitwise the seven-product backward's (the same kernel body, the same additions); chunks bitwise one launch;
deterministic; NaN/Inf containment in both modes; a plan per band size (two batches of the same tile counts whose
bands differ); and what it does not run (tail queries; the Hopper kernel where it cannot) raises.
"""

import math

import pytest
import torch
from conftest import DEVICE
from helpers import Case, check_against_oracle, make_inputs, params, run_parallel
from test_attn_five_product import ChunkSpy

import fla_bwd.ops.attn.from_ds as from_ds
import fla_bwd.ops.attn.host as host
from fla_bwd.settings import dkv_path, dq_path, ds_kernel

f16, bf16 = torch.float16, torch.bfloat16
_SPLIT_PATHS = {1: "gqa", 2: "gqa-split2", 4: "gqa-split4"}

CPU_CASES = [
    Case(B=1, T=200, HQ=4, H=2, K=64, dtype=bf16, cu_seqlens=(0, 1, 1, 70, 200)),  # empty and one-token sequences
    Case(B=1, T=150, HQ=8, H=2, K=128, dtype=f16, cu_seqlens=(0, 63, 64, 150), window=30),
    Case(B=1, T=130, HQ=2, H=2, K=32, dtype=bf16, cu_seqlens=(0, 64, 130)),  # MHA, a sequence of whole tiles
    Case(B=1, T=100, HQ=4, H=1, K=64, V=32, dtype=bf16, cu_seqlens=(0, 37, 100)),  # K != V
    Case(B=1, T=90, HQ=2, H=1, K=16, dtype=bf16, cu_seqlens=(0, 20, 90), window=1, scale=0.3),
    Case(B=1, T=120, HQ=4, H=2, K=64, dtype=bf16, cu_seqlens=(0, 5, 100, 120), sink=1.0),  # a short row: o_lo
    Case(B=1, T=160, HQ=4, H=1, K=32, dtype=f16, cu_seqlens=(0, 70, 160), sink=float("nan"), window=30),
    # Gated: o_lo from the forward, the gate's key side per sequence (`from_ds.key_side_kernel`), its scan per sequence.
    Case(B=1, T=300, HQ=4, H=2, K=64, dtype=bf16, cu_seqlens=(0, 1, 1, 170, 300), gate=True),
    Case(B=1, T=200, HQ=2, H=1, K=32, dtype=f16, cu_seqlens=(0, 64, 200), gate=True, window=40, sink=0.5),
    # Head dims above 128: dV and dS in the dK/dV kernel, dK from the stored tiles (`FiveProduct.dk_from_ds`).
    Case(B=1, T=90, HQ=4, H=2, K=160, dtype=bf16, cu_seqlens=(0, 1, 30, 90)),
    Case(B=1, T=100, HQ=2, H=1, K=64, V=192, dtype=f16, cu_seqlens=(0, 45, 100), window=20, sink=1.0),
]
GPU_CASES = [
    Case(B=1, T=3000, HQ=16, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1, 1000, 2200, 3000)),
    Case(B=1, T=2500, HQ=8, H=8, K=128, dtype=f16, cu_seqlens=(0, 777, 2500)),
    Case(B=1, T=2000, HQ=8, H=2, K=64, dtype=bf16, cu_seqlens=(0, 500, 1500, 2000), window=300),
    Case(B=1, T=1200, HQ=4, H=1, K=128, V=64, dtype=bf16, cu_seqlens=(0, 129, 1200)),
    Case(B=1, T=2100, HQ=16, H=2, K=128, dtype=bf16, cu_seqlens=(0, 9, 1000, 2100), sink=float("nan")),
    Case(B=1, T=2200, HQ=16, H=2, K=256, dtype=bf16, cu_seqlens=(0, 1, 700, 2200)),
    Case(B=1, T=3000, HQ=16, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1, 1000, 2200, 3000), gate=True),
]
CASES = GPU_CASES if DEVICE == "cuda" else CPU_CASES


@pytest.mark.parametrize("case", params(CASES))
def test_packed_matches_oracle(case, monkeypatch):
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"):
        check_against_oracle(case)
    assert len(spy.chunks) == 1 and spy.chunks[0] is not None, spy.chunks


_SPLIT = Case(B=1, T=170, HQ=8, H=2, K=64, dtype=bf16, cu_seqlens=(0, 1, 90, 170), window=50) if DEVICE != "cuda" \
    else Case(B=1, T=2600, HQ=16, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1300, 2600))


@pytest.mark.parametrize("split", [2, 4])
def test_split_matches_oracle(split, monkeypatch):
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"), dkv_path(_SPLIT_PATHS[split]):
        check_against_oracle(_SPLIT)
    assert spy.splits == [split], spy.splits


_WIDE = Case(B=1, T=100, HQ=4, H=1, K=144, dtype=bf16, cu_seqlens=(0, 1, 64, 100)) if DEVICE != "cuda" else \
    Case(B=1, T=1500, HQ=8, H=2, K=256, dtype=bf16, cu_seqlens=(0, 1, 700, 1500))


@pytest.mark.parametrize("case,split,chunk", [(_SPLIT, 1, 2), (_SPLIT, 1, 1), (_SPLIT, 2, 1), (_WIDE, 1, 1),
                                              (_WIDE, 2, 1)], ids=["split1-chunk2", "split1-chunk1", "split2-chunk1",
                                                                   "wide-split1-chunk1", "wide-split2-chunk1"])
def test_chunks_are_bitwise_one_launch_and_dkv_the_seven_products(case, split, chunk, monkeypatch):
    """A budget that holds `chunk` heads of every share: dq, dk, dv bitwise the one-launch result, and (at head dims
    up to 128, where the dK/dV kernel sums dK too) dk, dv bitwise the seven-product backward's at the same split."""
    x = make_inputs(case)
    with dkv_path(_SPLIT_PATHS[split]):
        with dq_path("recompute"):
            seven = run_parallel(case, x)
        with dq_path("from-ds"):
            whole = run_parallel(case, x)
            again = run_parallel(case, x)
            lengths = [b - a for a, b in zip(case.cu_seqlens, case.cu_seqlens[1:])]
            band = sum(from_ds.band_bytes(n, case.window or case.T, max(case.K, case.Vd), False) for n in lengths)
            monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.H * split * chunk * band / 2**20))
            spy = ChunkSpy(monkeypatch)
            chunked = run_parallel(case, x)
    assert spy.chunks == [chunk], (spy.chunks, lengths)
    for name in ("o", "dq", "dk", "dv"):
        assert torch.equal(whole[name], again[name]), f"{name}: not deterministic"
        assert torch.equal(whole[name], chunked[name]), f"{name}: chunks differ from one launch"
    for name in ("dk", "dv") if case.K <= 128 else ("dv",):
        assert torch.equal(whole[name], seven[name]), f"{name}: differs from seven products"


def test_a_plan_per_band_size(monkeypatch):
    """Two batches of the same tile counts at every tile size (so the same call key) whose dS bands differ in size:
    each gets a plan of its own bands, and both match the oracle."""
    monkeypatch.setattr(host, "_PLANS", {})
    for cu in ((0, 128, 256, 256), (0, 256, 256, 256)):  # bands of 2 x 3 and of 10 tiles (64 x 64)
        case = Case(B=1, T=256, HQ=2, H=1, K=16, dtype=bf16, cu_seqlens=cu)
        with dq_path("from-ds"):
            check_against_oracle(case)
    assert len([k for k in host._PLANS if k[0] == "bwd"]) == 2


@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("containment", ["inline", "two-launch"])
@pytest.mark.parametrize("which,value", [("q", math.nan), ("k", math.inf), ("v", math.nan)],
                         ids=["q_nan", "k_inf", "v_nan"])
def test_nan_inf_stays_in_its_sequence(which, value, containment, gate, monkeypatch):
    """A non-finite q, k or v element of the second sequence: the other sequences' outputs and gradients are bitwise
    the clean run's, and the second sequence's are NaN/Inf exactly where its own dense five-product call's are."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    cu = (0, 40, 110, 150)
    case = Case(B=1, T=150, HQ=4, H=2, K=32, dtype=bf16, cu_seqlens=cu, window=20, gate=gate)
    x = make_inputs(case)
    with dq_path("from-ds"):
        clean = run_parallel(case, x)
        bad = getattr(x, which).detach().clone()
        bad[0, 60, 0, :] = value  # sequence 1, position 20, head 0
        setattr(x, which, bad.requires_grad_())
        out = run_parallel(case, x)
        one = Case(B=1, T=70, HQ=4, H=2, K=32, dtype=bf16, window=20, gate=gate)
        y = make_inputs(one)
        for name in ("q", "k", "v", "do") + (("g",) if gate else ()):
            setattr(y, name, getattr(x, name).detach()[:, 40:110].clone().requires_grad_(name != "do"))
        dense = run_parallel(one, y)
    for name, t in out.items():
        rest = torch.cat([t[:, :40], t[:, 110:]], 1)
        assert torch.equal(rest, torch.cat([clean[name][:, :40], clean[name][:, 110:]], 1)), name
        assert torch.equal(torch.isfinite(t[:, 40:110]), torch.isfinite(dense[name])), name
        if (which, name) != ("v", "dv"):  # dv does not depend on v
            assert not torch.isfinite(t[:, 40:110]).all(), name


def test_the_hopper_kernel_raises_where_it_cannot_run():
    """Packed calls run on the Hopper kernel where forced (tests/ops/test_attn_gluon_dkv.py); a forced "hopper" where
    it cannot run (here head dim 32, and on a CPU no GPU) raises, naming the setting."""
    case = Case(B=1, T=90, HQ=2, H=1, K=32, dtype=bf16, cu_seqlens=(0, 30, 90))
    x = make_inputs(case)
    with dq_path("from-ds"), ds_kernel("hopper"):
        with pytest.raises(ValueError, match="ds kernel 'hopper'"):
            run_parallel(case, x)


def test_auto_keeps_seven_products(monkeypatch):
    spy = ChunkSpy(monkeypatch)
    case = CPU_CASES[0]
    run_parallel(case, make_inputs(case))
    assert spy.chunks == [None], spy.chunks


def test_packed_tail_queries_raise():
    """Packed queries shorter than their keys (`cu_seqlens_k`) take the tail-query kernels, which five products do
    not have: forced, a clear error."""
    from fla_bwd.ops.attn import parallel_attn

    q = torch.randn(1, 30, 2, 32, device=DEVICE, dtype=bf16, requires_grad=True)
    k, v = (torch.randn(1, 90, 1, 32, device=DEVICE, dtype=bf16, requires_grad=True) for _ in range(2))
    cu_q = torch.tensor([0, 10, 30], device=DEVICE, dtype=torch.int32)
    cu_k = torch.tensor([0, 40, 90], device=DEVICE, dtype=torch.int32)
    with dq_path("from-ds"), pytest.raises(ValueError, match="tail queries"):
        o = parallel_attn(q, k, v, cu_seqlens=cu_q, cu_seqlens_k=cu_k)
        torch.autograd.grad(o.sum(), (q, k, v))


@pytest.mark.parametrize("cu,exact", [((0, 5, 100, 120), True), ((0, 0, 40, 120), False)])
def test_a_short_sequence_with_a_sink_takes_o_lo(cu, exact):
    """A sink on rows that see fewer than `config.SINK_EXACT_O_BELOW_KEYS` keys needs delta from o + o_lo: in a
    packed batch, the rows of its shortest non-empty sequence (not the packed length)."""
    from fla_bwd.ops.attn import select_backward

    x = make_inputs(Case(B=1, T=120, HQ=2, H=1, K=32, dtype=bf16, cu_seqlens=cu, sink=1.0))
    with dq_path("from-ds"):
        route = select_backward(x.q, x.k, x.v, None, None, x.cu_seqlens, x.sink_bias)
    assert route.five is not None and route.delta == ("o+o_lo" if exact else "o"), route.explain()


def test_plan_key_of_calls_five_products_cannot_run(monkeypatch):
    """fp32 and packed tail calls have no dS bands to size (and no "dkv_ds" tiles on a GPU): their backward's plan
    key holds none, and it is not asked for their tile config."""
    from fla_bwd.ops.attn import config

    def no_config(kernel, *args):
        assert kernel != "dkv_ds", "asked for the dS tiles of a call five products cannot run"
        return original(kernel, *args)

    original = config.tile_config
    monkeypatch.setattr(host, "tile_config", no_config)
    case = Case(B=1, T=60, HQ=2, H=1, K=32, dtype=torch.float32, cu_seqlens=(0, 20, 60))
    call = host.call_of(*(getattr(make_inputs(case), n) for n in ("q", "k", "v", "g", "sink_bias", "cu_seqlens")),
                        case.K ** -0.5, 0)
    assert host._bands_key(call) is None
