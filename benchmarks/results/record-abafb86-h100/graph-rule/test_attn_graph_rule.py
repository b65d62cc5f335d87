# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The capture rule of "auto" (`from_ds.captured_rule`, `config.FIVE_PRODUCT_MIN_T_CAPTURED`): an ungated dense call
shorter than `config.FIVE_PRODUCT_MIN_T` takes five products when it is made during a CUDA-graph capture, seven
otherwise; gated calls keep their rule; the capture state keys the backward's plan. The capture is faked on the CPU
(`from_ds.capturing`) and the thresholds scaled down to the interpreter's short sequences; the GPU's whole-step
captures are `test_attn_cuda_graph.py`'s."""

import pytest
from helpers import Case, check_against_oracle, make_inputs, run_parallel

from fla_bwd.ops.attn import config, from_ds, host


def plans_five(monkeypatch) -> list:
    """Whether each backward's plan took five products (`host._backward_plan`), appended as they are made."""
    five, original = [], host._backward_plan

    def spy(*args):
        plan = original(*args)
        five.append(plan.five is not None)
        return plan

    monkeypatch.setattr(host, "_backward_plan", spy)
    return five


@pytest.fixture
def short_rule(monkeypatch):
    """Thresholds scaled to T = 64: captured calls from T = 32 on, eager ones from T = 128 on; a GPU of one SM, which
    these few tiles keep busy (`config.group_fills_gpu`)."""
    monkeypatch.setattr(config, "FIVE_PRODUCT_MIN_T_CAPTURED", 32)
    monkeypatch.setattr(config, "sm_count", lambda device: 1)
    monkeypatch.setattr(config, "FIVE_PRODUCT_MIN_T", 128)
    state = {"capturing": False}
    monkeypatch.setattr(from_ds, "capturing", lambda device: state["capturing"])
    host.clear_plans()
    yield state
    host.clear_plans()


def test_captured_short_calls_take_five_products(short_rule, monkeypatch):
    five = plans_five(monkeypatch)
    case = Case(B=1, T=64, HQ=4, H=2, K=128)
    x = make_inputs(case)
    check_against_oracle(case, x)  # eager: seven products
    short_rule["capturing"] = True
    check_against_oracle(case, x)  # during the (faked) capture: five
    assert five == [False, True]  # two plans: the capture state keys them


def test_captured_rule_leaves_gated_and_long_calls(short_rule, monkeypatch):
    five = plans_five(monkeypatch)
    short_rule["capturing"] = True
    for case in (Case(B=1, T=64, HQ=4, H=2, K=128, gate=True), Case(B=1, T=16, HQ=4, H=2, K=128)):
        run_parallel(case, make_inputs(case))
    assert five == [False, False]  # gated: its own rule (the forward's o_lo); T = 16: under the captured minimum
