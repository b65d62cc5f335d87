# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn(..., softcap=c)` (issue 63): logits c * tanh(scale * q.k / c) before the gate's bias and the sink
(Gemma 2's attention logit soft-capping, flash-attn's `softcap`).

The protocol of `helpers` (o and every gradient against the fp32 oracle `naive_parallel_attn(..., softcap=c)` at
error ratio < 0.005, poisoned buffers) with q scaled up so that the cap bends the scores (a test that the cap is not
ignored checks that); on both backward routes, in each delta mode, packed, windowed, with the sink, the gate (seven
products only: five refuse it clearly), the lse, NaN containment; bad values of `softcap` raise.
"""

import math

import pytest
import torch
from helpers import Case, check_against_oracle, make_inputs, params, run_parallel
from test_attn_nan import _check_poisoned, _dependence

from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn, select_backward
from fla_bwd.settings import dq_path

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32
CAP = 2.5
# q's scale: scores of std ~2, which the cap bends (|s| > CAP often). Sharper (std 3, cap 4) put tiny calls (T16 D16)
# at the 5e-3 bar in bf16: 1 seed of 12 over it on the CPU, 8.6e-3 on an H100.
SHARP = 2.0

SEVEN_CASES = [
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16),
    Case(B=1, T=77, HQ=4, H=1, K=64, V=32, dtype=f16, window=20),
    Case(B=1, T=40, HQ=2, H=2, K=32, dtype=f32),
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16, gate=True),
    Case(B=1, T=90, HQ=2, H=1, K=32, dtype=bf16, gate=True, window=30, sink=1.0),
    Case(B=2, T=50, HQ=4, H=2, K=32, dtype=bf16, sink=float("nan")),
    Case(B=1, T=100, HQ=4, H=2, K=32, dtype=bf16, cu_seqlens=(0, 30, 30, 100)),
    Case(B=1, T=90, HQ=2, H=1, K=32, dtype=bf16, gate=True, cu_seqlens=(0, 37, 90)),
    Case(B=1, T=48, HQ=2, H=1, K=32, dtype=bf16, scale=0.3),
]
FIVE_CASES = [
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=bf16),
    Case(B=1, T=90, HQ=4, H=2, K=64, dtype=f16, window=20),
    Case(B=1, T=70, HQ=4, H=1, K=64, V=32, dtype=bf16, sink=1.0),
    Case(B=1, T=63, HQ=4, H=2, K=160, dtype=bf16),  # dK from the stored tiles
]


def _sharp(case: Case):
    x = make_inputs(case)
    x.q = (x.q.detach().float() * SHARP).to(case.dtype).requires_grad_()
    return x


def _ours(case: Case, cap=CAP):
    return lambda x: parallel_attn(x.q, x.k, x.v, g=x.g, scale=case.scale, window_size=case.window,
                                   cu_seqlens=x.cu_seqlens, sink_bias=x.sink_bias, softcap=cap)


def _oracle(case: Case, cap=CAP):
    return lambda q, k, v, g, sink_bias: naive_parallel_attn(q, k, v, scale=case.scale, window_size=case.window, g=g,
                                                             sink_bias=sink_bias, softcap=cap)


@pytest.mark.parametrize("case", params(SEVEN_CASES))
def test_softcap_seven_products(case):
    with dq_path("recompute"):
        check_against_oracle(case, _sharp(case), _ours(case), _oracle(case))


@pytest.mark.parametrize("case", params(FIVE_CASES))
def test_softcap_five_products(case):
    with dq_path("from-ds"):
        check_against_oracle(case, _sharp(case), _ours(case), _oracle(case))


def test_the_cap_bends_the_scores():
    """The inputs above are sharp enough that the capped oracle differs from the uncapped one by far more than the
    tolerance: a kernel that ignored the cap would fail the tests above."""
    case = SEVEN_CASES[0]
    x = _sharp(case)
    capped, plain = _oracle(case)(x.q, x.k, x.v, None, None), _oracle(case, None)(x.q, x.k, x.v, None, None)
    assert ((capped - plain).norm() / plain.norm()).item() > 0.1


@pytest.mark.parametrize("path", ["recompute", "from-ds"])
def test_softcap_with_lse(path):
    case = Case(B=1, T=50, HQ=4, H=2, K=32, dtype=bf16, sink=0.5)
    x = _sharp(case)
    dlse = torch.randn(1, 50, 4, device=x.q.device)
    wrt = x.grad_inputs()
    with dq_path(path):
        o, lse = parallel_attn(x.q, x.k, x.v, sink_bias=x.sink_bias, softcap=CAP, return_lse=True)
        got = torch.autograd.grad([o, lse], list(wrt.values()), [x.do, dlse])
    sink = x.sink_bias.detach().float().requires_grad_()
    ro, rlse = naive_parallel_attn(x.q, x.k, x.v, sink_bias=sink, softcap=CAP, return_lse=True)
    ref = torch.autograd.grad([ro, rlse], [x.q, x.k, x.v, sink], [x.do.float(), dlse])
    from helpers import compare
    compare({"o": ro, "lse": rlse, **dict(zip(wrt, ref))}, {"o": o, "lse": lse, **dict(zip(wrt, got))})


def test_softcap_zero_is_off():
    """softcap=0.0 is flash-attn's "off": bitwise the call without it."""
    case = Case(B=1, T=40, HQ=2, H=1, K=32, dtype=bf16, gate=True)
    x = _sharp(case)
    a = run_parallel(case, x, _ours(case, 0.0))
    b = run_parallel(case, x)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_gate_with_softcap_takes_seven_products():
    """Five products sum the gate's gradient from the stored tiles, which hold dS of q.k, not of the capped
    scores: "auto" takes seven products for it, and forcing five raises."""
    x = make_inputs(Case(B=1, T=40, HQ=2, H=1, K=32, dtype=bf16, gate=True))
    assert "softcap with a gate" in select_backward(x.q, x.k, x.v, x.g, softcap=CAP).explain() or \
        select_backward(x.q, x.k, x.v, x.g, softcap=CAP).five is None
    with dq_path("from-ds"), pytest.raises(ValueError, match="softcap with a gate"):
        o = parallel_attn(x.q, x.k, x.v, g=x.g, softcap=CAP)
        torch.autograd.grad(o, [x.q], x.do)


@pytest.mark.parametrize("path", ["recompute", "from-ds"])
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("containment", ["inline", "two-launch"])
def test_nan_with_softcap(which, containment, path, monkeypatch):
    """A NaN q, k or v vector (tanh of a NaN score is NaN) reaches exactly what it reaches without the cap."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    import test_attn_nan as nan
    case = Case(B=nan.NAN_B, T=nan.NAN_T, HQ=nan.NAN_HQ, H=nan.NAN_H, K=32, dtype=bf16, window=8, sink=0.0)
    x = _sharp(case)
    b, t, head = 1, 20, 1 if which == "q" else 0
    with dq_path(path):
        clean = run_parallel(case, x, _ours(case))
        src = getattr(x, which)
        bad = src.detach().clone()
        bad[b, t, head, :] = math.nan
        setattr(x, which, bad.requires_grad_())
        out = run_parallel(case, x, _ours(case))
    _check_poisoned(out, clean, _dependence(which, b, t, head, 8))


@pytest.mark.parametrize("bad,error", [(-1.0, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                                       (1e39, ValueError), ("4", TypeError), (True, TypeError)])
def test_bad_softcap(bad, error):
    x = make_inputs(Case(T=8, K=16))
    with pytest.raises(error, match="softcap"):
        parallel_attn(x.q, x.k, x.v, softcap=bad)
