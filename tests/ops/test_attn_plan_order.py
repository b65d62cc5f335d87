# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The order of a launch plan's steps (`fla_bwd.ops.utils.launch.Plan`), on the real plans of forwards and
backwards of every kind (seven products; five on the Triton kernel, split, chunked and gated; five on the Hopper
step, built but not run here): every step reads only the call's inputs and what earlier steps made, and each
buffer is allocated just before the first step that reads it (`Plan.allocate_late`: the GPU waits for a call's
first launches). Plans are built, not run: no kernel executes in this file."""

import pytest
import torch

from fla_bwd.ops.attn import config, dispatch, gluon_dkv, host
from fla_bwd.ops.utils import launch

BACKWARD_INPUTS = {"q", "k", "v", "o", "o_lo", "do", "lse", "gc", "sink_bias", "cu_seqlens"}
FORWARD_INPUTS = {"q", "k", "v", "g", "sink_bias", "cu_seqlens"}


def _call(B=1, T=256, HQ=8, H=2, D=128, gate=False, sink=False, window=0, cu=None):
    q = torch.zeros(B, T, HQ, D, dtype=torch.bfloat16)
    k, v = (torch.zeros(B, T, H, D, dtype=torch.bfloat16) for _ in range(2))
    g = torch.zeros(B, T, HQ) if gate else None
    s = torch.zeros(HQ) if sink else None
    cu_seqlens = torch.tensor(cu, dtype=torch.int32) if cu is not None else None
    return host.call_of(q, k, v, g, s, cu_seqlens, D**-0.5, window)


def _check_order(plan: launch.Plan, inputs: set) -> None:
    made = set(inputs) | {f"chunks{BT}" for BT in plan.tile_sizes}  # packed tile lists: bound by `host._run`
    pending = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, launch.Empty):
            pending.append(step.name)
            made.add(step.name)
            continue
        uses = set(step.uses)
        own = {n for n in uses if n.startswith(gluon_dkv._DESC)}  # the Hopper step makes its descriptors
        assert uses - own <= made, f"step {i} ({type(step).__name__}) reads {sorted(uses - own - made)} unmade"
        # The allocations just before a step are all its own: none waits for a later step.
        assert all(name in uses for name in pending), f"step {i} is issued after {pending}, which it does not read"
        pending = []
        if isinstance(step, launch.Apply):
            made.add(step.name)
    readers = set().union(*(s.uses for s in plan.steps))
    assert not (set(pending) & readers)


SEVEN = {
    "plain": dict(),
    "gated": dict(gate=True),
    "sink-window": dict(sink=True, window=64),
    "varlen": dict(B=1, T=300, cu=(0, 37, 300)),
    "mha-D64": dict(HQ=4, H=4, D=64),
}


@pytest.mark.parametrize("containment", ["inline", "two-launch"])
@pytest.mark.parametrize("name", list(SEVEN))
def test_seven_product_and_forward_plans(name, containment, monkeypatch):
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    call = _call(**SEVEN[name])
    route = dispatch.route(call, dispatch.knobs(), True, False)
    assert route.five is None
    _check_order(host._build_backward(call.shape, call.tiles, route), BACKWARD_INPUTS)
    _check_order(host._build_forward(call, False, False, "auto"), FORWARD_INPUTS)


FIVE = {  # (split, chunk, hopper): G = 4
    "one-head-launches": (1, 1, False),  # four launches: the fp32 sums ping-pong
    "split2-chunk2": (2, 2, False),
    "split4": (4, 1, False),
    "hopper": (1, 4, True),
    "hopper-split2-chunk1": (2, 1, True),
}


@pytest.mark.parametrize("containment", ["inline", "two-launch"])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("name", list(FIVE))
def test_five_product_plans(name, gated, containment, monkeypatch):
    """Gated plans at T = 256 and, with `GATE_GRAD_BY_BAND_MAX_T` lowered, the key-side launch and the scan."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    for by_band_max_t in (2048, 0) if gated else (2048,):
        monkeypatch.setattr(config, "GATE_GRAD_BY_BAND_MAX_T", by_band_max_t)
        call = _call(gate=gated)
        route = dispatch.five_route(call.shape, dispatch.FiveProduct(*FIVE[name]), dispatch.knobs())
        plan = host._build_backward(call.shape, None, route)
        _check_order(plan, BACKWARD_INPUTS)
        kinds = [type(step).__name__ for step in plan.steps]
        # delta's launch is issued right after its own buffer, ahead of everything the dK/dV launches need
        assert kinds[:2] == ["Empty", "Launch"] and plan.steps[0].name == "delta"
        for step in plan.steps:  # its TMA descriptors' inputs are read through the step, not as `Ref` arguments
            if isinstance(step, gluon_dkv.HopperDkvLaunch):
                assert step.uses >= {"q", "k", "v", "do", "lse", "delta", "ds", "flags", *(["gc"] if gated else [])}
        dq_at = next(i for i, step in enumerate(plan.steps) if getattr(step, "name", None) == "dq")
        assert any(kind.endswith("Launch") for kind in kinds[2:dq_at])  # after a dK/dV launch, which needs no dq


def test_allocate_late_keeps_order_and_respects_unknown_steps():
    """A step without `uses` keeps every allocation before it; allocations keep their order; one nobody reads
    goes last."""
    plan = launch.Plan(torch.device("cpu"))
    plan.empty("a", (1,), torch.float32)
    plan.empty("b", (1,), torch.float32)
    plan.empty("c", (1,), torch.float32)
    plan.apply("x", lambda b: b, launch.Ref("b"))
    plan.empty("d", (1,), torch.float32)
    plan.empty("unread", (1,), torch.float32)
    plan.add(lambda env, device, stream: None)  # reads anything
    plan.apply("y", lambda a, c: a, launch.Ref("a"), launch.Ref("c"))
    plan.empty("last", (1,), torch.float32)
    plan.allocate_late()
    names = [getattr(step, "name", "?") for step in plan.steps]
    assert names == ["b", "x", "a", "c", "d", "unread", "?", "y", "last"]
    env = plan.run({})
    assert set(env) == {"a", "b", "c", "d", "unread", "x", "y", "last"}
