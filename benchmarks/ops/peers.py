# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Peers timed on the same inputs: FlexAttention, SDPA (cuDNN, FLASH_ATTENTION), upstream FLA 0.6, FA3 (JAX).

Each peer says why it cannot run (one line) instead of failing: not importable, or a shape it does not support.
Torch peers return a `Candidate` and are timed interleaved with this package; FA3 is timed apart with a wall
clock around N calls + block_until_ready, median of repeats, as the anchors were.
"""

import math
import os
from typing import Optional

import torch

from .candidates import Candidate, one_line

PEERS = ("flex", "sdpa-cudnn", "sdpa-fa2", "fla", "fa3")
_import_errors: dict = {}


def _leaves(inputs):
    return [t for t in (inputs["q"], inputs["k"], inputs["v"], inputs.get("g")) if t is not None]


# ---------------------------------------------------------------- FlexAttention
_flex_fn = None


def _flex():
    global _flex_fn
    if _flex_fn is None:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # one compiled graph per shape: lift dynamo's recompile limits so later shapes do not fall back to eager
        for key in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                    "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, key):
                setattr(torch._dynamo.config, key, 4096)
        _flex_fn = torch.compile(flex_attention, dynamic=False)
    return _flex_fn


def _flex_candidate(shape, inputs, do) -> Candidate:
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v, g = inputs["q"], inputs["k"], inputs["v"], inputs.get("g")
    W, T, dev = shape.W, q.shape[1], q.device
    doc = None
    if shape.varlen:
        cu = inputs["cu_seqlens"].long()
        doc = torch.zeros(T, dtype=torch.int32, device=dev)
        doc[cu[1:-1]] = 1
        doc = doc.cumsum(0, dtype=torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        m = q_idx >= kv_idx
        if W is not None:
            m = m & (q_idx - kv_idx < W)
        if doc is not None:
            m = m & (doc[q_idx] == doc[kv_idx])
        return m

    block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T, device=dev)
    flex = _flex()
    gqa = shape.G > 1

    def forward():
        score_mod = None
        if g is not None:
            gq = g.float().cumsum(1).transpose(1, 2)  # [B, HQ, T]; differences within a sequence only
            gk = gq.clone()  # flex refuses two indexings of one grad-requiring buffer

            def score_mod(score, b, h, q_idx, kv_idx):
                return score + gq[b, h, q_idx] - gk[b, h, kv_idx]
        o = flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), score_mod=score_mod,
                 block_mask=block_mask, enable_gqa=gqa)
        return o.transpose(1, 2)

    return Candidate(name="flex", forward=forward, leaves=_leaves(inputs), do=do, state={"block_mask": block_mask})


# ---------------------------------------------------------------- SDPA
def _sdpa_candidate(backend_name, shape, inputs, do) -> Candidate:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    gqa = shape.G > 1

    def forward():
        with sdpa_kernel(backend):  # the backend's own backward node is recorded by this forward
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=gqa)
        return o.transpose(1, 2)

    tag = {"CUDNN_ATTENTION": "sdpa-cudnn", "FLASH_ATTENTION": "sdpa-fa2"}[backend_name]
    return Candidate(name=tag, forward=forward, leaves=_leaves(inputs), do=do)


# ---------------------------------------------------------------- upstream FLA
def _fla_candidate(shape, inputs, do) -> Candidate:
    from fla.ops.attn.parallel import parallel_attn as fla_parallel_attn

    q, k, v, g, cu = inputs["q"], inputs["k"], inputs["v"], inputs.get("g"), inputs.get("cu_seqlens")

    def forward():
        return fla_parallel_attn(q, k, v, g=g, window_size=shape.W, cu_seqlens=cu)

    return Candidate(name="fla-0.6", forward=forward, leaves=_leaves(inputs), do=do)


# ---------------------------------------------------------------- availability
def unavailable(peer: str) -> Optional[str]:
    """None when the peer can be imported here, else a one-line reason (cached)."""
    if peer in _import_errors:
        return _import_errors[peer]
    reason = None
    try:
        if peer == "flex":
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401
        elif peer.startswith("sdpa"):
            from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401

            if not hasattr(SDPBackend, "CUDNN_ATTENTION" if peer == "sdpa-cudnn" else "FLASH_ATTENTION"):
                reason = f"this torch {torch.__version__} has no such SDPBackend"
        elif peer == "fla":
            os.environ["FLA_DISABLE_BACKEND_DISPATCH"] = "1"  # must precede the first import of fla
            from fla.ops.attn.parallel import parallel_attn  # noqa: F401
        elif peer == "fa3":
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            import jax
            from flash_attn3_jax import flash  # noqa: F401

            if not any(d.platform == "gpu" for d in jax.devices()):
                reason = "JAX sees no GPU"
        else:
            reason = f"unknown peer {peer!r}"
    except Exception as e:
        reason = f"not importable ({one_line(e, 120)})"
    _import_errors[peer] = reason
    return reason


def unsupported(peer: str, shape) -> Optional[str]:
    """None when the peer computes this shape's function, else why not."""
    if peer in ("sdpa-cudnn", "sdpa-fa2"):
        if shape.W is not None or shape.gated or shape.varlen:
            return "SDPA has no sliding window / gate / packed varlen"
    if peer == "fa3":
        if shape.K != 128 or shape.V != 128:
            return "the flash_attn3_jax wheel has head-dim-128 kernels only"
        if shape.gated:
            return "FA3 has no forget gate"
        if shape.varlen:
            return "FA3 varlen not wired in this harness"
        if shape.dtype == "fp32":
            return "FA3 is fp16/bf16 only"
    return None


def torch_candidate(peer: str, shape, inputs, do) -> Candidate:
    if peer == "flex":
        return _flex_candidate(shape, inputs, do)
    if peer == "sdpa-cudnn":
        return _sdpa_candidate("CUDNN_ATTENTION", shape, inputs, do)
    if peer == "sdpa-fa2":
        return _sdpa_candidate("FLASH_ATTENTION", shape, inputs, do)
    if peer == "fla":
        return _fla_candidate(shape, inputs, do)
    raise ValueError(f"{peer} is not a torch peer")


# ---------------------------------------------------------------- FA3 through JAX
def _to_jax(t: torch.Tensor):
    import jax
    import jax.numpy as jnp

    t = t.detach().contiguous()
    try:
        return jnp.array(jax.dlpack.from_dlpack(t), copy=True)  # own copy: no aliasing with torch's allocator
    except Exception:
        host = t.float().cpu().numpy()
        return jnp.asarray(host).astype(jnp.bfloat16 if t.dtype == torch.bfloat16 else jnp.float16)


def time_fa3(shape, inputs, do, mode: str, calls: int, repeats: int, warmup: int = 3) -> dict:
    """Median over `repeats` of the wall time of `calls` calls ended by block_until_ready, per call (us)."""
    import jax
    from flash_attn3_jax import flash

    from .timing import summarize, wall_median_us

    torch.cuda.synchronize()
    q, k, v, dout = (_to_jax(t) for t in (inputs["q"], inputs["k"], inputs["v"], do))
    cfg = dict(softmax_scale=1.0 / math.sqrt(shape.K), is_causal=True,
               window_size=(-1, -1) if shape.W is None else (shape.W - 1, 0))
    fwd = jax.jit(lambda q, k, v: flash._flash_mha_fwd(q, k, v, **cfg))
    bwd = jax.jit(lambda d, q, k, v, o, lse: flash._flash_mha_bwd(d, q, k, v, o, lse, **cfg))

    @jax.jit
    def fwdbwd(d, q, k, v):
        o, lse = flash._flash_mha_fwd(q, k, v, **cfg)
        return flash._flash_mha_bwd(d, q, k, v, o, lse, **cfg)

    if mode == "fwd":
        fn = lambda: fwd(q, k, v)  # noqa: E731
    elif mode == "bwd":
        o, lse = jax.block_until_ready(fwd(q, k, v))
        fn = lambda: bwd(dout, q, k, v, o, lse)  # noqa: E731
    else:
        fn = lambda: fwdbwd(dout, q, k, v)  # noqa: E731
    for _ in range(warmup):
        jax.block_until_ready(fn())
    samples = wall_median_us(fn, jax.block_until_ready, calls, repeats)
    out = summarize(samples)
    out["timer"] = f"wall clock, {repeats} repeats x {calls} calls + block_until_ready"
    return out
