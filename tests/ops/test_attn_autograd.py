# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""How autograd drives `parallel_attn` (issue 6, split out of test_attn_robust.py): subsets of the inputs requiring
grad (only q, only g and v, none), the backward receiving o's gradient alone (no zero-filled lse-shaped gradient),
and double backward, which raises after a first backward with create_graph=True that matches the oracle. The
gradients are compared with the fp32 oracle `naive_parallel_attn` under the 0.005 error-ratio rule
(`conftest.assert_close`)."""

import pytest
import torch
from conftest import assert_close
from helpers import Case, Inputs, compare, make_inputs, run_parallel, run_reference
from robust_helpers import leaf as _leaf

from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32


# ------------------------------------------------------------------------------------------------------------
# Gradient subsets: inputs that do not require grad
# ------------------------------------------------------------------------------------------------------------

def _all_leaves_require_grad(x: Inputs) -> Inputs:
    """Copies of the inputs, all requiring grad, for the oracle (`run_reference` differentiates all of them)."""
    def leaf(t):
        return None if t is None else _leaf(t)
    return Inputs(leaf(x.q), leaf(x.k), leaf(x.v), leaf(x.g), leaf(x.sink_bias), x.cu_seqlens, x.do)


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate_nograd"])
def test_only_q_requires_grad(gate):
    """Only q requires grad (k, v and g do not): `.backward()` fills q.grad (matching the oracle) and leaves
    k.grad, v.grad and g.grad None; o requires grad."""
    case = Case(B=2, T=40, HQ=4, H=2, K=64, dtype=bf16, gate=gate, window=25)
    x = make_inputs(case)
    for t in (x.k, x.v) + ((x.g,) if gate else ()):
        t.requires_grad_(False)
    o = parallel_attn(x.q, x.k, x.v, g=x.g, window_size=case.window)
    assert o.requires_grad
    o.backward(x.do)
    assert x.k.grad is None and x.v.grad is None and (x.g is None or x.g.grad is None)
    ref = run_reference(case, _all_leaves_require_grad(x))
    compare({"o": ref["o"], "dq": ref["dq"]}, {"o": o, "dq": x.q.grad}, tag="[only q]")


def test_only_g_and_v_require_grad():
    """q and k without grad, g (strided) and v with: dg and dv match the oracle, q.grad/k.grad stay None."""
    case = Case(B=2, T=40, HQ=4, H=2, K=32, dtype=f16, gate=True, window=12)
    x = make_inputs(case)
    x.q.requires_grad_(False)
    x.k.requires_grad_(False)
    x.g = _leaf(x.g.transpose(0, 1).contiguous().transpose(0, 1))
    assert not x.g.is_contiguous()
    o = parallel_attn(x.q, x.k, x.v, g=x.g, window_size=case.window)
    dv, dg = torch.autograd.grad(o, [x.v, x.g], x.do)
    ref = run_reference(case, _all_leaves_require_grad(x))
    assert x.q.grad is None and x.k.grad is None
    compare({"o": ref["o"], "dv": ref["dv"], "dg": ref["dg"]}, {"o": o, "dv": dv, "dg": dg}, tag="[g, v only]")


def test_nothing_requires_grad():
    """No input requires grad: o does not require grad and matches the oracle."""
    case = Case(B=1, T=30, HQ=2, H=1, K=32, dtype=bf16, gate=True)
    x = make_inputs(case)
    for t in (x.q, x.k, x.v, x.g):
        t.requires_grad_(False)
    o = parallel_attn(x.q, x.k, x.v, g=x.g)
    assert not o.requires_grad
    with torch.no_grad():
        ref = naive_parallel_attn(x.q, x.k, x.v, g=x.g)
    assert_close("o[no grad]", ref, o)


# ------------------------------------------------------------------------------------------------------------
# The backward's inputs: double backward, internal gradients
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_double_backward_raises(gate):
    """A gradient of a gradient: the first backward with create_graph=True works (and matches the oracle); the
    second raises a RuntimeError that says double backward is not supported."""
    case = Case(B=1, T=20, HQ=2, H=1, K=32, dtype=f32, gate=gate)
    x = make_inputs(case)
    o = parallel_attn(x.q, x.k, x.v, g=x.g)
    dq, = torch.autograd.grad(o, [x.q], x.do, create_graph=True)
    assert_close("dq[create_graph]", run_reference(case, x)["dq"], dq)
    with pytest.raises(RuntimeError, match="double backward"):
        dq.pow(2).sum().backward()


@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_backward_gets_no_zero_filled_internal_gradients(gate, monkeypatch):
    """lse and the gate's cumsum are internal: the eager autograd.Function returns o alone, so autograd hands its
    backward one gradient (do) and never a zero-filled lse-shaped tensor (an allocation and a fill kernel per
    backward, seen in the Nsight profile of), and the gradients stay right."""
    import fla_bwd.ops.attn.autograd as A
    seen = []
    real = A.EagerParallelAttn.backward

    def spy(ctx, *grads):
        seen.append(tuple(x is not None for x in grads))
        return real(ctx, *grads)

    monkeypatch.setattr(A.EagerParallelAttn, "backward", staticmethod(spy))
    case = Case(B=1, T=20, HQ=2, H=1, K=32, dtype=f32, gate=gate)
    x = make_inputs(case)
    compare(run_reference(case, x), run_parallel(case, x))
    assert seen == [(True,)]
