# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Argument validation for the attention ops: every bad input gets a ValueError/TypeError naming the argument.

Where a bad input is another library's convention (flash-attn's `window_size=(left, right)` or its varlen
`[total_tokens, heads, dim]`, torch SDPA's `[B, H, T, D]`), the error says what to pass here instead. A valid call
whose shape suggests `[B, H, T, D]` passed as `[B, T, H, D]` gets a `LayoutWarning` (`warn_if_head_first`).

It also refuses, before any kernel, tensors the kernels cannot run on: real meta tensors (no data), CPU tensors when
Triton's interpreter is off, any tensor when the interpreter is only half on (`triton_mode`), and devices other than
CUDA for compiled kernels.
"""

import numbers
import os
import sys
import warnings
from typing import Optional

import torch
import triton
import triton.language as tl

MAX_HEAD_DIM = 256
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
GATE_DTYPES = FLOAT_DTYPES + (torch.float64,)  # g and sink_bias: read in their own dtype, then in fp32
FP32_MAX = torch.finfo(torch.float32).max


def _tensor(name: str, x, ndim: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}: use {name}.to_dense()")
    if x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}{_rank_hint(name, x, ndim)}")
    return x


def _rank_hint(name: str, x: torch.Tensor, ndim: int) -> str:
    """For q, k or v of the wrong rank, the flash-attn layout it looks like and how to pass it here ("" if none)."""
    if ndim != 4 or name not in ("q", "k", "v"):
        return ""
    if x.dim() == 3:
        return (f": [total_tokens, heads, dim] is flash-attn's varlen layout; here packed sequences are "
                f"[1, total_tokens, heads, dim] with cu_seqlens: pass {name}.unsqueeze(0) (B = 1, and the same "
                f"cu_seqlens), and o.squeeze(0) gives [total_tokens, heads, dim] back")
    if x.dim() == 5 and x.shape[2] in (2, 3):
        packed = "qkv" if x.shape[2] == 3 else "kv"
        names = "q, k, v" if packed == "qkv" else "k, v"
        return (f": [B, T, {x.shape[2]}, H, D] is flash-attn's packed {packed} layout: pass {names} = "
                f"{packed}.unbind(2)")
    return ""


def _float(name: str, x: torch.Tensor) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")


def _gate_float(name: str, x: torch.Tensor) -> None:
    if x.dtype not in GATE_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor of float16, bfloat16, float32 or float64, "
                        f"got {x.dtype}")


# ----------------------------------------------------------------------------------------------------------------
# Can the kernels run at all? (Triton's interpreter, devices)
# ----------------------------------------------------------------------------------------------------------------

INTERPRETED, COMPILED, MIXED = "interpreted", "compiled", "mixed"


@triton.jit
def _probe():
    # A kernel of this package decorated in the same import as the others: its type is what @triton.jit chose for
    # fla_bwd, whichever of our modules are loaded when `triton_mode` first runs.
    pass


def _kernel_types() -> tuple:
    """(InterpretedFunction or None, the set of types of this package's kernel objects, the type of tl.sum)."""
    from fla_bwd.ops.utils.triton_private import kernel_types

    KernelInterface, JITFunction, InterpretedFunction, GluonJITFunction = kernel_types()
    leaves = (JITFunction,) + ((InterpretedFunction,) if InterpretedFunction is not None else ())
    ours = {type(_probe)}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "fla_bwd" or name.startswith("fla_bwd.")):
            continue
        for x in list(vars(module).values()):
            while isinstance(x, KernelInterface) and not isinstance(x, leaves) and hasattr(x, "fn"):
                x = x.fn  # triton.heuristics / autotune wrappers
            if isinstance(x, GluonJITFunction):
                continue
            if isinstance(x, leaves) and getattr(getattr(x, "fn", None), "__module__", "").startswith("fla_bwd"):
                ours.add(type(x))
    # triton.language's own @jit helpers (tl.sum, tl.max, tl.cdiv, ...) were decorated when triton was imported.
    return InterpretedFunction, ours, type(tl.sum)


# Under torch.compile the answer is a constant of the process: traced as one, so no guard watches the module scan.
@torch.compiler.assume_constant_result
def triton_mode() -> str:
    """How this package's kernels will run: `INTERPRETED`, `COMPILED` or `MIXED`, decided from the types of the
    kernel objects, not from the TRITON_INTERPRET variable.

    Triton 3.6-3.9 decide per `@triton.jit` decoration (`triton.runtime.jit.jit` reads `knobs.runtime.interpret`,
    i.e. TRITON_INTERPRET, at that moment): an `InterpretedFunction` when it is set, a `JITFunction` otherwise. So a
    variable set after `import triton` (which decorates `triton.language`'s own helpers such as `tl.sum`) but before
    `import fla_bwd` gives interpreted kernels that call compiled helpers, which fails inside the first kernel with
    "Cannot call @triton.jit'd outside of the scope of a kernel": that is `MIXED`. A variable set after
    `import fla_bwd` leaves the kernels compiled (`COMPILED`). Computed once (the types cannot change), then a
    module global.
    """
    global _MODE
    if _MODE is None:
        interpreted_type, ours, lib = _kernel_types()
        types = ours | {lib}
        if interpreted_type is not None and types == {interpreted_type}:
            _MODE = INTERPRETED
        elif interpreted_type is None or interpreted_type not in types:
            _MODE = COMPILED
        else:
            _MODE = MIXED
    return _MODE


_MODE: Optional[str] = None


def _interpret_hint() -> str:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return (" (TRITON_INTERPRET is set now, but was not when triton and fla_bwd were imported: Triton chooses "
                "interpreted or compiled when each kernel is decorated, at import)")
    return ""


def check_runnable(name: str, x: torch.Tensor) -> None:
    """Refuse a tensor the kernels cannot run on, with what to do. Called for non-CUDA tensors (and once for CUDA
    ones, until `triton_mode` is known): the CUDA path costs `check_attn_inputs` one device-type compare."""
    device = x.device
    if device.type == "meta":
        if torch.compiler.is_compiling() or _is_fake(x):
            return  # torch.compile traces fake tensors through the op's fake implementation: nothing runs
        raise ValueError(f"{name} is a meta tensor (a shape without data), so there is nothing to compute on: pass "
                         f"real tensors on a CUDA device (or on the CPU with TRITON_INTERPRET=1 set before importing "
                         f"triton); meta/fake tensors are accepted only under torch.compile or a FakeTensorMode")
    mode = triton_mode()
    if mode == MIXED:
        raise ValueError(
            f"{name} cannot be processed: Triton's interpreter is only half on. TRITON_INTERPRET=1 was set after "
            f"`import triton` but before `import fla_bwd`, so fla_bwd's kernels are interpreted while "
            f"triton.language's own helpers (tl.sum, ...) are compiled, and the first kernel would fail with "
            f"\"Cannot call @triton.jit'd outside of the scope of a kernel\": set TRITON_INTERPRET=1 before "
            f"importing triton (in the shell, or first thing in the program), or leave it unset to run on a GPU")
    if mode == INTERPRETED or device.type == "cuda":
        return
    if device.type == "cpu":
        raise ValueError(f"{name} is on the CPU but Triton's interpreter is off{_interpret_hint()}: set "
                         f"TRITON_INTERPRET=1 before importing triton or fla_bwd, or move the tensors to a CUDA "
                         f"device ({name}.cuda())")
    raise ValueError(f"{name} is on {device}, but fla_bwd's compiled kernels launch on CUDA devices only: move the "
                     f"tensors to a CUDA device, or run on the CPU with TRITON_INTERPRET=1 set before importing "
                     f"triton or fla_bwd")


def _is_fake(x: torch.Tensor) -> bool:
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, FakeTensor)


# ----------------------------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------------------------

class HeadFirstRemoved(TypeError, DeprecationWarning):
    """FLA's `parallel_attn` raises `DeprecationWarning` for `head_first`; this is also a TypeError, the error this
    package raises for a bad argument, so code written for either catches it."""


def check_fla_kwargs(kwargs: dict) -> None:
    """The keywords FLA's `parallel_attn(..., **kwargs)` swallows. FLA raises for `head_first` (removed: inputs are
    `[B, T, H, ...]`) and silently ignores everything else; this package refuses every other unknown keyword too,
    so that a misspelt argument (`windows_size=`) is not silently dropped."""
    if not kwargs:
        return
    if "head_first" in kwargs:
        raise HeadFirstRemoved("head_first has been removed (as in FLA's parallel_attn, which raises "
                               "DeprecationWarning for it): pass q, k, v as [B, T, H, ...] and drop head_first")
    names = ", ".join(sorted(kwargs))
    raise TypeError(f"parallel_attn got unexpected keyword argument(s) {names}: FLA's parallel_attn ignores unknown "
                    f"keywords, this one refuses them; its arguments are q, k, v, g, scale, window_size, "
                    f"cu_seqlens, chunk_indices, sink_bias, causal, softcap and return_lse")


def check_chunk_indices(chunk_indices, device: torch.device) -> None:
    """FLA's `chunk_indices`: `prepare_chunk_indices(cu_seqlens, 128)` precomputed by the caller, `[NT, 2]` integer
    (sequence index, tile index within it). A cache of what `cu_seqlens` already says; this package tiles with its
    own tile lists, so its values are not read (and, as in FLA, it is unused without `cu_seqlens`)."""
    _tensor("chunk_indices", chunk_indices, 2)
    if chunk_indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"chunk_indices must be int32 or int64, got {chunk_indices.dtype}")
    if chunk_indices.shape[1] != 2:
        raise ValueError(f"chunk_indices must be [NT, 2] (sequence index, tile index), got "
                         f"{tuple(chunk_indices.shape)}")
    if chunk_indices.device != device:
        raise ValueError(f"chunk_indices must be on the inputs' device {device}, got {chunk_indices.device}: move "
                         f"it with chunk_indices.to(q.device)")


def check_attn_inputs(q, k, v, g, scale, window_size, cu_seqlens, sink_bias, chunk_indices=None,
                      kwargs=None, return_lse=False, softcap=None, causal=True, cu_seqlens_k=None) -> None:
    """Validate `parallel_attn`'s arguments (see its docstring for the shapes); `chunk_indices` and `kwargs` (the
    extra keywords) are FLA's (`check_chunk_indices`, `check_fla_kwargs`)."""
    if kwargs:
        check_fla_kwargs(kwargs)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool (True: return (o, lse)), got {type(return_lse).__name__}")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap must be a Python float or None, got {type(softcap).__name__}")
        if not 0 <= softcap <= FP32_MAX:  # also refuses NaN; the kernels take it in fp32
            raise ValueError(f"softcap must be >= 0 and finite in float32 (logits softcap * tanh(scale * q.k / "
                             f"softcap); None or 0.0: off), got {softcap}")
    _tensor("q", q, 4)
    _tensor("k", k, 4)
    _tensor("v", v, 4)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _float(name, x)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    B, Tq, HQ, K = q.shape
    T, H, V = k.shape[1], k.shape[2], v.shape[3]  # T: the keys' length; queries may be fewer (bottom-right)
    if k.shape[0] != B or k.shape[3] != K or T < Tq:
        raise ValueError(f"k must be [B, Tk, H, K] = [{B}, Tk >= {Tq}, H, {K}] to match q {tuple(q.shape)} (q's "
                         f"queries sit at k's last Tq positions; more queries than keys are not supported), "
                         f"got {tuple(k.shape)}{_k_swapped_hint(q.shape, k.shape)}")
    if cu_seqlens_k is not None:
        if cu_seqlens is None:
            raise ValueError("cu_seqlens_k (k's packed offsets) needs cu_seqlens, q's offsets")
        check_cu_seqlens(cu_seqlens_k, B, q.device, "cu_seqlens_k")
    elif cu_seqlens is not None and T != Tq:
        raise ValueError(f"with cu_seqlens alone, q and k must have one packed length (q {Tq}, k {T} tokens): for "
                         f"packed queries shorter than keys pass k's offsets as cu_seqlens_k")
    if v.shape[:3] != (B, T, H):
        hint = ""
        if v.shape[:3] == (B, H, T) and H != T:
            hint = (": v looks like [B, H, T, V] (head-first, torch SDPA's layout) while q and k are [B, T, H, D]: "
                    "pass v.transpose(1, 2)")
        raise ValueError(f"v must be [B, T, H, V] = [{B}, {T}, {H}, V] to match k {tuple(k.shape)}, "
                         f"got {tuple(v.shape)}{hint}")
    if H == 0 or HQ % H != 0:
        raise ValueError(f"the number of query heads HQ={HQ} (q.shape[2]) must be a multiple of the number of "
                         f"key/value heads H={H} (k.shape[2])")
    for name, d in (("K (q.shape[3])", K), ("V (v.shape[3])", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"head dim {name} must be in [1, {MAX_HEAD_DIM}], got {d}")
    devices = {("q", q.device), ("k", k.device), ("v", v.device)}
    if g is not None:
        _tensor("g", g, 3)
        _gate_float("g", g)
        if g.shape != (B, T, HQ):
            raise ValueError(f"g must be [B, Tk, HQ] = [{B}, {T}, {HQ}] (one gate per key position), got "
                             f"{tuple(g.shape)}")
        devices.add(("g", g.device))
    if sink_bias is not None:
        _tensor("sink_bias", sink_bias, 1)
        _gate_float("sink_bias", sink_bias)
        if sink_bias.shape != (HQ,):
            raise ValueError(f"sink_bias must be [HQ] = [{HQ}], got {tuple(sink_bias.shape)}")
        devices.add(("sink_bias", sink_bias.device))
    if len({d for _, d in devices}) > 1:
        raise ValueError("q, k, v, g and sink_bias must be on one device, got "
                         + ", ".join(f"{n} on {d}" for n, d in sorted(devices, key=lambda x: x[0]))
                         + ": move them to one device, e.g. with .to(q.device)")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
            raise TypeError(f"scale must be a Python float or None, got {type(scale).__name__}")
        if not abs(scale) <= FP32_MAX:  # the kernels take it in fp32
            raise ValueError(f"scale must be finite in float32 (|scale| <= {FP32_MAX:.6g}), got {scale}")
    if not causal and g is not None:
        raise ValueError("a forget gate g needs causal attention (its bias gc_i - gc_j sums the gates between key j "
                         "and query i): pass causal=True, or g=None")
    if isinstance(window_size, (tuple, list)):
        _check_window_pair(window_size, causal)
    elif window_size is not None:
        if isinstance(window_size, bool) or not isinstance(window_size, int):
            raise TypeError(f"window_size must be an int, a (left, right) pair of ints or None, got "
                            f"{type(window_size).__name__}")
        if not causal:
            raise ValueError(f"window_size={window_size} (an int: W keys ending at the query) is causal; with "
                             f"causal=False pass a pair (left, right): query i sees keys i - left .. i + right, "
                             f"-1 for no bound on that side")
        if window_size < 0:
            raise ValueError(f"window_size must be >= 0 (W >= 1: query i sees keys [i - W + 1, i]; 0: no key, "
                             f"with sink_bias only), got {window_size}")
        if window_size == 0 and sink_bias is None:
            # FLA's meaning of 0: every key masked. With a sink the sink takes all the mass (o = 0); without one
            # the softmax has no term at all (FLA returns 0 / 0 = NaN), which is refused here.
            raise ValueError("window_size=0 masks every key, so without sink_bias the softmax has no term (FLA's "
                             "parallel_attn returns NaN there): pass window_size >= 1, None for full causal "
                             "attention, or a sink_bias (then o is 0, as in FLA)")
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, B, q.device)
    elif Tq < HQ and H == HQ:  # the one test a valid call pays: fewer tokens than heads (`warn_if_head_first`)
        warn_if_head_first(q.shape)
    if chunk_indices is not None:
        check_chunk_indices(chunk_indices, q.device)
    # Last, once every argument is known good: can the kernels run on these tensors at all? On a GPU one call (a
    # global read once the mode is known) and two compares; on the CPU under the interpreter, one more compare.
    # Everything else (meta, CPU without the interpreter, half-on interpreter) is the slow path.
    device_type = q.device.type
    mode = triton_mode()
    if (device_type != "cuda" or mode != COMPILED) and (device_type == "meta" or mode != INTERPRETED):
        check_runnable("q", q)


def _check_window_pair(window_size, causal: bool) -> None:
    """flash-attn's `window_size=(left, right)`: query i sees keys i - left .. i + right, -1 for no bound."""
    if len(window_size) != 2 or not all(isinstance(w, int) and not isinstance(w, bool) for w in window_size):
        raise TypeError(f"window_size as a pair must be (left, right), two ints, got {window_size!r}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size=(left, right) takes ints >= -1 (-1: no bound on that side), got "
                         f"{window_size!r}")
    if causal and right > 0:
        raise ValueError(f"window_size={window_size!r} lets a query see {right} later key(s), which causal "
                         f"attention does not: pass causal=False, or a right side of 0 (or -1)")


def resolve_window(window_size, causal: bool = True) -> tuple:
    """(W, WR) of a checked window_size: query i sees keys [i - W + 1, i + WR]; W 0: no bound on the left (FLA's
    int 0, no key at all, is the caller's to handle first); WR None: causal (no key after the query), -1: no bound
    on the right."""
    if isinstance(window_size, (tuple, list)):
        left, right = window_size
        W = 0 if left < 0 else left + 1
        return W, None if causal else right
    return window_size or 0, None if causal else -1


class LayoutWarning(UserWarning):
    """A call's shape suggests tensors in `[B, H, T, D]` (head-first) passed where `[B, T, H, D]` is expected. A
    UserWarning of its own, so that `warnings.filterwarnings("ignore", category=LayoutWarning)` silences it alone."""


@torch.compiler.disable  # under torch.compile: run eagerly (a graph break on this rare path), not traced
def warn_if_head_first(q_shape) -> None:
    """Warn (`LayoutWarning`) that q of shape `[B, T, HQ, D]` with T < HQ, k with as many heads as q, and no
    cu_seqlens may be `[B, H, T, D]` tensors: such a call raises nothing (every shape agrees) and attends over the
    heads instead of the tokens. `check_attn_inputs` calls it only for such shapes (an integer compare per call).

    Once per call site and shape under Python's default warning filter: the warning is attributed to the first
    frame outside fla_bwd and torch (the user's line that called the op), and Python's registry of that module
    shows each message (which names the shape) once; the standard filters change that ("always", "error",
    "ignore"). Under torch.compile it runs eagerly, so a compiled call warns too."""
    B, T, HQ, D = q_shape
    frame, level = sys._getframe(1), 2  # level 2: warn_if_head_first's caller
    while frame is not None and frame.f_back is not None and _skipped(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        f"parallel_attn got q of shape {tuple(q_shape)}: T={T} tokens but HQ={HQ} heads, and k with as many heads. "
        f"Inputs are token-major [B, T, H, D]; tensors in [B, H, T, D] (torch SDPA's layout, FLA's old "
        f"head_first=True) pass every check but attend over the wrong axis. If yours are [B, H, T, D], pass "
        f"q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2) and transpose the output back. If the shape is "
        f"intended (fewer tokens than heads), silence this with warnings.filterwarnings(\"ignore\", "
        f"category=fla_bwd.LayoutWarning)",
        LayoutWarning, stacklevel=level)


def _skipped(module: str) -> bool:
    """Frames the warning is not attributed to: this package's, and torch's (torch.compile's eager wrappers)."""
    return module.split(".", 1)[0] in ("fla_bwd", "torch")


def _k_swapped_hint(q_shape, k_shape) -> str:
    """For a k whose shape does not match q's: "" or, where the mismatch looks like axes 1 and 2 swapped (torch
    SDPA's head-first `[B, H, T, D]`), which tensors look so and what to pass."""
    B, T, HQ, K = q_shape
    if len(k_shape) != 4 or k_shape[0] != B or k_shape[3] != K:
        return ""
    H1, T2 = k_shape[1], k_shape[2]
    # q and k both head-first: they agree on axis 2 (the sequence), and q's axis 1 (query heads) is a multiple of
    # k's (key heads, GQA); an equal head count raises nothing and gets `warn_if_head_first` instead.
    if T2 == HQ and H1 >= 1 and T % H1 == 0:
        return (f": q and k look like [B, H, T, D] (head-first, torch SDPA's layout: {T} query heads, {H1} key heads, "
                f"{HQ} tokens), and this op takes [B, T, H, D]: pass q.transpose(1, 2), k.transpose(1, 2), "
                f"v.transpose(1, 2) and transpose the output back with o.transpose(1, 2)")
    # k alone head-first: its axis 2 is q's sequence and its axis 1 a divisor of q's head count.
    if T2 == T and H1 >= 1 and HQ % H1 == 0:
        return (": k looks like [B, H, T, K] (head-first, torch SDPA's layout) while q is [B, T, HQ, K]: pass "
                "k.transpose(1, 2) (and v.transpose(1, 2) if v is head-first too)")
    return ""


def check_cu_seqlens(cu_seqlens, B: int, device: torch.device, name: str = "cu_seqlens") -> None:
    """Structure of `cu_seqlens` (type, rank, dtype, device, B == 1); its values are read and checked at every call by
    `fla_bwd.ops.utils.index.varlen_tiles`, inside the op, so that `torch.compile` traces none of it."""
    _tensor(name, cu_seqlens, 1)
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {cu_seqlens.dtype}")
    if B != 1:
        raise ValueError(f"{name} requires packed inputs with batch size B == 1, got B = {B}")
    if cu_seqlens.device != device:
        raise ValueError(f"{name} must be on the inputs' device {device}, got {cu_seqlens.device}: move it "
                         f"with {name}.to(q.device)")
    if cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must hold at least 2 offsets [0, ..., T], got {cu_seqlens.numel()}")


def resolve_softcap(softcap: Optional[float]) -> float:
    """The kernels' softcap: 0.0 (off) for None or 0.0, else the (checked) value as a float."""
    return 0.0 if softcap is None else float(softcap)


def resolve_scale(scale: Optional[float], K: int) -> float:
    return K ** -0.5 if scale is None else float(scale)
