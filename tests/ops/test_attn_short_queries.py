# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Queries shorter than keys (issue 63): q `[B, Tq, HQ, K]` with k, v `[B, Tk, H, *]`, Tq <= Tk, aligned bottom-right
(query i at key position Tk - Tq + i, flash-attn >= 2.1), any offset Tk - Tq; the gate over the key positions.

The protocol of `helpers` (o, lse and every gradient against the fp32 oracle `naive_parallel_attn` on the same
shapes, error ratio < 0.005, poisoned buffers) at aligned offsets and at offsets that take each of `frame_tail`'s
layouts (zero query rows in front; keys dropped; zero keys in front), with a gate, windows, a sink, softcap, the lse,
non-causal pairs, K != V, the three dtypes, every seven-product dK/dV kernel; NaN/Inf containment against the
dependence of the short call itself (the framing must not widen it); determinism; bad shapes.
"""

import math

import pytest
import torch
from conftest import DEVICE
from helpers import compare
from test_attn_nan import _check_poisoned

from fla_bwd.ops.attn import host, naive_parallel_attn, parallel_attn, select_backward
from fla_bwd.ops.attn.autograd import frame_packed, frame_tail
from fla_bwd.ops.forgetting_attn import parallel_forgetting_attn
from fla_bwd.ops.utils.index import varlen_tiles
from fla_bwd.settings import dkv_path

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32


def _inputs(B, Tq, Tk, HQ, H, K, V, dtype, gate=False, sink=False):
    def randn(*shape, dt=dtype):
        return torch.randn(*shape, device=DEVICE).to(dt)

    x = {"q": randn(B, Tq, HQ, K), "k": randn(B, Tk, H, K), "v": randn(B, Tk, H, V)}
    if gate:
        x["g"] = torch.nn.functional.logsigmoid(randn(B, Tk, HQ, dt=f32))
    if sink:
        x["sink_bias"] = randn(HQ, dt=f32)
    return {n: t.requires_grad_() for n, t in x.items()}, randn(B, Tq, HQ, V), randn(B, Tq, HQ, dt=f32)


def _grads(fn, x, do, dlse, lse: bool, cast=lambda t: t):
    out = fn(**x)
    outs, grads_out = ([out[0], out[1]], [cast(do), dlse]) if lse else ([out], [cast(do)])
    grads = torch.autograd.grad(outs, list(x.values()), grads_out)
    res = {"o": outs[0], **{"d" + ("sink" if n == "sink_bias" else n): gr for n, gr in zip(x, grads)}}
    if lse:
        res["lse"] = outs[1]
    return res


def _check(B, Tq, Tk, HQ, H, K, V=None, dtype=bf16, gate=False, sink=False, lse=False, **kw):
    x, do, dlse = _inputs(B, Tq, Tk, HQ, H, K, V or K, dtype, gate, sink)
    out = _grads(lambda **a: parallel_attn(**a, return_lse=lse, **kw), x, do, dlse, lse)
    ref_x = dict(x)
    if sink:  # an fp32 leaf of its own, as `helpers.run_reference` does
        ref_x["sink_bias"] = x["sink_bias"].detach().clone().requires_grad_()
    ref = _grads(lambda **a: naive_parallel_attn(**a, return_lse=lse, **kw), ref_x, do, dlse, lse,
                 cast=lambda t: t.float())
    for name in ("o", "dq", "dk", "dv"):
        assert out[name].dtype == dtype, (name, out[name].dtype)
    assert out["o"].shape == (B, Tq, HQ, V or K) and out["o"].is_contiguous()
    compare(ref, out)
    return out


# Interpreter tiles are 32 wide: offsets 64 (aligned), 55/45 with a window reaching key 0 (zero query rows),
# 50 with W 9 (keys from 18 on), 34 with left 33 (zero keys in front).
CASES = [
    dict(B=2, Tq=20, Tk=84, HQ=4, H=2, K=32),  # aligned offset 64
    dict(B=2, Tq=20, Tk=75, HQ=4, H=2, K=32),  # zero query rows
    dict(B=1, Tq=17, Tk=70, HQ=2, H=1, K=32, gate=True),
    dict(B=1, Tq=20, Tk=70, HQ=2, H=1, K=32, window_size=9, gate=True, sink=True),  # keys from 18 on
    dict(B=2, Tq=10, Tk=45, HQ=2, H=1, K=32, window_size=30, gate=True),  # keys from 3 on
    dict(B=1, Tq=10, Tk=45, HQ=2, H=1, K=32, window_size=36),  # the window reaches key 0: zero query rows
    dict(B=1, Tq=40, Tk=70, HQ=4, H=2, K=32, dtype=f32, gate=True, sink=True, window_size=30),
    dict(B=1, Tq=33, Tk=77, HQ=4, H=1, K=64, V=32, dtype=f16, sink=True),
    dict(B=1, Tq=5, Tk=60, HQ=2, H=2, K=32, causal=False),
    dict(B=1, Tq=25, Tk=60, HQ=2, H=1, K=32, causal=False, window_size=(7, 11), lse=True),
    dict(B=1, Tq=10, Tk=44, HQ=2, H=1, K=32, causal=False, window_size=(33, 5), lse=True),  # zero keys in front
    dict(B=1, Tq=25, Tk=60, HQ=2, H=1, K=32, softcap=3.0, sink=True, gate=True, lse=True),
    dict(B=1, Tq=1, Tk=50, HQ=2, H=1, K=16, dtype=f16),  # one query: decoding a step against a cache
    dict(B=1, Tq=30, Tk=30, HQ=2, H=1, K=32, V=48),  # Tq == Tk: the ordinary call
    dict(B=1, Tq=12, Tk=50, HQ=2, H=1, K=160),
]


def _id(c):
    return "-".join(f"{k}{v}" for k, v in c.items()).replace("torch.", "").replace(" ", "")


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_short_queries_match_oracle(case):
    _check(**case)


@pytest.mark.parametrize("path", ["legacy", "gqa", "gqa-split2"])
def test_short_queries_dkv_kernels(path):
    with dkv_path(path):
        _check(B=1, Tq=21, Tk=70, HQ=4, H=2, K=32, gate=True, window_size=40)


def test_frame_layouts():
    """`frame_tail`'s layouts: aligned offsets as they are; zero query rows where the first query's window reaches
    key 0; else the keys from the first one a query sees, rounded down to the tiles (zero keys where that is
    before key 0)."""
    a = host.tail_alignment(32, bf16)
    assert frame_tail(20, 20 + 2 * a, 0, 32, bf16) == (0, 0)
    assert frame_tail(20, 20 + a + 5, 0, 32, bf16) == (5, 0)
    assert frame_tail(20, 20 + a + 5, a + 6, 32, bf16) == (5, 0)
    assert frame_tail(20, 20 + 2 * a + 5, 9, 32, bf16) == (0, a + 5)
    assert frame_tail(20, 20 + 2 * a + 5, 2 * a + 5, 32, bf16) == (0, 2 * a + 5 - 3 * a)


def test_short_queries_are_deterministic():
    x, do, _ = _inputs(1, 20, 70, 4, 2, 32, 32, bf16, gate=True, sink=True)
    a = _grads(lambda **kw: parallel_attn(**kw, window_size=9), x, do, None, False)
    b = _grads(lambda **kw: parallel_attn(**kw, window_size=9), x, do, None, False)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def _dependence(which: str, t: int, Tq: int, Tk: int, W: int, HQ: int, H: int) -> dict:
    """Which outputs depend on a non-finite k or v at key position t (batch 0, KV head 0) of the short call, by the
    short call's own visibility (query i at position Tk - Tq + i sees keys [pos - W + 1, pos])."""
    G = HQ // H
    pos = torch.arange(Tk - Tq, Tk)
    j = torch.arange(Tk)
    visible = (pos[:, None] >= j[None, :]) & (pos[:, None] - j[None, :] < W)  # [query, key]
    rows = torch.zeros(1, Tq, HQ, dtype=torch.bool)
    rows[0, :, :G] = visible[:, t, None]
    keys = (rows.transpose(1, 2).float() @ visible.float()).transpose(1, 2) > 0  # [1, Tk, HQ]
    kv = keys.view(1, Tk, H, G).any(3)
    return {"o": rows, "dq": rows, "dk": kv, "dv": torch.zeros_like(kv) if which == "v" else kv}


@pytest.mark.parametrize("which", ["k", "v"])
@pytest.mark.parametrize("t, W", [(45, 9), (41, 9), (10, 9), (30, 0)],
                         ids=["seen", "seen-by-no-query", "before-the-window", "causal"])
@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_short_queries_contain_nonfinite(which, t, W, value):
    """A NaN/Inf key or value reaches only what depends on it in the short call: a key that no query sees (the
    zero query rows or dropped keys of the framing would see some) changes nothing at all."""
    Tq, Tk, HQ, H = 20, 70, 2, 1
    x, do, _ = _inputs(1, Tq, Tk, HQ, H, 32, 32, bf16)
    kw = dict(window_size=W or None)
    clean = _grads(lambda **a: parallel_attn(**a, **kw), x, do, None, False)
    bad = {n: v.detach().clone() for n, v in x.items()}
    bad[which][0, t, 0] = value
    out = _grads(lambda **a: parallel_attn(**a, **kw), {n: v.requires_grad_() for n, v in bad.items()}, do, None,
                 False)
    _check_poisoned(out, clean, _dependence(which, t, Tq, Tk, W or Tk, HQ, H))


def _packed_check(lq, lk, HQ=4, H=2, K=32, dtype=bf16, gate=False, sink=False, lse=False, **kw):
    """Packed queries shorter than keys (cu_seqlens: q's offsets, cu_seqlens_k: k's) against the oracle, one call per
    sequence on its own slices, concatenated."""
    def offsets(lengths):
        return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)

    cq, ck = offsets(lq), offsets(lk)
    x, do, dlse = _inputs(1, sum(lq), sum(lk), HQ, H, K, K, dtype, gate, sink)
    out = _grads(lambda **a: parallel_attn(**a, cu_seqlens=cq, cu_seqlens_k=ck, return_lse=lse, **kw), x, do, dlse,
                 lse)
    ref_x = dict(x)
    if sink:
        ref_x["sink_bias"] = x["sink_bias"].detach().clone().requires_grad_()

    def oracle(q, k, v, g=None, sink_bias=None):
        outs = []
        for n in range(len(lq)):
            if lq[n]:
                a, b, c, d = cq[n], cq[n + 1], ck[n], ck[n + 1]
                outs.append(naive_parallel_attn(q[:, a:b], k[:, c:d], v[:, c:d], g=g[:, c:d] if g is not None else None,
                                                sink_bias=sink_bias, return_lse=True, **kw))
        o, l_ = torch.cat([o for o, _ in outs], 1), torch.cat([l_ for _, l_ in outs], 1)
        return (o, l_) if lse else o

    ref = _grads(oracle, ref_x, do, dlse, lse, cast=lambda t: t.float())
    compare(ref, out)


PACKED = [
    dict(lq=[20, 0, 33], lk=[75, 10, 33]),  # a sequence without queries, one without an offset
    dict(lq=[17, 5], lk=[70, 40], gate=True, sink=True),
    dict(lq=[20, 12], lk=[70, 44], window_size=9, gate=True),  # keys dropped in one, zero query rows in the other
    dict(lq=[10, 25], lk=[44, 60], causal=False, window_size=(33, 5), lse=True),
    dict(lq=[8, 1], lk=[8, 64], softcap=3.0, lse=True, dtype=f16),
    dict(lq=[30, 20], lk=[30, 20], sink=True),  # every sequence as many queries as keys: the ordinary packed call
]


@pytest.mark.parametrize("case", PACKED, ids=[_id(c) for c in PACKED])
def test_packed_short_queries_match_oracle(case):
    _packed_check(**case)


def test_packed_short_queries_dkv_kernels():
    for path in ("legacy", "gqa-split2"):
        with dkv_path(path):
            _packed_check([21, 3], [70, 35], gate=True, window_size=40)


def test_packed_frame_offsets_are_not_read_back(monkeypatch):
    """The framed offsets are the package's own (`index.own_offsets`): the plans know their tiles without a
    device-to-host read; only the user's two offsets are read."""
    cq = torch.tensor([0, 20, 33], dtype=torch.int32, device=DEVICE)
    ck = torch.tensor([0, 75, 108], dtype=torch.int32, device=DEVICE)
    frame = frame_packed(cq, ck, 33, 108, 0, 32, bf16)
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t) or original(t))
    for cu, total in ((frame.cu_q, int(frame.cu_q[-1])), (frame.cu_k, int(frame.cu_k[-1]))):
        assert varlen_tiles(cu, total).offsets == tuple(int(x) for x in cu)
    assert reads == []


def test_packed_short_query_errors():
    q = torch.randn(1, 30, 2, 32, device=DEVICE)
    k = torch.randn(1, 50, 1, 32, device=DEVICE)
    cq = torch.tensor([0, 10, 30], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="cu_seqlens_k .* needs cu_seqlens"):
        parallel_attn(q, k, k, cu_seqlens_k=torch.tensor([0, 50], dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="cu_seqlens_k must be int32 or int64"):
        parallel_attn(q, k, k, cu_seqlens=cq, cu_seqlens_k=torch.tensor([0.0, 50.0], device=DEVICE))
    with pytest.raises(ValueError, match="one sequence each"):
        parallel_attn(q, k, k, cu_seqlens=cq, cu_seqlens_k=torch.tensor([0, 50], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="sequence 1 has 20 queries .* and 15 keys"):
        parallel_attn(q, k, k, cu_seqlens=cq, cu_seqlens_k=torch.tensor([0, 35, 50], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="cu_seqlens_k must end at the packed length T = 50"):
        parallel_attn(q, k, k, cu_seqlens=cq, cu_seqlens_k=torch.tensor([0, 20, 40], dtype=torch.int32, device=DEVICE))


def test_forgetting_attn_takes_short_queries():
    """`parallel_forgetting_attn` passes q shorter than k (dense and packed) to `parallel_attn`: the same results."""
    x, do, _ = _inputs(1, 20, 70, 2, 1, 32, 32, bf16, gate=True)
    cq = torch.tensor([0, 12, 20], dtype=torch.int32, device=DEVICE)
    ck = torch.tensor([0, 40, 70], dtype=torch.int32, device=DEVICE)
    for kw in ({}, {"cu_seqlens": cq, "cu_seqlens_k": ck}):
        a = _grads(lambda q, k, v, g, kw=kw: parallel_forgetting_attn(q, k, v, g, **kw), x, do, None, False)
        b = _grads(lambda kw=kw, **y: parallel_attn(**y, **kw), x, do, None, False)
        for name in a:
            assert torch.equal(a[name], b[name]), name


def test_select_backward_says_tail_queries():
    """The dispatch explains a short call's route (seven products: tail queries), dense and packed, and a packed call
    whose sequences all have as many queries as keys is the ordinary packed call."""
    q, k = torch.randn(1, 20, 4, 32, device=DEVICE), torch.randn(1, 70, 2, 32, device=DEVICE)
    cq = torch.tensor([0, 12, 20], dtype=torch.int32, device=DEVICE)
    ck = torch.tensor([0, 40, 70], dtype=torch.int32, device=DEVICE)
    for route in (select_backward(q, k, k), select_backward(q, k, k, cu_seqlens=cq, cu_seqlens_k=ck)):
        assert route.five is None and "tail queries" in route.explain(), route.explain()
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE)
    route = select_backward(k.repeat(1, 1, 2, 1), k, k, cu_seqlens=cu, cu_seqlens_k=cu)
    assert "tail queries" not in route.explain() and "packed" in route.explain(), route.explain()
    with pytest.raises(ValueError, match="sequence 1 has 40 queries"):
        select_backward(k[:, :50].repeat(1, 1, 2, 1), k, k, cu_seqlens=torch.tensor([0, 10, 50], dtype=torch.int32,
                        device=DEVICE), cu_seqlens_k=ck)


def test_short_query_errors():
    q = torch.randn(1, 40, 2, 32, device=DEVICE)
    k = torch.randn(1, 30, 1, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"k must be \[B, Tk, H, K\] = \[1, Tk >= 40, H, 32\]"):
        parallel_attn(q, k, k)
    k = torch.randn(1, 50, 1, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"v must be \[B, T, H, V\]"):
        parallel_attn(q, k, k[:, :40])
    with pytest.raises(ValueError, match=r"g must be \[B, Tk, HQ\] = \[1, 50, 2\]"):
        parallel_attn(q, k, k, g=torch.zeros(1, 40, 2, device=DEVICE))
    cu = torch.tensor([0, 40], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="pass k's offsets as cu_seqlens_k"):
        parallel_attn(q, k, k, cu_seqlens=cu)


def test_short_queries_compile():
    """Under torch.compile: a dense short call in one graph (fullgraph; the framing is plain torch), a packed one
    with a graph break at `frame_packed` (it reads the offsets); both match eager."""
    torch._dynamo.reset()
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    x, do, _ = _inputs(1, 20, 70, 4, 2, 32, 32, bf16, gate=True)

    def dense(q, k, v, g):
        return parallel_attn(q, k, v, g=g, window_size=9)

    cq = torch.tensor([0, 12, 20], dtype=torch.int32, device=DEVICE)
    ck = torch.tensor([0, 40, 70], dtype=torch.int32, device=DEVICE)

    def packed(q, k, v, g):
        return parallel_attn(q, k, v, g=g, cu_seqlens=cq, cu_seqlens_k=ck)

    for fn, fullgraph in ((dense, True), (packed, False)):
        got = _grads(torch.compile(fn, backend=backend, fullgraph=fullgraph), x, do, None, False)
        want = _grads(fn, x, do, None, False)
        for name in want:
            assert torch.allclose(got[name].float(), want[name].float(), rtol=1e-3, atol=1e-3), (fn.__name__, name)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU (the interpreter has no streams or graphs)")
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_short_queries_whole_step_capture(packed):
    """Forward and backward captured in one CUDA graph (after warm-up calls, which fill the frame and tile caches)
    replay bitwise like eager."""
    x, do, _ = _inputs(1, 300, 1000, 8, 2, 64, 64, bf16, gate=True, sink=True)
    kw = dict(window_size=200)
    if packed:
        kw.update(cu_seqlens=torch.tensor([0, 100, 300], dtype=torch.int32, device=DEVICE),
                  cu_seqlens_k=torch.tensor([0, 450, 1000], dtype=torch.int32, device=DEVICE))

    def step():
        return _grads(lambda **a: parallel_attn(**a, **kw), x, do, None, False)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static = step()
    graph.replay()
    torch.cuda.synchronize()
    eager = step()
    for name in eager:
        assert torch.isfinite(eager[name]).all(), name
        assert torch.equal(eager[name], static[name]), name
