# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""CPU tests of issue 60's benchmark rows (group "fastpath"): they validate and build their inputs (on reduced heads
and head dims: the full rows are far too large for the interpreter), the sink logits reach the op and the backward,
the report's "vs twin" ratio (per visible pair) and the peers that cannot represent a sink say so."""

import dataclasses
import os
import sys
import types

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_runner import run_cli, synthetic  # noqa: E402

from benchmarks.ops import candidates, plan, registry, summary  # noqa: E402
from benchmarks.ops.shapes import PEERS, Shape, ShapeError, cu_seqlens_list, parse_custom, unsupported  # noqa: E402

# name -> (B, T, HQ, H, D, varlen lens, sink, twin)
NEW_ROWS = {
    "gqa4-B4-T2048": (4, 2048, 32, 8, 128, (), False, ""),
    "packed-4x2048-G4": (1, 8192, 32, 8, 128, (2048,) * 4, False, "gqa4-B4-T2048"),
    "packed-1x8192-G8": (1, 8192, 32, 4, 128, (8192,), False, "g8-T8192"),
    "packed-mixed-8192-G8": (1, 8192, 32, 4, 128, (2227, 869, 1233, 3863), False, "g8-T8192"),
    "gqa4-long-sink": (2, 2048, 32, 8, 128, (), True, "gqa4-long"),
    "g8-T8192-sink": (1, 8192, 32, 4, 128, (), True, "g8-T8192"),
    "gqa4-long-D256": (2, 2048, 32, 8, 256, (), False, ""),
}
OP = registry.get_op("parallel_attn")


def small(s: Shape) -> Shape:
    """The row with one KV head of G query heads and head dim 16: B, T, the packed lengths and the sink unchanged."""
    return dataclasses.replace(s, HQ=s.G, H=1, K=16, V=16)


def test_new_rows_registered_last_in_their_group_and_valid():
    names = [s.name for s in registry.SHAPES if s.group != "variants"]  # the call's variants come after them
    assert names[-len(NEW_ROWS):] == list(NEW_ROWS)  # appended: the earlier rows keep their priority
    for name, (B, T, HQ, H, D, lens, sink, twin) in NEW_ROWS.items():
        s = OP.check(registry.get_shape(name))
        assert (s.B, s.T, s.HQ, s.H, s.K, s.V, s.sink, s.twin, s.group) == (B, T, HQ, H, D, D, sink, twin, "fastpath")
        assert s.varlen == bool(lens) and (not lens or s.seqlens() == list(lens)) and not s.gated
        assert ("sink" in s.describe()) == sink and registry.twin_error(s) is None
        if twin:
            t = registry.get_shape(twin)
            assert (t.HQ, t.H, t.K, t.V, t.dtype) == (s.HQ, s.H, s.K, s.V, s.dtype) and not (t.sink or t.varlen)
    by = {n: registry.get_shape(n) for n in NEW_ROWS}
    # a sink adds no pair; equal sequences packed are their dense twin's pairs; the mixed lengths have fewer
    for name in ("gqa4-long-sink", "g8-T8192-sink", "packed-4x2048-G4", "packed-1x8192-G8"):
        twin = registry.get_shape(by[name].twin)
        assert by[name].pairs() == twin.pairs() and by[name].flops("bwd") == twin.flops("bwd"), name
    assert by["packed-mixed-8192-G8"].pairs() < registry.get_shape("g8-T8192").pairs()
    assert by["gqa4-long-D256"].fwd_flops() == 2 * registry.get_shape("gqa4-long").fwd_flops()
    assert registry.select_shapes("group:fastpath") == list(by.values())
    listing = run_cli("--list")
    assert listing.returncode == 0 and all(n in listing.stdout for n in NEW_ROWS), listing.stdout
    assert "[twin: gqa4-B4-T2048]" in listing.stdout and "D128 sink bf16" in listing.stdout


def test_validation_of_sink_twin_and_lens():
    assert parse_custom("B=1,T=64,HQ=4,H=2,D=16,sink").sink
    assert "sink" in Shape("x", 1, 64, 4, 2, 16, 16, sink=True).as_dict()["describe"]
    for bad in (dict(varlen=True, lens=(32, 32), nseq=3), dict(twin="x")):
        with pytest.raises(ShapeError):
            Shape("x", 1, 64, 4, 2, 16, 16, **bad).validate()
    assert "not a registered row" in registry.twin_error(Shape("x", 1, 64, 4, 2, 16, 16, twin="nope"))
    assert "other heads" in registry.twin_error(Shape("x", 1, 8192, 32, 8, 128, 128, twin="g8-T8192"))


@pytest.mark.parametrize("name", list(NEW_ROWS))
def test_new_rows_build_inputs_on_the_cpu(name):
    s = small(registry.get_shape(name))
    a, b = (registry.make_inputs(OP, s, "cpu") for _ in range(2))
    assert a["q"].shape == (s.B, s.T, s.HQ, 16) and a["k"].shape == a["v"].shape == (s.B, s.T, 1, 16)
    assert a["g"] is None and torch.equal(a["q"], b["q"])  # seeded
    if s.varlen:
        assert a["cu_seqlens"].tolist() == cu_seqlens_list(s.seqlens()) and a["cu_seqlens"][-1] == s.T
    else:
        assert a["cu_seqlens"] is None
    if s.sink:
        sink = a["sink_bias"]
        assert sink.shape == (s.HQ,) and sink.dtype == torch.float32 and sink.requires_grad and sink.is_leaf
        assert torch.equal(sink, b["sink_bias"]) and sink.abs().sum() > 0
        plain = registry.make_inputs(OP, dataclasses.replace(s, sink=False), "cpu")
        assert plain["sink_bias"] is None and torch.equal(plain["q"], a["q"]) and torch.equal(plain["v"], a["v"])
        assert candidates.leaves_of(a)[-1] is sink  # the backward differentiates the sink too
    else:
        assert a["sink_bias"] is None and len(candidates.leaves_of(a)) == 3


def test_sink_bias_reaches_the_call():
    seen = []

    def fake(q, k, v, **kw):
        seen.append(kw)
        return q

    built = {}
    for name in ("g8-T8192-sink", "g8-T8192"):
        s = small(registry.get_shape(name))
        built[name] = registry.make_inputs(OP, s, "cpu")
        OP.call(fake, built[name], s)
    with_sink, without = seen
    assert with_sink["sink_bias"] is built["g8-T8192-sink"]["sink_bias"]
    assert with_sink["window_size"] is None and with_sink["cu_seqlens"] is None and with_sink["g"] is None
    assert "sink_bias" not in without  # a row without a sink calls the op exactly as before


def test_fla_peer_passes_the_sink(monkeypatch):
    """FLA 0.6's parallel_attn takes `sink_bias`: the peer runs the sink rows with it."""
    from benchmarks.ops import peers

    seen = {}
    mod = types.ModuleType("fla.ops.attn.parallel")
    mod.parallel_attn = lambda q, k, v, **kw: seen.update(kw) or q
    for name in ("fla", "fla.ops", "fla.ops.attn"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.attn.parallel", mod)
    s = small(registry.get_shape("gqa4-long-sink"))
    inputs = registry.make_inputs(OP, s, "cpu")
    cand = peers.torch_candidate("fla", s, inputs, None)
    cand.forward()
    assert seen["sink_bias"] is inputs["sink_bias"] is cand.leaves[-1]


def test_sink_backward_through_the_harness():
    """Our op on a tiny sink row, as the runner times it (bwd: autograd.grad over q, k, v and the sink)."""
    s = Shape("tiny-sink", 1, 32, 4, 2, 16, 16, sink=True, modes=("bwd",), peers=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # tests/conftest.py: the interpreter on a CPU
    inputs = registry.make_inputs(OP, s, device)
    do = torch.randn(1, 32, 4, 16).to(device, torch.bfloat16)
    grads = candidates.ours(OP.load(), OP.call, inputs, s, do, None).build("bwd")()
    assert len(grads) == 4 and grads[-1].shape == (4,) and bool(torch.isfinite(grads[-1]).all())
    assert grads[-1].abs().sum() > 0


def test_peers_without_a_sink_say_so():
    sink = registry.get_shape("g8-T8192-sink")
    for peer in ("sdpa-cudnn", "sdpa-fa2", "fa3", "flex"):
        why = unsupported(peer, sink)
        assert why and "sink" in why and "\n" not in why, peer
        assert unsupported(peer, registry.get_shape("g8-T8192")) is None, peer  # the twin runs them all
    assert unsupported("fla", sink) is None
    assert plan.peers_for(sink) == ["fla"] and plan.peers_for(registry.get_shape("gqa4-long-sink")) == ["fla"]
    assert set(plan.peers_for(registry.get_shape("gqa4-B4-T2048"), PEERS)) == set(PEERS)
    for name in ("packed-4x2048-G4", "packed-1x8192-G8", "packed-mixed-8192-G8"):
        assert plan.peers_for(registry.get_shape(name)) == ["flex", "fla"], name
        assert plan.peers_for(registry.get_shape(name), PEERS) == ["flex", "fla", "fa4", "fa4-det"], name
    assert "fa3" not in plan.peers_for(registry.get_shape("gqa4-long-D256"))  # its wheel is head-dim-128 only


def with_rows(data, rows):
    """`data` (test_runner.synthetic) plus registered rows with our median `us` (bwd and fwdbwd)."""
    for name, us in rows:
        s = registry.get_shape(name)
        c = {"fla_bwd": {"median_us": us, "tflops": 1.0}}
        data["results"].append({"shape": s.as_dict(), "errors": {}, "skipped_peers": {},
                                "modes": {m: {"candidates": c, "seconds": 1.0} for m in ("bwd", "fwdbwd")}})
    return data


def test_twin_ratio_per_visible_pair():
    data = with_rows(synthetic(), [("g8-T8192-sink", 3300.0), ("packed-mixed-8192-G8", 1500.0),
                                   ("packed-1x8192-G8", 2970.0), ("packed-4x2048-G4", 900.0)])
    dense, mixed = registry.get_shape("g8-T8192").pairs(), registry.get_shape("packed-mixed-8192-G8").pairs()
    got = summary.twin_ratios(data["results"], "bwd")  # g8-T8192 ran at 3000 us; gqa4-B4-T2048 did not run
    assert got["g8-T8192-sink"] == ("g8-T8192", pytest.approx(1.1))
    assert got["packed-1x8192-G8"] == ("g8-T8192", pytest.approx(0.99))
    assert got["packed-mixed-8192-G8"] == ("g8-T8192", pytest.approx((1500.0 / mixed) / (3000.0 / dense)))
    assert got["packed-mixed-8192-G8"][1] > 1500.0 / 3000.0  # fewer pairs: per pair it costs more than the time says
    assert set(got) == {"g8-T8192-sink", "packed-1x8192-G8", "packed-mixed-8192-G8"}
    head, body = summary.rows(data, "bwd", view="user")
    col = head.index(summary.TWIN_HEAD)
    cells = {r[0]: r[col] for r in body}
    assert cells["g8-T8192-sink"] == "1.100 (g8-T8192)" and cells["packed-1x8192-G8"] == "0.990 (g8-T8192)"
    assert cells["g8-T8192"] == cells["packed-4x2048-G4"] == "-"  # no twin; twin not in this record
    assert summary.TWIN_HEAD in summary.render(data, "bwd") and "per visible pair" in summary.TWIN_HEAD
    assert summary.TWIN_HEAD not in summary.rows(data, "bwd", view="dev")[0]
    assert summary.TWIN_HEAD not in summary.rows(synthetic(), "bwd")[0]  # no twin row: no column
    red = with_rows(synthetic(gate="red"), [("g8-T8192-sink", 3300.0)])
    assert summary.TWIN_HEAD not in summary.rows(red, "bwd")[0]  # a red gate reports no ratio
    kinds = {n: summary.row_kind(registry.get_shape(n).as_dict()) for n in NEW_ROWS}
    assert kinds["g8-T8192-sink"] == kinds["gqa4-long-sink"] == "sink" and kinds["packed-4x2048-G4"] == "varlen"
    assert kinds["gqa4-B4-T2048"] == kinds["gqa4-long-D256"] == "dense GQA"
