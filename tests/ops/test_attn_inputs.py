# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""What the inputs of `parallel_attn` look like in real training (issue 6, split out of test_attn_robust.py): fp32
inputs under CUDA autocast, strided and non-contiguous inputs (last-dim slices, large outer strides, storage
offsets, stride-0 `expand()` of KV, q and do), and inputs on mismatched devices. Results are compared with the fp32
oracle `naive_parallel_attn` under the 0.005 error-ratio rule (`conftest.assert_close`); tests marked GPU-only
skip without CUDA. Transposes of [B, H, T, D] and T-slices are in test_attn.py."""

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, assert_close
from helpers import Case, check_against_oracle, compare, make_inputs
from robust_helpers import leaf as _leaf
from robust_helpers import needs_gpu

from fla_bwd.ops.attn import naive_parallel_attn, parallel_attn

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32


# ------------------------------------------------------------------------------------------------------------
# Autocast (GPU-only: parallel_attn's autocast handling is for CUDA autocast)
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
# Strided and odd inputs (transposes of [B, H, T, D] and T-slices are in test_attn.py)
# ------------------------------------------------------------------------------------------------------------

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


# ------------------------------------------------------------------------------------------------------------
# Inputs on mismatched devices (beyond test_attn_errors.py; GPU-only)
# ------------------------------------------------------------------------------------------------------------

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
# cu_seqlens edited in place without a version bump (issue 19)
# ------------------------------------------------------------------------------------------------------------

def test_cu_seqlens_edited_without_a_version_bump():
    """Offsets edited through views that do not bump the tensor's version counter (`.data`; on the CPU also
    `.numpy()`) are read anew at the next call: output and gradients equal, bitwise, a call with a fresh tensor of
    the new offsets, and an edit that makes them invalid raises before any kernel runs."""
    T, HQ, H, D = 60, 2, 1, 32
    q, k, v = (torch.randn(1, T, h, D, device=DEVICE, dtype=bf16, requires_grad=True) for h in (HQ, H, H))
    do = torch.randn(1, T, HQ, D, device=DEVICE, dtype=bf16)

    def run(cu):
        o = parallel_attn(q, k, v, cu_seqlens=cu)
        return (o,) + torch.autograd.grad(o, (q, k, v), do)

    cu = torch.tensor([0, 10, T], dtype=torch.int32, device=DEVICE)
    first = run(cu)
    version = cu._version
    edits = [(1, 45)] + ([(1, 25)] if cu.device.type == "cpu" else [])
    for i, (index, value) in enumerate(edits):
        if i == 0:
            cu.data[index] = value
        else:
            cu.numpy()[index] = value
        assert cu._version == version  # the edit is invisible to the version counter
        fresh = torch.tensor([0, value, T], dtype=torch.int32, device=DEVICE)
        for got, want in zip(run(cu), run(fresh)):
            assert torch.equal(got, want)
    assert not torch.equal(first[0], run(cu)[0])
    cu.data[1] = T + 10  # not non-decreasing any more
    with pytest.raises(ValueError, match="cu_seqlens must be non-decreasing"):
        parallel_attn(q, k, v, cu_seqlens=cu)


# ------------------------------------------------------------------------------------------------------------
# [B, H, T, D] passed as [B, T, H, D]: a LayoutWarning
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture
def no_kernels(monkeypatch):
    """Calls stop after validation (at the plan's first step): the warning tests run no kernel."""
    from fla_bwd.ops.utils import launch

    def stop(*args, **kwargs):
        raise _Stopped

    monkeypatch.setattr(launch.Plan, "run", stop)


class _Stopped(Exception):
    pass


def _call(q, k, v, **kwargs):
    try:
        parallel_attn(q, k, v, **kwargs)
    except _Stopped:
        pass


def _head_first(B=1, H=4, T=40, D=32):
    return tuple(torch.randn(B, H, T, D, device=DEVICE) for _ in range(3))


def test_head_first_layout_warns(no_kernels):
    """The issue's call: q, k, v = randn(1, 4, 40, 32) ([B, H, T, D] read as T = 4 tokens of 40 heads). The
    LayoutWarning (a UserWarning) names the shape, the fix and how to silence it, and points at the caller's line."""
    from fla_bwd.ops.utils.checks import LayoutWarning

    assert issubclass(LayoutWarning, UserWarning)
    with pytest.warns(LayoutWarning) as record:
        _call(*_head_first())
    assert len(record) == 1
    message = str(record[0].message)
    assert "q of shape (1, 4, 40, 32): T=4 tokens but HQ=40 heads" in message
    assert "q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)" in message
    assert 'warnings.filterwarnings("ignore", category=fla_bwd.LayoutWarning)' in message
    assert record[0].filename == __file__  # `_call`'s line: the first frame outside fla_bwd


def test_head_first_layout_warns_through_forgetting_attn(no_kernels):
    from fla_bwd.ops.forgetting_attn import parallel_forgetting_attn
    from fla_bwd.ops.utils.checks import LayoutWarning

    q, k, v = _head_first()
    with pytest.warns(LayoutWarning) as record:
        try:
            parallel_forgetting_attn(q, k, v, F.logsigmoid(torch.randn(1, 4, 40, device=DEVICE)))
        except _Stopped:
            pass
    assert [r.filename for r in record] == [__file__]


@pytest.mark.parametrize(
    "shapes, cu",
    [
        pytest.param(((1, 40, 4, 32), (1, 40, 4, 32)), None, id="token-major"),
        pytest.param(((1, 4, 4, 32), (1, 4, 4, 32)), None, id="T-equals-HQ"),
        pytest.param(((2, 3, 8, 32), (2, 3, 2, 32)), None, id="gqa-short"),  # a head-first GQA call fails on k
        pytest.param(((1, 3, 8, 32), (1, 3, 8, 32)), (0, 1, 3), id="packed-short"),
    ],
)
def test_no_layout_warning_for_valid_calls(no_kernels, shapes, cu):
    """No warning where T >= HQ, where k has fewer heads than q (GQA), or for a packed call (T is the total)."""
    import warnings

    (qs, ks) = shapes
    q, k = torch.randn(*qs, device=DEVICE), torch.randn(*ks, device=DEVICE)
    cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=DEVICE) if cu is not None else None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _call(q, k, k, cu_seqlens=cu_seqlens)


def test_layout_warning_once_per_call_site_and_shape(no_kernels):
    """Under Python's default filter the warning shows once per calling line and shape: a training loop sees it
    once, a second shape once more."""
    import warnings

    from fla_bwd.ops.utils.checks import LayoutWarning

    first, second = _head_first(), _head_first(T=48)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("default")
        for args in (first, first, first, second, second):
            _call(*args)
    assert [r.category for r in record] == [LayoutWarning, LayoutWarning]
    assert "(1, 4, 40, 32)" in str(record[0].message) and "(1, 4, 48, 32)" in str(record[1].message)


def test_layout_warning_silenced_by_its_category(no_kernels):
    import warnings

    from fla_bwd.ops.utils.checks import LayoutWarning

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=LayoutWarning)
        _call(*_head_first())
    assert record == []


def test_head_first_transposed_runs_without_warning():
    """The fix the warning gives: the transposes run silently and match the oracle over the right axis."""
    import warnings

    q, k, v = (t.to(bf16) for t in _head_first(H=2, T=20, D=16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o = parallel_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    ref = naive_parallel_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    assert_close("o[head-first transposed]", ref, o)


def test_layout_warning_under_torch_compile():
    """Under torch.compile the check runs eagerly (`torch.compiler.disable`): the same warning, attributed to the
    compiled function's line, and no warning from Dynamo about what it cannot trace."""
    import warnings

    from fla_bwd.ops.utils.checks import LayoutWarning, check_attn_inputs

    def f(q, k, v):
        check_attn_inputs(q, k, v, None, None, None, None, None)
        return q * 2

    q, k, v = _head_first()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.compile(f, backend="eager")(q, k, v)
    torch._dynamo.reset()
    assert [(r.category, r.filename) for r in record] == [(LayoutWarning, __file__)], [str(r.message) for r in record]
