# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The one dispatch (`dispatch.route`): `select_backward` says the route a backward takes, with a reason per choice,
and the backward runs exactly that route; forced paths that cannot run a call raise, never fall back."""

import dataclasses

import pytest
import torch
from helpers import Case, check_against_oracle, make_inputs, params

import fla_bwd.ops.attn.host as host
from fla_bwd.ops.attn import Route, parallel_attn, select_backward
from fla_bwd.settings import dkv_path, dq_path

bf16, f32 = torch.bfloat16, torch.float32

CASES = [
    Case(B=1, T=70, HQ=4, H=4, K=32, dtype=bf16),
    Case(B=2, T=40, HQ=8, H=2, K=64, dtype=bf16, gate=True),
    Case(B=1, T=90, HQ=4, H=2, K=32, dtype=f32, window=20, sink=float("nan")),
    Case(B=1, T=100, HQ=4, H=2, K=32, dtype=bf16, cu_seqlens=[0, 1, 1, 60, 100]),
]


class RouteSpy:
    """The routes of the backwards run during a test (the plans' `route`, `host._backward_plan`)."""

    def __init__(self, monkeypatch):
        self.routes = []
        original = host._backward_plan

        def spy(*args):
            plan = original(*args)
            self.routes.append(plan.route)
            return plan

        monkeypatch.setattr(host, "_backward_plan", spy)


def _select(case: Case) -> Route:
    x = make_inputs(case)
    return select_backward(x.q, x.k, x.v, x.g, case.window, x.cu_seqlens, x.sink_bias)


@pytest.mark.parametrize("forced", ["auto", "from-ds"])
@pytest.mark.parametrize("case", params(CASES))
def test_select_backward_is_the_route_the_backward_runs(case, forced, monkeypatch):
    runnable = case.dtype != f32  # packed calls too, since the five-product kernels take them (forced)
    spy = RouteSpy(monkeypatch)
    with dq_path(forced):
        if forced == "from-ds" and not runnable:
            with pytest.raises(ValueError, match="from-ds"):
                _select(case)
            return
        expected = _select(case)
        check_against_oracle(case)
    assert spy.routes == [expected]
    assert expected.products == (5 if forced == "from-ds" else 7)


@pytest.mark.parametrize("case", params(CASES))
def test_every_choice_has_a_reason(case):
    route = _select(case)
    names = [name for name, _ in route.reasons]
    assert names[0] == "products" and "delta" in names and "containment" in names
    assert ("gate gradient" in names) == case.gate
    assert ("dK/dV kernel" in names) == (route.five is None)
    assert all(why.strip() for _, why in route.reasons)
    text = route.explain()
    assert len(text.splitlines()) == len(route.reasons)


def test_forced_choices_name_their_setting(monkeypatch):
    case = CASES[1]
    with dkv_path("gqa-split2"):
        route = _select(case)
    assert route.dkv.name == "gqa-split2" and "FLA_BWD_DKV_PATH=gqa-split2" in route.explain()
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    assert _select(case).containment == "two-launch"
    with dkv_path("gqa-split4"), pytest.raises(ValueError, match="multiple of 4"):
        _select(Case(B=1, T=40, HQ=6, H=3, K=32, dtype=bf16))  # G = 2


def test_a_route_is_frozen():
    route = _select(CASES[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        route.containment = "inline"
    assert hash(route) == hash(_select(CASES[0]))  # plans key tail calls on it


def test_tail_route_is_seven_products():
    from fla_bwd.ops.attn import dispatch

    s = host.call_of(*(torch.zeros(1, 64, 4, 32, dtype=bf16) for _ in range(3)), None, None, None, 0.2, 0).shape
    with dq_path("from-ds"):  # tail queries take seven products whatever the dq path (context parallelism's)
        route = dispatch.tail_route(s._replace(Q0=32), dispatch.knobs())
    assert route.products == 7 and route.reasons[0] == ("products", "seven: tail queries")


@pytest.mark.parametrize("gate,sink,window", [(False, None, None), (True, 0.5, 20)], ids=["plain", "gate-sink-W20"])
def test_packed_batch_of_one_length_runs_as_its_dense_batch(gate, sink, window):
    """N packed sequences of one length L are laid out as the dense batch [N, L]: they run its kernels on the same
    memory, so o and every gradient are bitwise the dense call's, and the route says so; mixed lengths and
    zero-length sequences stay packed."""
    N, L = 3, 32
    case = Case(B=1, T=N * L, HQ=4, H=2, K=32, dtype=bf16, cu_seqlens=tuple(range(0, N * L + 1, L)), gate=gate,
                sink=sink, window=window)
    x = make_inputs(case)
    packed = check_against_oracle(case, x)
    as_dense = lambda t: t.view(N, L, *t.shape[2:]) if t is not None else None  # noqa: E731
    o = parallel_attn(as_dense(x.q), as_dense(x.k), as_dense(x.v), g=as_dense(x.g), window_size=window,
                      sink_bias=x.sink_bias)
    wrt = x.grad_inputs()
    dense = dict(o=o.view(packed["o"].shape), **dict(zip(wrt, torch.autograd.grad(o, list(wrt.values()),
                                                                                    as_dense(x.do)))))
    for name, value in packed.items():
        assert value.shape == dense[name].shape and torch.equal(value, dense[name]), name
    assert _select(case).reasons[0] == ("packed", f"{N} sequences of {L} tokens: run as the dense batch they are "
                                                  "laid out as")
    for cu in ((0, 32, 40, 96), (0, 0, 48, 96)):
        assert _select(dataclasses.replace(case, cu_seqlens=cu)).reasons[0][0] == "products"
