# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn(..., return_lse=True)` (issue 63): lse `[B, T, HQ]` fp32, the natural log of each row's softmax
denominator (its visible keys and the sink), differentiable.

The protocol of `helpers` with lse as a second output: a loss sum(o * dO) + sum(lse * dlse) with fresh normal dO and
dlse, against the fp32 oracle (`naive_parallel_attn(..., return_lse=True)`, one call per packed sequence) at error
ratio < 0.005 on o, lse and every gradient, with poisoned buffers; on both backward routes (seven products, in each
delta mode: rounded, refined with a gate, exact with a sink; five products, also above head dim 128), packed batches,
window 0 with a sink, a loss of lse alone, NaN in dlse, torch.compile, CUDA-graph capture; and what must not
change: with return_lse, o and a backward from o alone are bitwise those of the call without it.
"""

import math

import pytest
import test_attn_nan
import torch
from conftest import DEVICE
from helpers import Case, compare, make_inputs, params, segments
from test_attn_nan import _check_poisoned, _dependence

import fla_bwd.ops.attn.host as host
from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn
from fla_bwd.ops.forgetting_attn import parallel_forgetting_attn
from fla_bwd.settings import dq_path

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

# Seven products: rounded delta (neither), refined (gate), exact (sink); dense, packed, windowed, GQA and MHA.
SEVEN_CASES = [
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16),
    Case(B=1, T=77, HQ=4, H=1, K=64, V=32, dtype=f16, window=20),
    Case(B=1, T=40, HQ=2, H=2, K=32, dtype=f32),
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, gate=True),
    Case(B=1, T=90, HQ=2, H=1, K=32, dtype=bf16, gate=True, window=30, g_dtype=bf16),
    Case(B=2, T=50, HQ=4, H=2, K=32, dtype=bf16, sink=float("nan")),
    Case(B=1, T=70, HQ=2, H=1, K=32, dtype=f16, sink=2.0, gate=True, window=9),
    Case(B=1, T=90, HQ=4, H=2, K=32, dtype=bf16, cu_seqlens=(0, 30, 30, 90)),  # an empty sequence
    Case(B=1, T=100, HQ=2, H=1, K=32, dtype=bf16, gate=True, sink=0.0, cu_seqlens=(0, 37, 100)),
    Case(B=1, T=80, HQ=2, H=1, K=32, dtype=bf16, cu_seqlens=(0, 40, 80)),  # one length: runs as the dense [2, 40]
    Case(B=1, T=1, HQ=2, H=1, K=16, dtype=bf16),
]
# Five products (dense, 16-bit): the delta kernel subtracts dlse; with a sink also `sink_grad_kernel`.
FIVE_CASES = [
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16),
    Case(B=1, T=90, HQ=4, H=2, K=64, dtype=f16, window=20),
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, gate=True),
    Case(B=1, T=70, HQ=4, H=1, K=64, V=32, dtype=bf16, sink=1.0),
    Case(B=1, T=40, HQ=2, H=1, K=32, dtype=bf16, sink=-2.0, window=1, scale=0.5),  # one key a row: delta from o_lo
    Case(B=1, T=63, HQ=4, H=2, K=160, dtype=bf16),  # dK from the stored tiles
    Case(B=1, T=45, HQ=4, H=1, K=136, dtype=bf16, sink=1.0, gate=True),
]


def _lse_grad(case: Case) -> torch.Tensor:
    return torch.randn(case.B, case.T, case.HQ, device=DEVICE)


def run_ours(case: Case, x, dlse, use_o: bool = True, fn=parallel_attn) -> dict:
    """o, lse and the gradients of sum(o * dO) + sum(lse * dlse) (of lse alone without `use_o`) from the op."""
    kwargs = dict(g=x.g, scale=case.scale, window_size=case.window, cu_seqlens=x.cu_seqlens, sink_bias=x.sink_bias)
    if fn is parallel_forgetting_attn:
        kwargs.pop("sink_bias")
    o, lse = fn(x.q, x.k, x.v, **kwargs, return_lse=True)
    assert lse.dtype == f32 and lse.shape == (case.B, case.T, case.HQ) and lse.is_contiguous()
    wrt = x.grad_inputs()
    outs, grads = ([o, lse], [x.do, dlse]) if use_o else ([lse], [dlse])
    return {"o": o, "lse": lse, **dict(zip(wrt, torch.autograd.grad(outs, list(wrt.values()), grads)))}


def run_oracle(case: Case, x, dlse, use_o: bool = True) -> dict:
    wrt = x.grad_inputs()
    sink = x.sink_bias
    if "dsink" in wrt:  # an fp32 leaf: autograd would sum the sequences' dsink in sink_bias's dtype
        sink = wrt["dsink"] = sink.detach().float().requires_grad_()
    os, lses = [], []
    for bos, eos in segments(case):
        g = x.g[:, bos:eos] if x.g is not None else None
        o, lse = naive_parallel_attn(x.q[:, bos:eos], x.k[:, bos:eos], x.v[:, bos:eos], scale=case.scale,
                                     window_size=case.window, g=g, sink_bias=sink, return_lse=True)
        os.append(o)
        lses.append(lse)
    o, lse = torch.cat(os, 1), torch.cat(lses, 1)
    if case.cu_seqlens is not None:  # rows of empty sequences: none (the op leaves no row out either)
        assert lse.shape[1] == case.T
    outs, grads = ([o, lse], [x.do.float(), dlse]) if use_o else ([lse], [dlse])
    got = torch.autograd.grad(outs, list(wrt.values()), grads, allow_unused=True)
    got = [torch.zeros_like(t, dtype=f32) if gr is None else gr for t, gr in zip(wrt.values(), got)]
    return {"o": o, "lse": lse, **dict(zip(wrt, got))}


def check_lse_case(case: Case, use_o: bool = True) -> dict:
    x = make_inputs(case)
    dlse = _lse_grad(case)
    out = run_ours(case, x, dlse, use_o)
    compare(run_oracle(case, x, dlse, use_o), out)
    return out


@pytest.mark.parametrize("case", params(SEVEN_CASES))
def test_lse_seven_products(case):
    with dq_path("recompute"):
        check_lse_case(case)


@pytest.mark.parametrize("case", params(FIVE_CASES))
def test_lse_five_products(case):
    with dq_path("from-ds"):
        check_lse_case(case)


@pytest.mark.parametrize("path", ["recompute", "from-ds"])
@pytest.mark.parametrize("case", params([Case(B=1, T=50, HQ=4, H=2, K=32, dtype=bf16, sink=0.5, gate=True)]))
def test_loss_of_lse_alone(case, path):
    """No gradient reaches o: dO is zero, dv is zero, and the others come from dlse alone."""
    with dq_path(path):
        out = check_lse_case(case, use_o=False)
    assert not out["dv"].any()


def test_window_zero_with_sink():
    """window_size=0 (no key visible, FLA's meaning, with a sink): lse is the sink's logit in every row, and
    dsink the sum of dlse over the rows of its head."""
    case = Case(B=2, T=5, HQ=3, H=1, K=16, dtype=bf16, sink=float("nan"), window=0)
    x = make_inputs(case)
    dlse = _lse_grad(case)
    o, lse = parallel_attn(x.q, x.k, x.v, window_size=0, sink_bias=x.sink_bias, return_lse=True)
    assert not o.any() and torch.equal(lse, x.sink_bias.detach().float().expand(2, 5, 3))
    dq, dsink = torch.autograd.grad([o, lse], [x.q, x.sink_bias], [x.do, dlse])
    assert not dq.any()
    assert torch.allclose(dsink, dlse.sum((0, 1)))


@pytest.mark.parametrize("path", ["recompute", "from-ds"])
def test_lse_changes_nothing_else(path):
    """With return_lse and a loss of o alone: o and every gradient bitwise those of the call without return_lse
    (the backward takes no lse gradient: autograd hands it None)."""
    case = Case(B=1, T=70, HQ=4, H=2, K=32, dtype=bf16, gate=True, sink=0.0)
    x = make_inputs(case)
    kwargs = dict(g=x.g, sink_bias=x.sink_bias)
    wrt = list(x.grad_inputs().values())
    with dq_path(path):
        o = parallel_attn(x.q, x.k, x.v, **kwargs)
        o2, _ = parallel_attn(x.q, x.k, x.v, **kwargs, return_lse=True)
        assert torch.equal(o, o2)
        for a, b in zip(torch.autograd.grad(o, wrt, x.do), torch.autograd.grad(o2, wrt, x.do)):
            assert torch.equal(a, b)


def test_lse_backward_is_deterministic():
    case = Case(B=1, T=70, HQ=4, H=2, K=32, dtype=bf16, gate=True, sink=0.0, cu_seqlens=(0, 33, 70))
    x = make_inputs(case)
    dlse = _lse_grad(case)
    first, second = run_ours(case, x, dlse), run_ours(case, x, dlse)
    for name in first:
        assert torch.equal(first[name], second[name]), name


@pytest.mark.parametrize("path", ["recompute", "from-ds"])
@pytest.mark.parametrize("containment", ["inline", "two-launch"])
@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_nonfinite_lse_gradient_is_contained(value, containment, path, monkeypatch):
    """A NaN/Inf dlse of one row reaches exactly what depends on it: that row's dq, the dk of the keys it sees,
    the gate's gradient (a reverse cumsum) and its head's dsink, never dv or o; the rest is bitwise the clean
    run's."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    B, T, HQ, H, D = test_attn_nan.NAN_B, test_attn_nan.NAN_T, test_attn_nan.NAN_HQ, test_attn_nan.NAN_H, 32
    case = Case(B=B, T=T, HQ=HQ, H=H, K=D, dtype=bf16, gate=True, sink=0.0, window=8)
    x = make_inputs(case)
    dlse = _lse_grad(case)
    b, t, head = 1, 20, 1
    with dq_path(path):
        clean = run_ours(case, x, dlse)
        bad = dlse.clone()
        bad[b, t, head] = value
        out = run_ours(case, x, bad)
    dep = _dependence("q", b, t, head, 8)
    dep["dv"] = torch.zeros_like(dep["dv"])
    dep["o"] = dep["lse"] = torch.zeros_like(dep["o"])
    _check_poisoned(out, clean, dep)


def test_forgetting_attn_returns_lse():
    case = Case(B=1, T=50, HQ=2, H=1, K=32, dtype=bf16, gate=True)
    x = make_inputs(case)
    dlse = _lse_grad(case)
    compare(run_oracle(case, x, dlse), run_ours(case, x, dlse, fn=parallel_forgetting_attn))


def test_compiled_lse_matches_eager():
    """Under torch.compile(fullgraph=True) the custom ops carry the user's lse and its gradient."""
    torch._dynamo.reset()
    case = Case(B=1, T=40, HQ=4, H=2, K=32, dtype=bf16, gate=True, sink=0.0)
    x = make_inputs(case)
    dlse = _lse_grad(case)

    def f(q, k, v, g, sink_bias):
        return parallel_attn(q, k, v, g=g, sink_bias=sink_bias, return_lse=True)

    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    o, lse = torch.compile(f, fullgraph=True, backend=backend)(x.q, x.k, x.v, x.g, x.sink_bias)
    wrt = x.grad_inputs()
    got = dict(zip(wrt, torch.autograd.grad([o, lse], list(wrt.values()), [x.do, dlse])))
    compare(run_oracle(case, x, dlse), {"o": o, "lse": lse, **got})


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_return_lse_must_be_bool(bad):
    x = make_inputs(Case(T=8, K=16))
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        parallel_attn(x.q, x.k, x.v, return_lse=bad)


def test_plans_keep_lse_apart():
    """The forward with and without the user's lse, and the backward with and without its gradient, are
    different plans (each keyed on it)."""
    host.clear_plans()
    case = Case(B=1, T=40, HQ=2, H=1, K=32, dtype=bf16)
    x = make_inputs(case)
    o = parallel_attn(x.q, x.k, x.v)
    torch.autograd.grad(o, [x.q], x.do)
    plans = len(host._PLANS)
    o, lse = parallel_attn(x.q, x.k, x.v, return_lse=True)
    torch.autograd.grad([o, lse], [x.q], [x.do, _lse_grad(case)])
    assert len(host._PLANS) == plans + 2
