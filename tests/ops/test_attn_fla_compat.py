# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Calls written for FLA's `parallel_attn` (fla/ops/attn/parallel.py, fla-org/flash-linear-attention) work here
unchanged, with FLA's meaning, or get a clear error where this package deliberately differs.

FLA: `parallel_attn(q, k, v, g=None, scale=None, window_size=None, cu_seqlens=None, chunk_indices=None, *,
sink_bias=None, **kwargs)`; `head_first` in kwargs raises DeprecationWarning, other keywords are ignored there.
"""

import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, assert_close

from fla_bwd.ops.attn import parallel_attn
from fla_bwd.ops.attn.naive import naive_parallel_attn

B, T, HQ, H, K, V = 1, 24, 4, 2, 16, 16


def _inputs(dtype=torch.float32, B=B):
    q = torch.randn(B, T, HQ, K, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(B, T, H, K, device=DEVICE).to(dtype).requires_grad_()
    v = torch.randn(B, T, H, V, device=DEVICE).to(dtype).requires_grad_()
    return q, k, v


def test_signature_matches_fla():
    params = inspect.signature(parallel_attn).parameters
    positional = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == ["q", "k", "v", "g", "scale", "window_size", "cu_seqlens", "chunk_indices"]
    assert params["sink_bias"].kind == params["sink_bias"].KEYWORD_ONLY
    for name in ("g", "scale", "window_size", "cu_seqlens", "chunk_indices", "sink_bias"):
        assert params[name].default is None, name


def test_fla_positional_call_with_gate_and_scale():
    """fla/ops/forgetting_attn/parallel.py calls `parallel_attn(q, k, v, g, scale, window_size=..., cu_seqlens=...)`."""
    q, k, v = _inputs()
    g = F.logsigmoid(torch.randn(B, T, HQ, device=DEVICE))
    o = parallel_attn(q, k, v, g, 0.2, window_size=5, cu_seqlens=None)
    assert_close("o", naive_parallel_attn(q, k, v, 0.2, 5, g=g), o)


def test_chunk_indices_accepted_positionally_and_ignored():
    """FLA's chunk_indices is `prepare_chunk_indices(cu_seqlens, 128)` precomputed by the caller: [NT, 2] of
    (sequence, tile within it), a cache of what cu_seqlens says. Here it is validated and unused: the same result,
    bitwise, as without it."""
    q, k, v = _inputs()
    cu = torch.tensor([0, 5, 24], dtype=torch.int64, device=DEVICE)
    chunk_indices = torch.tensor([[0, 0], [1, 0]], dtype=torch.int64, device=DEVICE)
    o = parallel_attn(q, k, v, None, None, None, cu, chunk_indices)
    assert torch.equal(o, parallel_attn(q, k, v, cu_seqlens=cu))
    with pytest.raises(ValueError, match=r"^chunk_indices must be \[NT, 2\]"):
        parallel_attn(q, k, v, cu_seqlens=cu, chunk_indices=chunk_indices[:, :1])
    with pytest.raises(TypeError, match=r"^chunk_indices must be int32 or int64"):
        parallel_attn(q, k, v, cu_seqlens=cu, chunk_indices=chunk_indices.float())


def test_head_first_refused_as_in_fla():
    q, k, v = _inputs()
    for value in (False, True):
        with pytest.raises(DeprecationWarning, match=r"^head_first has been removed.*\[B, T, H, \.\.\.\]"):
            parallel_attn(q, k, v, head_first=value)
        with pytest.raises(TypeError, match=r"^head_first has been removed"):
            parallel_attn(q, k, v, head_first=value)


@pytest.mark.parametrize("name", ["chunk_size", "windows_size", "dropout_p"])
def test_unknown_keywords_refused(name):
    """FLA swallows unknown keywords (**kwargs); this package refuses them so that a misspelt one is not ignored."""
    q, k, v = _inputs()
    with pytest.raises(TypeError, match=rf"^parallel_attn got unexpected keyword argument\(s\) {name}: FLA's "
                                        r"parallel_attn ignores unknown keywords"):
        parallel_attn(q, k, v, **{name: 64})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gate"])
def test_window_size_zero_with_sink(dtype, gate):
    """FLA, window_size=0 with a sink: its kernels mask every key (`o_q - o_k < 0` is never true and the
    off-diagonal loop is empty), the pivot is made finite and the sink's exp is the whole denominator, so o = 0 and
    lse = the sink's logit; in the backward delta = rowsum(o * dO) = 0, so dsink = -sum(p_sink * delta) = 0 and
    every P is 0, so dq = dk = dv = dg = 0. Mathematically the same: o does not depend on any input."""
    q, k, v = _inputs(dtype)
    g = F.logsigmoid(torch.randn(B, T, HQ, device=DEVICE)).requires_grad_() if gate else None
    sink = torch.randn(HQ, device=DEVICE).requires_grad_()
    o = parallel_attn(q, k, v, g, window_size=0, sink_bias=sink)
    assert o.shape == (B, T, HQ, V) and o.dtype == dtype
    assert torch.equal(o, torch.zeros_like(o))
    ref = naive_parallel_attn(q, k, v, None, 0, g=g, sink_bias=sink)  # the oracle agrees: exactly 0
    assert torch.equal(ref, torch.zeros_like(ref))
    do = torch.randn_like(o)
    leaves = [x for x in (q, k, v, g, sink) if x is not None]
    grads = torch.autograd.grad(o, leaves, do)
    refs = torch.autograd.grad(ref, leaves, do.float())
    for x, dx, rx in zip(leaves, grads, refs):
        assert dx is not None and dx.shape == x.shape and dx.dtype == x.dtype
        assert torch.equal(dx, torch.zeros_like(dx))
        assert torch.equal(rx, torch.zeros_like(rx))


def test_window_size_zero_without_sink_refused():
    """FLA returns NaN there (0 / 0: no term in the softmax); refused here with what to do."""
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"^window_size=0 masks every key, so without sink_bias .*FLA's "
                                         r"parallel_attn returns NaN.*pass window_size >= 1, None"):
        parallel_attn(q, k, v, window_size=0)


@pytest.mark.parametrize("W", [1, 3, T, 10 * T])
def test_window_sizes_as_fla(W):
    """W >= 1: query i sees keys [i - W + 1, i] (W >= T is full causal), with a sink."""
    q, k, v = _inputs()
    sink = torch.randn(HQ, device=DEVICE)
    o = parallel_attn(q, k, v, window_size=W, sink_bias=sink)
    assert_close("o", naive_parallel_attn(q, k, v, None, W, sink_bias=sink), o)


def test_negative_window_refused():
    """FLA does not check; a negative W masks every key there. Refused here."""
    q, k, v = _inputs()
    with pytest.raises(ValueError, match=r"^window_size must be >= 0"):
        parallel_attn(q, k, v, window_size=-1, sink_bias=torch.zeros(HQ, device=DEVICE))


def test_cu_seqlens_needs_batch_one_as_in_fla():
    q, k, v = _inputs(B=2)
    with pytest.raises(ValueError, match=r"cu_seqlens requires .*B == 1"):
        parallel_attn(q, k, v, cu_seqlens=torch.tensor([0, T], device=DEVICE))
