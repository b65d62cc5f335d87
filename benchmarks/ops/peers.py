# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Peers timed on the same inputs: FlexAttention, SDPA (cuDNN, FLASH_ATTENTION), upstream FLA 0.6, FA3 (JAX),
FA4 (flash_attn.cute, and its deterministic backward).

Each peer says why it cannot run (one line) instead of failing: not importable, or a shape it does not support.
Torch peers return a `Candidate` and are timed interleaved with this package; FA3 is timed apart with a wall
clock around N calls + block_until_ready, median of repeats, as the anchors were.
"""

import math
import os
import sys
from typing import Optional  # noqa: F401 - kept for callers

import torch
from einops import rearrange

from .candidates import Candidate, leaves_of, one_line
from .shapes import FA4_PEERS, PEERS, unsupported  # noqa: F401 - re-exported

_import_errors: dict = {}


# ---------------------------------------------------------------- FlexAttention
_flex_fns: dict = {}


def _gated_flex(q, k, v, g, block_mask, enable_gqa):
    """Flex with the forget gate as a score_mod; compiled whole, so the closure is built inside the graph."""
    from torch.nn.attention.flex_attention import flex_attention

    gq = rearrange(g.float().cumsum(1), "b t h -> b h t")  # differences within a sequence only
    gk = gq.clone()  # flex refuses two indexings of one grad-requiring buffer

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + gq[b, h, q_idx] - gk[b, h, kv_idx]

    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa)


def _capped_flex(cap: float):
    """Flex with logit soft-capping as a score_mod: cap * tanh(score / cap) on the scaled score (parallel_attn's
    softcap); `cap` is a constant of the compiled graph."""
    from torch.nn.attention.flex_attention import flex_attention

    def capped(q, k, v, block_mask, enable_gqa):
        def score_mod(score, b, h, q_idx, kv_idx):
            return cap * torch.tanh(score / cap)

        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=enable_gqa)

    return capped


def _flex(gated: bool, softcap: Optional[float] = None):
    """torch.compile(dynamic=False) of flex_attention (or of the gated or soft-capped wrapper); one graph per
    shape."""
    key = (gated, softcap or None)
    if key not in _flex_fns:
        import torch._dynamo
        from torch.nn.attention.flex_attention import flex_attention

        # one compiled graph per shape: lift dynamo's recompile limits so later shapes do not fall back to eager
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
        fn = _gated_flex if gated else _capped_flex(softcap) if softcap else flex_attention
        _flex_fns[key] = torch.compile(fn, dynamic=False)
    return _flex_fns[key]


def flex_mask_mod(shape, doc=None):
    """The row's visibility as a Flex mask_mod, or None where every query sees every key (causal=False, no window,
    one sequence): causal (query i at key position T - Tq + i where q is shorter: bottom-right), within the window,
    within the document `doc` (the packed token's sequence id)."""
    W, causal, off = shape.W, shape.causal, shape.T - shape.q_len
    if not causal and W is None and doc is None:
        return None

    def mask_mod(b, h, q_idx, kv_idx):
        pos = q_idx + off if off else q_idx
        m = pos >= kv_idx if causal else None
        if W is not None:
            m = (pos - kv_idx < W) if m is None else m & (pos - kv_idx < W)
        if doc is not None:
            m = (doc[q_idx] == doc[kv_idx]) if m is None else m & (doc[q_idx] == doc[kv_idx])
        return m

    return mask_mod


def _flex_candidate(shape, inputs, do) -> Candidate:
    from torch.nn.attention.flex_attention import create_block_mask

    q, k, v, g = inputs["q"], inputs["k"], inputs["v"], inputs.get("g")
    T, dev = k.shape[1], q.device
    doc = None
    if shape.varlen:
        cu = inputs["cu_seqlens"].long()
        doc = torch.zeros(T, dtype=torch.int32, device=dev)
        doc[cu[1:-1]] = 1
        doc = doc.cumsum(0, dtype=torch.int32)  # document id of every packed token

    mask_mod = flex_mask_mod(shape, doc)
    block_mask = None if mask_mod is None else create_block_mask(mask_mod, B=None, H=None, Q_LEN=q.shape[1],
                                                                 KV_LEN=T, device=dev)
    flex, gqa = _flex(g is not None, shape.softcap), shape.G > 1

    def forward():
        qt, kt, vt = (rearrange(x, "b t h d -> b h t d") for x in (q, k, v))  # views, as flex wants them
        if g is None:
            o = flex(qt, kt, vt, block_mask=block_mask, enable_gqa=gqa)
        else:
            o = flex(qt, kt, vt, g, block_mask, gqa)
        return rearrange(o, "b h t d -> b t h d")

    return Candidate(name="flex", forward=forward, leaves=leaves_of(inputs), do=do, state={"block_mask": block_mask})


# ---------------------------------------------------------------- SDPA
def _sdpa_candidate(backend_name, shape, inputs, do) -> Candidate:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    gqa, causal = shape.G > 1, shape.causal  # `unsupported` keeps SDPA off softcap, lse and Tq < Tk rows

    def forward():
        with sdpa_kernel(backend):  # the backend's own backward node is recorded by this forward
            qt, kt, vt = (rearrange(x, "b t h d -> b h t d") for x in (q, k, v))
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
        return rearrange(o, "b h t d -> b t h d")

    tag = {"CUDNN_ATTENTION": "sdpa-cudnn", "FLASH_ATTENTION": "sdpa-fa2"}[backend_name]
    return Candidate(name=tag, forward=forward, leaves=leaves_of(inputs), do=do)


# ---------------------------------------------------------------- upstream FLA
def _fla_candidate(shape, inputs, do) -> Candidate:
    from fla.ops.attn.parallel import parallel_attn as fla_parallel_attn

    q, k, v, g, cu = inputs["q"], inputs["k"], inputs["v"], inputs.get("g"), inputs.get("cu_seqlens")
    sink = {"sink_bias": inputs["sink_bias"]} if inputs.get("sink_bias") is not None else {}  # FLA 0.6 has sinks
    # `unsupported` keeps FLA 0.6 off every variant row (causal=False, softcap, return_lse, Tq < Tk): it has none

    def forward():
        return fla_parallel_attn(q, k, v, g=g, window_size=shape.W, cu_seqlens=cu, **sink)

    return Candidate(name="fla-0.6", forward=forward, leaves=leaves_of(inputs), do=do)


# ---------------------------------------------------------------- FlashAttention-4
def fa4_kwargs(shape, inputs: dict, deterministic: bool) -> dict:
    """flash_attn.cute's keywords for the row (`unsupported` keeps it off the rows it cannot compute). Its window
    (left, right) lets query i see keys i - left .. i + right, so our W is (W - 1, 0), and (None, None) is no window;
    causal=False is every key; a shorter q is aligned bottom-right, as ours; `learnable_sink` is our [HQ] fp32
    sink_bias (natural-log units, not scaled; FA4 returns its gradient); softcap 0.0 is off; return_lse only on a
    return_lse row (the loss stays on o). A packed row adds cu_seqlens (int32) and the longest sequence."""
    kw = dict(softmax_scale=1.0 / math.sqrt(shape.K), causal=shape.causal,
              window_size=(None, None) if shape.W is None else (shape.W - 1, 0),
              learnable_sink=inputs.get("sink_bias"), softcap=shape.softcap or 0.0, deterministic=deterministic,
              return_lse=bool(shape.lse))
    if shape.varlen:
        n = max(shape.seqlens())
        kw.update(cu_seqlens_q=inputs["cu_seqlens"], cu_seqlens_k=inputs["cu_seqlens"], max_seqlen_q=n,
                  max_seqlen_k=n)
    return kw


def _fa4_candidate(peer, shape, inputs, do) -> Candidate:
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    kw = fa4_kwargs(shape, inputs, deterministic=peer == "fa4-det")

    def forward():
        if shape.varlen:  # [total, heads, D] views of the packed B = 1 batch
            return _fa4_out(flash_attn_varlen_func(q[0], k[0], v[0], **kw)).unsqueeze(0)
        return _fa4_out(flash_attn_func(q, k, v, **kw))

    return Candidate(name=peer, forward=forward, leaves=leaves_of(inputs), do=do)


def _fa4_out(ret):
    """o from FA4's return: 4.0.0b36 returns (out, lse) on every call (lse None where not needed)."""
    return ret[0] if isinstance(ret, tuple) else ret


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
            reason = _probe_fa3()
            if reason is None:
                from flash_attn3_jax import flash  # noqa: F401
        elif peer in FA4_PEERS:
            reason = _fa4_reason(deterministic=peer == "fa4-det")
            if reason is None:
                from flash_attn.cute import flash_attn_func, flash_attn_varlen_func  # noqa: F401
        else:
            reason = f"unknown peer {peer!r}"
    except Exception as e:
        reason = f"not importable ({one_line(e, 120)})"
    _import_errors[peer] = reason
    return reason


_FA3_PROBE = """
import jax, jax.numpy as jnp
from flash_attn3_jax import flash
assert any(d.platform == "gpu" for d in jax.devices()), "JAX sees no GPU"
q = jax.random.normal(jax.random.PRNGKey(0), (1, 256, 2, 128), jnp.float32).astype(jnp.bfloat16)
cfg = dict(softmax_scale=128 ** -0.5, is_causal=True, window_size=(-1, -1))
o, lse = jax.jit(lambda q: flash._flash_mha_fwd(q, q, q, **cfg))(q)
dq, dk, dv = jax.jit(lambda q, o, lse: flash._flash_mha_bwd(o, q, q, q, o, lse, **cfg))(q, o, lse)
jax.block_until_ready(dv)
print("fa3-ok")
"""


def _probe_fa3(timeout_s: float = 120.0) -> Optional[str]:
    """Run a tiny FA3 forward and backward in a subprocess first: a JAX/CUDA clash or a crash there costs a
    skipped peer, not this process."""
    return _run_probe(_FA3_PROBE, [], "fa3-ok", dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"), timeout_s)


def _run_probe(code: str, args: list, ok: str, env: dict, timeout_s: float) -> Optional[str]:
    """None when `python -c code *args` exits 0 and prints `ok`, else a one-line reason."""
    import subprocess

    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"probe timed out after {timeout_s:.0f} s"
    if proc.returncode == 0 and ok in proc.stdout:
        return None
    lines = [x for x in (proc.stderr + proc.stdout).strip().splitlines() if x.strip()]
    return f"probe failed (exit {proc.returncode}): {lines[-1][:200] if lines else 'no output'}"


def _fa4_reason(deterministic: bool) -> Optional[str]:
    """Why FA4 cannot run here, checked without running its code in this process: not installed, no CUDA GPU, or
    its probe (a tiny forward + backward in a subprocess) failed; None when the probe passed."""
    import importlib.util

    found = sys.modules.get("flash_attn.cute", False)  # imported already (None: an import blocked)
    if found is False:
        try:
            found = importlib.util.find_spec("flash_attn.cute")
        except ImportError:  # no package flash_attn at all
            found = None
    if found is None:
        return "not importable: no flash_attn.cute (flash-attn-4; benchmarks/tools/install_fa4.sh installs it)"
    if not torch.cuda.is_available():
        return "no CUDA GPU here: FA4 runs on NVIDIA GPUs only (sm_80 and newer; this harness times its sm_90 path)"
    return _probe_fa4(deterministic)


_FA4_PROBE = """
import sys, torch
from flash_attn.cute import flash_attn_func
q = torch.randn(1, 256, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(1, 256, 2, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
ret = flash_attn_func(q, k, v, causal=True, deterministic=sys.argv[1] == "1")
o = ret[0] if isinstance(ret, tuple) else ret
o.backward(torch.randn_like(o))
torch.cuda.synchronize()
assert all(bool(torch.isfinite(t.grad).all()) for t in (q, k, v)), "non-finite gradient"
print("fa4-ok")
"""


def _probe_fa4(deterministic: bool, timeout_s: float = 300.0) -> Optional[str]:
    """A tiny FA4 forward and backward (GQA, causal, head dim 128, bf16; deterministic as the peer) in a subprocess
    first: a crash there, or in its kernels' compile, costs a skipped peer, not this process."""
    return _run_probe(_FA4_PROBE, ["1" if deterministic else "0"], "fa4-ok", dict(os.environ), timeout_s)


def torch_candidate(peer: str, shape, inputs, do) -> Candidate:
    if peer == "flex":
        return _flex_candidate(shape, inputs, do)
    if peer == "sdpa-cudnn":
        return _sdpa_candidate("CUDNN_ATTENTION", shape, inputs, do)
    if peer == "sdpa-fa2":
        return _sdpa_candidate("FLASH_ATTENTION", shape, inputs, do)
    if peer == "fla":
        return _fla_candidate(shape, inputs, do)
    if peer in FA4_PEERS:
        return _fa4_candidate(peer, shape, inputs, do)
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


def fa3_config(shape) -> dict:
    """The keyword arguments of FA3's `_flash_mha_fwd` / `_flash_mha_bwd` for the row. causal=False: is_causal=False
    (W is None there); q shorter than k: FA3 aligns it bottom-right, as parallel_attn does; a return_lse row: FA3's
    forward returns (o, lse) on every row. `unsupported` keeps it off softcap rows (the wheel passes softcap=0.0)."""
    return dict(softmax_scale=1.0 / math.sqrt(shape.K), is_causal=shape.causal,
                window_size=(-1, -1) if shape.W is None else (shape.W - 1, 0))


def time_fa3(shape, inputs, do, mode: str, calls: int, repeats: int, warmup: int = 3) -> dict:
    """Median over `repeats` of the wall time of `calls` calls ended by block_until_ready, per call (us)."""
    import jax
    from flash_attn3_jax import flash

    from .timing import summarize, wall_median_us

    torch.cuda.synchronize()
    q, k, v, dout = (_to_jax(t) for t in (inputs["q"], inputs["k"], inputs["v"], do))
    cfg = fa3_config(shape)
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
