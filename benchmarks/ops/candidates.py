# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""A candidate turns a differentiable forward into the zero-argument call each mode times.

- fwd:    the forward alone (autograd on, as in training);
- bwd:    the forward runs once outside the timed region; the timed call is only
          `torch.autograd.grad(o, leaves, do, retain_graph=True)`;
- fwdbwd: forward and `torch.autograd.grad(o, leaves, do)`.
A context factory (e.g. `lambda: dkv_path("legacy")`) wraps the forward and every timed call.
"""

import contextlib
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch


@dataclass
class Candidate:
    name: str
    forward: Callable[[], torch.Tensor]  # returns o [B, T, HQ, V]
    leaves: list
    do: torch.Tensor
    ctx: Callable = contextlib.nullcontext
    kind: str = "torch"  # "ours", "baseline" (an earlier commit's package) or "torch" (peers); FA3 is timed apart
    state: dict = field(default_factory=dict)

    def build(self, mode: str) -> Callable[[], object]:
        """Returns the timed call for `mode` (for bwd this runs the forward once, now)."""
        ctx, fwd, leaves, do = self.ctx, self.forward, self.leaves, self.do
        if mode == "fwd":
            def call():
                with ctx():
                    return fwd()
        elif mode == "bwd":
            with ctx():
                o = fwd()
            self.state["o"] = o

            def call():
                with ctx():
                    return torch.autograd.grad(o, leaves, do, retain_graph=True)
        elif mode == "fwdbwd":
            def call():
                with ctx():
                    return torch.autograd.grad(fwd(), leaves, do)
        else:
            raise ValueError(f"unknown mode {mode!r}")
        return call

    def held(self) -> list:
        """Tensors alive outside the timed call (subtracted from peak memory)."""
        return [t for t in self.leaves + [self.do, self.state.get("o")] if t is not None]

    def release(self) -> None:
        self.state.clear()


def leaves_of(inputs: dict) -> list:
    """The tensors a backward differentiates: q, k, v and, where given, the gate g and the sink logits."""
    return [t for t in (inputs.get(n) for n in ("q", "k", "v", "g", "sink_bias")) if t is not None]


def ours(op_fn, call, inputs: dict, shape, do, path: Optional[str]) -> Candidate:
    """This package's op; `path` forces the dK/dV backward through `dkv_path(path)` (None: no context)."""
    ctx = contextlib.nullcontext
    if path is not None:
        from fla_bwd.ops.attn import dkv_path

        def ctx():
            return dkv_path(path)
    name = "fla_bwd" if path in (None, "auto") else f"fla_bwd[{path}]"
    return Candidate(name=name, forward=lambda: call(op_fn, inputs, shape), leaves=leaves_of(inputs), do=do, ctx=ctx,
                     kind="ours")


def load_baseline(path: str):
    """(label, parallel_attn) of an earlier commit's package written by `benchmarks/tools/make_baseline.py`
    (`fla_bwd@COMMIT`, `+PATCH` where a candidate patch was applied to it)."""
    import importlib

    path = os.path.abspath(path)
    stamp = os.path.join(path, "BASELINE_COMMIT")
    if not os.path.isfile(stamp):
        raise ValueError(f"--baseline: {path} has no BASELINE_COMMIT (write it with benchmarks/tools/make_baseline.py)")
    with open(stamp) as f:
        commit, *rest = f.read().split("\n")
    patch = [line.split(" ", 1)[1] for line in rest if line.startswith("patch ")]
    parent, name = os.path.split(path)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    label = f"fla_bwd@{commit.strip()[:7]}" + "".join(f"+{x}" for x in patch)
    return label, importlib.import_module(f"{name}.ops.attn").parallel_attn


def baseline_unsupported(fn, shape) -> Optional[str]:
    """None when an earlier commit's `parallel_attn` can make this row's call, else why not. Rows without the call's
    variants always can (their call is the one it had). A variant needs its keyword in the package's signature
    (`causal`, `softcap`, `return_lse`); a row with q shorter than k needs `cu_seqlens_k` (added with the packed
    form of that call, after the dense one: a conservative sign that the package aligns a shorter q bottom-right, since
    an older one might take such a q without an error and compute another function)."""
    need = list(shape.call_kwargs())
    if shape.Tq is not None and shape.Tq < shape.T:
        need.append("cu_seqlens_k")
    if not need:
        return None
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return f"its parallel_attn's signature cannot be read: not timed on this row ({', '.join(shape.variants())})"
    missing = [n for n in need if n not in params]
    if missing:
        return (f"its parallel_attn has no {', '.join(missing)}: not timed on this row "
                f"({', '.join(shape.variants())})")
    return None


def baseline(label: str, fn, call, inputs: dict, shape, do) -> Candidate:
    """The earlier commit's op on the same inputs, timed interleaved as a peer (its default dispatch)."""
    return Candidate(name=label, forward=lambda: call(fn, inputs, shape), leaves=leaves_of(inputs), do=do,
                     kind="baseline")


def one_line(e: BaseException, limit: int = 200) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:limit] if msg else ''}".rstrip(": ")
