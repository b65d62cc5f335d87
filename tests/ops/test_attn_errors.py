# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Invalid inputs to `parallel_attn` raise a ValueError/TypeError naming the argument, before any kernel runs."""

import re

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

from fla_bwd.ops.attn import parallel_attn
from fla_bwd.ops.utils import launch

B, T, HQ, H, K, V = 1, 8, 4, 2, 16, 16


def _inputs(dtype=torch.bfloat16, device=DEVICE, B=B, T=T, HQ=HQ, H=H, K=K, V=V):
    q = torch.randn(B, T, HQ, K, device=device).to(dtype)
    k = torch.randn(B, T, H, K, device=device).to(dtype)
    v = torch.randn(B, T, H, V, device=device).to(dtype)
    return q, k, v


@pytest.fixture(autouse=True)
def no_kernel_runs(monkeypatch):
    """Any kernel launch or buffer of a call (every one is a step of a plan, run by `Plan.run`) fails the test:
    validation must reject a bad input before any of them."""

    def forbidden(*args, **kwargs):
        raise AssertionError("validation let a bad input through: a launcher or an allocation started")

    monkeypatch.setattr(launch.Plan, "run", forbidden)


def _raises(exc, match, *args, **kwargs):
    with pytest.raises(exc, match=match):
        parallel_attn(*args, **kwargs)


def test_valid_call_reaches_the_forward():
    """Sanity check of the fixture: a valid call gets past validation (and is stopped by the fixture)."""
    with pytest.raises(AssertionError, match="a launcher or an allocation started"):
        parallel_attn(*_inputs())


# ------------------------------------------------------------------------------------------------------------
# Shapes and heads
# ------------------------------------------------------------------------------------------------------------

def test_heads_not_a_multiple():
    q, k, v = _inputs(HQ=6, H=4)
    _raises(ValueError, r"HQ=6.*multiple.*H=4", q, k, v)


def test_zero_kv_heads():
    q, k, v = _inputs(HQ=4, H=0)
    _raises(ValueError, r"H=0", q, k, v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_rank(which):
    q, k, v = _inputs()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which][0]
    _raises(ValueError, rf"^{which} must have 4 dimensions", **args)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_rank_of_flash_attn_varlen_layout(which):
    """flash-attn's varlen `[total_tokens, heads, dim]`: the error says to add the batch axis of 1."""
    q, k, v = _inputs()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which][0]
    _raises(ValueError, rf"^{which} must have 4 dimensions, got shape .*flash-attn's varlen layout.*"
                        rf"pass {which}\.unsqueeze\(0\) \(B = 1, and the same cu_seqlens\)", **args)


def test_rank_of_flash_attn_packed_qkv():
    """flash-attn's packed `[B, T, 3, H, D]` (and kv `[B, T, 2, H, D]`): the error says to unbind it."""
    q, k, v = _inputs(HQ=H)
    qkv = torch.stack([q, k, v], dim=2)
    _raises(ValueError, r"^q must have 4 dimensions.*packed qkv layout: pass q, k, v = qkv\.unbind\(2\)", qkv, k, v)
    _raises(ValueError, r"^k must have 4 dimensions.*packed kv layout: pass k, v = kv\.unbind\(2\)",
            q, torch.stack([k, v], dim=2), v)
    _raises(ValueError, r"^q must have 4 dimensions, got shape \(8, 16\)$", q[0, :, 0], k, v)  # no hint: 2-D


def test_k_shape_mismatch():
    q, k, v = _inputs()
    _raises(ValueError, r"^k must be \[B, Tk, H, K\] = \[1, Tk >= 8, H, 16\]", q, k[:, :-1], v[:, :-1])
    _raises(ValueError, r"^k must be \[B, Tk, H, K\]", q, torch.randn(B, T, H, K + 1, dtype=q.dtype, device=DEVICE), v)
    _raises(ValueError, r"^k must be \[B, Tk, H, K\]", q, torch.cat([k, k]), torch.cat([v, v]))


def test_v_shape_mismatch():
    q, k, v = _inputs()
    _raises(ValueError, r"^v must be \[B, T, H, V\]", q, k, v[:, :-1])
    _raises(ValueError, r"^v must be \[B, T, H, V\]", q, k, torch.randn(B, T, H + 1, V, dtype=q.dtype, device=DEVICE))


def test_head_first_gqa_says_transpose():
    """torch SDPA's `[B, H, T, D]` with fewer KV heads than query heads: k's shape mismatch names the layout."""
    q = torch.randn(1, 8, 12, K, device=DEVICE)  # [B, HQ, T, K]
    k = v = torch.randn(1, 2, 12, K, device=DEVICE)  # [B, H, T, K]
    _raises(ValueError, r"^k must be \[B, Tk, H, K\] = \[1, Tk >= 8, H, 16\] to match q \(1, 8, 12, 16\) .*got "
                        r"\(1, 2, 12, 16\): q and k look like \[B, H, T, D\] .*8 query heads, 2 key heads, 12 "
                        r"tokens.*pass q\.transpose\(1, 2\), k\.transpose\(1, 2\), v\.transpose\(1, 2\)", q, k, v)


def test_k_alone_head_first_says_transpose():
    q, k, v = _inputs(T=12)
    _raises(ValueError, r"^k must be \[B, Tk, H, K\].*: k looks like \[B, H, T, K\].*pass k\.transpose\(1, 2\)",
            q, k.transpose(1, 2), v)


def test_v_alone_head_first_says_transpose():
    q, k, v = _inputs(T=12)
    _raises(ValueError, r"^v must be \[B, T, H, V\].*: v looks like \[B, H, T, V\].*pass v\.transpose\(1, 2\)",
            q, k, v.transpose(1, 2))


def test_unrelated_shape_mismatch_gets_no_layout_hint():
    """A mismatch that is not a swap of axes 1 and 2 says nothing about layouts."""
    q, k, v = _inputs(T=12)
    for kk, vv in ((k[:, :-1], v[:, :-1]), (torch.cat([k, k]), torch.cat([v, v]))):
        with pytest.raises(ValueError, match=r"^k must be") as e:
            parallel_attn(q, kk, vv)
        assert "looks like" not in str(e.value) and "look like" not in str(e.value)
    with pytest.raises(ValueError, match=r"^v must be") as e:
        parallel_attn(q, k, v[:, :-1])
    assert "looks like" not in str(e.value)


def test_g_shape_and_rank():
    q, k, v = _inputs()
    _raises(ValueError, r"^g must be \[B, Tk, HQ\]", q, k, v, g=torch.zeros(B, T, H, device=DEVICE))
    _raises(ValueError, r"^g must be \[B, Tk, HQ\]", q, k, v, g=torch.zeros(B, T - 1, HQ, device=DEVICE))
    _raises(ValueError, r"^g must have 3 dimensions", q, k, v, g=torch.zeros(B, T, HQ, 1, device=DEVICE))
    _raises(TypeError, r"^g must be a torch.Tensor", q, k, v, g=[0.0] * T)


def test_sink_shape_and_rank():
    q, k, v = _inputs()
    _raises(ValueError, r"^sink_bias must be \[HQ\]", q, k, v, sink_bias=torch.zeros(H, device=DEVICE))
    _raises(ValueError, r"^sink_bias must have 1 dimensions", q, k, v, sink_bias=torch.zeros(1, HQ, device=DEVICE))


@pytest.mark.parametrize("which, dim", [("K (q.shape[3])", "K"), ("V (v.shape[3])", "V")])
def test_head_dim_too_large(which, dim):
    q, k, v = _inputs(**{dim: 257})
    _raises(ValueError, re.escape(f"head dim {which} must be in [1, 256], got 257"), q, k, v)


def test_not_tensors():
    q, k, v = _inputs()
    _raises(TypeError, r"^q must be a torch.Tensor", q.tolist(), k, v)
    _raises(TypeError, r"^v must be a torch.Tensor", q, k, None)


# ------------------------------------------------------------------------------------------------------------
# Dtypes and devices
# ------------------------------------------------------------------------------------------------------------

def test_mixed_dtypes():
    q, k, v = _inputs()
    _raises(TypeError, r"q, k and v must share one dtype", q, k.half(), v)
    _raises(TypeError, r"q, k and v must share one dtype", q.float(), k, v)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float64, torch.bool],
                         ids=["int32", "int64", "float64", "bool"])
def test_unsupported_q_dtype(dtype):
    q, k, v = _inputs(torch.float32)
    _raises(TypeError, rf"^q must be float16, bfloat16 or float32, got {dtype}", q.to(dtype), k, v)


def test_unsupported_kv_dtype():
    q, k, v = _inputs(torch.float32)
    _raises(TypeError, r"^k must be float16, bfloat16 or float32", q, k.double(), v)
    _raises(TypeError, r"^v must be float16, bfloat16 or float32", q, k, v.to(torch.int8))


def test_integer_gate_and_sink():
    q, k, v = _inputs()
    _raises(TypeError, r"^g must be a floating-point tensor", q, k, v, g=torch.zeros(B, T, HQ, dtype=torch.int32,
                                                                                        device=DEVICE))
    _raises(TypeError, r"^sink_bias must be a floating-point tensor", q, k, v,
            sink_bias=torch.zeros(HQ, dtype=torch.int64, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
def test_fp8_gate_and_sink(dtype):
    """Floating point, but not a dtype the kernels read (the interpreter failed deep in the forward's launch)."""
    q, k, v = _inputs()
    _raises(TypeError, r"^g must be a floating-point tensor of float16, bfloat16, float32 or float64, got",
            q, k, v, g=torch.zeros(B, T, HQ, device=DEVICE).to(dtype))
    _raises(TypeError, r"^sink_bias must be a floating-point tensor of float16, bfloat16, float32 or float64, got",
            q, k, v, sink_bias=torch.zeros(HQ, device=DEVICE).to(dtype))


@pytest.mark.parametrize("which", ["q", "k", "v", "g"])
def test_sparse_inputs(which):
    q, k, v = _inputs()
    args = dict(q=q, k=k, v=v, g=F.logsigmoid(torch.randn(B, T, HQ, device=DEVICE)))
    args[which] = args[which].to_sparse()
    _raises(TypeError, rf"^{which} must be a dense \(strided\) tensor, got layout torch.sparse_coo", **args)


@pytest.mark.parametrize("which", ["k", "v", "g", "sink_bias"])
def test_mixed_devices(which):
    """Tensors on two devices: the meta device stands in for a second device when there is no second GPU."""
    q, k, v = _inputs()
    args = {"q": q, "k": k, "v": v, "g": F.logsigmoid(torch.randn(B, T, HQ, device=DEVICE)),
            "sink_bias": torch.zeros(HQ, device=DEVICE)}
    args[which] = args[which].to("meta")
    _raises(ValueError, rf"one device.*{which} on meta", **args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU for a real second device")
def test_mixed_devices_cpu_cuda():
    q, k, v = _inputs(device="cuda")
    _raises(ValueError, r"one device.*k on cpu", q, k.cpu(), v)


def test_cu_seqlens_device():
    q, k, v = _inputs()
    cu = torch.tensor([0, T], dtype=torch.int32, device="meta")
    _raises(ValueError, r"^cu_seqlens must be on the inputs' device", q, k, v, cu_seqlens=cu)


# ------------------------------------------------------------------------------------------------------------
# cu_seqlens
# ------------------------------------------------------------------------------------------------------------

def _cu(values, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


def test_cu_seqlens_needs_batch_one():
    q, k, v = _inputs(B=2)
    _raises(ValueError, r"cu_seqlens requires .*B == 1, got B = 2", q, k, v, cu_seqlens=_cu([0, 3, T]))


def test_cu_seqlens_rank():
    q, k, v = _inputs()
    _raises(ValueError, r"^cu_seqlens must have 1 dimensions", q, k, v, cu_seqlens=_cu([[0, 3, T]]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.bool], ids=["float32", "int16", "bool"])
def test_cu_seqlens_dtype(dtype):
    q, k, v = _inputs()
    _raises(TypeError, r"^cu_seqlens must be int32 or int64", q, k, v, cu_seqlens=_cu([0, 3, T]).to(dtype))


@pytest.mark.parametrize(
    "values, match",
    [
        pytest.param([1, 3, T], r"^cu_seqlens must start at 0, got 1", id="start1"),
        pytest.param([-1, 3, T], r"^cu_seqlens must start at 0, got -1", id="start-1"),
        pytest.param([0, 5, 3, T], r"^cu_seqlens must be non-decreasing", id="decreasing"),
        pytest.param([0, 3, T - 1], rf"^cu_seqlens must end at the packed length T = {T}, got {T - 1}", id="short"),
        pytest.param([0, 3, T + 1], rf"^cu_seqlens must end at the packed length T = {T}, got {T + 1}", id="long"),
        pytest.param([0], r"^cu_seqlens must hold at least 2 offsets", id="one-offset"),
        pytest.param([], r"^cu_seqlens must hold at least 2 offsets", id="empty"),
    ],
)
def test_cu_seqlens_values(values, match):
    q, k, v = _inputs()
    _raises(ValueError, match, q, k, v, cu_seqlens=_cu(values, torch.int64))


def test_cu_seqlens_not_a_tensor():
    q, k, v = _inputs()
    _raises(TypeError, r"^cu_seqlens must be a torch.Tensor", q, k, v, cu_seqlens=[0, T])


# ------------------------------------------------------------------------------------------------------------
# window_size and scale
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("W", [-1, -100])
def test_window_size_negative(W):
    _raises(ValueError, rf"^window_size must be >= 0 .*got {W}", *_inputs(), window_size=W)


def test_window_size_zero_needs_a_sink():
    """FLA's window_size=0 masks every key: only a sink is left in the softmax (o = 0); without one there is no
    term at all (FLA returns NaN), which is refused."""
    _raises(ValueError, r"^window_size=0 masks every key, so without sink_bias .*pass window_size >= 1",
            *_inputs(), window_size=0)


@pytest.mark.parametrize("W", [2.5, 4.0, True, "8", torch.tensor(4)], ids=["2.5", "4.0", "True", "str", "tensor"])
def test_window_size_not_int(W):
    _raises(TypeError, r"^window_size must be an int, a \(left, right\) pair of ints or None", *_inputs(),
            window_size=W)


@pytest.mark.parametrize("W", [(15, 0), (0, 0), [7, -1], (-1, -1), (-1, 0)],
                         ids=["left15", "left0", "list-right-1", "none-1-1", "none-1-0"])
def test_window_size_flash_attn_pair_is_accepted(W):
    """flash-attn's `window_size=(left, right)` with causal=True and right 0 or -1 (issue 63; it was a TypeError
    that named the int to pass): query i sees keys i - left .. i (tests/ops/test_attn_noncausal.py checks it is
    bitwise the int window): validation lets it through to the forward (stopped by this file's fixture)."""
    with pytest.raises(AssertionError, match="a launcher or an allocation started"):
        parallel_attn(*_inputs(), window_size=W)


def test_window_size_pair_with_a_right_side_needs_causal_false():
    _raises(ValueError, r"^window_size=\(15, 3\) lets a query see 3 later key\(s\), which causal attention does "
            r"not: pass causal=False", *_inputs(), window_size=(15, 3))


@pytest.mark.parametrize("W", [(1, 2, 3), (1.5, 0), (True, 0)], ids=["three", "float", "bool"])
def test_window_size_other_pairs(W):
    with pytest.raises(TypeError, match=r"^window_size as a pair must be \(left, right\), two ints"):
        parallel_attn(*_inputs(), window_size=W)


@pytest.mark.parametrize("scale", [float("inf"), float("-inf"), float("nan"), 1e39, -1e300],
                         ids=["inf", "-inf", "nan", "1e39", "-1e300"])
def test_scale_not_finite(scale):
    """Python floats past float32's range too: the kernels take scale in fp32 (1e39 gave NaN gradients)."""
    _raises(ValueError, r"^scale must be finite", *_inputs(), scale=scale)


@pytest.mark.parametrize("scale", ["0.1", True, torch.tensor(0.1)], ids=["str", "bool", "tensor"])
def test_scale_not_a_number(scale):
    _raises(TypeError, r"^scale must be a Python float or None", *_inputs(), scale=scale)
