# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Declarative benchmark registry: ops (tensor specs, constraints, gate file) and named shapes.

Shape names follow the peer anchors (/work/shared/anchors) wherever the same shape was measured there.
Nothing here imports torch at module load; `make_inputs` imports it lazily.
"""

from dataclasses import dataclass, field
from typing import Callable, Optional

from .shapes import Shape, ShapeError, cu_seqlens_list


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: Callable[[Shape], tuple]
    dtype: Optional[str] = None  # None: the shape's dtype
    transform: Optional[str] = None  # "logsigmoid": gate = logsigmoid(normal sample)
    requires_grad: bool = True
    when: Callable[[Shape], bool] = lambda s: True  # noqa: E731 - declarative default


@dataclass(frozen=True)
class OpEntry:
    name: str
    module: str  # where the callable lives (imported lazily)
    attr: str
    tensors: tuple
    gate_files: tuple  # pytest files that must pass before any speedup is reported
    constraints: tuple = field(default_factory=tuple)  # callables Shape -> error string or None
    post_init: Optional[Callable] = None  # (shape, inputs dict, device) -> None; adds non-tensor-spec args
    call: Optional[Callable] = None  # (fn, inputs dict, shape) -> output

    def load(self):
        import importlib

        return getattr(importlib.import_module(self.module), self.attr)

    def check(self, shape: Shape) -> Shape:
        shape.validate()
        for rule in self.constraints:
            err = rule(shape)
            if err:
                raise ShapeError(f"shape {shape.name!r} does not fit op {self.name!r}: {err}")
        return shape


def _varlen_post_init(shape: Shape, inputs: dict, device) -> None:
    import torch

    if shape.varlen:
        inputs["cu_seqlens"] = torch.tensor(cu_seqlens_list(shape.seqlens()), dtype=torch.int32, device=device)
    else:
        inputs["cu_seqlens"] = None


def _call_parallel_attn(fn, inputs: dict, shape: Shape):
    """The op on the row's inputs; `sink_bias`, `causal=False`, `softcap` and `return_lse=True` only where the row
    has them (`Shape.call_kwargs`: the calls of other rows stay as they were, for an earlier commit's package too).
    A return_lse row's call returns (o, lse): o is the output the timed loss uses. A Tq row's q is simply shorter."""
    extra = {"sink_bias": inputs["sink_bias"]} if inputs.get("sink_bias") is not None else {}
    extra.update(shape.call_kwargs())
    out = fn(inputs["q"], inputs["k"], inputs["v"], g=inputs.get("g"), scale=None, window_size=shape.W,
             cu_seqlens=inputs.get("cu_seqlens"), **extra)
    if shape.lse:
        o, _lse = out
        return o
    return out


OPS = {
    "parallel_attn": OpEntry(
        name="parallel_attn",
        module="fla_bwd.ops.attn",
        attr="parallel_attn",
        tensors=(
            TensorSpec("q", lambda s: (s.B, s.q_len, s.HQ, s.K)),  # Tq rows: the last Tq queries
            TensorSpec("k", lambda s: (s.B, s.T, s.H, s.K)),
            TensorSpec("v", lambda s: (s.B, s.T, s.H, s.V)),
            TensorSpec("g", lambda s: (s.B, s.T, s.HQ), dtype="fp32", transform="logsigmoid",
                       when=lambda s: s.gated),
            # drawn last: a row without a sink draws q, k, v and g exactly as before the sink existed
            TensorSpec("sink_bias", lambda s: (s.HQ,), dtype="fp32", when=lambda s: s.sink),
        ),
        # the op's contract, and the dK/dV "gqa" kernel's and dispatch's contract (what the A/B measures)
        gate_files=("tests/ops/test_attn.py", "tests/ops/test_attn_gqa.py"),
        constraints=(
            lambda s: None if s.HQ % s.H == 0 else "HQ must be a multiple of H",
            lambda s: None if not s.varlen or s.B == 1 else "packed varlen needs B == 1",
            lambda s: None if s.causal or not s.gated else "a gate needs causal=True",
        ),
        post_init=_varlen_post_init,
        call=_call_parallel_attn,
    ),
}


def make_inputs(op: OpEntry, shape: Shape, device) -> dict:
    """Random inputs (never zeros), deterministic in shape.seed; grad-requiring leaves where the spec says so."""
    import torch
    import torch.nn.functional as F

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    gen = torch.Generator(device="cpu").manual_seed(shape.seed)
    inputs = {}
    for spec in op.tensors:
        if not spec.when(shape):
            inputs[spec.name] = None
            continue
        x = torch.randn(spec.shape(shape), generator=gen, dtype=torch.float32)
        if spec.transform == "logsigmoid":
            x = F.logsigmoid(x)
        x = x.to(device=device, dtype=dt[spec.dtype or shape.dtype])
        inputs[spec.name] = x.requires_grad_(spec.requires_grad)
    if op.post_init is not None:
        op.post_init(shape, inputs, device)
    return inputs


def _s(name, B, T, HQ, H, D, **kw):
    K, V = kw.pop("K", D), kw.pop("V", D)
    return Shape(name=name, B=B, T=T, HQ=HQ, H=H, K=K, V=V, **kw)


# Ordered by priority: within one run (or one part of a split run, benchmarks/ops/plan.py) the total budget drops
# rows from the end. `peers`: True (every peer asked for, each skipped with a one-line reason where it cannot compute
# the row: benchmarks/ops/peers.py `unsupported`), False (A/B only), or the tuple of peers worth timing on that row.
# Every registered row times every peer that can represent it; no row restricts its peers for time.
SHAPES = [
    # headline dense GQA and the llama rows (anchor names)
    _s("g8-T8192", 1, 8192, 32, 4, 128),
    _s("g8-T4096", 1, 4096, 32, 4, 128),
    _s("g4-T2048-D64", 2, 2048, 32, 8, 64),
    _s("gqa4-long", 2, 2048, 32, 8, 128, group="llama"),
    _s("gqa4-short", 4, 512, 32, 8, 128, group="llama"),
    _s("mha-long", 2, 2048, 32, 32, 128, group="llama"),
    _s("mha-short", 4, 512, 32, 32, 128, group="llama"),
    # sliding-window GQA
    _s("g8-T8192-W512", 1, 8192, 32, 4, 128, W=512, group="window"),
    _s("g8-T16384-W256", 1, 16384, 32, 4, 128, W=256, group="window"),
    # gated dense twins (anchor rows for fla-0.6 and flex-gated; "gated costs at most 1.15x ungated")
    _s("g8-T8192-gated", 1, 8192, 32, 4, 128, gated=True, group="gated"),
    _s("gqa4-long-gated", 2, 2048, 32, 8, 128, gated=True, group="gated"),
    # gated unequal-length packed varlen GQA; the lengths are pinned to those of every run so far (drawn then by a
    # splitmix64 stream that `random.Random` replaced; a new draw would make these rows incomparable to the record)
    _s("varlen-gated-8192", 1, 8192, 32, 4, 128, gated=True, varlen=True, seed=8192, group="varlen",
       lens=(2227, 869, 1233, 3863)),
    _s("varlen-gated-16384", 1, 16384, 32, 4, 128, gated=True, varlen=True, seed=16384, group="varlen",
       lens=(1965, 1829, 3180, 1801, 1078, 3478, 1854, 1199)),
    # the other two windows (no anchors)
    _s("g8-T8192-W256", 1, 8192, 32, 4, 128, W=256, group="window"),
    _s("g8-T16384-W512", 1, 16384, 32, 4, 128, W=512, group="window"),
    # llama rows in fp16
    _s("mha-short-fp16", 4, 512, 32, 32, 128, dtype="fp16", group="llama"),
    _s("mha-long-fp16", 2, 2048, 32, 32, 128, dtype="fp16", group="llama"),
    # breadth: G = 2, 4, 8 x D = 64, 128 at B2 T2048 HQ32 (G4 rows are g4-T2048-D64 and gqa4-long above)
    _s("g2-T2048-D64", 2, 2048, 32, 16, 64, group="breadth"),
    _s("g2-T2048-D128", 2, 2048, 32, 16, 128, group="breadth"),
    _s("g8-T2048-D64", 2, 2048, 32, 4, 64, group="breadth"),
    _s("g8-T2048-D128", 2, 2048, 32, 4, 128, group="breadth"),
    # fallback controls: the dispatch must not lose where it should fall back (A/B ratio ~1); peers are timed here
    # too wherever they can represent the row (fp32, K != V: see peers.unsupported)
    _s("ctl-fwd-g8-T8192", 1, 8192, 32, 4, 128, modes=("fwd",), group="control",
       note="forward alone: the dK/dV dispatch must not touch it"),
    _s("ctl-g16-T2048", 2, 2048, 32, 2, 128, group="control", note="G > 8"),
    _s("ctl-fp32-g8-T2048", 1, 2048, 32, 4, 128, dtype="fp32", group="control", note="fp32"),
    _s("ctl-K128-V64-g8-T2048", 2, 2048, 32, 4, 128, V=64, group="control", note="K != V"),
    _s("ctl-mha-T2048", 2, 2048, 32, 32, 128, group="control", note="MHA (G = 1)"),
    # issue 60's fast paths, each beside the row it is compared with (`twin`: the report's "vs twin" column, our
    # time over our time on the twin row, per visible pair). Appended last: the rows above keep their priority.
    _s("gqa4-B4-T2048", 4, 2048, 32, 8, 128, group="fastpath", note="dense twin of packed-4x2048-G4"),
    _s("packed-4x2048-G4", 1, 8192, 32, 8, 128, varlen=True, lens=(2048,) * 4, group="fastpath",
       twin="gqa4-B4-T2048", note="four equal sequences packed: the same pairs as its dense twin"),
    _s("packed-1x8192-G8", 1, 8192, 32, 4, 128, varlen=True, lens=(8192,), group="fastpath", twin="g8-T8192",
       note="one packed sequence: the same pairs as its dense twin"),
    _s("packed-mixed-8192-G8", 1, 8192, 32, 4, 128, varlen=True, lens=(2227, 869, 1233, 3863), group="fastpath",
       twin="g8-T8192", note="varlen-gated-8192's lengths, ungated: fewer pairs than its twin"),
    _s("gqa4-long-sink", 2, 2048, 32, 8, 128, sink=True, group="fastpath", twin="gqa4-long"),
    _s("g8-T8192-sink", 1, 8192, 32, 4, 128, sink=True, group="fastpath", twin="g8-T8192"),
    _s("gqa4-long-D256", 2, 2048, 32, 8, 256, group="fastpath"),
    # the call's variants (causal=False, softcap, return_lse, queries shorter than keys), each beside its twin (the
    # same call without the variant). Appended last: every row above keeps its priority, its call and its FLOPs.
    _s("g8-T4096-noncausal", 1, 4096, 32, 4, 128, causal=False, group="variants", twin="g8-T4096",
       note="causal=False: every query sees all 4096 keys (2x the causal pairs, less the diagonal)"),
    _s("mha-long-softcap", 2, 2048, 32, 32, 128, softcap=30.0, group="variants", twin="mha-long",
       note="softcap=30.0: the twin's pairs"),
    _s("g8-T8192-softcap", 1, 8192, 32, 4, 128, softcap=30.0, group="variants", twin="g8-T8192",
       note="softcap=30.0: the twin's pairs"),
    _s("gqa4-long-lse", 2, 2048, 32, 8, 128, lse=True, group="variants", twin="gqa4-long",
       note="return_lse=True: (o, lse), the loss on o alone"),
    _s("g8-T8192-lse", 1, 8192, 32, 4, 128, lse=True, group="variants", twin="g8-T8192",
       note="return_lse=True: (o, lse), the loss on o alone"),
    _s("g8-Tq1024-Tk8192", 1, 8192, 32, 4, 128, Tq=1024, group="variants", twin="g8-T8192",
       note="the last 1024 queries of 8192 keys (bottom-right)"),
]

# CPU/interpreter self-test shapes (not performance numbers)
SMOKE_SHAPES = [
    _s("smoke", 1, 64, 4, 2, 32, modes=("fwd", "bwd", "fwdbwd"), group="smoke", peers=False),
    _s("smoke-varlen-gated", 1, 64, 4, 2, 32, gated=True, varlen=True, nseq=3, seed=3, W=16,
       modes=("bwd",), group="smoke", peers=False),
]

GROUPS = sorted({s.group for s in SHAPES + SMOKE_SHAPES})
_BY_NAME = {s.name: s for s in SHAPES + SMOKE_SHAPES}
assert len(_BY_NAME) == len(SHAPES) + len(SMOKE_SHAPES), "duplicate shape name"


def twin_error(s: Shape) -> Optional[str]:
    """None when the row's twin (if any) is a registered row of the same heads, head dims and dtype (what a per-pair
    time ratio needs), else why not."""
    t = _BY_NAME.get(s.twin) if s.twin else s
    if t is None:
        return f"twin {s.twin!r} is not a registered row"
    if (t.HQ, t.H, t.K, t.V, t.dtype) != (s.HQ, s.H, s.K, s.V, s.dtype):
        return f"twin {s.twin!r} has other heads, head dims or dtype"
    return None


assert not any(map(twin_error, SHAPES + SMOKE_SHAPES)), [e for e in map(twin_error, SHAPES + SMOKE_SHAPES) if e]


def get_op(name: str) -> OpEntry:
    if name not in OPS:
        raise ShapeError(f"unknown op {name!r}; known ops: {', '.join(OPS)}")
    return OPS[name]


def get_shape(name: str) -> Shape:
    if name not in _BY_NAME:
        raise ShapeError(f"unknown shape {name!r}; run with --list to see the {len(_BY_NAME)} registered shapes")
    return _BY_NAME[name]


def select_shapes(spec: Optional[str]) -> list:
    """`None` or `all`: every registered (non-smoke) shape; else comma-separated names or `group:NAME`."""
    if not spec or spec == "all":
        return list(SHAPES)
    out = []
    for tok in (t.strip() for t in spec.split(",")):
        if not tok:
            raise ShapeError(f"empty name in --shapes {spec!r}")
        if tok.startswith("group:"):
            grp = tok.split(":", 1)[1]
            if grp not in GROUPS:
                raise ShapeError(f"unknown shape group {grp!r}; groups: {', '.join(GROUPS)}")
            out += [s for s in SHAPES + SMOKE_SHAPES if s.group == grp]
        else:
            out.append(get_shape(tok))
    return out


def listing() -> str:
    lines = ["ops:"]
    for op in OPS.values():
        lines.append(f"  {op.name:<16} {op.module}.{op.attr}  (gate: {' '.join(op.gate_files)})")
    lines.append("shapes (name, group, default modes, description):")
    for s in SHAPES + SMOKE_SHAPES:
        extra = f"  -- {s.note}" if s.note else ""
        peers = "" if s.peers is True else " [no peers]" if not s.peers else f" [peers: {','.join(s.peers)}]"
        twin = f" [twin: {s.twin}]" if s.twin else ""
        lines.append(f"  {s.name:<24} {s.group:<9} {','.join(s.modes):<11} {s.describe()}{peers}{twin}{extra}")
    return "\n".join(lines)
