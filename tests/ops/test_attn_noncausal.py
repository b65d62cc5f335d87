# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn(..., causal=False)` and flash-attn's `window_size=(left, right)` (issue 63): query i sees keys
i - left .. i + right of its own sequence (-1: no bound on that side).

The protocol of `helpers` (o and every gradient against the fp32 oracle `naive_parallel_attn(..., causal=False)` at
error ratio < 0.005, poisoned buffers) on full bidirectional attention and on windows of every shape (left or right
unbounded, both bounded, wider than the sequence, the query alone), GQA and MHA, packed batches with an empty
sequence, a sink, K != V, the three dtypes, both seven-product dK/dV kernels, with softcap and the lse; NaN/Inf
containment against the non-causal dependence; determinism; a causal pair window is bitwise the int window; five
products and a gate refuse non-causal calls clearly.
"""

import math

import pytest
import torch
from helpers import Case, check_against_oracle, make_inputs, params, run_parallel
from test_attn_nan import _check_poisoned

from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn, select_backward
from fla_bwd.settings import dkv_path, dq_path

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

CASES = [
    (Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16), None),
    (Case(B=1, T=70, HQ=2, H=2, K=32, dtype=f16), (5, 9)),
    (Case(B=1, T=77, HQ=4, H=1, K=64, V=32, dtype=bf16), (-1, 3)),
    (Case(B=1, T=77, HQ=4, H=1, K=32, dtype=bf16), (20, -1)),
    (Case(B=1, T=40, HQ=2, H=1, K=32, dtype=f32), (0, 0)),  # the query alone
    (Case(B=1, T=50, HQ=2, H=1, K=32, dtype=bf16), (100, 200)),  # wider than the sequence
    (Case(B=1, T=90, HQ=4, H=2, K=32, dtype=bf16, sink=float("nan")), (7, 30)),
    (Case(B=1, T=100, HQ=4, H=2, K=32, dtype=bf16, cu_seqlens=(0, 30, 30, 100)), None),  # an empty sequence
    (Case(B=1, T=90, HQ=2, H=1, K=32, dtype=f16, sink=1.0, cu_seqlens=(0, 37, 90)), (10, 4)),
    (Case(B=1, T=80, HQ=2, H=1, K=32, dtype=bf16, cu_seqlens=(0, 40, 80)), (3, 12)),  # runs as the dense [2, 40]
    (Case(B=1, T=45, HQ=2, H=1, K=160, dtype=bf16), None),
    (Case(B=1, T=1, HQ=2, H=1, K=16, dtype=bf16), None),
]


def _ours(case: Case, window, **kw):
    return lambda x: parallel_attn(x.q, x.k, x.v, scale=case.scale, window_size=window, cu_seqlens=x.cu_seqlens,
                                   sink_bias=x.sink_bias, causal=False, **kw)


def _oracle(case: Case, window, **kw):
    return lambda q, k, v, g, sink_bias: naive_parallel_attn(q, k, v, scale=case.scale, window_size=window,
                                                             sink_bias=sink_bias, causal=False, **kw)


def _cases():
    return [pytest.param(c, w, id=f"{c.id}-{w}") for c, w in CASES]


@pytest.mark.parametrize("case, window", _cases())
def test_noncausal_matches_oracle(case, window):
    check_against_oracle(case, None, _ours(case, window), _oracle(case, window))


@pytest.mark.parametrize("path", ["legacy", "gqa", "gqa-split2"])
def test_noncausal_dkv_kernels(path):
    case = Case(B=1, T=70, HQ=4, H=2, K=32, dtype=bf16, sink=0.0)
    with dkv_path(path):
        check_against_oracle(case, None, _ours(case, (9, 17)), _oracle(case, (9, 17)))


def test_noncausal_with_softcap_and_lse():
    case = Case(B=1, T=60, HQ=4, H=2, K=32, dtype=bf16, sink=0.5)
    x = make_inputs(case)
    dlse = torch.randn(1, 60, 4, device=x.q.device)
    wrt = x.grad_inputs()
    o, lse = parallel_attn(x.q, x.k, x.v, sink_bias=x.sink_bias, causal=False, window_size=(12, 5), softcap=3.0,
                           return_lse=True)
    got = torch.autograd.grad([o, lse], list(wrt.values()), [x.do, dlse])
    sink = x.sink_bias.detach().float().requires_grad_()
    ro, rlse = naive_parallel_attn(x.q, x.k, x.v, sink_bias=sink, causal=False, window_size=(12, 5), softcap=3.0,
                                   return_lse=True)
    ref = torch.autograd.grad([ro, rlse], [x.q, x.k, x.v, sink], [x.do.float(), dlse])
    from helpers import compare
    compare({"o": ro, "lse": rlse, **dict(zip(wrt, ref))}, {"o": o, "lse": lse, **dict(zip(wrt, got))})


def test_noncausal_is_not_causal():
    """The oracle's non-causal output differs from its causal one by far more than the tolerance."""
    x = make_inputs(Case(B=1, T=40, HQ=2, H=1, K=32))
    a = naive_parallel_attn(x.q, x.k, x.v, causal=False)
    b = naive_parallel_attn(x.q, x.k, x.v)
    assert ((a - b).norm() / b.norm()).item() > 0.3


@pytest.mark.parametrize("left", [-1, 0, 6])
def test_causal_pair_window_is_the_int_window(left):
    """causal=True with (left, 0) or (left, -1) is flash-attn's spelling of window_size=left + 1 (None for -1):
    bitwise the same call."""
    case = Case(B=1, T=50, HQ=2, H=1, K=32, dtype=bf16)
    x = make_inputs(case)
    W = None if left < 0 else left + 1
    want = run_parallel(case, x, lambda x: parallel_attn(x.q, x.k, x.v, window_size=W))
    for right in (0, -1):
        got = run_parallel(case, x, lambda x, r=right: parallel_attn(x.q, x.k, x.v, window_size=(left, r)))
        for name in want:
            assert torch.equal(want[name], got[name]), (name, right)


def test_noncausal_backward_is_deterministic():
    case = Case(B=1, T=70, HQ=4, H=2, K=32, dtype=bf16, sink=0.0, cu_seqlens=(0, 33, 70))
    x = make_inputs(case)
    a, b = run_parallel(case, x, _ours(case, (8, 8))), run_parallel(case, x, _ours(case, (8, 8)))
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_noncausal_takes_seven_products():
    """Five products store the causal band of dS tiles: "auto" takes seven for a non-causal call (and says why),
    forcing five raises."""
    x = make_inputs(Case(B=1, T=40, HQ=2, H=1, K=32, dtype=bf16))
    route = select_backward(x.q, x.k, x.v, causal=False)
    assert route.five is None and "not causal" in route.explain()
    with dq_path("from-ds"), pytest.raises(ValueError, match="runs causal attention only"):
        o = parallel_attn(x.q, x.k, x.v, causal=False)
        torch.autograd.grad(o, [x.q], x.do)


def _dependence(which: str, b: int, t: int, head: int, left: int, right: int, B, T, HQ, H) -> dict:
    """What depends on a poisoned q (query t of head `head`), k or v (key t of KV head `head`) when query i sees
    keys i - left .. i + right: rows R; dk, dv at keys seen from R (and dk at the poisoned key itself; dv does not
    depend on v); dsink of the heads with a dependent row."""
    G = HQ // H
    i = torch.arange(T)
    d = i[:, None] - i[None, :]
    vis = (d <= left) & (d >= -right)  # [query, key]
    rows = torch.zeros(B, T, HQ, dtype=torch.bool)
    if which == "q":
        rows[b, t, head] = True
    else:
        rows[b, :, head * G:(head + 1) * G] = vis[:, t][:, None]
    keys = (rows.transpose(1, 2).float() @ vis.float()).transpose(1, 2) > 0
    kv = keys.view(B, T, H, G).any(3)
    if which == "k":
        kv[b, t, head] = True
    return {"o": rows, "dq": rows, "dk": kv, "dv": torch.zeros_like(kv) if which == "v" else kv,
            "dsink": rows.any(1).any(0)}


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("containment", ["inline", "two-launch"])
def test_noncausal_nan_inf_is_contained(which, value, containment, monkeypatch):
    """A NaN/Inf q, k or v vector reaches exactly what depends on it under a (5, 6) window; the rest is bitwise
    the clean run's."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    B, T, HQ, H = 2, 40, 4, 2
    case = Case(B=B, T=T, HQ=HQ, H=H, K=32, dtype=bf16, sink=0.0)
    x = make_inputs(case)
    b, t, head = 1, 20, 1 if which == "q" else 0
    clean = run_parallel(case, x, _ours(case, (5, 6)))
    bad = getattr(x, which).detach().clone()
    bad[b, t, head, :] = value
    setattr(x, which, bad.requires_grad_())
    out = run_parallel(case, x, _ours(case, (5, 6)))
    _check_poisoned(out, clean, _dependence(which, b, t, head, 5, 6, B, T, HQ, H))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(causal=False, window_size=8), ValueError, r"with causal=False pass a pair \(left, right\)"),
    (dict(window_size=(8, 2)), ValueError, r"lets a query see 2 later key\(s\), which causal attention does not"),
    (dict(causal=False, window_size=(-2, 3)), ValueError, r"ints >= -1"),
    (dict(causal=False, window_size=(1, 2, 3)), TypeError, r"must be \(left, right\), two ints"),
    (dict(causal=False, window_size=(1.5, 2)), TypeError, r"must be \(left, right\), two ints"),
    (dict(causal=False, window_size=(True, 2)), TypeError, r"must be \(left, right\), two ints"),
    (dict(causal=1), TypeError, r"causal must be a bool"),
])
def test_bad_noncausal_arguments(kwargs, error, match):
    x = make_inputs(Case(T=8, K=16))
    with pytest.raises(error, match=match):
        parallel_attn(x.q, x.k, x.v, **kwargs)


def test_gate_needs_causal():
    x = make_inputs(Case(T=8, K=16, gate=True))
    with pytest.raises(ValueError, match="a forget gate g needs causal attention"):
        parallel_attn(x.q, x.k, x.v, g=x.g, causal=False)


@pytest.mark.parametrize("case", params([Case(B=1, T=40, HQ=4, H=2, K=32, dtype=bf16)]))
def test_compiled_noncausal_matches_eager(case):
    """Under torch.compile(fullgraph=True) the custom ops carry the right window."""
    from conftest import DEVICE
    torch._dynamo.reset()
    x = make_inputs(case)
    f = torch.compile(lambda q, k, v: parallel_attn(q, k, v, causal=False, window_size=(4, 9)), fullgraph=True,
                      backend="inductor" if DEVICE == "cuda" else "aot_eager")
    check_against_oracle(case, x, lambda x: f(x.q, x.k, x.v), _oracle(case, (4, 9)))
