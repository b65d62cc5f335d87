# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The five-product backward (`fla_bwd.ops.attn.from_ds`, issue 18; opt-in: FLA_BWD_DQ_PATH=from-ds).

Held to the same contract as the default backward: o and every gradient against the fp32 oracle at error ratio
< 0.005 with poisoned buffers (an unwritten dS tile or dq row shows up as NaN), NaN/Inf containment in both modes,
bitwise determinism; and its own: the chunks of query heads are bitwise the one-launch result, dK/dV are bitwise
the seven-product backward's (the same kernel, additions in the same order), and every call it cannot run raises.
"""

import math

import pytest
import test_attn_nan
import torch
import triton
import triton.language as tl
from conftest import DEVICE, error_ratio
from helpers import Case, check_against_oracle, make_inputs, params, run_parallel, run_reference
from test_attn_cuda_graph import test_whole_step_capture_replays_bitwise_like_eager as _capture_replays_like_eager
from test_attn_nan import _check_poisoned, _poisoned_run

import fla_bwd.ops.attn.dispatch as dispatch
import fla_bwd.ops.attn.from_ds as from_ds
import fla_bwd.ops.attn.host as host
from fla_bwd.ops.attn import config, parallel_attn
from fla_bwd.ops.attn.inner import o_lo_decode, o_lo_encode
from fla_bwd.settings import dkv_path, dq_path, ds_kernel
from fla_bwd.utils import interpreter_bf16_fix, interpreter_index_fix

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

CPU_CASES = [
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16),
    Case(B=1, T=100, HQ=8, H=2, K=128, dtype=f16),
    Case(B=2, T=45, HQ=2, H=2, K=32, dtype=bf16),  # MHA
    Case(B=1, T=77, HQ=4, H=1, K=64, V=32, dtype=bf16),  # K != V
    Case(B=1, T=90, HQ=4, H=2, K=64, dtype=bf16, window=20),
    Case(B=1, T=70, HQ=2, H=1, K=64, dtype=f16, window=1),
    Case(B=2, T=50, HQ=2, H=1, K=64, dtype=bf16, window=33),
    Case(B=1, T=1, HQ=2, H=1, K=64, dtype=bf16),
    Case(B=1, T=16, HQ=2, H=1, K=16, dtype=bf16, scale=0.3),
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, gate=True),
    Case(B=1, T=100, HQ=4, H=1, K=64, dtype=f16, gate=True, window=30),
    Case(B=1, T=80, HQ=2, H=2, K=32, dtype=bf16, gate=True, g_dtype=bf16),
    Case(B=1, T=130, HQ=2, H=2, K=64, dtype=bf16, gate=True, scale=0.5),  # sharp rows: delta from o alone failed
    Case(B=1, T=300, HQ=2, H=1, K=32, dtype=bf16, gate=True, window=100),  # keys of several key-side programs
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, sink=float("nan")),
    Case(B=1, T=90, HQ=4, H=1, K=64, V=32, dtype=f16, sink=2.0, window=20),  # the sink takes much of the mass
    Case(B=1, T=70, HQ=2, H=2, K=32, dtype=bf16, sink=-1.0, sink_dtype=bf16, gate=True),
    Case(B=1, T=40, HQ=2, H=1, K=32, dtype=bf16, sink=-2.0, window=1, scale=0.5),  # one key a row: o_lo's delta
    Case(B=1, T=9, HQ=2, H=2, K=64, dtype=bf16, sink=0.0, scale=0.5),
    # Head dims above 128: dV and dS in the dK/dV kernel, dK from the stored tiles (`FiveProduct.dk_from_ds`).
    Case(B=1, T=63, HQ=4, H=2, K=160, dtype=bf16),
    Case(B=1, T=50, HQ=2, H=1, K=256, V=192, dtype=f16, window=20),
    Case(B=2, T=40, HQ=2, H=2, K=144, dtype=bf16, gate=True),
    Case(B=1, T=45, HQ=4, H=1, K=136, dtype=bf16, sink=1.0),
    Case(B=1, T=33, HQ=2, H=1, K=64, V=256, dtype=bf16, sink=float("nan"), window=1),
]
GPU_CASES = [
    Case(B=2, T=1000, HQ=16, H=2, K=128, dtype=bf16),
    Case(B=1, T=777, HQ=8, H=8, K=128, dtype=f16),
    Case(B=1, T=1500, HQ=8, H=2, K=64, dtype=bf16, window=300),
    Case(B=3, T=200, HQ=4, H=1, K=128, V=64, dtype=bf16, window=64),
    Case(B=2, T=1000, HQ=16, H=2, K=128, dtype=bf16, gate=True),
    Case(B=1, T=2048, HQ=8, H=8, K=128, dtype=f16, gate=True),
    Case(B=1, T=1500, HQ=8, H=2, K=64, dtype=bf16, gate=True, window=300),
    Case(B=2, T=1024, HQ=16, H=4, K=128, dtype=bf16, sink=float("nan")),
    Case(B=1, T=2048, HQ=8, H=2, K=128, dtype=f16, sink=2.0, sink_dtype=bf16),
    Case(B=1, T=1000, HQ=8, H=2, K=64, dtype=bf16, sink=0.0, gate=True, window=200),
    Case(B=2, T=1024, HQ=16, H=4, K=256, dtype=bf16),
    Case(B=1, T=777, HQ=8, H=2, K=192, V=256, dtype=f16, sink=1.0),
    Case(B=1, T=1000, HQ=4, H=1, K=256, dtype=bf16, gate=True, window=300),
    Case(B=1, T=2048, HQ=8, H=8, K=256, dtype=bf16, sink=float("nan")),
]
CASES = GPU_CASES if DEVICE == "cuda" else CPU_CASES
_SPLIT_PATHS = {1: "gqa", 2: "gqa-split2", 4: "gqa-split4"}  # the dK/dV path that forces each split


class ChunkSpy:
    """Records the chunk and the split of every backward (the plan's `route.five`, `host._backward_plan`; None: seven
    products)."""

    def __init__(self, monkeypatch):
        self.chunks, self.splits = [], []
        original = host._backward_plan

        def spy(*args):
            plan = original(*args)
            self.record(plan.route.five)
            return plan

        monkeypatch.setattr(host, "_backward_plan", spy)

    def record(self, five) -> None:
        self.chunks.append(None if five is None else five.chunk)
        self.splits.append(None if five is None else five.split)


def _band_bytes(case: Case) -> int:
    """Scratch bytes of one band (one query head, one batch element) at this case's tiles (`from_ds.band_bytes`)."""
    W = case.T if case.window is None else min(case.window, case.T)
    return from_ds.band_bytes(case.T, W, max(case.K, case.Vd), case.gate)


@pytest.mark.parametrize("case", params(CASES))
def test_five_product_matches_oracle(case, monkeypatch):
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"):
        check_against_oracle(case)
    # The default budget holds every head of each share of these cases (split by `config.FIVE_PRODUCT_SPLITS`).
    assert len(spy.splits) == 1 and spy.chunks == [case.HQ // case.H // spy.splits[0]], (spy.splits, spy.chunks)


def test_dispatch_runs_once_per_kind_of_call(monkeypatch):
    """The backward's dispatch (`dispatch.route`) runs when a plan is built: once for repeated calls of one kind
    under the same settings, and again for each change of a setting it reads (the dS budget, the dq path), which
    every backward reads anew (`host._backward_plan`); each backward takes the decision made for its settings."""
    case = Case(B=1, T=40, HQ=4, H=2, K=32, dtype=bf16)
    x = make_inputs(case)
    dispatched = []
    original = dispatch.route

    def counted(*args):
        dispatched.append(original(*args).five)
        return original(*args)

    monkeypatch.setattr(dispatch, "route", counted)
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"):
        runs = [run_parallel(case, x) for _ in range(3)]
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.B * case.H * _band_bytes(case) / 2**20))
        runs += [run_parallel(case, x) for _ in range(2)]
    with dq_path("recompute"):
        run_parallel(case, x)
    assert [None if f is None else f.chunk for f in dispatched] == [2, 1, None], dispatched
    assert spy.chunks == [2, 2, 2, 1, 1, None], spy.chunks
    for run in runs[1:]:
        for name in ("dq", "dk", "dv"):
            assert torch.equal(run[name], runs[0][name]), name


SPLIT_CASES = [(Case(B=2, T=63, HQ=4, H=1, K=64, dtype=bf16), 2), (Case(B=1, T=100, HQ=8, H=2, K=128, dtype=f16), 4),
               (Case(B=1, T=90, HQ=4, H=2, K=64, dtype=bf16, window=20), 2)] if DEVICE != "cuda" else \
    [(Case(B=2, T=1000, HQ=16, H=2, K=128, dtype=bf16), 2), (Case(B=1, T=1500, HQ=8, H=2, K=64, dtype=bf16,
                                                                  window=300), 4)]


@pytest.mark.parametrize("case,split", [pytest.param(c, s, id=f"{c.id}-split{s}") for c, s in SPLIT_CASES])
def test_split_matches_oracle(case, split, monkeypatch):
    """Each group's query heads dealt to `split` programs a key tile (forced by the dK/dV path)."""
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"), dkv_path(_SPLIT_PATHS[split]):
        check_against_oracle(case)
    assert spy.splits == [split] and spy.chunks == [case.HQ // case.H // split], (spy.splits, spy.chunks)


_CHUNKED = Case(B=2, T=70, HQ=8, H=2, K=64, dtype=bf16, window=40) if DEVICE != "cuda" else \
    Case(B=2, T=900, HQ=16, H=2, K=128, dtype=bf16)


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("split,chunk", [(1, 4), (1, 2), (1, 1), (2, 2), (2, 1), (4, 1)] if DEVICE != "cuda" else
                         [(1, 8), (1, 4), (1, 2), (1, 1), (2, 4), (2, 1), (4, 2)])
def test_chunks_are_bitwise_one_launch(split, chunk, heads, monkeypatch):
    """Each group's query heads dealt to `split` programs (shares), a budget that holds `chunk` heads of every
    share, dK/dV launches of `heads` (or fewer) heads each: the same dq, dk, dv bitwise as one chunk of all of them
    (and as a second call: determinism), and dk, dv bitwise the seven-product backward's at the same split (each
    share's heads added in the same order, then the shares' partials)."""
    case = _CHUNKED
    x = make_inputs(case)
    monkeypatch.setattr(config, "DS_TWO_HEADS_BELOW_T", 2**31 if heads == 2 else 0)
    monkeypatch.setattr(host, "_PLANS", {})  # plans built at the other heads per launch
    spy = ChunkSpy(monkeypatch)
    share = case.HQ // case.H // split
    with dq_path("from-ds"), dkv_path(_SPLIT_PATHS[split]):
        whole = run_parallel(case, x)
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.B * case.H * split * chunk * _band_bytes(case) / 2**20))
        chunked = run_parallel(case, x)
        again = run_parallel(case, x)
    with dq_path("recompute"), dkv_path(_SPLIT_PATHS[split]):
        seven = run_parallel(case, x)
    assert spy.chunks == [share, chunk, chunk, None], spy.chunks
    assert spy.splits == [split, split, split, None], spy.splits
    for name in ("dq", "dk", "dv"):
        assert torch.equal(chunked[name], whole[name]), name
        assert torch.equal(again[name], chunked[name]), name
    for name in ("dk", "dv"):
        assert torch.equal(chunked[name], seven[name]), name


def _whole_then_chunked(case: Case, split: int, chunk: int, monkeypatch) -> tuple:
    """(inputs, ChunkSpy, one chunk's outputs, then with a budget of `chunk` heads a share, then those again) of a
    five-product backward whose groups are dealt to `split` programs, from fresh plans."""
    x = make_inputs(case)
    monkeypatch.setattr(host, "_PLANS", {})
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"), dkv_path(_SPLIT_PATHS[split]):
        whole = run_parallel(case, x)
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.B * case.H * split * chunk * _band_bytes(case) / 2**20))
        chunked = run_parallel(case, x)
        again = run_parallel(case, x)
    return x, spy, whole, chunked, again


_WIDE_CHUNKED = Case(B=2, T=70, HQ=8, H=2, K=160, V=144, dtype=bf16, window=40) if DEVICE != "cuda" else \
    Case(B=2, T=900, HQ=16, H=2, K=256, dtype=bf16)


@pytest.mark.parametrize("split,chunk", [(1, 4), (1, 1), (2, 1), (4, 1)] if DEVICE != "cuda" else
                         [(1, 8), (1, 2), (2, 4), (4, 1)])
def test_wide_chunks_are_bitwise_one_launch(split, chunk, monkeypatch):
    """Head dims above 128 (dK from dS, `from_ds.parallel_attn_bwd_kernel_dk_from_ds`, which carries its fp32 sums
    from chunk to chunk in place): the same dq, dk, dv bitwise in chunks as in one chunk, and again (determinism);
    dv bitwise the seven-product backward's at the same split (dK's sum runs in another order there)."""
    case = _WIDE_CHUNKED
    x, spy, whole, chunked, again = _whole_then_chunked(case, split, chunk, monkeypatch)
    with dq_path("recompute"), dkv_path(_SPLIT_PATHS[split]):
        seven = run_parallel(case, x)
    assert spy.chunks == [case.HQ // case.H // split, chunk, chunk, None], spy.chunks
    for name in ("dq", "dk", "dv"):
        assert torch.equal(chunked[name], whole[name]), name
        assert torch.equal(again[name], chunked[name]), name
    assert torch.equal(chunked["dv"], seven["dv"])
    assert error_ratio(seven["dk"].float(), chunked["dk"].float()) < 5e-3


_GATED_CHUNKED = Case(B=2, T=70, HQ=8, H=2, K=64, dtype=bf16, gate=True) if DEVICE != "cuda" else \
    Case(B=2, T=900, HQ=16, H=2, K=128, dtype=bf16, gate=True)


@pytest.mark.parametrize("split,chunk", [(1, 4), (1, 1), (2, 1)] if DEVICE != "cuda" else [(1, 8), (1, 2), (4, 1)])
def test_gated_chunks_are_bitwise_one_launch(split, chunk, monkeypatch):
    """A gated call: the same dq, dk, dv and dg bitwise in chunks as in one chunk, and again (determinism); each
    chunk's dQ launch stores the query side of dgc for its own heads only."""
    case = _GATED_CHUNKED
    _, spy, whole, chunked, again = _whole_then_chunked(case, split, chunk, monkeypatch)
    assert spy.chunks == [case.HQ // case.H // split, chunk, chunk], spy.chunks
    for name in ("o", "dq", "dk", "dv", "dg"):
        assert torch.equal(chunked[name], whole[name]), name
        assert torch.equal(again[name], chunked[name]), name


def _gated_call(case: Case):
    x = make_inputs(case)
    q, k, v, g = (t.detach() for t in (x.q, x.k, x.v, x.g))
    return x, (q, k, v, g, None, None, case.K ** -0.5, 0)


def test_forward_makes_o_lo_only_for_a_gated_five_product_backward():
    """o's rounding residual costs the forward one more store: made for a gated call whose backward takes five
    products (and only when a backward may follow; for a sink only on short rows, `dispatch.needs_exact_o`). It is
    the residual of o's rounding (at most half an ulp of o, and not all zero) and brings o + o_lo closer to the fp32
    oracle than o."""
    case = Case(B=1, T=70, HQ=2, H=1, K=64, dtype=bf16, gate=True)
    x, args = _gated_call(case)
    sink = torch.zeros(case.HQ, device=DEVICE)
    with dq_path("from-ds"):
        o, _, _, o_lo, _, _ = host.forward(*args, for_backward=True)
        assert host.forward(*args, for_backward=False)[3] is None
        assert host.forward(*args[:3], None, *args[4:], for_backward=True)[3] is None  # ungated
        assert host.forward(*args[:3], None, sink, *args[5:], for_backward=True)[3] is None  # a sink: 70 keys a row
        short = (*args[:3], None, sink, None, args[6], config.SINK_EXACT_O_BELOW_KEYS - 1)  # rows of 15 keys
        assert host.forward(*short, for_backward=True)[3] is not None
        assert host.forward(*short[:-1], config.SINK_EXACT_O_BELOW_KEYS, for_backward=True)[3] is None
    with dq_path("recompute"):
        assert host.forward(*args, for_backward=True)[3] is None
    assert o_lo is not None and o_lo.dtype == torch.int8 and o_lo.shape == o.shape
    assert o_lo.abs().max() <= 64  # half a 16-bit ulp in 1/128ths
    exact = _o_lo_decoded(o, o_lo)
    # At most half an ulp of o, plus the code's own rounding (1/256 of an ulp).
    assert ((exact - o.float()).abs() <= o.float().abs() * torch.finfo(o.dtype).eps / 2 * (1 + 2**-6)).all()
    assert (o_lo != 0).float().mean() > 0.5
    ref = run_reference(case, x)["o"].float()
    err, err_lo = error_ratio(ref, o.float()), error_ratio(ref, exact)
    assert err_lo < err / 2, (err_lo, err)


_O_LO_SHIFT = {torch.bfloat16: 9, torch.float16: 6}  # o_lo's unit: 2**SHIFT fp32 ulps, 1/128 of a 16-bit ulp


def _o_lo_decoded(o, o_lo):
    """o in fp32 from o and o_lo, in torch: the format `inner.o_lo_encode` documents, read independently of it."""
    return (o.float().view(torch.int32) + (o_lo.to(torch.int32) << _O_LO_SHIFT[o.dtype])).view(torch.float32)


@triton.jit
def _o_lo_round_trip_kernel(x, r, lo, y, N, BN: tl.constexpr):
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    m_n = o_n < N
    b_x = tl.load(x + o_n, mask=m_n, other=0)
    b_r = b_x.to(r.dtype.element_ty)
    tl.store(r + o_n, b_r, mask=m_n)
    tl.store(lo + o_n, o_lo_encode(b_x, b_r), mask=m_n)
    tl.store(y + o_n, o_lo_decode(tl.load(r + o_n, mask=m_n, other=0), tl.load(lo + o_n, mask=m_n, other=0)),
             mask=m_n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_o_lo_round_trip(dtype):
    """`inner.o_lo_encode` / `o_lo_decode` (the gated forward's int8 record of o's rounding, and delta's read of it)
    against the format in torch, on random values and edges: signed zeros, values that round across a power of two,
    rounding ties, the smallest normals and the largest values of o's dtype. The codes are those of the format
    exactly, and the decoded value is within 2**(SHIFT - 1) fp32 ulps of the fp32 input in the 16-bit dtype's normal
    range (below it, fp16's subnormals, within 2**-25)."""
    info = torch.finfo(dtype)
    shift = _O_LO_SHIFT[dtype]
    edges = [0.0, -0.0, 1.0, -1.0, info.tiny, -info.tiny, info.max * 0.99, -info.max * 0.99]
    for p in (-3, 0, 5):
        below = torch.tensor(2.0**p).nextafter(torch.tensor(0.0)).item()  # just under 2**p: rounds up across it
        ulp = 2.0**p * info.eps  # a 16-bit ulp above 2**p
        edges += [below, -below, 2.0**p + ulp / 2, 2.0**p + 1.5 * ulp, 2.0**p + ulp / 2 + 2.0**p * 2**-23]
    x = torch.cat([torch.tensor(edges), torch.randn(3000) * 4.0**torch.randint(-6, 6, (3000,))]).to(DEVICE)
    n = x.numel()
    r = torch.full((n,), float("nan"), dtype=dtype, device=DEVICE)
    lo = torch.full((n,), -128, dtype=torch.int8, device=DEVICE)
    y = torch.full((n,), float("nan"), device=DEVICE)
    with interpreter_bf16_fix():  # the interpreter's fp32 -> bf16 cast rounds as the GPU's only with it
        _o_lo_round_trip_kernel[(triton.cdiv(n, 512),)](x, r, lo, y, n, BN=512)
    x, r, lo, y = x.cpu(), r.cpu(), lo.cpu(), y.cpu()
    assert torch.equal(r, x.to(dtype))
    d = x.view(torch.int32) - r.float().view(torch.int32)
    expected = ((d + (1 << (shift - 1))) >> shift).clamp(-128, 127).to(torch.int8)
    assert torch.equal(lo, expected), (x[lo != expected], lo[lo != expected], expected[lo != expected])
    assert torch.equal(y, _o_lo_decoded(r, lo))
    normal = (x.abs() >= info.tiny) | (x == 0)  # fp16's subnormals (random values here) round by more
    assert normal.float().mean() > 0.9 and lo[normal].abs().max() <= 64
    assert ((y.view(torch.int32) - x.view(torch.int32))[normal].abs() <= 1 << (shift - 1)).all()
    assert ((y - x)[~normal].abs() <= 2.0**-25).all()  # clamped: between o rounded and o


def test_gated_backward_without_o_lo():
    """A gated backward whose forward made no o_lo (the torch.compile path's, `autograd.parallel_attn_fwd_op`):
    "auto" takes seven products, a forced five-product backward raises rather than compute a coarser dg. A sink
    needs no o_lo: its call takes five products all the same."""
    case = Case(B=1, T=70, HQ=2, H=1, K=64, dtype=bf16, gate=True)
    x, (q, k, v, g, *rest) = _gated_call(case)
    o, lse, gc, o_lo, _, _ = host.forward(q, k, v, g, *rest)
    assert o_lo is None
    do = x.do.contiguous()
    with dq_path("from-ds"):
        with pytest.raises(ValueError, match="rounding residual from the forward"):
            host.backward(do, q, k, v, o, lse, gc, g, None, None, rest[-2], rest[-1])
    call = host.call_of(q, k, v, g, None, None, rest[-2], rest[-1])
    assert dispatch.five_product(call.shape, True, True, exact_o=False) is None
    sink = torch.zeros(case.HQ, device=DEVICE)
    call = host.call_of(q, k, v, None, sink, None, rest[-2], rest[-1])
    with dq_path("from-ds"):
        assert dispatch.five_product(call.shape, True, True, exact_o=False) is not None


def _contained_on_five_products(containment: str, monkeypatch, *args, **kwargs) -> None:
    """`_poisoned_run(*args, **kwargs)` under forced five products and `containment`: every backward took five
    products, and the non-finite input reached exactly the outputs that depend on it (`_check_poisoned`)."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"):
        out, clean, dep = _poisoned_run(*args, **kwargs)
    assert all(c is not None for c in spy.chunks) and spy.chunks, spy.chunks
    _check_poisoned(out, clean, dep)


_WINDOWS = pytest.mark.parametrize("W", [None, 8], ids=["causal", "W8"])
_NONFINITE = pytest.mark.parametrize("which,value", [("q", math.nan), ("k", math.inf), ("v", math.nan)],
                                     ids=["q_nan", "k_inf", "v_nan"])
_CONTAINMENT = pytest.mark.parametrize("containment", ["inline", "two-launch"])


@_WINDOWS
@_NONFINITE
@_CONTAINMENT
@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
def test_nan_inf_propagation(which, value, W, containment, gate, monkeypatch):
    """As tests/ops/test_attn_nan.py: a non-finite input reaches exactly the outputs that depend on it; the stored
    dS tiles are the contained ones, and the dQ-from-dS kernel keeps a bad K row out of the rows that do not see
    it."""
    _contained_on_five_products(containment, monkeypatch, which, value, W, gate=gate)


@_WINDOWS
@_NONFINITE
@_CONTAINMENT
def test_nan_inf_propagation_wide(which, value, W, containment, monkeypatch):
    """The same above head dim 128 (dK from dS): the dV + dS kernel's containment flag sees a non-finite stored dS
    (a bad v row reaches dS, not dV), and the dK-from-dS kernel keeps a bad q row out of the keys that do not see
    it."""
    monkeypatch.setattr(test_attn_nan, "NAN_D", 160)
    _contained_on_five_products(containment, monkeypatch, which, value, W, gate=False)


@pytest.mark.parametrize("which", ["q", "k", "v"])
@_CONTAINMENT
def test_nan_with_sink(which, containment, monkeypatch):
    """As tests/ops/test_attn_nan.py's sink test, on five products: a NaN q, k or v vector reaches the same outputs
    as without a sink, and dsink (`from_ds.sink_grad_kernel`) of exactly the query heads with a dependent row."""
    _contained_on_five_products(containment, monkeypatch, which, math.nan, 8, gate=False, sink=0.0)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU (Triton's CPU interpreter has no graphs)")
@pytest.mark.parametrize("case,chunks", [(Case(B=2, T=256, HQ=8, H=2, K=64, window=64), 1),
                                         (Case(B=2, T=1024, HQ=8, H=2, K=128), 2)], ids=["inline", "two-launch"])
def test_whole_step_capture(case, chunks, monkeypatch):
    """tests/ops/test_attn_cuda_graph.py's protocol on this path: forward + backward captured in one graph replays
    bitwise like eager calls (the dK/dV kernel's descriptor scratch is allocated at launch, inside the capture),
    with two chunks of heads in the larger case."""
    monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.B * case.H * (case.HQ // case.H // chunks) * _band_bytes(case)
                                                    / 2**20))
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"):
        _capture_replays_like_eager(case)
    assert set(spy.chunks) == {case.HQ // case.H // chunks}, spy.chunks


def _shape(**kw):
    from fla_bwd.ops.attn.call import Shape

    base = dict(device=torch.device(DEVICE), B=2, T=2048, HQ=32, H=32, K=128, V=128, dtype=bf16, g_dtype=None,
                sink_dtype=None, scale=0.1, W=2048, containment="auto")
    base.update(kw)
    return Shape(**base)


@pytest.mark.parametrize("kw,expected", [  # expected: (split, chunk) or None (seven products)
    (dict(), (1, 1)),  # long dense MHA at D = 128: measured faster
    (dict(dtype=f16), (1, 1)),
    (dict(T=4096, W=4096, B=1), (1, 1)),
    (dict(T=1024, W=1024), None),  # shorter: host-bound, slower
    (dict(H=16), (1, 2)),  # GQA whose launches fill the GPU: faster
    (dict(H=8), (1, 4)),
    (dict(B=1, T=8192, W=8192, H=4), (1, 2)),  # G8 T8192: two heads of each group fit the default budget
    (dict(H=4), (4, 2)),  # G8 B2 T2048: imbalanced unsplit; four programs a key tile balance it
    (dict(B=1, T=4096, W=4096, H=4), (4, 2)),
    (dict(H=2), (4, 4)),  # G16
    (dict(K=64, V=64), None),  # D = 64: slower
    (dict(W=512), None),  # windows: not measured faster
    (dict(g_dtype=f32), None),  # gated: only on the Hopper kernel (Triton's lost) and `FIVE_PRODUCT_GATED`
    (dict(sink_dtype=f32), (1, 1)),  # a sink: as its no-sink twin (its forward stores o_lo)
    (dict(dtype=f32), None),
    (dict(T=8192, W=8192, B=1), None),  # dS tiles over the default budget: seven products, no error
    # Head dims above 128: dV and dS in one kernel, dK from dS (`FiveProduct.dk_from_ds`), on any GPU
    (dict(K=256, V=256, H=8), (1, 4, False, True)),
    (dict(K=256, V=256), (1, 1, False, True)),
    (dict(K=192, V=256, H=8, sink_dtype=f32), (1, 4, False, True)),
    (dict(K=256, V=256, B=1, T=8192, W=8192, H=4), (1, 2, False, True)),
    (dict(K=256, V=256, H=8, W=512), None),
    (dict(K=256, V=256, H=8, g_dtype=f32), None),
    (dict(K=256, V=256, H=8, T=1024, W=1024), None),
], ids=["mha", "fp16", "T4096", "T1024", "g2", "g4", "g8-T8192", "g8-imbalanced", "g8-T4096", "g16", "D64", "window",
        "gate", "sink", "fp32", "over-budget", "D256-g4", "D256-mha", "K192-V256-sink", "D256-g8-T8192",
        "D256-window", "D256-gate", "D256-T1024"])
def test_auto_dispatch(kw, expected, monkeypatch):
    """The Triton kernel's rule (the Hopper kernel's: tests/ops/test_attn_gluon_dkv.py), for an eager call whose
    forward stored o_lo where it needs it; without o_lo a gate or a sink takes seven products."""
    monkeypatch.delenv("FLA_BWD_DQ_PATH", raising=False)
    monkeypatch.delenv("FLA_BWD_DS_BUDGET_MIB", raising=False)
    monkeypatch.setenv("FLA_BWD_DS_KERNEL", "triton")
    monkeypatch.setattr(config, "hbm_tbps", lambda device: config.REFERENCE_TBPS)  # the H200's (on the CPU too)
    monkeypatch.setattr(config, "FIVE_PRODUCT_WIDE", True)
    five = dispatch.five_product(_shape(**kw), True, True, exact_o=True)
    assert five == (None if expected is None else dispatch.FiveProduct(*expected)), five
    if max(_shape(**kw).K, _shape(**kw).V) > 128:  # not a bandwidth trade there: also on the H100's 3.35 TB/s
        monkeypatch.setattr(config, "hbm_tbps", lambda device: 3.35)
        assert dispatch.five_product(_shape(**kw), True, True, exact_o=True) == five
        monkeypatch.setattr(config, "FIVE_PRODUCT_WIDE", False)  # "auto" leaves them to seven products
        assert dispatch.five_product(_shape(**kw), True, True, exact_o=True) is None
    if dispatch.needs_exact_o(_shape(**kw)):
        assert dispatch.five_product(_shape(**kw), True, True, exact_o=False) is None
    assert dispatch.five_product(_shape(**kw), False, True) is None  # packed: seven products
    # another dK/dV kernel asked for: seven products
    with dkv_path("per-query-head"):
        assert dispatch.five_product(_shape(**kw), True, True) is None
    with dq_path("recompute"):
        assert dispatch.five_product(_shape(**kw), True, True) is None


@pytest.mark.parametrize("hopper", [False, True])
def test_auto_dispatch_by_bandwidth(hopper, monkeypatch):
    """On the Triton kernel "auto" takes five products only on GPUs of at least `config.TRITON_FIVE_MIN_TBPS` (it lost
    ctl-K128-V64-g8-T2048 on the H100); the Hopper kernel's calls (faked on) take them whatever the
    bandwidth. The device reports its own (`config.hbm_tbps`); the CPU the H200's."""
    monkeypatch.delenv("FLA_BWD_DQ_PATH", raising=False)
    monkeypatch.delenv("FLA_BWD_DS_BUDGET_MIB", raising=False)
    monkeypatch.delenv("FLA_BWD_CONTAINMENT", raising=False)
    monkeypatch.delenv("FLA_BWD_DS_KERNEL", raising=False)
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    monkeypatch.setattr(dispatch, "hopper_why_not",
                        lambda s, device, aligned, dense=True: None if hopper else "not faked on")
    call = _shape(H=4, V=64) if not hopper else _shape(H=4)
    expected = dispatch.FiveProduct(2, 4, True) if hopper else dispatch.FiveProduct(4, 2)
    assert config.hbm_tbps(torch.device("cpu")) == config.REFERENCE_TBPS
    if DEVICE == "cuda":  # memory clock x bus width: H100 SXM 3.35, H200 4.8
        assert 1.0 < config.hbm_tbps(torch.device("cuda")) < 20.0
    for tbps, five in ((4.8, True), (4.0, True), (3.35, hopper)):
        monkeypatch.setattr(config, "hbm_tbps", lambda device, tbps=tbps: tbps)
        assert dispatch.five_product(call, True, True) == (expected if five else None), tbps
    with dq_path("from-ds"):  # asked for: runs at any bandwidth
        assert dispatch.five_product(call, True, True) is not None


def test_auto_runs_five_products_where_it_dispatches(monkeypatch):
    """End to end through "auto" (the length threshold lowered to the interpreter's sizes, and on the CPU one SM,
    which these short calls keep busy): the five-product backward runs and matches the oracle for MHA and GQA, while
    a call outside the rule (D = 64 on the CPU, load-imbalanced GQA on the GPU) keeps seven products. On the GPU
    the Hopper kernel's calls run the Triton kernel here (the Hopper one: tests/ops/test_attn_gluon_dkv.py)."""
    monkeypatch.setattr(config, "FIVE_PRODUCT_MIN_T", 64)
    monkeypatch.setenv("FLA_BWD_DS_KERNEL", "triton")
    monkeypatch.setattr(config, "hbm_tbps", lambda device: config.REFERENCE_TBPS)
    if DEVICE != "cuda":
        monkeypatch.setattr(config, "sm_count", lambda device: 1)
    spy = ChunkSpy(monkeypatch)
    mha, gqa = (Case(B=2, T=70, HQ=2, H=2, K=128, dtype=bf16), Case(B=1, T=90, HQ=4, H=2, K=128, dtype=bf16)) \
        if DEVICE != "cuda" else (Case(B=1, T=2048, HQ=16, H=16, K=128, dtype=bf16),
                                  Case(B=2, T=2048, HQ=16, H=8, K=128, dtype=bf16))
    check_against_oracle(mha)
    check_against_oracle(gqa)
    outside = CASES[0] if DEVICE != "cuda" else CASES[2]  # D = 64
    run_parallel(outside, make_inputs(outside))
    assert spy.chunks == [1, 2, None], spy.chunks


def test_auto_splits_imbalanced_calls(monkeypatch):
    """A GQA call that one program per KV head leaves imbalanced runs five products with each group's heads split
    over four programs a key tile (`config.FIVE_PRODUCT_SPLITS`), end to end and against the oracle (on the CPU at
    two SMs, where the short case is imbalanced unsplit). The Triton kernel's rule (the Hopper kernel's own split:
    tests/ops/test_attn_gluon_dkv.py)."""
    monkeypatch.setattr(config, "FIVE_PRODUCT_MIN_T", 64)
    monkeypatch.setenv("FLA_BWD_DS_KERNEL", "triton")
    monkeypatch.setattr(config, "hbm_tbps", lambda device: config.REFERENCE_TBPS)
    if DEVICE != "cuda":
        monkeypatch.setattr(config, "sm_count", lambda device: 2)
    spy = ChunkSpy(monkeypatch)
    case = Case(B=1, T=90, HQ=8, H=2, K=128, dtype=bf16) if DEVICE != "cuda" else \
        Case(B=2, T=2048, HQ=32, H=4, K=128, dtype=bf16)
    check_against_oracle(case)
    assert spy.splits == [4] and spy.chunks == [case.HQ // case.H // 4], (spy.splits, spy.chunks)


def _needs_o_lo(s) -> bool:
    """`dispatch.needs_o_lo` of a dense, aligned call of Shape s under the settings now."""
    return dispatch.needs_o_lo(host.Call(None, s, None, True), dispatch.knobs())


def test_auto_dispatch_of_gated_calls(monkeypatch):
    """Gated calls take five products under "auto" only where `config.FIVE_PRODUCT_GATED` allows, the Hopper kernel
    runs them (faked on here) and the forward made o_lo; then by the Hopper kernel's rule. On the Triton kernel they
    keep seven products, and under forced from-ds they run on either. The forward makes o_lo exactly where the
    backward would take five products."""
    monkeypatch.delenv("FLA_BWD_DQ_PATH", raising=False)
    monkeypatch.delenv("FLA_BWD_DS_BUDGET_MIB", raising=False)
    monkeypatch.delenv("FLA_BWD_CONTAINMENT", raising=False)
    monkeypatch.setattr(config, "sm_count", lambda device: 132)
    monkeypatch.setattr(dispatch, "hopper_why_not", lambda s, device, aligned, dense=True: None)
    gated = _shape(g_dtype=f32)
    for allowed in (False, True):
        monkeypatch.setattr(config, "FIVE_PRODUCT_GATED", allowed)
        expected = dispatch.FiveProduct(1, 1, True) if allowed else None
        assert dispatch.five_product(gated, True, True, exact_o=True) == expected
        assert dispatch.five_product(gated, True, True, exact_o=False) is None
        assert _needs_o_lo(gated) == allowed
        assert not _needs_o_lo(_shape())  # ungated: never
        with ds_kernel("triton"):
            assert dispatch.five_product(gated, True, True, exact_o=True) is None
            assert not _needs_o_lo(gated)
            with dq_path("from-ds"):
                assert dispatch.five_product(gated, True, True, exact_o=True) == dispatch.FiveProduct(1, 1, False)
                assert _needs_o_lo(gated)
        short = _shape(g_dtype=f32, T=1024, W=1024)
        assert dispatch.five_product(short, True, True, exact_o=True) is None


# (Head dims above 128 run since dK from dS, `CPU_CASES`: every head dim the API accepts, up to 256, runs.)
@pytest.mark.parametrize("what", ["packed", "fp32", "dkv_path", "budget", "budget_gated", "split"])
def test_calls_it_cannot_run_raise(what, monkeypatch):
    """Each reason is named, also for a gated call, whose forward cannot make o_lo for a backward it cannot run."""
    case = {
        "budget_gated": Case(T=40, HQ=2, H=1, K=32, gate=True),
        "packed": Case(T=40, HQ=2, H=1, K=32, cu_seqlens=(0, 10, 40)),  # the Hopper kernel forced (below) at K = 32
        "fp32": Case(T=40, HQ=2, H=1, K=32, dtype=f32),
    }.get(what, Case(T=40, HQ=2, H=1, K=32))
    x = make_inputs(case)
    if what.startswith("budget"):
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", "0")
    message = {"dkv_path": "dK/dV path", "budget": "FLA_BWD_DS_BUDGET_MIB", "budget_gated": "FLA_BWD_DS_BUDGET_MIB",
               "split": "multiple of 4", "packed": "ds kernel 'hopper'"}.get(what, "needs 16-bit")
    forced = {"dkv_path": "per-query-head", "split": "gqa-split4"}.get(what, "auto")  # split: G = 2
    with dq_path("from-ds"), dkv_path(forced), ds_kernel("hopper" if what == "packed" else "auto"):
        with pytest.raises(ValueError, match=message):
            run_parallel(case, x)


@pytest.mark.parametrize("K,V", [(64, 64), (160, 160), (64, 256)])
def test_empty_call_gives_empty_gradients(K, V):
    """T = 0 under forced five products (above head dim 128 too, where dK from dS writes dk): every gradient exists,
    empty and of its input's shape."""
    q = torch.randn(1, 0, 4, K, device=DEVICE, dtype=bf16, requires_grad=True)
    k = torch.randn(1, 0, 2, K, device=DEVICE, dtype=bf16, requires_grad=True)
    v = torch.randn(1, 0, 2, V, device=DEVICE, dtype=bf16, requires_grad=True)
    with dq_path("from-ds"):
        dq, dk, dv = torch.autograd.grad(parallel_attn(q, k, v).sum(), (q, k, v))
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)


def test_bad_settings_raise(monkeypatch):
    with pytest.raises(ValueError, match="dq_path must be one of"):
        with dq_path("fast"):
            pass
    case = CASES[0]
    x = make_inputs(case)
    monkeypatch.setenv("FLA_BWD_DQ_PATH", "fast")
    with pytest.raises(ValueError, match="FLA_BWD_DQ_PATH must be one of"):
        run_parallel(case, x)
    monkeypatch.setenv("FLA_BWD_DQ_PATH", "from-ds")
    for bad in ("lots", "-1", "nan", "inf"):
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", bad)
        with pytest.raises(ValueError, match="FLA_BWD_DS_BUDGET_MIB must be a number"):
            run_parallel(case, x)


def _brute_layout(T: int, W: int, BQ: int, BT: int):
    """(tiles of a band, {query block: index of its tile kj minus kj}) by enumeration."""
    index, first = 0, {}
    for qi in range(-(-T // BQ)):
        lo, hi = max(qi * BQ - W + 1, 0) // BT, (qi * BQ + BQ - 1) // BT
        first[qi] = index - lo
        index += hi - lo + 1
    return index, first


def test_layout_formula_matches_enumeration():
    for BQ, BT in ((16, 32), (64, 64), (32, 64), (16, 64)):
        for T in (1, 5, 16, 31, 32, 33, 100, 257, 1000):
            for W in (1, 2, 15, 16, 17, 31, 33, 64, 129, T):
                W = min(W, T)
                tiles, first = _brute_layout(T, W, BQ, BT)
                assert from_ds.ds_layout(T, W, BQ, BT) == tiles, (T, W, BQ, BT)
                assert all(from_ds.ds_first_tile(qi, W, BQ, BT) == f for qi, f in first.items()), (T, W, BQ, BT)


def _partials(T: int, W: int, BQ: int, BT: int, bands: int):
    """Random partial key sums `[programs, bands, T]` where each dQ-from-dS program stores them (program p: query
    blocks 2p, 2p + 1; keys from the window's first tile to the last its queries see), NaN where none does, and
    their float64 sums `[bands, T]`."""
    NP = math.ceil(T / (2 * BQ))
    part = torch.full((NP, bands, T), math.nan, dtype=torch.float32)
    ref = torch.zeros(bands, T, dtype=torch.float64)
    for p in range(NP):
        lo = max(2 * p * BQ - W + 1, 0) // BT
        hi = (min(2 * p * BQ + 2 * BQ, T) - 1) // BT
        keys = slice(lo * BT, min((hi + 1) * BT, T))
        part[p, :, keys] = torch.randn(bands, keys.stop - keys.start)
        ref[:, keys] += part[p, :, keys].double()
    return part.to(DEVICE), ref


@pytest.mark.parametrize("T,W,BQ", [(2100, 2100, 32), (2100, 300, 32), (130, 130, 64), (700, 64, 64)])
def test_key_side_sums_exactly_the_programs_that_stored_each_key(T, W, BQ):
    """`key_side_kernel` against a float64 sum over the dQ-from-dS programs whose key range holds each key, with
    every entry no program stored poisoned (NaN): each key reads exactly its programs, several blocks of them at the
    longest T."""
    BT, B, H, G, CHUNK = 64, 2, 1, 2, 2
    bands = B * H * CHUNK
    part, ref = _partials(T, W, BQ, BT, bands)
    dgc_k = torch.full((H * G, B * T), math.nan, dtype=torch.float32, device=DEVICE)
    keys = 256
    with interpreter_index_fix():  # a direct launch: the launcher's fixes are not around it
        from_ds.key_side_kernel[(math.ceil(T / keys), bands)](
            part, dgc_k, cu_seqlens=None, chunk_indices=None, ks_offsets=None, T=T, W=W, G0=0, NTOK=None, H=H, G=G,
            SPLIT=1, CHUNK=CHUNK, BT=BT, BQ=BQ, BR=keys, BP=16, NUM_BANDS=bands)
    # band (b, c) -> head c of batch element b (`_band_heads` with H = SPLIT = 1, G0 = 0)
    got = dgc_k.view(G, B, T).permute(1, 0, 2).reshape(bands, T).double().cpu()
    torch.testing.assert_close(got, -ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("T,W,BQ,BR,BP,G0", [(2100, 2100, 32, 256, 16, 0), (2100, 300, 32, 1024, 8, 2),
                                             (130, 130, 64, 64, 4, 0), (700, 64, 64, 128, 16, 2)])
def test_gate_grad_of_band_is_the_reverse_scan_of_both_sides(T, W, BQ, BR, BP, G0):
    """`gate_grad_of_band_kernel` (a chunk of 2 of the group's 4 query heads, from head G0) against the float64
    reverse cumsum over each sequence of dgc_q minus the sum of the programs' partial key sums, with every partial
    no program stored poisoned, and dg's entries of the heads outside the chunk (NaN) left as they were."""
    BT, B, H, G, CHUNK = 64, 2, 1, 4, 2
    bands = B * H * CHUNK
    part, ref = _partials(T, W, BQ, BT, bands)
    dgc_q = torch.randn(H * G, B * T, dtype=torch.float32, device=DEVICE)
    dg = torch.full((B, T, H * G), math.nan, dtype=torch.float32, device=DEVICE)
    with interpreter_index_fix():  # a direct launch: the launcher's fixes are not around it
        from_ds.gate_grad_of_band_kernel[(bands,)](
            part, dgc_q, dg, T, W, G0, HQ=H * G, H=H, G=G, SPLIT=1, CHUNK=CHUNK, BT=BT, BQ=BQ, BR=BR, BP=BP,
            NUM_BANDS=bands)
    heads = list(range(G0, G0 + CHUNK))
    # band (b, c) -> head G0 + c of batch element b
    dgc = dgc_q.view(G, B, T)[heads].permute(1, 0, 2).reshape(bands, T).double().cpu() - ref
    want = dgc.flip(-1).cumsum(-1).flip(-1)
    got = dg[:, :, heads].permute(0, 2, 1).reshape(bands, T).double().cpu()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
    assert dg[:, :, [h for h in range(G) if h not in heads]].isnan().all()


@pytest.mark.parametrize("by_band_max_t", [0, 2**31])
def test_gated_both_gate_gradient_launches_match_oracle(by_band_max_t, monkeypatch):
    """The gate's gradient through `key_side_kernel` and the scan (calls longer than
    `config.GATE_GRAD_BY_BAND_MAX_T`) and through `gate_grad_of_band_kernel` (shorter ones), in chunks."""
    monkeypatch.setattr(config, "GATE_GRAD_BY_BAND_MAX_T", by_band_max_t)
    monkeypatch.setattr(host, "_PLANS", {})
    by_band = []
    add = host.add_gate_grad_by_band
    monkeypatch.setattr(host, "add_gate_grad_by_band", lambda *args: by_band.append(add(*args)))
    case = _GATED_CHUNKED
    spy = ChunkSpy(monkeypatch)
    with dq_path("from-ds"):
        monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", str(case.B * case.H * 1 * _band_bytes(case) / 2**20))
        check_against_oracle(case)
    chunks = case.HQ // case.H // spy.splits[0]  # one head of each share a chunk
    assert spy.chunks == [1] and len(by_band) == (chunks if by_band_max_t else 0), (spy.chunks, len(by_band))


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("W", [300, 100])
def test_band_bytes_is_what_a_band_allocates(gated, W):
    """`band_bytes`, which the dS budget divides by (`ds_chunk`), against the scratch that
    `host.add_five_product` allocates for its bands: the dS tiles and, gated, the dQ kernel's key-side partials."""
    from fla_bwd.ops.utils.launch import Empty

    s = _shape(B=2, T=300, HQ=4, H=2, K=64, V=64, W=W, g_dtype=bf16 if gated else None)
    five = dispatch.FiveProduct(split=1, chunk=2)
    plan = host.new_plan(s, inline=True)
    host.add_five_product(plan, s, dispatch.five_route(s, five, dispatch.knobs()))
    size = {st.name: math.prod(st.shape) * st.dtype.itemsize for st in plan.steps if isinstance(st, Empty)}
    assert ("dgk_part" in size) == gated
    bands = s.B * s.H * five.split * five.chunk
    assert size["ds"] + size.get("dgk_part", 0) == bands * from_ds.band_bytes(s.T, s.W, 64, gated)
