#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Compile the attention kernels for sm_90 on a machine with no GPU and report registers, spills and shared
memory per config (ptxas -v). Catches GPU-only compile errors before a device call, and answers "does this
config spill" without spending device time.

    python scripts/compile_sm90.py                     # every kernel at the configs the launchers use
    python scripts/compile_sm90.py --dkv BT=128,BS=64,num_warps=8
    python scripts/compile_sm90.py --dims 128 --plain --loops   # + per-loop instructions and spills (SASS)
    python scripts/compile_sm90.py --hopper --loops              # the Gluon dK/dV kernel (gluon_dkv.py)
    python scripts/compile_sm90.py --hopper-fwd --loops          # the Gluon forward (gluon_fwd.py)

`--sass-hash` adds a hash of each kernel's whole SASS and one of its PTX, both blind to the source's file, line
numbers and the kernel's name (`sass_text`, `ptx_text`): a change that must not alter the generated code (a new
constexpr variant, a refactor) is checked by comparing the hashes before and after it (scripts/sass_diff.py).

`--loops` lists, for every loop of the SASS that holds matrix products (HGMMA), its instruction count and its
local-memory stores/loads (STL/LDL: spill traffic); then whether ptxas serialized the kernel's wgmmas (C7515).
The stack size is a maximum over the whole kernel; the loops say where the spills are, e.g. whether the unmasked
bulk loop spills at all. Check with the device's Triton (3.6): ptxas's verdict differs between versions.
"""

import argparse
import concurrent.futures
import functools
import hashlib
import multiprocessing
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import fla_bwd.ops.attn.kernels as P
from fla_bwd.ops.attn.config import (
    DK_FROM_DS_ABOVE_D,
    DK_FROM_DS_LAUNCH,
    DQ_FROM_DS_LAUNCH,
    DQ_FROM_DS_LAUNCH_WIDE,
    TILE_CONFIGS,
    tile_config,
)
from fla_bwd.ops.attn.inner import FLAG

HOPPER_SMEM_PER_BLOCK = 232448  # 227 KB: cudaDevAttrMaxSharedMemoryPerBlockOptin on H100/H200
TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32", torch.int8: "i8",
         torch.int64: "i64"}


def compile_sm90(kernel, args: dict, num_warps: int, num_stages: int):
    """`triton.compile` for sm_90 from Python-level launch arguments (tensors only give their dtype)."""
    fn, args = kernel, dict(args)
    while not isinstance(fn, triton.runtime.jit.JITFunction):  # unwrap @triton.heuristics
        for name, rule in getattr(fn, "values", {}).items():
            args[name] = rule(args)
        fn = fn.fn
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, param) in enumerate(zip(fn.arg_names, fn.params)):
        value = args[name]
        if param.is_constexpr or value is None:
            signature[name], constexprs[(i,)] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]  # the JIT's specialisation of a 16-byte aligned pointer
        else:
            signature[name] = "fp32" if isinstance(value, float) else "i32"
            if isinstance(value, int) and value % 16 == 0 and not param.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]  # and of an integer multiple of 16
    return triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, num_stages=num_stages))


def compile_hopper_sm90(dtype: torch.dtype, acc_in: bool, acc_out: bool, split: int = 2, chunk: int = 2,
                        gated: bool = False, sink: bool = False, softcap: bool = False, packed: bool = False, **knobs):
    """The Gluon dK/dV kernel (`gluon_dkv.parallel_attn_bwd_kernel_dkv_ds_hopper`) for sm_90 at H = 4, G = 8, with
    the pointer types its launches pass (ACC_IN, ACC_OUT: fp32 sums read, written; `gated`: the gate's inputs;
    `sink`: the sink and its partial sums; `softcap`: its cap_in; `packed`: the offsets and tile tables, lse and
    delta by pointer instead of by TMA) and its constexpr `knobs`."""
    from triton.experimental.gluon._runtime import GluonASTSource

    import fla_bwd.ops.attn.gluon_dkv as GD

    fn = GD.parallel_attn_bwd_kernel_dkv_ds_hopper
    e = TYPES[dtype]
    out = "*fp32" if acc_out or split > 1 else "*" + e
    sig = dict(q_desc=f"tensordesc<{e}[64, 128],{GD.Q_SMEM.value!r}>", k_desc=f"tensordesc<{e}[{GD.BH}, 128],"
               f"{GD.KV_SMEM.value!r}>", lse_desc=f"tensordesc<fp32[64],{GD.ROW_SMEM.value!r}>",
               ds_desc=f"tensordesc<{e}[64, 64],{GD.DS_TILE.value!r}>", dk=out, dv=out,
               dk_in="*fp32" if acc_in else out, nonfinite="*i8", sched="*i32", L="i32", B="i32", T="i32",
               NTILE="i32", G0="i32", qk_scale="fp32", dk_scale="fp32", ACC_IN="i32")
    sig.update(v_desc=sig["k_desc"], do_desc=sig["q_desc"], delta_desc=sig["lse_desc"], dv_in=sig["dk_in"])
    values = dict(H=4, G=8, SPLIT=split, CHUNK=chunk, **knobs)
    if gated:
        sig.update(gc_desc=sig["lse_desc"], gc="*fp32")
    else:
        values.update(gc_desc=None, gc=None)
    if packed:
        sig.update(cu_seqlens="*i32", chunks="*i32", ds_offsets="*i64", k64_offsets="*i64", NT64="i32", lse="*fp32",
                   delta="*fp32")
        values.update(lse_desc=None, delta_desc=None, gc_desc=None)
        del sig["lse_desc"], sig["delta_desc"]
        sig.pop("gc_desc", None)
    else:
        values.update(cu_seqlens=None, chunks=None, ds_offsets=None, k64_offsets=None, NT64=None, lse=None,
                      delta=None)
    if sink:
        sig.update(sink_bias="*fp32", sink_part="*fp32")
    else:
        values.update(sink_bias=None, sink_part=None)
    if softcap:
        sig["cap_in"] = "fp32"
    else:
        values["cap_in"] = None
    names = fn.arg_names
    signature = {n: sig.get(n, "constexpr") for n in names}
    constexprs = {(names.index(n),): v for n, v in values.items()}
    attrs = {(names.index(n),): [["tt.divisibility", 16]]
             for n in ("dk", "dv", "dk_in", "dv_in", "nonfinite", "sched") + (("gc",) if gated else ())}
    return triton.compile(GluonASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=GD.NUM_WARPS))


def compile_hopper_fwd_sm90(dtype: torch.dtype, causal: bool = True, gated: bool = False, sink: bool = False,
                            o_lo: bool = False, lse_out: bool = False, packed: bool = False, D: int = 128,
                            softcap: bool = False):
    """The Gluon forward (`gluon_fwd.parallel_attn_fwd_kernel_hopper`) for sm_90 at HQ = 32, G = 4 and head dim D, with
    the pointer types its launches pass: causal (W a runtime int) or not (None), and the gate, the sink, o_lo and the
    user's lse each there or None; packed: cu_seqlens and chunk_indices int32 pointers, else None; softcap: an fp32
    softcap, else None."""
    from triton.experimental.gluon._runtime import GluonASTSource

    import fla_bwd.ops.attn.gluon_fwd as GF

    fn = GF.parallel_attn_fwd_kernel_hopper
    e = TYPES[dtype]
    q_block, kv_block = [GF.BH, D], [GF.KEYS[D], D]
    sig = dict(q_desc=f"tensordesc<{e}{q_block},{GF.smem_layout(q_block)!r}>",
               k_desc=f"tensordesc<{e}{kv_block},{GF.smem_layout(kv_block)!r}>", lse="*fp32", nonfinite="*i8",
               B="i32", T="i32", NT="i32", scale="fp32")
    sig.update(v_desc=sig["k_desc"], o="*" + e)
    values = dict(HQ=32, G=4)
    if causal:
        sig["W"] = "i32"
    else:
        values["W"] = None
    if gated:
        sig.update(gc="*fp32")
    else:
        values.update(gc=None)
    for name, on, ty in (("sink_bias", sink, "*fp32"), ("o_lo", o_lo, "*i8"), ("lse_out", lse_out, "*fp32"),
                         ("cu_seqlens", packed, "*i32"), ("chunk_indices", packed, "*i32"),
                         ("softcap", softcap, "fp32")):
        if on:
            sig[name] = ty
        else:
            values[name] = None
    names = fn.arg_names
    signature = {n: sig.get(n, "constexpr") for n in names}
    constexprs = {(names.index(n),): v for n, v in values.items()}
    aligned = ("o", "lse", "nonfinite") + (("gc",) if gated else ())
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton.compile(GluonASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=GF.NUM_WARPS))


# The Gluon forward's forms that --hopper-fwd compiles: (causal, gated, sink, o_lo, lse_out, packed)
HOPPER_FWD_FORMS = ((True, False, False, False, False, False), (False, False, False, False, False, False),
                    (True, True, False, True, False, False), (True, False, True, False, True, False),
                    (True, True, True, True, True, False), (True, False, False, False, False, True),
                    (True, False, True, False, True, True), (True, True, False, False, False, True))


def _nvidia_tool(name: str) -> str:
    """The path of a CUDA tool that Triton ships (cuobjdump, ptxas)."""
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def cuobjdump(compiled, flag: str) -> str:
    """The output of the cuobjdump Triton ships, run with `flag` on the compiled kernel's cubin."""
    tool = _nvidia_tool("cuobjdump")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        return subprocess.run([tool, flag, path], capture_output=True, text=True).stdout


def sass_text(compiled) -> str:
    """The kernel's SASS as `--sass-hash` hashes it, free of where the source is: without the `Function :` header
    and any `//##` line-info comment, the kernel's name replaced wherever else it appears."""
    name = compiled.metadata.name
    lines = (re.sub(r"\s*//##.*", "", line) for line in cuobjdump(compiled, "-sass").splitlines())
    return "\n".join(line.replace(name, "KERNEL") for line in lines if line.strip() and "Function :" not in line)


def ptx_text(compiled) -> str:
    """The kernel's PTX without its line information (`.loc`, `.file`, the debug sections and their labels),
    comments and name: what the code is, whatever its file, lines and name. ptxas reads the line information, and
    it can change register allocation and spill slots, not instructions (dK/dV at D = 128 compiled with and without
    TRITON_DISABLE_LINE_INFO): when `sass` differs and `ptx` does not, only that changed."""
    out = []
    for line in compiled.asm["ptx"].splitlines():
        if re.match(r"\s*\.(file|section\s+\.debug)", line):
            break  # the debug sections come last
        line = re.sub(r"//.*", "", line).rstrip()
        if line.strip() and not re.match(r"\s*\.loc\b|\$L__(tmp|func_begin|func_end)\d+:", line):
            out.append(line.replace(compiled.metadata.name, "KERNEL"))
    return "\n".join(out)


def code_hashes(compiled) -> str:
    """`sass HASH  ptx HASH` of the kernel (`sass_text`, `ptx_text`)."""
    h = lambda text: hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"sass {h(sass_text(compiled))}  ptx {h(ptx_text(compiled))}"


def wgmma_serialized(compiled) -> str:
    """ptxas's verdict on the kernel's wgmma pipelining: it serializes every wgmma of a function (each waits for
    itself) when it cannot prove a pipeline stage safe, and says so only in -v output (C7515 and kin), which
    Triton discards. The PTX is compiled again with Triton's ptxas to read it."""
    tool = _nvidia_tool("ptxas")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(compiled.asm["ptx"])
        run = subprocess.run([tool, "-v", "--gpu-name", "sm_90a", path, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True)
    why = re.findall(r"wgmma\.mma_async instructions are serialized due to (.*?) in the function",
                     run.stdout + run.stderr)
    return "SERIALIZED (" + "; ".join(why) + ")" if why else "pipelined"


def resource_report(compiled) -> str:
    """Registers, spills and shared memory of the cubin Triton built."""
    out = cuobjdump(compiled, "--dump-resource-usage")
    regs = re.search(r"REG:(\d+)", out)
    stack = re.search(r"STACK:(\d+)", out)
    local = re.search(r"LOCAL:(\d+)", out)
    if not regs:
        return f"cuobjdump gave no resource line: {out.strip()[:200]}"
    stack, local = stack.group(1) if stack else "?", local.group(1) if local else "?"
    return f"regs {regs.group(1):>3s}  stack {stack} B  local {local} B  smem {compiled.metadata.shared} B"


def sass_loops(compiled, ops=("HGMMA", "STL", "LDL")) -> list:
    """(first address, last address, instructions, {op: count}) of every backward branch's range in the SASS, in
    code order (nested ranges listed separately), counting the instructions of each of `ops`."""
    ins = []
    for line in cuobjdump(compiled, "-sass").splitlines():
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    out = []
    for addr, text in ins:
        target = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if not target or int(target.group(1), 16) >= addr:
            continue
        lo = int(target.group(1), 16)
        body = [x for a, x in ins if lo <= a <= addr]
        out.append((lo, addr, len(body), {op: sum(bool(re.search(rf"\b{op}\b", x)) for x in body) for op in ops}))
    return out


def loop_report(compiled) -> list:
    """One line per loop whose range holds HGMMA instructions (a loop with matrix products; `sass_loops`), in code
    order: address range, instructions, HGMMA, STL, LDL. Then ptxas's wgmma verdict on the whole kernel
    (`wgmma_serialized`)."""
    return [f"    loop [{lo:#x}, {addr:#x}]: {n:5d} instructions, HGMMA {c['HGMMA']:3d}, STL {c['STL']:3d}, "
            f"LDL {c['LDL']:3d}" for lo, addr, n, c in sass_loops(compiled) if c["HGMMA"]] + \
        [f"    wgmma: {wgmma_serialized(compiled)}"]


def kernels(D: int, dtype=torch.bfloat16, gated=True, sink=True, five=False, features=False):
    """(name, kernel, launch args, launcher config key) at head dim D, G = 8; `five`: the five-product backward's
    kernels instead; `features`: the kernels' forms for softcap and return_lse instead (`_features`)."""
    no_ds = dict(ds=None, dk_in=None, dv_in=None, NTILE=None, G0=None, CHUNK=None, HEADS=None, ACC_OUT=False)
    t = lambda dt=dtype: torch.empty(1, dtype=dt)
    f32 = torch.float32
    dims = dict(HQ=32, H=4, G=8, K=D, V=D, BK=max(16, triton.next_power_of_2(D)), BV=max(16, triton.next_power_of_2(D)),
                DOT_PREC="ieee" if dtype == f32 else "tf32")
    gate, sk = (t(f32) if gated else None), (t(f32) if sink else None)
    base = dict(q=t(), k=t(), v=t(), lse=t(f32), nonfinite=t(torch.int8), g_cumsum=gate, cu_seqlens=None,
                cu_seqlens_q=None, chunk_indices=None, scale=0.1, softcap=None, T=100, W=100, WR=None, NTOK=100, B=1,
                Q0=None, **dims)
    dkv = dict(base, do=t(), dgc_k=gate, dsink_partial=sk, dsink=sk, delta=t(f32), NUM_PARTIALS=7)
    # Each kernel is compiled in its three CONTAIN modes (INLINE, FLAG, FIXUP; see `host.add_contained`).
    plain = [
        ("fwd", P.parallel_attn_fwd_kernel, dict(base, o=t(), o_lo=None, lse_out=None, sink_bias=sk), "fwd"),
        ("dq", P.parallel_attn_bwd_kernel_dq,
         dict(base, o=t(), do=t(), dq=t(), dgc_q=gate, dlse=None, delta=t(f32), sink_bias=sk, dsink_partial=sk,
              REFINE_DELTA=gated and not sink, EXACT_DELTA=sink), "dq"),
        ("dkv_per_query_head", P.parallel_attn_bwd_kernel_dkv_per_query_head, dict(dkv, dk=t(f32), dv=t(f32)), "dkv"),
        # SPLIT = 1; the split paths run the same loop over fewer heads, with the same tiles and shared memory.
        ("dkv_per_kv_head", P.parallel_attn_bwd_kernel_dkv_per_kv_head, dict(dkv, dk=t(), dv=t(), SPLIT=1, **no_ds),
         "dkv"),
    ]
    if 64 < D and "dkv_window" in TILE_CONFIGS[(dtype != f32, D > 128)]:  # short windows (`config.dkv_tiles`)
        plain.append(("dkv_per_kv_head_window", P.parallel_attn_bwd_kernel_dkv_per_kv_head,
                      dict(dkv, dk=t(), dv=t(), SPLIT=1, W=50, **no_ds), "dkv_window"))
    if five:  # the five-product backward: a middle chunk's dK/dV launch, unsplit, packed, split, gated, sink
        store = dict(dkv, g_cumsum=None, dgc_k=None, dsink_partial=None, dsink=None, dk=t(f32), dv=t(f32), ds=t(),
                     dk_in=t(f32), dv_in=t(f32), sink_bias=None, sink_part=None, NTILE=1000, G0=2, CHUNK=2, HEADS=1,
                     ACC_OUT=True, DK_FROM_DS=False, ds_offsets=None, TILES=None)
        ds_kernel = P.parallel_attn_bwd_kernel_dkv_ds_per_kv_head
        i32 = torch.int32
        packed = dict(cu_seqlens=t(i32), chunk_indices=t(i32), ds_offsets=t(torch.int64), TILES=8000)
        plain = [("dkv_store_ds", ds_kernel, dict(store, SPLIT=1), "dkv_ds"),
                 ("dkv_store_ds_packed", ds_kernel, dict(store, SPLIT=1, **packed), "dkv_ds"),
                 ("dkv_store_ds_split4", ds_kernel, dict(store, SPLIT=4), "dkv_ds"),
                 ("dkv_store_ds_gated", ds_kernel,
                  dict(store, SPLIT=1, g_cumsum=t(f32)), "dkv_ds"),
                 ("dkv_store_ds_sink", ds_kernel, dict(store, SPLIT=1, sink_bias=t(f32), sink_part=t(f32)), "dkv_ds")]
        if D > DK_FROM_DS_ABOVE_D:  # dV and dS alone (`FiveProduct.dk_from_ds`)
            dv_only = dict(store, SPLIT=1, dk=None, dk_in=None, DK_FROM_DS=True)
            plain += [("dv_store_ds", ds_kernel, dv_only, "dkv_ds"),
                      ("dv_store_ds_sink", ds_kernel, dict(dv_only, sink_bias=t(f32), sink_part=t(f32)), "dkv_ds")]
    if features:
        plain, extra = _features(D, dtype, t, plain, dkv, no_ds)
    modes = [(name + ("[inline]", "[flag]", "[fixup]")[mode], kernel, dict(launch, CONTAIN=mode), key)
             for name, kernel, launch, key in plain for mode in (0, 1, 2)]
    return modes + (_five_extra(D, dtype, t, base) if five else []) + (extra if features else [])


def _features(D: int, dtype, t, plain: list, dkv: dict, no_ds: dict):
    """(kernels in 3 CONTAIN modes, kernels in one) of softcap, non-causal calls, packed tail queries and return_lse:
    the forward, dQ, the per-KV-head and the dS-storing dK/dV kernels with softcap (the last with a sink; above head
    dim 128 its dV-alone form); the forward, dQ and the per-KV-head dK/dV kernel not causal (a window reaching 50
    keys ahead, a sink, no gate) and with packed queries shorter than keys (`cu_seqlens_q`, gated, with a sink); the
    forward storing the user's lse, dQ subtracting its gradient (with a sink: exact delta), and the five-product
    delta and sink-gradient kernels with it."""
    import fla_bwd.ops.attn.from_ds as F
    f32 = torch.float32
    fwd, dq, _, dkv_kv = (dict(launch) for _, _, launch, _ in plain[:4])
    cap = dict(softcap=4.0)
    store = dict(dkv, g_cumsum=None, dgc_k=None, dsink_partial=None, dsink=None, dk=t(f32), dv=t(f32), ds=t(),
                 dk_in=t(f32), dv_in=t(f32), sink_bias=t(f32), sink_part=t(f32), NTILE=1000, G0=2, CHUNK=2, HEADS=1,
                 ACC_OUT=True, DK_FROM_DS=D > DK_FROM_DS_ABOVE_D, SPLIT=1, ds_offsets=None, TILES=None, **cap)
    if store["DK_FROM_DS"]:
        store.update(dk=None, dk_in=None)
    ds_kernel = P.parallel_attn_bwd_kernel_dkv_ds_per_kv_head
    moded = [("fwd_softcap", P.parallel_attn_fwd_kernel, dict(fwd, **cap), "fwd"),
             ("dq_softcap", P.parallel_attn_bwd_kernel_dq, dict(dq, **cap), "dq"),
             ("dkv_per_kv_head_softcap", P.parallel_attn_bwd_kernel_dkv_per_kv_head, dict(dkv_kv, **cap), "dkv")]
    if dtype != f32:
        moded.append(("dkv_store_ds_softcap_sink", ds_kernel, store, "dkv_ds"))
    ungated = dict(g_cumsum=None, WR=50)
    moded += [("fwd_noncausal", P.parallel_attn_fwd_kernel, dict(fwd, **ungated), "fwd"),
              ("dq_noncausal", P.parallel_attn_bwd_kernel_dq, dict(dq, dgc_q=None, REFINE_DELTA=False, **ungated),
               "dq"),
              ("dkv_per_kv_head_noncausal", P.parallel_attn_bwd_kernel_dkv_per_kv_head,
               dict(dkv_kv, dgc_k=None, **ungated), "dkv")]
    i32 = torch.int32
    packed = dict(cu_seqlens=t(i32), cu_seqlens_q=t(i32), chunk_indices=t(i32))
    moded += [("fwd_tail_packed", P.parallel_attn_fwd_kernel, dict(fwd, **packed), "fwd"),
              ("dq_tail_packed", P.parallel_attn_bwd_kernel_dq, dict(dq, **packed), "dq"),
              ("dkv_per_kv_head_tail_packed", P.parallel_attn_bwd_kernel_dkv_per_kv_head, dict(dkv_kv, **packed),
               "dkv")]
    bk = max(16, triton.next_power_of_2(D))
    once = [("fwd_lse_out[flag]", P.parallel_attn_fwd_kernel, dict(fwd, lse_out=t(f32), CONTAIN=FLAG.value), "fwd"),
            ("dq_dlse[flag]", P.parallel_attn_bwd_kernel_dq, dict(dq, dlse=t(f32), CONTAIN=FLAG.value), "dq"),
            ("delta_dlse", F.delta_kernel, dict(o=t(), o_lo=None, do=t(), dlse=t(f32), delta=t(f32), R=1000,
                                                NTOK=100, HQ=32, V=D, BR=4096 // bk, BV=bk), "dkv_ds"),
            ("sink_grad_dlse", F.sink_grad_kernel, dict(lse=t(f32), delta=t(f32), dlse=t(f32), sink_bias=t(f32),
                                                        sink_part=t(f32), dsink=t(f32), NTOK=100, NP=8, HQ=32,
                                                        BN=1024, BP=8), "dkv_ds")]
    return moded, once


def _five_extra(D: int, dtype, t, base: dict):
    """The five-product backward's own kernels (no CONTAIN modes), and the gated forward that stores o_lo for them
    (`base`: the forward's and dK/dV kernels' common arguments, `kernels`)."""
    import fla_bwd.ops.attn.from_ds as F
    cfg = tile_config("dkv_ds", D, dtype)
    bk = max(16, triton.next_power_of_2(D))
    dq = dict(k=t(), ds=t(), dq=t(), cu_seqlens=None, chunk_indices=None, ds_offsets=None, ks_offsets=None, NTOK=None,
              scale=0.1, T=100, W=100, NTILE=1000, G0=2, HQ=32, H=4, G=8, CHUNK=2, K=D, BT=cfg["BT"], BQ=cfg["BS"],
              BK=bk, NUM_BANDS=8, SPLIT=1)
    packed = dict(cu_seqlens=t(torch.int32), chunk_indices=t(torch.int32), ds_offsets=t(torch.int64))
    keys = dict(ks_offsets=t(torch.int64), NTOK=1000)  # gated packed: with `packed`
    key_side = dict(dgk_part=t(torch.float32), dgc_k=t(torch.float32), cu_seqlens=None, chunk_indices=None,
                    ks_offsets=None, NTOK=None, T=100, W=100, G0=2, H=4, G=8, SPLIT=1, CHUNK=2, BT=cfg["BT"],
                    BQ=cfg["BS"], BR=256, BP=16, NUM_BANDS=8)
    f32 = torch.float32
    fwd = dict(base, o=t(), o_lo=t(torch.int8), lse_out=None, g_cumsum=t(f32), sink_bias=None, CONTAIN=FLAG.value)
    delta = dict(o=t(), o_lo=None, do=t(), dlse=None, delta=t(f32), R=1000, NTOK=100, HQ=32, V=D, BR=4096 // bk, BV=bk)
    dk = dict(q=t(), ds=t(), dk=t(f32), dk_in=t(f32), cu_seqlens=None, chunk_indices=None, ds_offsets=None,
              scale=0.1, T=100, W=100, NTILE=1000, G0=2, HQ=32, H=4, G=8, SPLIT=1, CHUNK=2, K=D, BT=cfg["BT"],
              BQ=cfg["BS"], BK=bk, NUM_PARTS=8, ACC_OUT=True)
    wide = [("dk_from_ds", F.parallel_attn_bwd_kernel_dk_from_ds, dk, "dkv_ds"),
            ("dk_from_ds_packed", F.parallel_attn_bwd_kernel_dk_from_ds, dict(dk, **packed), "dkv_ds")
            ] if D > DK_FROM_DS_ABOVE_D else []
    return wide + [("dq_from_ds", F.parallel_attn_bwd_kernel_dq_from_ds, dict(dq, dgc_q=None, dgk_part=None), "dkv_ds"),
            ("dq_from_ds_packed", F.parallel_attn_bwd_kernel_dq_from_ds, dict(dq, dgc_q=None, dgk_part=None, **packed),
             "dkv_ds"),
            ("dq_from_ds_gated", F.parallel_attn_bwd_kernel_dq_from_ds, dict(dq, dgc_q=t(f32), dgk_part=t(f32)),
             "dkv_ds"),
            ("dq_from_ds_packed_gated", F.parallel_attn_bwd_kernel_dq_from_ds,
             dict(dq, dgc_q=t(f32), dgk_part=t(f32), **packed, **keys), "dkv_ds"),
            ("key_side", F.key_side_kernel, key_side, "dkv_ds"),
            ("key_side_packed", F.key_side_kernel, dict(key_side, cu_seqlens=t(torch.int32),
                                                        chunk_indices=t(torch.int32), **keys), "dkv_ds"),
            ("gate_grad_of_band", F.gate_grad_of_band_kernel,
             dict(dgk_part=t(f32), dgc_q=t(f32), dg=t(f32), T=100, W=100, G0=2, HQ=32, H=4, G=8, SPLIT=1, CHUNK=2,
                  BT=cfg["BT"], BQ=cfg["BS"], BR=1024, BP=8, NUM_BANDS=8), "dkv_ds"),
            ("delta", F.delta_kernel, delta, "dkv_ds"),
            ("sink_grad", F.sink_grad_kernel, dict(lse=t(f32), delta=t(f32), dlse=None, sink_bias=t(f32),
                                                   sink_part=t(f32), dsink=t(f32), NTOK=100, NP=8, HQ=32, BN=1024,
                                                   BP=8), "dkv_ds"),
            # a gated five-product call's forward (the FLAG launch of long rows) stores o_lo; its delta reads it
            ("fwd_o_lo_gated[flag]", P.parallel_attn_fwd_kernel, fwd, "fwd"),
            ("delta_o_lo", F.delta_kernel, dict(delta, o_lo=t(torch.int8)), "dkv_ds")]


def parse_override(text):
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))} if text else {}


def compile_one(task: tuple) -> tuple:
    """(report lines, over-the-limit message or None) of one kernel; a task is (D, dtype name, variant, index of the
    kernel in `kernels`, overrides per launcher key, loops, SASS hash). Top-level, so worker processes can run it."""
    D, dtype_name, variant, index, overrides, loops, sass_hash = task
    dtype = getattr(torch, dtype_name)
    name, kernel, launch, key = kernels(D, dtype, *_FLAGS[variant])[index]
    cfg = dict(tile_config(key, D, dtype), **parse_override(overrides.get(key, "")))
    if name.startswith("dq_from_ds"):  # the dK/dV kernel's tiles, its own warps and stages
        cfg.update(DQ_FROM_DS_LAUNCH_WIDE if D > DK_FROM_DS_ABOVE_D else DQ_FROM_DS_LAUNCH)
    if name.startswith("dk_from_ds"):
        cfg.update(DK_FROM_DS_LAUNCH)
    nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
    c = compile_sm90(kernel, dict(launch, **cfg), nw, ns)
    lines = [f"D={D:3d} {name:26s} {cfg} warps={nw} stages={ns}: {resource_report(c)}"]
    if sass_hash:
        lines[0] += f"  {code_hashes(c)}"
    if loops:
        lines += loop_report(c)
    too_big = f"{name} D={D} {dtype_name}: {c.metadata.shared} B" if c.metadata.shared > HOPPER_SMEM_PER_BLOCK else None
    return lines, too_big


# (gated, sink, five-product kernels)
_FLAGS = {"plain": (False, False, False), "gate": (True, False, False), "gate+sink": (True, True, False),
          "five": (False, False, True), "features": (True, True, False, True)}


def _report_gluon(kind: str, forms: list, args) -> None:
    """Compile each (label, compile function) of a Gluon kernel's forms and print its report line (SASS hashes,
    loops where asked); with --check-smem, exit 1 if a form needs more shared memory than a block may use."""
    over = []
    for label, compile_form in forms:
        c = compile_form()
        print(f"{kind} {label} {args.dtype}: "
              f"{resource_report(c)}" + (f"  {code_hashes(c)}" if args.sass_hash else ""), flush=True)
        if args.loops:
            print("\n".join(loop_report(c)), flush=True)
        if c.metadata.shared > HOPPER_SMEM_PER_BLOCK:
            over.append(f"{label}: {c.metadata.shared} B")
    if args.check_smem and over:
        raise SystemExit("over the shared-memory limit: " + "; ".join(over))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--plain", action="store_true", help="no gate and no sink (default: both)")
    ap.add_argument("--gate-only", action="store_true", help="a gate and no sink")
    ap.add_argument("--five", action="store_true", help="the five-product backward's kernels (from_ds.py)")
    ap.add_argument("--hopper", action="store_true", help="the Gluon dK/dV kernel (gluon_dkv.py) instead")
    ap.add_argument("--hopper-fwd", action="store_true", help="the Gluon forward (gluon_fwd.py) instead")
    ap.add_argument("--features", action="store_true", help="the kernels' softcap and return_lse forms instead")
    ap.add_argument("--loops", action="store_true", help="also list each matrix-product loop's size and spills")
    ap.add_argument("--sass-hash", action="store_true",
                    help="also print hashes of each kernel's SASS and of its PTX, blind to file, line numbers and "
                    "kernel name (sass_text, ptx_text)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--check-smem", action="store_true",
                    help=f"exit 1 if a kernel needs more than {HOPPER_SMEM_PER_BLOCK} B of shared memory per block")
    ap.add_argument("--jobs", type=int, default=1, help="compile in this many processes (output order unchanged)")
    for k in ("fwd", "dq", "dkv"):
        ap.add_argument(f"--{k}", default="", help="override, e.g. BT=128,BS=64,num_warps=8,num_stages=2")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("compile_sm90.py compiles for the GPU: run it without TRITON_INTERPRET=1")
    dtype = getattr(torch, args.dtype)
    if args.hopper:
        _report_gluon("hopper dkv", [
            (f"ACC_IN={acc_in} ACC_OUT={acc_out} gated={gated}" + (" sink=True" if sink else ""),
             functools.partial(compile_hopper_sm90, dtype, acc_in, acc_out, gated=gated, sink=sink))
            for acc_in, acc_out in ((False, False), (True, True), (True, False))
            for gated, sink in ((False, False), (True, False), (False, True))] + [
            (f"ACC_IN={acc_in} ACC_OUT={acc_out} softcap=True" + (" sink=True" if sink else ""),
             functools.partial(compile_hopper_sm90, dtype, acc_in, acc_out, sink=sink, softcap=True))
            for acc_in, acc_out in ((False, False), (True, True)) for sink in (False, True)] + [
            (f"packed ACC_IN={acc_in} ACC_OUT={acc_out} gated={gated} sink={sink}",
             functools.partial(compile_hopper_sm90, dtype, acc_in, acc_out, gated=gated, sink=sink, packed=True))
            for acc_in, acc_out in ((False, False), (True, True)) for gated, sink in ((False, False), (True, True))],
            args)
        return
    if args.hopper_fwd:
        _report_gluon("hopper fwd", [
            (" ".join(f"{n}={v}" for n, v in zip(("causal", "gated", "sink", "o_lo", "lse_out", "packed", "D"),
                                                 form + (D,))),
             functools.partial(compile_hopper_fwd_sm90, dtype, *form, D=D))
            for D in map(int, args.dims.split(",")) for form in HOPPER_FWD_FORMS] + [
            (f"softcap=True causal={causal} gated={gated} D={D}",
             functools.partial(compile_hopper_fwd_sm90, dtype, causal, gated, D=D, softcap=True))
            for D in map(int, args.dims.split(",")) for causal, gated in ((True, False), (False, False), (True, True))],
            args)
        return
    overrides = {k: getattr(args, k) for k in ("fwd", "dq", "dkv")}
    if args.plain and args.gate_only:
        raise SystemExit("--plain and --gate-only exclude each other")
    variant = ("five" if args.five else "features" if args.features else "plain" if args.plain
               else "gate" if args.gate_only else "gate+sink")
    tasks = [(D, args.dtype, variant, i, overrides, args.loops, args.sass_hash)
             for D in map(int, args.dims.split(","))
             for i in range(len(kernels(D, getattr(torch, args.dtype), *_FLAGS[variant])))]
    too_big = []

    def report(results):
        for lines, over in results:
            print("\n".join(lines), flush=True)
            if over:
                too_big.append(over)

    if args.jobs > 1:
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            # Inside the block, so each kernel's lines come as it is done (in order), not all at the pool's shutdown:
            # tests/ops/test_kernel_resources.py reads them as progress.
            report(ex.map(compile_one, tasks))
    else:
        report(map(compile_one, tasks))
    if args.check_smem and too_big:
        raise SystemExit("over the shared-memory limit: " + "; ".join(too_big))


if __name__ == "__main__":
    main()
