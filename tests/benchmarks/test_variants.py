# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""CPU tests of the call's variants in the benchmark registry (group "variants": causal=False, softcap, return_lse,
queries shorter than keys): every earlier row is unchanged (pairs, description, record, call), the new rows count
their pairs exactly, malformed variants are refused, the call passes only the keywords a row uses, each peer runs
a variant row only where it computes that function (Flex's masks and softcap checked against the oracle, eagerly),
and an earlier commit's package is timed only on the rows its signature can call."""

import dataclasses
import inspect
import os
import subprocess
import sys

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_runner import run_cli, synthetic  # noqa: E402

from benchmarks.ops import candidates, plan, registry, summary  # noqa: E402
from benchmarks.ops.shapes import (  # noqa: E402
    PEERS,
    Shape,
    ShapeError,
    brute_force_pairs,
    parse_custom,
    unsupported,
    visible_pairs,
)

OP = registry.get_op("parallel_attn")

# Every row registered before the variants, as computed at the commit before them: name -> (pairs, describe())
EARLIER_ROWS = {
    "g8-T8192": (33558528, "B1 T8192 HQ32 H4 D128 bf16"),
    "g8-T4096": (8390656, "B1 T4096 HQ32 H4 D128 bf16"),
    "g4-T2048-D64": (4196352, "B2 T2048 HQ32 H8 D64 bf16"),
    "gqa4-long": (4196352, "B2 T2048 HQ32 H8 D128 bf16"),
    "gqa4-short": (525312, "B4 T512 HQ32 H8 D128 bf16"),
    "mha-long": (4196352, "B2 T2048 HQ32 H32 D128 bf16"),
    "mha-short": (525312, "B4 T512 HQ32 H32 D128 bf16"),
    "g8-T8192-W512": (4063488, "B1 T8192 HQ32 H4 D128 W512 bf16"),
    "g8-T16384-W256": (4161664, "B1 T16384 HQ32 H4 D128 W256 bf16"),
    "g8-T8192-gated": (33558528, "B1 T8192 HQ32 H4 D128 gated bf16"),
    "gqa4-long-gated": (4196352, "B2 T2048 HQ32 H8 D128 gated bf16"),
    "varlen-gated-8192": (11082970, "B1 T8192 HQ32 H4 D128 gated varlen(N=4) bf16"),
    "varlen-gated-16384": (19356168, "B1 T16384 HQ32 H4 D128 gated varlen(N=8) bf16"),
    "g8-T8192-W256": (2064512, "B1 T8192 HQ32 H4 D128 W256 bf16"),
    "g8-T16384-W512": (8257792, "B1 T16384 HQ32 H4 D128 W512 bf16"),
    "mha-short-fp16": (525312, "B4 T512 HQ32 H32 D128 fp16"),
    "mha-long-fp16": (4196352, "B2 T2048 HQ32 H32 D128 fp16"),
    "g2-T2048-D64": (4196352, "B2 T2048 HQ32 H16 D64 bf16"),
    "g2-T2048-D128": (4196352, "B2 T2048 HQ32 H16 D128 bf16"),
    "g8-T2048-D64": (4196352, "B2 T2048 HQ32 H4 D64 bf16"),
    "g8-T2048-D128": (4196352, "B2 T2048 HQ32 H4 D128 bf16"),
    "ctl-fwd-g8-T8192": (33558528, "B1 T8192 HQ32 H4 D128 bf16"),
    "ctl-g16-T2048": (4196352, "B2 T2048 HQ32 H2 D128 bf16"),
    "ctl-fp32-g8-T2048": (2098176, "B1 T2048 HQ32 H4 D128 fp32"),
    "ctl-K128-V64-g8-T2048": (4196352, "B2 T2048 HQ32 H4 K128 V64 bf16"),
    "ctl-mha-T2048": (4196352, "B2 T2048 HQ32 H32 D128 bf16"),
    "gqa4-B4-T2048": (8392704, "B4 T2048 HQ32 H8 D128 bf16"),
    "packed-4x2048-G4": (8392704, "B1 T8192 HQ32 H8 D128 varlen(N=4) bf16"),
    "packed-1x8192-G8": (33558528, "B1 T8192 HQ32 H4 D128 varlen(N=1) bf16"),
    "packed-mixed-8192-G8": (11082970, "B1 T8192 HQ32 H4 D128 varlen(N=4) bf16"),
    "gqa4-long-sink": (4196352, "B2 T2048 HQ32 H8 D128 sink bf16"),
    "g8-T8192-sink": (33558528, "B1 T8192 HQ32 H4 D128 sink bf16"),
    "gqa4-long-D256": (4196352, "B2 T2048 HQ32 H8 D256 bf16"),
}
RECORD_KEYS = {"name", "B", "T", "HQ", "H", "K", "V", "W", "gated", "sink", "varlen", "dtype", "G", "seed", "group",
               "twin", "pairs", "describe"}

# name -> (twin, the Shape fields that differ from the twin, the keywords the call adds, exact pairs)
VARIANT_ROWS = {
    "g8-T4096-noncausal": ("g8-T4096", dict(causal=False), {"causal": False}, 4096 * 4096),
    "mha-long-softcap": ("mha-long", dict(softcap=30.0), {"softcap": 30.0}, 2 * 2048 * 2049 // 2),
    "g8-T8192-softcap": ("g8-T8192", dict(softcap=30.0), {"softcap": 30.0}, 8192 * 8193 // 2),
    "gqa4-long-lse": ("gqa4-long", dict(lse=True), {"return_lse": True}, 2 * 2048 * 2049 // 2),
    "g8-T8192-lse": ("g8-T8192", dict(lse=True), {"return_lse": True}, 8192 * 8193 // 2),
    # query i at key position 7168 + i sees 7168 + i + 1 keys
    "g8-Tq1024-Tk8192": ("g8-T8192", dict(Tq=1024), {}, sum(7168 + i + 1 for i in range(1024))),
}


def small(s: Shape, T: int = 64) -> Shape:
    """The row at one KV head of G query heads, head dim 16, length T (Tq rows: half of T): the interpreter's size."""
    return dataclasses.replace(s, B=min(s.B, 2), T=T, HQ=s.G, H=1, K=16, V=16, Tq=None if s.Tq is None else T // 2)


# ------------------------------------------------------------------ the earlier rows are unchanged
def test_earlier_rows_unchanged():
    earlier = [s for s in registry.SHAPES if s.group != "variants"]
    assert [s.name for s in earlier] == list(EARLIER_ROWS)  # the same rows, in the same order, first
    assert [s.name for s in registry.SHAPES[:len(EARLIER_ROWS)]] == list(EARLIER_ROWS)
    for s in earlier + registry.SMOKE_SHAPES:
        d = s.as_dict()
        assert set(d) == RECORD_KEYS | ({"seqlens"} if s.varlen else set()), s.name  # no new key in the record
        assert (s.causal, s.softcap, s.lse, s.Tq) == (True, None, False, None), s.name
        assert s.call_kwargs() == {} and s.variants() == [] and s.q_len == s.T, s.name
        assert summary.row_kind(d) != "variant", s.name
        if s.name in EARLIER_ROWS:
            pairs, describe = EARLIER_ROWS[s.name]
            assert (s.pairs(), s.describe(), d["pairs"], d["describe"]) == (pairs, describe, pairs, describe), s.name
            assert s.fwd_flops() == 2 * s.HQ * (s.K + s.V) * pairs


def test_earlier_rows_call_as_before():
    """The call of a row without a variant passes exactly the keywords it passed before them (an earlier commit's
    package is timed with it), and returns the op's output as it is."""
    seen = []

    def fake(q, k, v, **kw):
        seen.append(kw)
        return q

    for s in registry.SHAPES + registry.SMOKE_SHAPES:
        if s.group == "variants":
            continue
        t = small(s) if not s.varlen else dataclasses.replace(s, HQ=s.G, H=1, K=16, V=16, T=s.T)
        inputs = registry.make_inputs(OP, t, "cpu") if not s.varlen else None
        if inputs is None:  # packed rows: their lengths fix T; only the keyword set matters here
            inputs = {"q": torch.zeros(1), "k": None, "v": None, "g": None, "cu_seqlens": None, "sink_bias": None}
        assert OP.call(fake, inputs, t) is inputs["q"]
        want = {"g", "scale", "window_size", "cu_seqlens"} | ({"sink_bias"} if s.sink else set())
        assert set(seen[-1]) == want, s.name


# ------------------------------------------------------------------ the variant rows
def test_variant_rows_registered_last_with_their_twins():
    names = [s.name for s in registry.SHAPES]
    assert names[-len(VARIANT_ROWS):] == list(VARIANT_ROWS)
    assert registry.select_shapes("group:variants") == [registry.get_shape(n) for n in VARIANT_ROWS]
    assert "variants" in registry.GROUPS
    for name, (twin, diff, kw, pairs) in VARIANT_ROWS.items():
        s = OP.check(registry.get_shape(name))
        t = registry.get_shape(twin)
        assert s.group == "variants" and s.twin == twin and registry.twin_error(s) is None and s.peers is True
        assert dataclasses.replace(t, name=s.name, group=s.group, twin=s.twin, note=s.note, **diff) == s, name
        assert s.call_kwargs() == kw and s.variants() and summary.row_kind(s.as_dict()) == "variant"
        assert s.pairs() == pairs and s.fwd_flops() == 4 * s.HQ * s.K * pairs, name
        assert s.as_dict()["pairs"] == pairs and set(s.as_dict()) - RECORD_KEYS == {
            {"causal": "causal", "softcap": "softcap", "return_lse": "lse"}[k] for k in kw} | (
            {"Tq"} if s.Tq else set()), name
    by = {n: registry.get_shape(n) for n in VARIANT_ROWS}
    assert by["g8-T4096-noncausal"].pairs() == 2 * registry.get_shape("g8-T4096").pairs() - 4096  # less the diagonal
    for name in ("mha-long-softcap", "g8-T8192-softcap", "gqa4-long-lse", "g8-T8192-lse"):
        assert by[name].flops("bwd") == registry.get_shape(by[name].twin).flops("bwd"), name  # FLOPs unchanged
    tq = by["g8-Tq1024-Tk8192"]
    assert (tq.T, tq.Tq, tq.q_len, tq.pairs()) == (8192, 1024, 1024, 1024 * 7168 + 1024 * 1025 // 2)
    assert tq.describe() == "B1 Tq1024 Tk8192 HQ32 H4 D128 bf16"
    assert by["g8-T4096-noncausal"].describe() == "B1 T4096 HQ32 H4 D128 non-causal bf16"
    assert by["g8-T8192-softcap"].describe() == "B1 T8192 HQ32 H4 D128 softcap30 bf16"
    assert by["gqa4-long-lse"].describe() == "B2 T2048 HQ32 H8 D128 lse bf16"
    listing = run_cli("--list")
    assert listing.returncode == 0 and all(n in listing.stdout for n in VARIANT_ROWS), listing.stdout
    assert "[twin: g8-T4096]" in listing.stdout and "Tq1024 Tk8192" in listing.stdout


def test_shapes_and_registry_import_no_torch():
    code = ("import sys; import benchmarks.ops.registry, benchmarks.ops.shapes, benchmarks.ops.plan; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("n,window,causal,tq", [(1, None, True, 1), (9, None, True, 4), (9, 3, True, 4),
                                                (9, 3, True, 9), (9, 12, True, 2), (8, None, True, 0),
                                                (7, None, False, None), (7, None, False, 3), (13, 5, True, 13)])
def test_pairs_against_brute_force(n, window, causal, tq):
    assert visible_pairs(n, window, causal=causal, tq=tq) == brute_force_pairs([n], window, causal=causal, tq=tq)


def test_shape_pairs_against_brute_force():
    for s in (Shape("a", 2, 24, 4, 2, 16, 16, causal=False), Shape("b", 3, 24, 4, 2, 16, 16, Tq=7),
              Shape("c", 1, 40, 4, 1, 8, 8, W=5, Tq=13), Shape("d", 1, 16, 2, 1, 8, 8, softcap=5.0, lse=True),
              Shape("e", 2, 24, 4, 2, 16, 16, causal=False, Tq=5)):
        s.validate()
        assert s.pairs() == s.B * brute_force_pairs([s.T], s.W, causal=s.causal, tq=s.Tq), s.name


@pytest.mark.parametrize("bad,needle", [
    (dict(causal=False, W=16), "(left, right) pair"),
    (dict(causal=False, gated=True), "gate needs causal"),
    (dict(softcap=0.0), "softcap must be"),
    (dict(softcap=-1.0), "softcap must be"),
    (dict(softcap=float("inf")), "softcap must be"),
    (dict(softcap=float("nan")), "softcap must be"),
    (dict(Tq=65), "Tq must be in 1..T"),
    (dict(Tq=0), "Tq must be in 1..T"),
    (dict(Tq=32, varlen=True, lens=(32, 32)), "Tq with packed varlen"),
])
def test_variant_validation(bad, needle):
    with pytest.raises(ShapeError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        Shape("x", 1, 64, 4, 2, 16, 16, **bad).validate()
    with pytest.raises(ShapeError):
        OP.check(Shape("x", 1, 64, 4, 2, 16, 16, **bad))
    with pytest.raises(ValueError):
        visible_pairs(8, 3, causal=False)
    with pytest.raises(ValueError):
        visible_pairs(8, None, tq=9)


def test_custom_variants():
    s = parse_custom("B=1,T=1024,HQ=32,H=4,D=128,noncausal,SOFTCAP=30,lse")
    assert (s.causal, s.softcap, s.lse, s.Tq) == (False, 30.0, True, None)
    assert s.call_kwargs() == {"causal": False, "softcap": 30.0, "return_lse": True} and s.pairs() == 1024 * 1024
    s = parse_custom("B=1,T=1024,HQ=32,H=4,D=128,TQ=256,SOFTCAP=12.5")
    assert (s.Tq, s.softcap, s.q_len, s.pairs()) == (256, 12.5, 256, 256 * 768 + 256 * 257 // 2)
    assert parse_custom("B=1,T=64,HQ=4,H=2,D=16").as_dict() == Shape(
        "custom", 1, 64, 4, 2, 16, 16, group="custom").as_dict()
    for bad in ("B=1,T=64,HQ=4,H=2,D=16,TQ=65", "B=1,T=64,HQ=4,H=2,D=16,SOFTCAP=-3", "B=1,T=64,HQ=4,H=2,D=16,SOFTCAP=x",
                "B=1,T=64,HQ=4,H=2,D=16,W=8,noncausal", "B=1,T=64,HQ=4,H=2,D=16,gated,noncausal",
                "B=1,T=64,HQ=4,H=2,D=16,TQ=8,varlen", "B=1,T=64,HQ=4,H=2,D=16,TQ=1.5"):
        with pytest.raises(ShapeError):
            parse_custom(bad)


# ------------------------------------------------------------------ inputs and the call
@pytest.mark.parametrize("name", list(VARIANT_ROWS))
def test_variant_call_passes_only_its_keywords(name):
    from benchmarks.ops.bench import make_do

    s = small(registry.get_shape(name))
    inputs = registry.make_inputs(OP, s, "cpu")
    assert inputs["q"].shape == (s.B, s.q_len, s.HQ, 16) and inputs["k"].shape == (s.B, s.T, 1, 16)
    assert inputs["v"].shape == (s.B, s.T, 1, 16) and inputs["g"] is None and inputs["sink_bias"] is None
    assert make_do(s, inputs, "cpu").shape == (s.B, s.q_len, s.HQ, 16)  # dO has q's rows
    seen = []

    def fake(q, k, v, **kw):
        seen.append(kw)
        o = q[..., :1].expand(*q.shape[:-1], 16)
        return (o, torch.zeros(q.shape[:-1])) if kw.get("return_lse") else o

    out = OP.call(fake, inputs, s)
    kw = seen[0]
    assert set(kw) == {"g", "scale", "window_size", "cu_seqlens"} | set(VARIANT_ROWS[name][2])
    assert {k: kw[k] for k in VARIANT_ROWS[name][2]} == VARIANT_ROWS[name][2]
    assert isinstance(out, torch.Tensor) and out.shape == (s.B, s.q_len, s.HQ, 16)  # (o, lse) unpacked to o


@pytest.mark.parametrize("name", list(VARIANT_ROWS))
def test_variant_rows_through_the_harness_match_the_oracle(name):
    """Our op on each variant row, reduced, as the runner builds it (fwd, and bwd: autograd.grad over q, k, v),
    against the fp32 oracle; the call is the registry's."""
    from fla_bwd.ops.attn.naive import naive_parallel_attn

    s = small(registry.get_shape(name))
    device = "cuda" if torch.cuda.is_available() else "cpu"  # tests/conftest.py: the interpreter on a CPU
    inputs = registry.make_inputs(OP, s, device)
    do = torch.randn(s.B, s.q_len, s.HQ, 16).to(device, torch.bfloat16)
    cand = candidates.ours(OP.load(), OP.call, inputs, s, do, None)
    o = cand.build("fwd")()
    want = naive_parallel_attn(inputs["q"], inputs["k"], inputs["v"], causal=s.causal, softcap=s.softcap)
    assert o.shape == want.shape == (s.B, s.q_len, s.HQ, 16)
    assert (o.float() - want).abs().max() < 2e-2, name
    grads = cand.build("bwd")()
    assert [g.shape for g in grads] == [x.shape for x in (inputs["q"], inputs["k"], inputs["v"])]
    assert all(bool(torch.isfinite(g).all()) and g.abs().sum() > 0 for g in grads)


# ------------------------------------------------------------------ peers
PEER_ON_VARIANTS = {  # row -> the peers that time it
    "g8-T4096-noncausal": ["flex", "sdpa-cudnn", "sdpa-fa2", "fa3", "fa4", "fa4-det"],
    "mha-long-softcap": ["flex", "fa4", "fa4-det"],
    "g8-T8192-softcap": ["flex", "fa4", "fa4-det"],
    "gqa4-long-lse": ["fa3", "fa4", "fa4-det"],
    "g8-T8192-lse": ["fa3", "fa4", "fa4-det"],
    "g8-Tq1024-Tk8192": ["flex", "fa3", "fa4", "fa4-det"],
}


def test_peers_on_the_variant_rows():
    for name, want in PEER_ON_VARIANTS.items():
        s = registry.get_shape(name)
        assert plan.peers_for(s, PEERS) == want, name
        for peer in PEERS:
            why = unsupported(peer, s)
            assert (why is None) == (peer in want), (name, peer, why)
            assert why is None or ("\n" not in why and len(why) < 120), why
    assert "softcap" in unsupported("fa3", registry.get_shape("g8-T8192-softcap"))
    assert "top-left" in unsupported("sdpa-cudnn", registry.get_shape("g8-Tq1024-Tk8192"))
    assert "logsumexp" in unsupported("sdpa-fa2", registry.get_shape("g8-T8192-lse"))
    assert "causal only" in unsupported("fla", registry.get_shape("g8-T4096-noncausal"))
    assert "lse" in unsupported("flex", registry.get_shape("gqa4-long-lse"))
    gated_capped = Shape("x", 1, 64, 4, 2, 16, 16, gated=True, softcap=5.0)
    assert "gate" in unsupported("flex", gated_capped)


def test_fa3_config():
    from benchmarks.ops.peers import fa3_config

    assert fa3_config(registry.get_shape("g8-T4096")) == dict(softmax_scale=1.0 / 128 ** 0.5, is_causal=True,
                                                              window_size=(-1, -1))
    assert fa3_config(registry.get_shape("g8-T4096-noncausal"))["is_causal"] is False
    assert fa3_config(registry.get_shape("g8-T8192-W512"))["window_size"] == (511, 0)
    for name in ("g8-T8192-lse", "g8-Tq1024-Tk8192"):  # FA3's own call: causal, bottom-right for a shorter q
        assert fa3_config(registry.get_shape(name)) == fa3_config(registry.get_shape("g8-T8192"))


def test_sdpa_peer_passes_is_causal(monkeypatch):
    import torch.nn.functional as F

    from benchmarks.ops import peers

    seen = []
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: seen.append(kw) or q)
    for name, causal in (("g8-T4096-noncausal", False), ("g8-T4096", True)):
        s = small(registry.get_shape(name))
        inputs = registry.make_inputs(OP, s, "cpu")
        peers.torch_candidate("sdpa-cudnn", s, inputs, None).forward()
        assert seen[-1] == {"is_causal": causal, "enable_gqa": True}, name


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", ["g8-T4096-noncausal", "g8-Tq1024-Tk8192", "g8-T8192-softcap", "g8-T8192",
                                  "g8-T8192-W512"])
def test_flex_masks_and_softcap_match_the_oracle(name):
    """Flex, eager on the CPU, with the peer's mask (none where every key is visible; bottom-right for a shorter q)
    and softcap score_mod, computes the oracle's function on the reduced row."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from benchmarks.ops import peers
    from fla_bwd.ops.attn.naive import naive_parallel_attn

    s = small(registry.get_shape(name))
    if s.W is not None:
        s = dataclasses.replace(s, W=16)
    inputs = registry.make_inputs(OP, s, "cpu")
    q, k, v = (inputs[n].detach().float() for n in ("q", "k", "v"))  # Flex has no CPU backward
    mask_mod = peers.flex_mask_mod(s)
    assert (mask_mod is None) == (not s.causal)
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, None, None, s.q_len, s.T, device="cpu")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    if s.softcap:
        o = peers._capped_flex(s.softcap)(qt, kt, vt, block_mask, s.G > 1)
    else:
        o = flex_attention(qt, kt, vt, block_mask=block_mask, enable_gqa=s.G > 1)
    want = naive_parallel_attn(q, k, v, window_size=s.W, causal=s.causal, softcap=s.softcap)
    assert (o.transpose(1, 2) - want).abs().max() < 1e-4, name


# ------------------------------------------------------------------ an earlier commit's package
def test_baseline_only_on_rows_its_signature_can_call():
    def old(q, k, v, g=None, scale=None, window_size=None, cu_seqlens=None, chunk_indices=None, *, sink_bias=None):
        return q

    def dense_tail(q, k, v, g=None, scale=None, window_size=None, cu_seqlens=None, *, causal=True, softcap=None,
                   return_lse=False):
        return q

    ours = OP.load()
    assert "cu_seqlens_k" in inspect.signature(ours).parameters
    for s in registry.SHAPES:
        assert candidates.baseline_unsupported(ours, s) is None, s.name  # this package runs every row
        if s.group != "variants":
            assert candidates.baseline_unsupported(old, s) is None, s.name  # the earlier rows: as before
    for name, (_twin, _diff, kw, _pairs) in VARIANT_ROWS.items():
        s = registry.get_shape(name)
        why = candidates.baseline_unsupported(old, s)
        assert why and all(k in why for k in kw) and "not timed" in why, (name, why)
        assert (candidates.baseline_unsupported(dense_tail, s) is None) == (s.Tq is None), name
    assert "cu_seqlens_k" in candidates.baseline_unsupported(dense_tail, registry.get_shape("g8-Tq1024-Tk8192"))


def test_twin_ratio_of_a_shorter_q_is_per_visible_pair():
    data = synthetic()  # g8-T8192 at 3000 us
    s = registry.get_shape("g8-Tq1024-Tk8192")
    c = {"fla_bwd": {"median_us": 900.0, "tflops": 1.0}}
    data["results"].append({"shape": s.as_dict(), "errors": {}, "skipped_peers": {},
                            "modes": {"bwd": {"candidates": c, "seconds": 1.0}}})
    got = summary.twin_ratios(data["results"], "bwd")["g8-Tq1024-Tk8192"]
    dense = registry.get_shape("g8-T8192").pairs()
    assert got == ("g8-T8192", pytest.approx((900.0 / s.pairs()) / (3000.0 / dense)))
    head, body, groups = summary.answer(data)
    assert groups["variant"] == ["g8-Tq1024-Tk8192"] and "variant (1)" in head
