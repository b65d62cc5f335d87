#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Bitwise fingerprints of the attention ops on a fixed, seeded set of small cases, under Triton's CPU interpreter:
a restructuring that must not change behaviour is checked by comparing two trees' files.

    python scripts/bitwise_cases.py --out before.json                 # every case (a few minutes)
    python scripts/bitwise_cases.py --out after.json --compare before.json
    PYTHONPATH=/path/to/other/checkout python scripts/bitwise_cases.py ...   # another tree's fla_bwd

Per case: the sha256 of o and of every gradient (dq, dk, dv, dg, dsink), over dtype, shape and bytes; a ValueError
is recorded as "refused: <message>" (which calls are refused is behaviour too). Cases cover MHA and GQA (G = 2, 4,
8), gates, windows, sinks, packed sequences (with an empty and a one-token sequence), K != V, fp32/fp16/bf16,
lengths that are no multiple of the tiles and a NaN input, each under the routes the environment variables force
(FLA_BWD_DKV_PATH, FLA_BWD_DQ_PATH, FLA_BWD_DS_KERNEL, FLA_BWD_DS_BUDGET_MIB, FLA_BWD_CONTAINMENT: read at each
call, so set between cases), plus `settings.dkv_path(...)` blocks, parallel_forgetting_attn, window_size=0 with a
sink, and the tail-query calls `tail_forward`/`tail_backward` (found in whichever module of the package defines
them; "absent" when none does). --compare prints each case equal/different and exits 1 on any difference.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before torch-dependent fla_bwd imports triton

import argparse  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import pkgutil  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402

import torch  # noqa: E402

ROUTE_VARS = ("FLA_BWD_DKV_PATH", "FLA_BWD_DQ_PATH", "FLA_BWD_DS_KERNEL", "FLA_BWD_DS_BUDGET_MIB",
              "FLA_BWD_CONTAINMENT")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# name -> shape: B, T, HQ, H, K, V, dtype; gate, window, sink; lens (packed sequences, B = 1), nan (a NaN key)
SHAPES = {
    "mha-bf16": dict(B=2, T=67, HQ=2, H=2, K=32, V=32, dtype="bf16"),
    "g2-gate-fp16": dict(B=1, T=80, HQ=4, H=2, K=32, V=32, dtype="fp16", gate=True),
    "g4-window-fp32": dict(B=2, T=45, HQ=4, H=1, K=16, V=16, dtype="fp32", window=17),
    "g8-gate-sink-bf16": dict(B=1, T=45, HQ=8, H=1, K=64, V=64, dtype="bf16", gate=True, sink=True),
    "varlen-g2-gate-window-bf16": dict(B=1, HQ=4, H=2, K=32, V=32, dtype="bf16", gate=True, window=20,
                                       lens=(0, 1, 39, 33)),
    "k48v24-g2-sink-fp16": dict(B=2, T=50, HQ=4, H=2, K=48, V=24, dtype="fp16", sink=True),
    "g2-gate-sink-window-fp32": dict(B=1, T=75, HQ=4, H=2, K=32, V=16, dtype="fp32", gate=True, sink=True,
                                     window=30),
    "nan-g2-gate-bf16": dict(B=1, T=60, HQ=4, H=2, K=32, V=32, dtype="bf16", gate=True, nan=True),
}
# shapes run only under the routes EXTRA names: the five-product backward at G = 8
FIVE_SHAPES = {"g8-window-fp16": dict(B=1, T=48, HQ=8, H=1, K=32, V=32, dtype="fp16", window=20)}
# route name -> environment
ROUTES = {
    "auto": {},
    "dkv-gqa": dict(FLA_BWD_DKV_PATH="gqa"),
    "dkv-gqa-split2": dict(FLA_BWD_DKV_PATH="gqa-split2"),
    "dkv-gqa-split4": dict(FLA_BWD_DKV_PATH="gqa-split4"),
    "dkv-per-query-head": dict(FLA_BWD_DKV_PATH="per-query-head"),
    "dq-from-ds": dict(FLA_BWD_DQ_PATH="from-ds"),
    "contain-inline": dict(FLA_BWD_CONTAINMENT="inline"),
    "contain-two-launch": dict(FLA_BWD_CONTAINMENT="two-launch"),
}
# further (shape, route name, environment) pairs
EXTRA = [
    ("mha-bf16", "dq-from-ds+two-launch", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_CONTAINMENT="two-launch")),
    ("g2-gate-fp16", "dq-from-ds+split2", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DKV_PATH="gqa-split2")),
    ("g2-gate-fp16", "dq-from-ds+per-query-head", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DKV_PATH="per-query-head")),
    ("g8-gate-sink-bf16", "dq-recompute", dict(FLA_BWD_DQ_PATH="recompute")),
    ("mha-bf16", "dq-from-ds+ds-hopper", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DS_KERNEL="hopper")),
    ("mha-bf16", "dq-from-ds+ds-triton", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DS_KERNEL="triton")),
    ("mha-bf16", "dq-from-ds+budget0", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DS_BUDGET_MIB="0")),
    ("g2-gate-fp16", "dq-from-ds+budget-tiny", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DS_BUDGET_MIB="0.01")),
    ("g2-gate-fp16", "dq-from-ds+budget-1-head", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DS_BUDGET_MIB="0.03")),
    ("g8-window-fp16", "auto", {}),
    ("g8-window-fp16", "dq-from-ds", dict(FLA_BWD_DQ_PATH="from-ds")),
    ("g8-window-fp16", "dq-from-ds+split4", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DKV_PATH="gqa-split4")),
    ("g8-window-fp16", "dq-from-ds+budget-2-heads", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_DS_BUDGET_MIB="0.01")),
    ("mha-bf16", "dkv-legacy", dict(FLA_BWD_DKV_PATH="legacy")),
    ("nan-g2-gate-bf16", "dq-from-ds+inline", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_CONTAINMENT="inline")),
    ("nan-g2-gate-bf16", "dq-from-ds+two-launch", dict(FLA_BWD_DQ_PATH="from-ds", FLA_BWD_CONTAINMENT="two-launch")),
]


def fingerprint(t) -> str:
    if t is None:
        return "none"
    t = t.detach().cpu().contiguous()
    head = f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
    return head + " " + hashlib.sha256(head.encode() + t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def inputs(name: str, shape: dict) -> dict:
    """The seeded inputs of a shape (the same for every route): q, k, v, g, sink_bias (requiring grad), do,
    cu_seqlens, window_size."""
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    dtype = DTYPES[shape["dtype"]]
    lens = shape.get("lens")
    B, T = shape["B"], sum(lens) if lens else shape["T"]
    HQ, H, K, V = shape["HQ"], shape["H"], shape["K"], shape["V"]
    rand = lambda *s: torch.randn(*s, generator=gen)
    q, k, v = rand(B, T, HQ, K).to(dtype), rand(B, T, H, K).to(dtype), rand(B, T, H, V).to(dtype)
    if shape.get("nan"):
        k[0, T // 3, 0, 1] = float("nan")
    g = torch.nn.functional.logsigmoid(rand(B, T, HQ)) if shape.get("gate") else None
    sink = rand(HQ) if shape.get("sink") else None
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) if lens else None
    x = dict(q=q, k=k, v=v, g=g, sink_bias=sink)
    for t in x.values():
        if t is not None:
            t.requires_grad_(True)
    return dict(x, do=rand(B, T, HQ, V).to(dtype), cu_seqlens=cu, window_size=shape.get("window"))


@contextlib.contextmanager
def environment(env: dict):
    """The route variables set to `env` (the others unset) for a block."""
    saved = {name: os.environ.pop(name, None) for name in ROUTE_VARS}
    os.environ.update(env)
    try:
        yield
    finally:
        for name in ROUTE_VARS:
            os.environ.pop(name, None)
            if saved[name] is not None:
                os.environ[name] = saved[name]


def run_attn(fn, x: dict, **kw) -> dict:
    """o and the gradients of `fn`(q, k, v, ...) (forward, then backward with do) as fingerprints."""
    out = {}
    try:
        o = fn(**kw)
        out["o"] = fingerprint(o)
        names = [n for n in ("q", "k", "v", "g", "sink_bias") if x.get(n) is not None]
        grads = torch.autograd.grad(o, [x[n] for n in names], x["do"])
        out.update({"d" + ("sink" if n == "sink_bias" else n): fingerprint(d) for n, d in zip(names, grads)})
    except ValueError as e:
        out["refused"] = f"refused: {e}"
    return out


def attn_case(shape_name: str, env: dict, block=None) -> dict:
    from fla_bwd.ops.attn import parallel_attn

    x = inputs(shape_name, {**SHAPES, **FIVE_SHAPES}[shape_name])
    with environment(env), block or contextlib.nullcontext():
        return run_attn(parallel_attn, x, q=x["q"], k=x["k"], v=x["v"], g=x["g"], window_size=x["window_size"],
                        cu_seqlens=x["cu_seqlens"], sink_bias=x["sink_bias"])


def forgetting_case(shape_name: str, env: dict) -> dict:
    from fla_bwd.ops.forgetting_attn import parallel_forgetting_attn

    x = inputs(shape_name, SHAPES[shape_name])
    with environment(env):
        return run_attn(parallel_forgetting_attn, x, q=x["q"], k=x["k"], v=x["v"], g=x["g"],
                        window_size=x["window_size"], cu_seqlens=x["cu_seqlens"])


def no_key_case() -> dict:
    from fla_bwd.ops.attn import parallel_attn

    x = inputs("g8-gate-sink-bf16", SHAPES["g8-gate-sink-bf16"])
    return run_attn(parallel_attn, x, q=x["q"], k=x["k"], v=x["v"], g=x["g"], window_size=0, sink_bias=x["sink_bias"])


def find_function(name: str):
    """(module name, function) of the package's module that defines `name`, or (None, None)."""
    import fla_bwd

    for info in pkgutil.walk_packages(fla_bwd.__path__, "fla_bwd."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        fn = getattr(module, name, None)
        if callable(fn) and getattr(fn, "__module__", None) == info.name:
            return info.name, fn
    return None, None


def tail_case(shape_name: str, Tq: int, env: dict) -> dict:
    """`tail_forward` then `tail_backward` of the last Tq queries (Q0 = T - Tq, a multiple of 32: the interpreter's
    tail alignment)."""
    where_f, forward = find_function("tail_forward")
    where_b, backward = find_function("tail_backward")
    if forward is None or backward is None:
        return {"result": "absent"}
    shape = SHAPES[shape_name]
    x = inputs(shape_name, shape)
    q, k, v, g, sink = (x[n].detach() if x[n] is not None else None for n in ("q", "k", "v", "g", "sink_bias"))
    T, HQ = q.shape[1], shape["HQ"]
    # the gate's cumsum in base-2 units, [HQ, B * T] fp32
    gc = (g.float().cumsum(1) * 1.4426950408889634).permute(2, 0, 1).reshape(HQ, -1).contiguous() if g is not None \
        else None
    q, do = q[:, T - Tq:].contiguous(), x["do"][:, T - Tq:].contiguous()
    scale, window = shape["K"] ** -0.5, shape.get("window") or 0
    out = {"where": f"{where_f}, {where_b}"}
    with environment(env):
        try:
            o, lse = forward(q, k, v, gc, sink, scale, window)
            B, Tk = k.shape[:2]  # lse is written at the query positions only
            out.update(o=fingerprint(o), lse=fingerprint(lse.view(HQ, B, Tk)[:, :, Tk - Tq:]))
            grads = backward(do, q, k, v, o, lse, gc, sink, scale, window)
            out.update(zip(("dq", "dk", "dv", "dgc_q", "dgc_k", "dsink"), map(fingerprint, grads)))
        except ValueError as e:
            out["refused"] = f"refused: {e}"
    return out


def cases() -> dict:
    """case name -> function computing its result."""
    from fla_bwd import settings

    out = {f"{s}/{r}": (lambda s=s, env=env: attn_case(s, env)) for s in SHAPES for r, env in ROUTES.items()}
    out.update({f"{s}/{r}": (lambda s=s, env=env: attn_case(s, env)) for s, r, env in EXTRA})
    for name in ("gqa-split2", "per-query-head"):  # the in-process override, against the environment's
        out[f"g2-gate-fp16/with-dkv_path({name})"] = lambda n=name: attn_case(
            "g2-gate-fp16", dict(FLA_BWD_DKV_PATH="gqa"), settings.dkv_path(n))
    out["mha-bf16/with-dq_path(from-ds)"] = lambda: attn_case("mha-bf16", {}, settings.dq_path("from-ds"))
    out["g8-gate-sink-bf16/window0"] = no_key_case
    for s in ("g2-gate-fp16", "varlen-g2-gate-window-bf16"):
        out[f"forgetting/{s}"] = lambda s=s: forgetting_case(s, {})
    out["tail/g2-gate-fp16/Tq48"] = lambda: tail_case("g2-gate-fp16", 48, {})
    out["tail/g8-gate-sink-bf16/Tq13/dkv-gqa-split2"] = lambda: tail_case("g8-gate-sink-bf16", 13,
                                                                          dict(FLA_BWD_DKV_PATH="gqa-split2"))
    out["tail/g4-window-fp32/Tq13"] = lambda: tail_case("g4-window-fp32", 13, {})
    return out


def compare(mine: dict, other: dict) -> int:
    """Print each case equal/different/missing; the number that are not equal."""
    bad = 0
    for name in sorted(set(mine) | set(other)):
        a, b = mine.get(name), other.get(name)
        if a is None or b is None:
            print(f"{name}: missing in {'this run' if a is None else 'the other file'}")
            bad += 1
            continue
        a, b = ({k: v for k, v in r.items() if k not in ("seconds", "where")} for r in (a, b))
        diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        print(f"{name}: {'equal' if not diff else 'DIFFERENT: ' + ', '.join(diff)}")
        bad += bool(diff)
    print(f"{len(set(mine) | set(other)) - bad} equal, {bad} not")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the results here (JSON)")
    ap.add_argument("--compare", help="a file an earlier run wrote: compare, exit 1 on any difference")
    ap.add_argument("--only", help="run only the cases whose name matches this regular expression")
    ap.add_argument("--list", action="store_true", help="list the case names and exit")
    args = ap.parse_args(argv)
    import fla_bwd

    todo = {n: f for n, f in cases().items() if not args.only or re.search(args.only, n)}
    if args.list:
        print("\n".join(todo))
        return
    print(f"fla_bwd from {fla_bwd.__file__}; {len(todo)} cases", file=sys.stderr)
    torch.use_deterministic_algorithms(True)
    results, start = {}, time.perf_counter()
    for name, fn in todo.items():
        t0 = time.perf_counter()
        results[name] = dict(fn(), seconds=round(time.perf_counter() - t0, 2))
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    print(f"{len(results)} cases in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(package=fla_bwd.__file__, cases=results), f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            other = json.load(f)["cases"]
        sys.exit(1 if compare(results, {n: r for n, r in other.items() if n in results or not args.only}) else 0)


if __name__ == "__main__":
    main()
