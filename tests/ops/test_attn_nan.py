# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn` and NaN/Inf (issue 6): a NaN or Inf in an input propagates to the outputs that depend on it and
nowhere else, and never crashes or hangs.

Inside a tile matrix product the masked entries of P (or dS) are exact zeros, and 0 * NaN = 0 * Inf = NaN, so a
non-finite q, k, v or do row (or the lse/delta of a row that depends on one) would poison the rows of the same tile
that cannot see it. The kernels' masked blocks (`MASK=True` in fla_bwd/ops/attn/inner.py) with SAFE mask after
the arithmetic and zero non-finite operand rows (`finite_rows`, `row_flags`); in unmasked blocks every row depends
on every key, so NaN spreading there is correct. SAFE runs only for tiles whose plain computation gave a non-finite
output, either in the same launch or in a second one (`host.add_contained`); every case runs both ways.
"""

import math
from typing import Optional

import pytest
import torch
from helpers import Case, make_inputs, run_parallel

bf16 = torch.bfloat16

# ------------------------------------------------------------------------------------------------------------
# 6. NaN / Inf propagation
# ------------------------------------------------------------------------------------------------------------
#
# "Depends on", for causal attention with window W (W = T without a window), query head hq reading KV head
# h = hq // G. Let R be the set of (t, hq) whose output row o[b, t, hq] depends on the poisoned input:
#   - q[b, t, hq]         -> R = {(t, hq)}
#   - k[b, s, h], v[b, s, h] -> R = {(t, hq) : s <= t <= s + W - 1, hq in group(h)}
#   - g[b, t, hq]         -> R = {(i, hq) : i >= t} (the gate's cumsum G_i carries g_t for every i >= t)
# Then, with a finite do:
#   o:  rows R;  dq: rows R;
#   dk, dv [b, j, h]: keys j visible from some row of R (i - W < j <= i) in KV head h -- except that dv does not
#       depend on v at all (dv_j = sum_i p_ij do_i), so a poisoned v leaves dv entirely finite;
#   dg [b, :, hq]: dG_i is poisoned at every row of R and key seen from R, and dg is its reverse cumsum, so dg is
#       poisoned at every i <= max index of that set -- with R non-empty this is i <= T - 1 whenever the last row or a
#       key seen from it is poisoned; computed exactly below.
# Everything in another batch element is independent. The test checks: no crash; every dependent element is
# non-finite; every independent element is finite and bitwise equal to the same call with the poisoned value
# replaced by the original finite one.

NAN_B, NAN_T, NAN_HQ, NAN_H, NAN_D = 2, 40, 4, 2, 32


def _dependence(which: str, b: int, t: int, head: int, W: int) -> dict:
    """Boolean masks (True = depends on the poisoned element) for o, dq, dk, dv, dg, per (b, t, head)."""
    B, T, HQ, H = NAN_B, NAN_T, NAN_HQ, NAN_H
    G = HQ // H
    rows = torch.zeros(B, T, HQ, dtype=torch.bool)
    if which == "q":
        rows[b, t, head] = True
    elif which in ("k", "v"):
        rows[b, t:t + W, head * G:(head + 1) * G] = True
    else:  # g
        rows[b, t:, head] = True
    i = torch.arange(T)
    visible = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < W)  # [query, key]
    # keys[b, j, hq]: key j is visible from a dependent row of query head hq.
    keys = (rows.transpose(1, 2).float() @ visible.float()).transpose(1, 2) > 0
    kv = keys.view(B, T, H, G).any(3)
    if which == "k":
        kv[b, t, head] = True
    dG = rows | keys
    # dg = reverse cumsum of dG: poisoned at i if any dG at i' >= i is.
    dg = dG.flip(1).cumsum(1).flip(1) > 0
    # dsink[hq] = -sum over every row of head hq of p_sink * delta: poisoned for heads with a dependent row.
    dsink = rows.any(1).any(0)
    return {"o": rows, "dq": rows, "dk": kv, "dv": torch.zeros_like(kv) if which == "v" else kv, "dg": dg,
            "dsink": dsink}


def _poisoned_run(which: str, value: float, W: Optional[int], gate: bool, sink: Optional[float] = None):
    case = Case(B=NAN_B, T=NAN_T, HQ=NAN_HQ, H=NAN_H, K=NAN_D, dtype=bf16, gate=gate, window=W, sink=sink)
    x = make_inputs(case)
    clean = run_parallel(case, x)
    b, t = 1, 20
    head = 1 if which in ("q", "g") else 0
    src = {"q": x.q, "k": x.k, "v": x.v, "g": x.g}[which]
    bad = src.detach().clone()
    if which == "g":
        bad[b, t, head] = value
    else:
        bad[b, t, head, :] = value
    setattr(x, which, bad.requires_grad_())
    out = run_parallel(case, x)
    return out, clean, _dependence(which, b, t, head, W or NAN_T)


def _check_poisoned(out: dict, clean: dict, dep: dict) -> None:
    errors = []
    for name, t in out.items():
        mask = dep[name]
        shape = mask.shape + (1,) * (t.dim() - mask.dim())
        mask = mask.view(shape).expand_as(t).to(t.device)
        finite = torch.isfinite(t)
        if (finite & mask).any():
            errors.append(f"{name}: {int((finite & mask).sum())} dependent elements are finite "
                          f"(first at {(finite & mask).nonzero()[0].tolist()})")
        if (~finite & ~mask).any():
            rows = (~finite & ~mask).nonzero()
            where = sorted({tuple(r[:3]) for r in rows.tolist()})
            errors.append(f"{name}: {rows.shape[0]} independent elements are NaN/Inf "
                          f"(at {len(where)} (b, t, head) rows, first ones {where[:8]})")
        elif not torch.equal(t[~mask], clean[name][~mask]):
            diff = (t[~mask].float() - clean[name][~mask].float()).abs().max().item()
            errors.append(f"{name}: independent elements differ from the clean run (max abs diff {diff:.3e})")
    assert not errors, "; ".join(errors)


@pytest.mark.parametrize("W", [None, 8], ids=["causal", "W8"])
@pytest.mark.parametrize("which,value", [
    ("q", math.nan), ("q", math.inf), ("k", math.nan), ("k", math.inf), ("v", math.nan), ("v", math.inf),
    ("g", math.nan), ("g", math.inf),
], ids=["q_nan", "q_inf", "k_nan", "k_inf", "v_nan", "v_inf", "g_nan", "g_inf"])
@pytest.mark.parametrize("containment", ["inline", "two-launch"])
def test_nan_inf_propagation(which, value, W, containment, monkeypatch):
    """A NaN/+Inf in one (b, t, head) vector of q, k, v (all D elements) or one element of g, at b = 1, t = 20
    (mid-tile for the interpreter's 32-row tiles, so masked elements of the same tile are exercised): the
    dependent outputs and gradients (see the table above) are non-finite; all others are finite and bitwise
    equal to the clean run."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    out, clean, dep = _poisoned_run(which, value, W, gate=which == "g")
    _check_poisoned(out, clean, dep)




@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("containment", ["inline", "two-launch"])
def test_nan_with_sink(which, containment, monkeypatch):
    """With an attention sink (two dQ launches for the exact delta, dsink from per-tile partials): a NaN q, k or v
    vector reaches the same outputs as without, and dsink of exactly the query heads with a dependent row."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", containment)
    out, clean, dep = _poisoned_run(which, math.nan, 8, gate=False, sink=0.0)
    _check_poisoned(out, clean, dep)


def test_containment_choice(monkeypatch):
    """Calls too small for a second launch to pay contain inline (one launch), larger ones with a second launch;
    the override is checked."""
    from fla_bwd.ops.attn.call import Shape
    from fla_bwd.ops.attn.dispatch import contain_inline as rule
    from fla_bwd.settings import forced_containment

    def contain_inline(B, HQ, T, W, D):
        return rule(Shape(None, B, T, HQ, HQ, D, D, None, None, None, 1.0, W, "auto"), forced_containment())

    monkeypatch.delenv("FLA_BWD_CONTAINMENT", raising=False)
    assert contain_inline(B=1, HQ=8, T=512, W=512, D=128)  # 2**28
    assert not contain_inline(B=4, HQ=32, T=512, W=512, D=128)  # the registry's mha-short row
    assert not contain_inline(B=2, HQ=32, T=2048, W=2048, D=128)  # gqa4-long
    assert not contain_inline(B=1, HQ=32, T=16384, W=256, D=128)  # g8-T16384-W256
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "inline")
    assert contain_inline(B=1, HQ=32, T=16384, W=256, D=128)
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    assert not contain_inline(B=1, HQ=8, T=512, W=512, D=128)
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "fast")
    with pytest.raises(ValueError, match="FLA_BWD_CONTAINMENT"):
        contain_inline(B=1, HQ=1, T=1, W=1, D=1)
