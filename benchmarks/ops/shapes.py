# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Benchmark shapes: the dataclass, exact FLOP counting, seeded unequal varlen splits and custom-shape parsing.

Pure Python (no torch) so the CLI can validate names before anything heavy is imported.
"""

import math
import random
from dataclasses import dataclass, field, replace
from typing import Optional

DTYPES = ("bf16", "fp16", "fp32")
MODES = ("fwd", "bwd", "fwdbwd")
PEERS = ("flex", "sdpa-cudnn", "sdpa-fa2", "fla", "fa3", "fa4", "fa4-det")
# The peers of the benchmark of record (gpu_run.sh's default PEERS, the split's estimates in plan.py): FA4 and its
# deterministic mode need their own install on the GPU machine (benchmarks/tools/install_fa4.sh) and run on request.
RECORD_PEERS = ("flex", "sdpa-cudnn", "sdpa-fa2", "fla", "fa3")
FA4_PEERS = ("fa4", "fa4-det")
# backward FLOPs = 2.5 x forward (the anchors' convention); forward + backward = 3.5 x forward
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}


class ShapeError(ValueError):
    """A shape that is malformed or breaks a constraint; the CLI prints it without a traceback."""


@dataclass(frozen=True)
class Shape:
    name: str
    B: int
    T: int  # per-sequence length; for varlen the packed total (B == 1)
    HQ: int
    H: int
    K: int
    V: int
    W: Optional[int] = None  # query i sees keys [i - W + 1, i]
    gated: bool = False
    sink: bool = False  # a learnable [HQ] sink logit in every softmax denominator (GPT-OSS); adds no pair
    varlen: bool = False
    nseq: int = 0  # varlen only: number of packed sequences (0: T // 2048, at least 2)
    lens: tuple = ()  # varlen only: the packed lengths given explicitly (else drawn from the seed)
    dtype: str = "bf16"
    seed: int = 0
    modes: tuple = ("bwd", "fwdbwd")
    group: str = "headline"
    peers: object = True  # True: every peer asked for; False: none (A/B only); a tuple: only these peers
    twin: str = ""  # the registered row our time is compared with (the same work without the feature), "" none
    note: str = ""
    tags: tuple = field(default_factory=tuple)
    # The call's variants (appended last, defaults = the call as before they existed; a row that sets none of them
    # calls parallel_attn, describes itself and counts its pairs exactly as before):
    causal: bool = True  # False: causal=False, every query sees every key of its sequence (then no W: a window
    #                      without causality is a (left, right) pair, not representable here)
    softcap: Optional[float] = None  # softcap=c: scores c * tanh(scale * q.k / c); adds no pair (FLOPs unchanged)
    lse: bool = False  # return_lse=True: the call returns (o, lse); the timed loss still uses o alone
    Tq: Optional[int] = None  # queries shorter than keys: q [B, Tq, HQ, K] against k, v [B, T, H, *], bottom-right
    #                           (query i at key position T - Tq + i); None: q as long as k

    @property
    def G(self) -> int:
        return self.HQ // self.H

    @property
    def q_len(self) -> int:
        """q's length: Tq where set, else T."""
        return self.T if self.Tq is None else self.Tq

    def variant_fields(self) -> dict:
        """The variant fields this row sets, by name (`{}` for every row registered before them)."""
        d = {}
        if not self.causal:
            d["causal"] = False
        if self.softcap:
            d["softcap"] = self.softcap
        if self.lse:
            d["lse"] = True
        if self.Tq is not None:
            d["Tq"] = self.Tq
        return d

    def call_kwargs(self) -> dict:
        """The keyword arguments of parallel_attn's variants this row passes (only those it sets: every other row's
        call stays the call of a package older than them); a shorter q is in q's shape, not an argument."""
        kw = {k: v for k, v in self.variant_fields().items() if k != "Tq"}
        if "lse" in kw:
            kw["return_lse"] = kw.pop("lse")
        return kw

    def variants(self) -> list:
        """The call's variants this row uses, as words (`[]` for every row registered before them)."""
        out = ["non-causal"] if not self.causal else []
        out += [f"softcap {self.softcap:g}"] if self.softcap else []
        out += ["return_lse"] if self.lse else []
        out += [f"Tq {self.Tq} < Tk {self.T}"] if self.Tq is not None and self.Tq < self.T else []
        return out

    def describe(self) -> str:
        t = f"T{self.T}" if self.Tq is None else f"Tq{self.Tq} Tk{self.T}"
        s = f"B{self.B} {t} HQ{self.HQ} H{self.H} "
        s += f"D{self.K}" if self.K == self.V else f"K{self.K} V{self.V}"
        if self.W:
            s += f" W{self.W}"
        if self.gated:
            s += " gated"
        if self.sink:
            s += " sink"
        if not self.causal:
            s += " non-causal"
        if self.softcap:
            s += f" softcap{self.softcap:g}"
        if self.lse:
            s += " lse"
        if self.varlen:
            s += f" varlen(N={len(self.seqlens())})"
        return s + f" {self.dtype}"

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "B", "T", "HQ", "H", "K", "V", "W", "gated", "sink", "varlen",
                                           "dtype")}
        d.update(G=self.G, seed=self.seed, group=self.group, twin=self.twin, pairs=self.pairs(),
                 describe=self.describe())
        if self.varlen:
            d["seqlens"] = self.seqlens()
        d.update(self.variant_fields())  # the variants only where set: every earlier row's record keeps its keys
        return d

    def seqlens(self) -> list:
        """Sequence lengths: [T] * B for dense rows; unequal lengths summing to T, fixed by the seed, for varlen."""
        if not self.varlen:
            return [self.T] * self.B
        if self.lens:
            return list(self.lens)
        n = self.nseq or max(2, self.T // 2048)
        return unequal_split(self.T, n, self.seed)

    def pairs(self) -> int:
        """Visible (query, key) pairs of the whole batch, counted exactly (non-causal: every query with every key of
        its sequence; Tq: the last Tq queries' pairs only)."""
        if self.causal and self.Tq is None:
            return sum(visible_pairs(n, self.W) for n in self.seqlens())
        return sum(visible_pairs(n, self.W, causal=self.causal, tq=self.Tq) for n in self.seqlens())

    def fwd_flops(self) -> int:
        # two matmuls per visible pair and query head: QK^T (2K flops) and PV (2V flops); 4*D*pairs when K == V
        return 2 * self.HQ * (self.K + self.V) * self.pairs()

    def flops(self, mode: str) -> float:
        return MODE_FLOP_FACTOR[mode] * self.fwd_flops()

    def validate(self) -> "Shape":
        for k in ("B", "T", "HQ", "H", "K", "V"):
            if getattr(self, k) <= 0:
                raise ShapeError(f"shape {self.name!r}: {k} must be positive, got {getattr(self, k)}")
        if self.HQ % self.H:
            raise ShapeError(f"shape {self.name!r}: HQ={self.HQ} is not a multiple of H={self.H}")
        if self.W is not None and self.W <= 0:
            raise ShapeError(f"shape {self.name!r}: W must be positive, got {self.W}")
        if self.varlen and self.B != 1:
            raise ShapeError(f"shape {self.name!r}: packed varlen needs B == 1, got B={self.B}")
        if self.dtype not in DTYPES:
            raise ShapeError(f"shape {self.name!r}: dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.lens and (not self.varlen or sum(self.lens) != self.T or min(self.lens) < 1):
            raise ShapeError(f"shape {self.name!r}: lens {self.lens} must be positive and sum to T={self.T} (varlen)")
        if self.varlen and self.nseq and self.nseq > self.T:
            raise ShapeError(f"shape {self.name!r}: {self.nseq} sequences cannot pack into T={self.T}")
        if self.nseq and self.lens and self.nseq != len(self.lens):
            raise ShapeError(f"shape {self.name!r}: nseq={self.nseq} but {len(self.lens)} lens given")
        if self.twin == self.name:
            raise ShapeError(f"shape {self.name!r}: a row cannot be its own twin")
        if not self.causal and self.W is not None:
            raise ShapeError(f"shape {self.name!r}: a window without causality is a (left, right) pair, which a "
                             "registry row does not describe (W must be None with causal=False)")
        if not self.causal and self.gated:
            raise ShapeError(f"shape {self.name!r}: a forget gate needs causal=True")
        if self.softcap is not None and not (self.softcap > 0 and math.isfinite(self.softcap)):
            raise ShapeError(f"shape {self.name!r}: softcap must be a positive finite number (None: off), "
                             f"got {self.softcap}")
        if self.Tq is not None:
            if not 1 <= self.Tq <= self.T:
                raise ShapeError(f"shape {self.name!r}: Tq must be in 1..T={self.T}, got {self.Tq}")
            if self.varlen:
                raise ShapeError(f"shape {self.name!r}: Tq with packed varlen (cu_seqlens_k) is not wired")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise ShapeError(f"shape {self.name!r}: unknown mode(s) {bad}; modes are {MODES}")
        return self

    def with_modes(self, modes) -> "Shape":
        return replace(self, modes=tuple(modes))


def visible_pairs(n: int, window: Optional[int] = None, causal: bool = True, tq: Optional[int] = None) -> int:
    """Causal pairs (i >= j) of one length-n sequence, restricted to i - j < window when a window is given.

    `tq`: only the last tq queries (positions n - tq .. n - 1: bottom-right); a query's pairs depend only on its
    position, so theirs are all n queries' pairs less the first n - tq queries'. `causal=False`: every query sees
    all n keys (no window)."""
    if tq is not None and not 0 <= tq <= n:
        raise ValueError(f"tq={tq} must be in 0..n={n}")
    if not causal:
        if window is not None:
            raise ValueError("a non-causal window is a (left, right) pair: not counted here")
        return (n if tq is None else tq) * n
    if tq is not None:
        return visible_pairs(n, window) - visible_pairs(n - tq, window)
    if window is None or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def brute_force_pairs(seqlens, window: Optional[int] = None, causal: bool = True, tq: Optional[int] = None) -> int:
    """O(T^2) reference count, for tests (tq: the last tq queries; causal=False: every key, no window)."""
    total = 0
    for n in seqlens:
        for i in range(n - (n if tq is None else tq), n):
            for j in range(i + 1 if causal else n):
                if window is None or i - j < window:
                    total += 1
    return total


def unequal_split(total: int, n: int, seed: int) -> list:
    """Split `total` tokens into `n` pairwise-different positive lengths, deterministic in `seed`.

    Lengths are drawn around total / n (between 0.25x and 1.75x the mean) and the remainder goes to the last
    sequence; the draw repeats until every length is positive and all lengths differ.
    """
    if n <= 0 or total < n * (n + 1) // 2:
        raise ShapeError(f"cannot split {total} tokens into {n} distinct positive lengths")
    if n == 1:
        return [total]
    rng = random.Random(seed * 1_000_003 + total * 31 + n)  # int seed + random(): reproducible across Pythons
    mean = total / n
    for _ in range(10_000):
        lens = [max(1, int(mean * (0.25 + 1.5 * rng.random()))) for _ in range(n - 1)]
        last = total - sum(lens)
        lens.append(last)
        if last > 0 and len(set(lens)) == n:
            return lens
    raise ShapeError(f"could not draw {n} distinct lengths summing to {total}")  # pragma: no cover


def cu_seqlens_list(seqlens) -> list:
    out = [0]
    for n in seqlens:
        out.append(out[-1] + n)
    return out


_CUSTOM_KEYS = {"B", "T", "HQ", "H", "D", "K", "V", "W", "N", "SEED", "TQ", "SOFTCAP"}
_CUSTOM_FLAGS = {"gated", "sink", "varlen", "noncausal", "lse", "bf16", "fp16", "fp32"}


def parse_custom(spec: str, name: str = "custom") -> Shape:
    """Parse `B=1,T=1024,HQ=32,H=4,D=128[,W=512][,gated][,sink][,varlen][,fp16|fp32][,N=4][,SEED=0]` and the call's
    variants `[,noncausal][,SOFTCAP=30][,lse][,TQ=256]` (T is then k's length)."""
    vals, flags = {}, set()
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise ShapeError(f"custom shape {spec!r}: empty field")
        if "=" in item:
            key, _, val = item.partition("=")
            key = key.strip().upper()
            if key not in _CUSTOM_KEYS:
                raise ShapeError(f"custom shape {spec!r}: unknown key {key!r} (keys: {sorted(_CUSTOM_KEYS)})")
            try:
                vals[key] = float(val) if key == "SOFTCAP" else int(val)
            except ValueError:
                kind = "a number" if key == "SOFTCAP" else "an integer"
                raise ShapeError(f"custom shape {spec!r}: {key} needs {kind}, got {val!r}") from None
        elif item.lower() in _CUSTOM_FLAGS:
            flags.add(item.lower())
        else:
            raise ShapeError(f"custom shape {spec!r}: unknown flag {item!r} (flags: {sorted(_CUSTOM_FLAGS)})")
    missing = [k for k in ("B", "T", "HQ", "H") if k not in vals]
    if "D" not in vals and not ("K" in vals and "V" in vals):
        missing.append("D (or K and V)")
    if missing:
        raise ShapeError(f"custom shape {spec!r}: missing {', '.join(missing)}")
    dtypes = [d for d in DTYPES if d in flags]
    if len(dtypes) > 1:
        raise ShapeError(f"custom shape {spec!r}: more than one dtype flag {dtypes}")
    return Shape(
        name=name, B=vals["B"], T=vals["T"], HQ=vals["HQ"], H=vals["H"],
        K=vals.get("K", vals.get("D")), V=vals.get("V", vals.get("D")), W=vals.get("W"),
        gated="gated" in flags, sink="sink" in flags, varlen="varlen" in flags, nseq=vals.get("N", 0),
        seed=vals.get("SEED", 0), dtype=dtypes[0] if dtypes else "bf16", group="custom",
        causal="noncausal" not in flags, softcap=vals.get("SOFTCAP"), lse="lse" in flags, Tq=vals.get("TQ"),
    ).validate()


def unsupported(peer: str, shape) -> Optional[str]:
    """None when the peer computes this shape's function, else why not."""
    softcap, lse = getattr(shape, "softcap", None), getattr(shape, "lse", False)
    causal, tq = getattr(shape, "causal", True), getattr(shape, "Tq", None)
    if peer in ("sdpa-cudnn", "sdpa-fa2"):
        if shape.W is not None or shape.gated or shape.varlen or shape.sink:
            return "SDPA has no sliding window / gate / packed varlen / attention sink"
        if softcap:
            return "SDPA has no logit softcap"
        if lse:
            return "SDPA returns no logsumexp (return_lse)"
        if tq is not None and tq < shape.T:
            return "SDPA's is_causal aligns a shorter q top-left, not bottom-right (an explicit mask: not wired)"
        if shape.dtype == "fp32":
            return ("cuDNN attention" if peer == "sdpa-cudnn" else "FlashAttention-2") + " is fp16/bf16 only"
        if peer == "sdpa-fa2" and shape.K != shape.V:
            return "FlashAttention-2 needs equal q/k and v head dims"
    if peer == "fa3":
        if shape.K != 128 or shape.V != 128:
            return "the flash_attn3_jax wheel has head-dim-128 kernels only"
        if shape.gated:
            return "FA3 has no forget gate"
        if shape.sink:
            return "the flash_attn3_jax wheel has no attention sink"
        if shape.varlen:
            return "FA3 varlen not wired in this harness"
        if softcap:
            return "the flash_attn3_jax wheel takes no softcap (its lowering passes softcap=0.0)"
        if shape.dtype == "fp32":
            return "FA3 is fp16/bf16 only"
        # causal=False (is_causal=False), return_lse (its forward always returns lse) and Tq < Tk (FA3 aligns a
        # shorter q bottom-right, as parallel_attn does) are FA3's own calls
    if peer in FA4_PEERS:
        why = fa4_unsupported(shape)
        if why:
            return why
        if peer == "fa4-det" and tuple(getattr(shape, "modes", ())) == ("fwd",):
            return "deterministic=True changes only FA4's backward: a forward-alone row is fa4's"
    if peer == "flex":
        if shape.sink:
            return "Flex has no sink logit (a logsumexp rescale of its output could add one: not wired)"
        if lse:
            return "Flex's lse output (return_lse / return_aux, by torch version) is not wired"
        if softcap and shape.gated:
            return "Flex with a softcap and a gate together is not wired"
    if peer == "fla":
        if not causal:
            return "FLA 0.6's parallel_attn is causal only"
        if softcap:
            return "FLA 0.6's parallel_attn has no softcap"
        if lse:
            return "FLA 0.6's parallel_attn has no return_lse"
        if tq is not None and tq < shape.T:
            return "FLA 0.6's parallel_attn needs q as long as k"
    return None


def fa4_unsupported(shape) -> Optional[str]:
    """None when FlashAttention-4 (flash_attn.cute 4.0.0b36, its SM90 path) computes this row's function, else why
    not. It takes a window (left, right), a learnable sink with its gradient, softcap, causal=False, return_lse, a
    shorter q aligned bottom-right and packed sequences (cu_seqlens); it has no forget gate."""
    if shape.gated:
        return "FA4 has no forget gate (its score_mod could add one: not wired)"
    if shape.dtype == "fp32":
        return "FA4 is fp16/bf16 only"
    bad = [d for d in (shape.K, shape.V) if not (8 <= d <= 256 and d % 8 == 0)]
    if bad:
        return f"FA4's SM90 path takes head dims 8..256 in multiples of 8, not {bad[0]}"
    if shape.K != shape.V and shape.G > 1:
        return "FA4's SM90 backward needs equal q/k and v head dims under GQA"
    return None
