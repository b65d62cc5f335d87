# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn` in real training (issue 6): torch.compile, import time, autocast, strided/odd inputs, degenerate
sequences, NaN/Inf propagation, bad inputs (double backward, devices) and sizes past 2**31 elements.

Everything with a reference is compared with the fp32 oracle `naive_parallel_attn` under the 0.005 error-ratio
rule (`conftest.assert_close`). Tests marked GPU-only skip without CUDA; the multi-GPU part is in
test_attn_multigpu.py.
"""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, assert_close, error_ratio
from helpers import Case, Inputs, check_against_oracle, compare, make_inputs, run_parallel, run_reference

from fla_bwd.ops.attn import dkv_path, naive_parallel_attn, parallel_attn

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="GPU-only: needs a CUDA GPU; run on the H200")


# ------------------------------------------------------------------------------------------------------------
# 1. torch.compile(fullgraph=True, dynamic=True): one graph for every sequence length
# ------------------------------------------------------------------------------------------------------------

def test_compile_fullgraph_dynamic_no_recompiles():
    """A compiled function calling parallel_attn (gate + window) then `.sum()`, forward and backward, at three
    sequence lengths: compiled once (a counting backend wraps aot_eager on CPU, inductor on the GPU), no graph
    breaks (fullgraph), and o and every gradient match the eager op bitwise-close and the oracle."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    inner = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(len(gm.graph.nodes))
        return torch._dynamo.lookup_backend(inner)(gm, example_inputs)

    W = 8

    def f(q, k, v, g):
        o = parallel_attn(q, k, v, g=g, window_size=W)
        return o, o.sum()

    compiled = torch.compile(f, backend=counting_backend, fullgraph=True, dynamic=True)
    try:
        for T in (20, 37, 70):
            case = Case(B=2, T=T, HQ=4, H=2, K=32, dtype=bf16, gate=True, window=W)
            x = make_inputs(case)
            x.do = torch.ones_like(x.do)  # d(sum)/do
            o, loss = compiled(x.q, x.k, x.v, x.g)
            wrt = x.grad_inputs()
            grads = torch.autograd.grad(loss, list(wrt.values()))
            out = {"o": o, **dict(zip(wrt, grads))}
            # Eager on the same inputs: o, its sum and every gradient.
            o_eager = parallel_attn(x.q, x.k, x.v, g=x.g, window_size=W)
            eager = {"o": o_eager, **dict(zip(wrt, torch.autograd.grad(o_eager.sum(), list(wrt.values()))))}
            for name in out:
                assert torch.allclose(out[name].float(), eager[name].float(), rtol=1e-3, atol=1e-3), \
                    f"T={T} {name}: compiled != eager"
            assert torch.equal(loss, o_eager.sum()), f"T={T}: compiled loss != eager loss"
            compare(run_reference(case, x), out, tag=f"[compile T={T}]")
            assert len(compiles) == 1, f"recompiled at T={T}: {len(compiles)} compilations"
    finally:
        torch._dynamo.reset()
    print(f"compilations: {len(compiles)}, dynamo counters: {dict(torch._dynamo.utils.counters['stats'])}")


# ------------------------------------------------------------------------------------------------------------
# 2. Import time
# ------------------------------------------------------------------------------------------------------------

def test_import_time():
    """In a fresh interpreter: `import torch`, then `import fla_bwd.ops.attn` on top of it. Sanity bound: the
    package (triton included) under 10 s."""
    code = ("import time; t0 = time.time(); import torch; t1 = time.time(); import fla_bwd.ops.attn; "
            "t2 = time.time(); print(t1 - t0, t2 - t1)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    t_torch, t_pkg = map(float, proc.stdout.split()[-2:])
    print(f"import torch: {t_torch:.2f} s; import fla_bwd.ops.attn after torch: {t_pkg:.2f} s")
    assert t_pkg < 10.0, f"import fla_bwd.ops.attn took {t_pkg:.1f} s (torch itself {t_torch:.1f} s)"


# ------------------------------------------------------------------------------------------------------------
# 3. Autocast (GPU-only: parallel_attn's autocast handling is for CUDA autocast)
# ------------------------------------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_autocast_bf16(gate):
    """fp32 q/k/v (and g) under `torch.autocast('cuda', bfloat16)`: o is bf16, gradients come back fp32, and
    all match the oracle on the bf16-rounded inputs."""
    B, T, HQ, H, D = 2, 300, 8, 2, 64
    q = torch.randn(B, T, HQ, D, device="cuda", requires_grad=True)
    k = torch.randn(B, T, H, D, device="cuda", requires_grad=True)
    v = torch.randn(B, T, H, D, device="cuda", requires_grad=True)
    g = F.logsigmoid(torch.randn(B, T, HQ, device="cuda")).requires_grad_() if gate else None
    do = torch.randn(B, T, HQ, D, device="cuda").to(bf16)
    with torch.autocast("cuda", dtype=bf16):
        o = parallel_attn(q, k, v, g=g, window_size=100)
    assert o.dtype == bf16
    wrt = [q, k, v] + ([g] if gate else [])
    grads = torch.autograd.grad(o, wrt, do)
    for gr in grads:
        assert gr.dtype == torch.float32, f"gradient dtype {gr.dtype} for an fp32 input"
    rounded = [t.detach().to(bf16).float().requires_grad_() for t in (q, k, v)]
    g_ref = g.detach().clone().requires_grad_() if gate else None
    ref_o = naive_parallel_attn(*rounded, window_size=100, g=g_ref)
    ref_wrt = rounded + ([g_ref] if gate else [])
    ref_grads = torch.autograd.grad(ref_o, ref_wrt, do.float())
    assert_close("o[autocast]", ref_o, o)
    for name, r, gr in zip(("dq", "dk", "dv", "dg"), ref_grads, grads):
        assert_close(f"{name}[autocast]", r, gr)


# ------------------------------------------------------------------------------------------------------------
# 4. Strided and odd inputs (transposes of [B, H, T, D] and T-slices are in test_attn.py)
# ------------------------------------------------------------------------------------------------------------

def _leaf(t: torch.Tensor, requires_grad: bool = True) -> torch.Tensor:
    return t.detach().requires_grad_(requires_grad)


def test_last_dim_slices():
    """q/k/v/do as `x[..., :D]` of tensors with a larger last dim (row stride != D), and g as every other element
    of a [B, T, 2 * HQ] tensor (last-dim stride 2)."""
    case = Case(B=2, T=45, HQ=4, H=2, K=64, V=32, dtype=bf16, gate=True, window=20)
    x = make_inputs(case)

    def wide(t):
        big = torch.randn(*t.shape[:-1], t.shape[-1] + 24, device=DEVICE).to(t.dtype)
        big[..., :t.shape[-1]] = t.detach()
        out = big[..., :t.shape[-1]]
        assert not out.is_contiguous() and torch.equal(out, t.detach())
        return out

    x.q, x.k, x.v = (_leaf(wide(t)) for t in (x.q, x.k, x.v))
    x.do = wide(x.do)
    big_g = torch.randn(case.B, case.T, 2 * case.HQ, device=DEVICE)
    big_g[..., ::2] = x.g.detach()
    x.g = _leaf(big_g[..., ::2])
    assert x.g.stride(-1) == 2
    check_against_oracle(case, x)


def test_large_outer_stride():
    """q/k/v/do/g as every other batch element of a twice-larger batch (batch stride 2 * T * heads * D), plus
    a packed variant whose tensors are T-slices starting at a large offset of a bigger buffer."""
    case = Case(B=2, T=50, HQ=4, H=2, K=64, dtype=f16, gate=True)
    x = make_inputs(case)

    def every_other_batch(t):
        big = torch.randn(2 * t.shape[0], *t.shape[1:], device=DEVICE).to(t.dtype)
        big[::2] = t.detach()
        return big[::2]

    x.q, x.k, x.v, x.g = (_leaf(every_other_batch(t)) for t in (x.q, x.k, x.v, x.g))
    x.do = every_other_batch(x.do)
    assert x.q.stride(0) == 2 * case.T * case.HQ * case.K
    check_against_oracle(case, x)

    packed = Case(T=60, HQ=2, H=1, K=32, dtype=bf16, cu_seqlens=(0, 7, 31, 60))
    y = make_inputs(packed)

    def offset(t):
        big = torch.randn(1, 1000 + t.shape[1], *t.shape[2:], device=DEVICE).to(t.dtype)
        big[:, 1000:] = t.detach()
        return big[:, 1000:]

    y.q, y.k, y.v = (_leaf(offset(t)) for t in (y.q, y.k, y.v))
    y.do = offset(y.do)
    assert y.q.storage_offset() == 1000 * packed.HQ * packed.K
    check_against_oracle(packed, y)


@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bf16", "fp32"])
def test_kv_from_expand(dtype):
    """MQA-style KV shared by heads through `expand()`: k, v = base[B, T, 1, D].expand(B, T, H, D) (head stride
    0). The gradient reaches the [B, T, 1, D] bases as the sum over the H copies."""
    B, T, HQ, H, D = 2, 40, 4, 4, 32
    q = torch.randn(B, T, HQ, D, device=DEVICE).to(dtype).requires_grad_()
    kb = torch.randn(B, T, 1, D, device=DEVICE).to(dtype).requires_grad_()
    vb = torch.randn(B, T, 1, D, device=DEVICE).to(dtype).requires_grad_()
    do = torch.randn(B, T, HQ, D, device=DEVICE).to(dtype)
    k, v = kb.expand(B, T, H, D), vb.expand(B, T, H, D)
    assert k.stride(2) == 0
    o = parallel_attn(q, k, v, window_size=17)
    grads = torch.autograd.grad(o, [q, kb, vb], do)
    ref_o = naive_parallel_attn(q, kb.expand(B, T, H, D), vb.expand(B, T, H, D), window_size=17)
    ref = torch.autograd.grad(ref_o, [q, kb, vb], do.float())
    compare({"o": ref_o, "dq": ref[0], "dk": ref[1], "dv": ref[2]},
            {"o": o, "dq": grads[0], "dk": grads[1], "dv": grads[2]}, tag="[expand]")


def test_do_from_sum_and_expanded_q():
    """`o.sum().backward()` hands the backward a stride-0 (expanded) do; q is itself an expand() over the batch
    (batch stride 0) and its gradient is the sum over the batch."""
    B, T, HQ, H, D = 3, 33, 2, 1, 64
    qb = torch.randn(1, T, HQ, D, device=DEVICE).to(bf16).requires_grad_()
    k = torch.randn(B, T, H, D, device=DEVICE).to(bf16).requires_grad_()
    v = torch.randn(B, T, H, D, device=DEVICE).to(bf16).requires_grad_()
    parallel_attn(qb.expand(B, T, HQ, D), k, v).float().sum().backward()
    ref_q, ref_k, ref_v = (_leaf(t) for t in (qb, k, v))
    naive_parallel_attn(ref_q.expand(B, T, HQ, D), ref_k, ref_v).sum().backward()
    assert_close("dq[sum]", ref_q.grad, qb.grad)
    assert_close("dk[sum]", ref_k.grad, k.grad)
    assert_close("dv[sum]", ref_v.grad, v.grad)


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
# 5. Degenerate sequences
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [
    Case(T=20, HQ=2, H=1, K=32, dtype=bf16, cu_seqlens=(0, 0, 5, 5, 5, 20, 20)),
    Case(T=20, HQ=4, H=2, K=64, dtype=f16, gate=True, window=3, cu_seqlens=(0, 0, 5, 5, 5, 20, 20)),
    Case(T=20, HQ=2, H=2, K=32, dtype=f32, sink=0.0, gate=True, cu_seqlens=(0, 0, 0, 5, 5, 5, 20, 20, 20)),
    Case(T=40, HQ=2, H=1, K=32, dtype=bf16, gate=True, cu_seqlens=(0, 0, 0, 0, 40)),
], ids=lambda c: c.id)
def test_zero_length_segments(case):
    """cu_seqlens with repeated offsets (empty sequences, also leading/trailing): each non-empty sequence gets the
    oracle's result, every gradient finite (assert_close checks finiteness on the whole tensor)."""
    check_against_oracle(case)


@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("gate", [False, True], ids=["nogate", "gate"])
def test_length_one_segments_exact(dtype, gate):
    """A length-1 sequence attends to itself only: o == v and (bf16) dv == do exactly (MHA, no sink); dq, dk, dg are
    0 in the oracle (softmax over one key) and near 0 here; the other sequences match the oracle."""
    case = Case(T=30, HQ=2, H=2, K=32, dtype=dtype, gate=gate, cu_seqlens=(0, 1, 2, 3, 10, 11, 30))
    x = make_inputs(case)
    out = run_parallel(case, x)
    ones = [0, 1, 2, 10]
    assert torch.equal(out["o"][:, ones], x.v[:, ones].detach()), "o != v on length-1 sequences"
    if dtype == bf16:
        assert torch.equal(out["dv"][:, ones], x.do[:, ones]), "dv != do on length-1 sequences"
    else:
        # The backward recomputes the score as k . q (another summation order than the forward's q . k), so in
        # fp32 p may be 1 - ulp: a few ulp (measured 4e-7 relative) instead of exact.
        assert torch.allclose(out["dv"][:, ones], x.do[:, ones], rtol=2e-6, atol=0), "dv != do on length-1"
    compare(run_reference(case, x), out)


@pytest.mark.parametrize("sink", [False, True], ids=["nosink", "sink"])
def test_dense_t1(sink):
    """T = 1, B = 3 (dense): o == v exactly without a sink, and everything matches the oracle."""
    case = Case(B=3, T=1, HQ=4, H=2, K=64, dtype=bf16, gate=True, sink=float("nan") if sink else None)
    x = make_inputs(case)
    out = check_against_oracle(case, x)
    if not sink:
        assert torch.equal(out["o"], x.v.detach().repeat_interleave(2, dim=2))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_window_at_least_t_is_full_causal(packed):
    """window_size = T and 10 * T give bitwise the same o and gradients as window_size=None; with packing,
    window_size >= the longest sequence too. And that matches the oracle."""
    if packed:
        case = Case(T=50, HQ=4, H=2, K=32, dtype=bf16, gate=True, cu_seqlens=(0, 20, 21, 50))
        windows = (29, 50, 500)
    else:
        case = Case(B=2, T=45, HQ=4, H=2, K=32, dtype=bf16, gate=True)
        windows = (45, 450)
    x = make_inputs(case)
    full = check_against_oracle(case, x)
    for W in windows:
        out = run_parallel(case, x, fn=lambda x, W=W: parallel_attn(x.q, x.k, x.v, g=x.g, window_size=W,
                                                                      cu_seqlens=x.cu_seqlens))
        for name in full:
            assert torch.equal(full[name], out[name]), f"window_size={W}: {name} differs from window_size=None"


def _fp64_oracle(case: Case, x: Inputs) -> dict:
    """o and the gradients of an fp64 copy of the oracle (dense, no sink), for inputs where fp32 cannot resolve
    the gradients (the fp32 oracle itself is then no reference)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (x.q, x.k, x.v))
    g = x.g.detach().double().requires_grad_() if x.g is not None else None
    B, T, HQ, K = q.shape
    G = HQ // k.shape[2]
    s = q.transpose(1, 2) @ k.transpose(1, 2).repeat_interleave(G, 1).transpose(-1, -2) * K ** -0.5
    if g is not None:
        gc = g.cumsum(1).transpose(1, 2)
        s = s + gc[..., :, None] - gc[..., None, :]
    i = torch.arange(T, device=q.device)
    visible = i[:, None] >= i[None, :]
    if case.window is not None:
        visible = visible & (i[:, None] - i[None, :] < case.window)
    o = (torch.softmax(s.masked_fill(~visible, float("-inf")), -1)
         @ v.transpose(1, 2).repeat_interleave(G, 1)).transpose(1, 2)
    wrt = [q, k, v] + ([g] if g is not None else [])
    grads = torch.autograd.grad(o, wrt, x.do.double())
    return dict(zip(("o", "dq", "dk", "dv", "dg"), (o,) + grads))


def _very_negative_gate_inputs(dtype) -> tuple:
    case = Case(B=2, T=60, HQ=4, H=2, K=32, dtype=dtype, gate=True)
    x = make_inputs(case)
    x.g = _leaf(F.logsigmoid(-20 + 0.1 * torch.randn(case.B, case.T, case.HQ, device=DEVICE)))
    return case, x


@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bf16", "fp32"])
def test_very_negative_gates(dtype):
    """g = logsigmoid(-20 + small noise): every step forgets almost everything (G falls by ~20 per token, to
    ~-1200 at the end; off-diagonal probabilities ~e^-20). Everything finite; o and dv match the fp32 oracle.
    dq and dk are ~1e-7 (a cancellation in dP - delta that fp32 cannot resolve: the fp32 oracle itself is 10-40%
    off an fp64 oracle), so they are held to the fp32 noise floor of a unit-scale gradient instead: rms error
    against the fp64 oracle below 1e-5. dg has its own test below."""
    case, x = _very_negative_gate_inputs(dtype)
    out = run_parallel(case, x)
    for name, t in out.items():
        assert torch.isfinite(t).all(), f"{name} is not finite"
    ref = run_reference(case, x)
    compare({n: ref[n] for n in ("o", "dv")}, {n: out[n] for n in ("o", "dv")}, tag="[g -20]")
    exact = _fp64_oracle(case, x)
    for name in ("dq", "dk"):
        err = (out[name].double() - exact[name]).pow(2).mean().sqrt().item()
        print(f"{name}[g -20]: rms {exact[name].pow(2).mean().sqrt().item():.2e}, abs rms error vs fp64 {err:.2e}")
        assert err < 1e-5, f"{name}: rms error {err:.3e} against the fp64 oracle"
    packed = Case(T=60, HQ=2, H=1, K=32, dtype=dtype, gate=True, window=10, cu_seqlens=(0, 1, 33, 60))
    y = make_inputs(packed)
    y.g = _leaf(F.logsigmoid(-20 + 0.1 * torch.randn(1, packed.T, packed.HQ, device=DEVICE)))
    out = run_parallel(packed, y)
    for name, t in out.items():
        assert torch.isfinite(t).all(), f"packed: {name} is not finite"
    ref = run_reference(packed, y)
    compare({n: ref[n] for n in ("o", "dv")}, {n: out[n] for n in ("o", "dv")}, tag="[g -20 packed]")


@pytest.mark.parametrize("dtype", [bf16, f32], ids=["bf16", "fp32"])
def test_very_negative_gates_dg(dtype):
    """The same inputs: dg (~1e-7) against the fp32 oracle, which resolves it here (its error ratio against the
    fp64 oracle is ~5e-5, printed), under the 0.005 rule."""
    case, x = _very_negative_gate_inputs(dtype)
    out = run_parallel(case, x)
    ref = run_reference(case, x)
    exact = _fp64_oracle(case, x)
    print(f"dg: fp32 oracle vs fp64 oracle error ratio {error_ratio(exact['dg'], ref['dg']):.2e}, "
          f"kernel vs fp64 {error_ratio(exact['dg'], out['dg']):.2e}")
    assert_close("dg[g -20]", ref["dg"], out["dg"])


@pytest.mark.parametrize("case", [
    Case(B=2, T=40, HQ=4, H=2, K=32, dtype=bf16, sink=-1e4),
    Case(B=2, T=40, HQ=4, H=2, K=32, dtype=bf16, sink=-30.0, gate=True),
    Case(B=1, T=1, HQ=2, H=1, K=32, dtype=f32, sink=-1e4),
    Case(T=40, HQ=2, H=1, K=64, dtype=f16, sink=-1e4, window=5, cu_seqlens=(0, 1, 20, 40)),
], ids=lambda c: c.id)
def test_very_negative_sink(case):
    """A sink logit of ~-1e4 or ~-30 (exp underflows or nearly): finite, matches the oracle, dsink ~ 0."""
    check_against_oracle(case)


# ------------------------------------------------------------------------------------------------------------
# 6. NaN / Inf propagation: in test_attn_nan.py.
# ------------------------------------------------------------------------------------------------------------

# ------------------------------------------------------------------------------------------------------------
# 7. Bad input (beyond test_attn_errors.py)
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
    backward, seen in the Nsight profile of PERF.md #21), and the gradients stay right."""
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


@needs_gpu
def test_cpu_qkv_with_cuda_gate_or_sink():
    """q, k, v on the CPU while g or sink_bias is on CUDA: ValueError naming both devices."""
    q, k, v = (torch.randn(1, 8, 2, 16).to(bf16) for _ in range(3))
    with pytest.raises(ValueError, match=r"one device.*g on cuda.*q on cpu"):
        parallel_attn(q, k[:, :, :1], v[:, :, :1], g=torch.zeros(1, 8, 2, device="cuda"))
    with pytest.raises(ValueError, match=r"one device.*q on cpu.*sink_bias on cuda"):
        parallel_attn(q, k, v, sink_bias=torch.zeros(2, device="cuda"))
    with pytest.raises(ValueError, match=r"one device.*q on cuda"):
        parallel_attn(q.cuda(), k, v)


@needs_gpu
def test_cu_seqlens_on_wrong_device():
    """cu_seqlens on the CPU for CUDA inputs, and on CUDA for CPU inputs: ValueError naming cu_seqlens."""
    q, k, v = (torch.randn(1, 8, 2, 16).to(bf16) for _ in range(3))
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="^cu_seqlens must be on the inputs' device"):
        parallel_attn(q.cuda(), k.cuda(), v.cuda(), cu_seqlens=cu)
    with pytest.raises(ValueError, match="^cu_seqlens must be on the inputs' device"):
        parallel_attn(q, k, v, cu_seqlens=cu.cuda())


# ------------------------------------------------------------------------------------------------------------
# 8. Sizes past 2**31 elements (GPU-only)
# ------------------------------------------------------------------------------------------------------------

@needs_gpu
def test_past_int32_packed_vs_pieces():
    """B * T * HQ * D = 600000 * 32 * 128 = 2.46e9 > 2**31 (bf16 q is 4.9 GB), window 128: a packed call with
    cu_seqlens [0, T/2, T] against each half alone (each under 2**31). o, dq, dk, dv bitwise equal (the dK/dV
    kernel forced to one path for both). The last 128 tokens -- the highest addresses -- also match the oracle
    (with W = 128 they only see, and are only seen by, the last 256 tokens)."""
    T, HQ, H, D, W = 600_000, 32, 4, 128, 128
    assert T * HQ * D > 2 ** 31
    half = T // 2
    dev = "cuda"
    q = torch.randn(1, T, HQ, D, device=dev, dtype=bf16)
    k = torch.randn(1, T, H, D, device=dev, dtype=bf16)
    v = torch.randn(1, T, H, D, device=dev, dtype=bf16)
    do = torch.randn(1, T, HQ, D, device=dev, dtype=bf16)
    cu = torch.tensor([0, half, T], dtype=torch.int32, device=dev)
    with dkv_path("gqa"):
        qa, ka, va = (_leaf(t) for t in (q, k, v))
        o = parallel_attn(qa, ka, va, window_size=W, cu_seqlens=cu)
        dq, dk, dv = torch.autograd.grad(o, [qa, ka, va], do)
        del qa, ka, va
        for lo, hi in ((0, half), (half, T)):
            qp, kp, vp = (_leaf(t[:, lo:hi]) for t in (q, k, v))
            op = parallel_attn(qp, kp, vp, window_size=W)
            grads = torch.autograd.grad(op, [qp, kp, vp], do[:, lo:hi])
            for name, full, piece in zip(("o", "dq", "dk", "dv"), (o, dq, dk, dv), (op,) + grads):
                part = full[:, lo:hi]
                if not torch.equal(part, piece):
                    r = (part.float() - piece.float()).pow(2).mean().sqrt() / piece.float().pow(2).mean().sqrt()
                    assert r.item() < 1e-6, f"{name} on tokens [{lo}, {hi}): packed != alone (ratio {r.item():.3e})"
            del qp, kp, vp, op, grads
    tail = slice(T - 2 * W, T)
    qt, kt, vt = (_leaf(t[:, tail]) for t in (q, k, v))
    ref_o = naive_parallel_attn(qt, kt, vt, window_size=W)
    ref = torch.autograd.grad(ref_o, [qt, kt, vt], do[:, tail].float())
    for name, r, x in zip(("o", "dq", "dk", "dv"), (ref_o,) + ref, (o, dq, dk, dv)):
        assert_close(f"{name}[>2**31 tail]", r[:, -W:], x[:, T - W:])


@needs_gpu
def test_past_int32_varlen_total():
    """Many packed sequences whose total B * T * HQ * D passes 2**31 (only the gate's and lse's [HQ, T] buffers
    stay small), with a gate: the last sequence (past 2**31) matches the same sequence run alone bitwise."""
    T, HQ, H, D, W = 560_000, 32, 8, 128, 64
    assert T * HQ * D > 2 ** 31
    lens = [100_000, 1, 259_999, 200_000 - 3000, 3000]
    assert sum(lens) == T
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.randn(1, T, HQ, D, device="cuda", dtype=bf16)
    k = torch.randn(1, T, H, D, device="cuda", dtype=bf16)
    v = torch.randn(1, T, H, D, device="cuda", dtype=bf16)
    g = F.logsigmoid(torch.randn(1, T, HQ, device="cuda"))
    do = torch.randn(1, T, HQ, D, device="cuda", dtype=bf16)
    lo = T - lens[-1]
    with dkv_path("gqa"):
        leaves = [_leaf(t) for t in (q, k, v, g)]
        o = parallel_attn(*leaves[:3], g=leaves[3], window_size=W, cu_seqlens=cu)
        grads = torch.autograd.grad(o, leaves, do)
        full = [o[:, lo:]] + [gr[:, lo:] for gr in grads]
        del leaves, o, grads
        pieces = [_leaf(t[:, lo:]) for t in (q, k, v, g)]
        op = parallel_attn(*pieces[:3], g=pieces[3], window_size=W)
        alone = [op] + list(torch.autograd.grad(op, pieces, do[:, lo:]))
    for name, a, b in zip(("o", "dq", "dk", "dv", "dg"), full, alone):
        if not torch.equal(a, b):
            r = (a.float() - b.float()).pow(2).mean().sqrt() / b.float().pow(2).mean().sqrt()
            assert r.item() < 1e-6, f"{name}: last packed sequence != alone (ratio {r.item():.3e})"
