# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""CPU tests of the FlashAttention-4 peers (`fa4`, `fa4-det`): a fake `flash_attn.cute` records what the peer passes
on every row kind it runs; the rows it refuses, each with one line why; `unavailable` without FA4, without a GPU
and through its subprocess probe; the summary with and without FA4 columns; the install script's loud failures."""

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
import types

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_runner import synthetic  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.ops import peers, plan, registry, summary, timing  # noqa: E402
from benchmarks.ops.shapes import PEERS, RECORD_PEERS, Shape, unsupported  # noqa: E402

OP = registry.get_op("parallel_attn")


def small(s: Shape) -> Shape:
    """The row at two KV heads of G query heads each and head dim 16; dense rows at T = 64 (Tq rows: 32 queries,
    windows: 16 keys), packed rows keep their lengths."""
    s = dataclasses.replace(s, HQ=2 * s.G, H=2, K=16, V=16)
    if s.varlen:
        return s
    return dataclasses.replace(s, B=min(s.B, 2), T=64, Tq=None if s.Tq is None else 32,
                               W=None if s.W is None else 16)


@pytest.fixture
def fa4(monkeypatch):
    """A fake flash_attn.cute: each call is recorded as (function, q, k, v, keywords) and returns (o, None) as
    4.0.0b36 does, o of q's rows and v's head dim, differentiable in q, k, v and the sink."""
    calls = []

    def fake(name):
        def fn(q, k, v, **kw):
            calls.append((name, q, k, v, kw))
            o = q[..., : v.shape[-1]] * 2 + (k.float().sum() + v.float().sum()).to(q.dtype) * 0
            if kw.get("learnable_sink") is not None:
                o = o + kw["learnable_sink"].sum().to(q.dtype) * 0
            return o, None
        return fn

    mod = types.ModuleType("flash_attn.cute")
    mod.flash_attn_func, mod.flash_attn_varlen_func = fake("func"), fake("varlen")
    pkg = types.ModuleType("flash_attn")
    pkg.__path__, pkg.cute = [], mod
    monkeypatch.setitem(sys.modules, "flash_attn", pkg)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", mod)
    return calls


def run_peer(peer, name, mode="fwd"):
    """The peer's candidate on the reduced row, built and called once on the CPU: (shape, inputs, result)."""
    s = small(registry.get_shape(name))
    inputs = registry.make_inputs(OP, s, "cpu")
    do = torch.randn(inputs["q"].shape[:-1] + (s.V,)).to(torch.bfloat16)
    cand = peers.torch_candidate(peer, s, inputs, do)
    assert cand.name == peer and cand.leaves == [t for t in (inputs["q"], inputs["k"], inputs["v"],
                                                             inputs["sink_bias"]) if t is not None]
    return s, inputs, cand.build(mode)()


def base_kwargs(deterministic=False, **kw):
    out = dict(softmax_scale=16 ** -0.5, causal=True, window_size=(None, None), learnable_sink=None, softcap=0.0,
               deterministic=deterministic, return_lse=False)
    return dict(out, **kw)


# ------------------------------------------------------------------ what the peer passes
@pytest.mark.parametrize("peer", ["fa4", "fa4-det"])
def test_dense_causal_gqa_row(fa4, peer):
    s, inputs, o = run_peer(peer, "gqa4-long")
    (name, q, k, v, kw), = fa4
    assert name == "func" and q is inputs["q"] and k is inputs["k"] and v is inputs["v"]
    assert q.shape[2] == 4 * k.shape[2] == 8  # GQA: k and v keep their 2 heads
    assert kw == base_kwargs(deterministic=peer == "fa4-det")
    assert o.shape == (2, 64, 8, 16)  # o, not (o, lse)


def test_backward_reaches_every_leaf(fa4):
    _s, inputs, grads = run_peer("fa4-det", "gqa4-long-sink", mode="bwd")
    assert [g.shape for g in grads] == [inputs[n].shape for n in ("q", "k", "v", "sink_bias")]
    assert fa4[0][4]["learnable_sink"] is inputs["sink_bias"] and fa4[0][4]["deterministic"] is True


@pytest.mark.parametrize("name,changed", [
    ("g8-T8192-W512", dict(window_size=(15, 0))),  # W keys [i - W + 1, i]: left W - 1, right 0
    ("mha-long-softcap", dict(softcap=30.0)),
    ("g8-T4096-noncausal", dict(causal=False)),
    ("gqa4-long-lse", dict(return_lse=True)),
    ("g8-Tq1024-Tk8192", {}),  # q shorter than k: FA4 aligns it bottom-right, as ours
])
def test_variant_rows(fa4, name, changed):
    s, inputs, o = run_peer("fa4", name)
    (fn, q, k, v, kw), = fa4
    assert fn == "func" and kw == base_kwargs(**changed), name
    assert o.shape == inputs["q"].shape[:-1] + (s.V,) and isinstance(o, torch.Tensor)
    assert q.shape[1] == s.q_len and k.shape[1] == s.T


def test_window_of_the_registered_row():
    s = registry.get_shape("g8-T8192-W512")
    assert peers.fa4_kwargs(s, {}, False)["window_size"] == (511, 0)
    assert peers.fa4_kwargs(registry.get_shape("g8-T8192"), {}, True)["window_size"] == (None, None)


def test_sink_row(fa4):
    s, inputs, _o = run_peer("fa4", "g8-T8192-sink")
    kw = fa4[0][4]
    sink = kw.pop("learnable_sink")
    assert sink is inputs["sink_bias"] and sink.shape == (s.HQ,) == (16,)
    assert sink.dtype == torch.float32 and sink.requires_grad
    assert kw == {k: v for k, v in base_kwargs().items() if k != "learnable_sink"}


@pytest.mark.parametrize("peer", ["fa4", "fa4-det"])
def test_packed_row(fa4, peer):
    s, inputs, o = run_peer(peer, "packed-mixed-8192-G8")
    (fn, q, k, v, kw), = fa4
    assert fn == "varlen"
    for got, full in ((q, inputs["q"]), (k, inputs["k"]), (v, inputs["v"])):
        assert got.shape == full.shape[1:] and got.data_ptr() == full.data_ptr()  # [total, heads, D] views
    cu = inputs["cu_seqlens"]
    assert kw.pop("cu_seqlens_q") is cu and kw.pop("cu_seqlens_k") is cu and cu.dtype == torch.int32
    assert cu.tolist() == [0, 2227, 3096, 4329, 8192]
    assert kw.pop("max_seqlen_q") == kw.pop("max_seqlen_k") == 3863
    assert kw == base_kwargs(deterministic=peer == "fa4-det")
    assert o.shape == (1, 8192, 16, 16)  # back to the batch of one


def test_an_older_return_of_out_alone_is_taken_as_is():
    o = torch.zeros(2)
    assert peers._fa4_out((o, None)) is o and peers._fa4_out(o) is o


# ------------------------------------------------------------------ the rows it refuses
REFUSED = {  # row -> the words of its reason
    "g8-T8192-gated": "forget gate", "gqa4-long-gated": "forget gate", "varlen-gated-8192": "forget gate",
    "varlen-gated-16384": "forget gate", "ctl-fp32-g8-T2048": "fp16/bf16", "ctl-K128-V64-g8-T2048": "equal",
}


def test_rows_each_fa4_peer_refuses():
    for peer in ("fa4", "fa4-det"):
        refused = {s.name: unsupported(peer, s) for s in registry.SHAPES if unsupported(peer, s)}
        want = dict(REFUSED, **({"ctl-fwd-g8-T8192": "backward"} if peer == "fa4-det" else {}))
        assert set(refused) == set(want), peer
        for name, why in refused.items():
            assert want[name] in why and "\n" not in why and len(why) < 120, (peer, name, why)
    assert unsupported("fa4", registry.get_shape("gqa4-long-D256")) is None  # head dim 256: its SM90 path takes it
    for d, ok in ((64, True), (96, True), (256, True), (320, False), (12, False), (4, False)):
        s = Shape("x", 1, 64, 4, 2, d, d)
        assert (unsupported("fa4", s) is None) == ok, d
    assert "head dims" in unsupported("fa4", Shape("x", 1, 64, 4, 2, 320, 320))
    assert unsupported("fa4", Shape("x", 1, 64, 4, 4, 128, 64)) is None  # K != V without GQA
    assert "forget gate" in unsupported("fa4-det", Shape("x", 1, 64, 4, 2, 16, 16, gated=True, varlen=True))


def test_plan_counts_the_record_peers():
    """The split's estimates count the peers gpu_run.sh times by default: FA4 runs on request."""
    with open(os.path.join(REPO, "benchmarks", "gpu_run.sh")) as f:
        default = re.search(r"^PEERS=\$\{PEERS:-([a-z0-9,.-]+)\}$", f.read(), re.M).group(1)
    assert tuple(default.split(",")) == RECORD_PEERS and set(PEERS) - set(RECORD_PEERS) == {"fa4", "fa4-det"}
    g8 = registry.get_shape("g8-T8192")
    assert plan.peers_for(g8) == list(RECORD_PEERS) and plan.peers_for(g8, PEERS) == list(PEERS)
    assert plan.shape_estimate(g8, PEERS) > plan.shape_estimate(g8)  # FA4 has an (unmeasured) estimate


# ------------------------------------------------------------------ availability
@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(peers, "_import_errors", {})


def test_unavailable_without_flash_attn_cute(monkeypatch, fresh):
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    for peer in ("fa4", "fa4-det"):
        why = peers.unavailable(peer)
        assert why.startswith("not importable") and "install_fa4.sh" in why and "\n" not in why, why


def test_unavailable_without_a_gpu(fa4, monkeypatch, fresh):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    why = peers.unavailable("fa4")
    assert "no CUDA GPU" in why and "\n" not in why


def test_unavailable_runs_the_probe_per_mode(fa4, monkeypatch, fresh):
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(peers, "_run_probe", lambda code, args, ok, env, timeout_s: seen.append(args) or None)
    assert peers.unavailable("fa4") is None and peers.unavailable("fa4-det") is None
    assert peers.unavailable("fa4") is None and seen == [["0"], ["1"]]  # cached: one probe a peer


def test_probe_failure_is_one_line(monkeypatch):
    out = subprocess.CompletedProcess([], 1, stdout="", stderr="Traceback (most recent call last):\n  ...\n"
                                      "AssertionError: (head_dim, head_dim_v)=(128, 128) is not supported\n")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: out)
    why = peers._probe_fa4(deterministic=True)
    assert why == "probe failed (exit 1): AssertionError: (head_dim, head_dim_v)=(128, 128) is not supported"

    def late(*a, **k):
        raise subprocess.TimeoutExpired("python", 300)
    monkeypatch.setattr(subprocess, "run", late)
    assert peers._probe_fa4(deterministic=False) == "probe timed out after 300 s"


# ------------------------------------------------------------------ the summary with and without FA4
def with_fa4(data):
    """`data` (test_runner.synthetic) with fa4 and fa4-det timed on g8-T8192 only (skipped elsewhere)."""
    data = copy.deepcopy(data)
    for r in data["results"]:
        if r["shape"]["name"] != "g8-T8192":
            r["skipped_peers"].update({"fa4": "FA4 has no forget gate", "fa4-det": "FA4 has no forget gate"})
            continue
        for m in r["modes"].values():
            ours = m["candidates"]["fla_bwd"]["median_us"]
            for p, x in (("fa4", 0.8), ("fa4-det", 1.0)):
                m["candidates"][p] = dict(m["candidates"]["fla_bwd"], median_us=ours * x)
                m["vs"][p] = timing.ratio_stats([x])
    data["geomean"] = summary.aggregate(data["results"], ["bwd", "fwdbwd"])
    return data


def test_summary_orders_fa4_after_fa3_and_keeps_old_records():
    data = with_fa4(synthetic())
    head, body = summary.rows(data, "bwd", view="user")
    peer_cols = [h for h in head if h.endswith(" us (x)")]
    assert peer_cols == ["fa3 us (x)", "fa4 us (x)", "fa4-det us (x)", "flex us (x)"]
    cells = {r[0]: r[head.index("fa4 us (x)")] for r in body}
    assert cells["g8-T8192"] == "2400.0 (0.80x)" and cells["mha-short"] == "skip"
    ahead, abody, _ = summary.answer(data)
    assert [r[0] for r in abody] == ["fa3", "fa4", "fa4-det", "flex"]
    row = dict(zip(ahead, abody[1]))
    assert row["all rows (3)"] == "0.80 / 0.80 (1 of 3)" and row["gated (1)"] == "n/a"
    assert data["geomean"]["bwd"]["vs:fa4-det"]["n"] == 1
    text = summary.render(data, "bwd")
    assert "fa4: FA4 has no forget gate" in text and "fa4-det / fla_bwd (our speedup): 1.000" in text
    md = report.markdown(data)
    assert "fa4-det" in md and md.index("| fa4 ") < md.index("| flex ")
    old = synthetic()  # a record from before FA4: no column, no row, nothing breaks
    assert not any("fa4" in h for h in summary.rows(old, "bwd")[0])
    assert "fa4" not in report.markdown(old)


def test_the_record_of_main_still_renders():
    with open(os.path.join(REPO, "benchmarks", "results", "summary.json")) as f:
        data = json.load(f)
    for mode in ("bwd", "fwdbwd", "fwd"):
        assert "fa4" not in summary.render(data, mode)
    head, body, _ = summary.answer(data)
    assert "fa4" not in [r[0] for r in body] and report.markdown(data)


# ------------------------------------------------------------------ the install script fails loudly
def install(parts, tmp_path):
    env = dict(os.environ, FA4_PARTS=str(parts), FA4_SITE=str(tmp_path / "site"))
    return subprocess.run(["bash", os.path.join(REPO, "benchmarks", "tools", "install_fa4.sh")], env=env,
                          capture_output=True, text=True, timeout=60)


def stage(parts, wheels=7, corrupt=False):
    """Fake parts of a 10-byte archive in `parts` (fa4a/, fa4b/), as scripts/stage_fa4.sh lays them out."""
    for d, name, data in (("fa4a", "libs_cu12.tar.xz.part1", b"01234"), ("fa4b", "libs_cu12.tar.xz.part2", b"56789")):
        (parts / d).mkdir(parents=True, exist_ok=True)
        (parts / d / name).write_bytes(data)
    for i in range(wheels):
        (parts / "fa4b" / f"w{i}-1.0-py3-none-any.whl").write_bytes(b"not a wheel")
    whole = b"0123456789" if not corrupt else b"0123456780"
    import hashlib

    (parts / "fa4b" / "libs_cu12.tar.xz.sha256").write_text(f"{hashlib.sha256(whole).hexdigest()}  x\n")
    for d in ("fa4a", "fa4b"):
        subprocess.run("sha256sum -- * > SHA256SUMS", shell=True, cwd=parts / d, check=True)


@pytest.mark.parametrize("case,needle", [
    ("nothing", "missing"), ("no part 1", "missing"), ("changed", "does not match its SHA256SUMS"),
    ("wheels", "holds 6 wheels"), ("archive", "do not make the staged archive"),
])
def test_install_fa4_fails_loudly(tmp_path, case, needle):
    parts = tmp_path / "parts"
    parts.mkdir()
    if case != "nothing":
        stage(parts, wheels=6 if case == "wheels" else 7, corrupt=case == "archive")
    if case == "no part 1":
        (parts / "fa4a" / "libs_cu12.tar.xz.part1").unlink()
    if case == "changed":
        (parts / "fa4b" / "libs_cu12.tar.xz.part2").write_bytes(b"56788")
    proc = install(parts, tmp_path)
    assert proc.returncode == 1 and proc.stdout == "", (case, proc.stdout, proc.stderr)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("install_fa4: ") and needle in last, (case, proc.stderr)
    assert not (tmp_path / "site").exists()  # nothing installed before the parts check out
