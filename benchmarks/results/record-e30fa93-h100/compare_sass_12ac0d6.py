# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The seven-product kernels of HEAD and of 12ac0d6 compiled for sm_90 with one harness (HEAD's
`scripts/compile_sm90.py`, Triton 3.6), side by side: registers, stack, SASS instructions and each matrix-product
loop's instructions / spill stores / spill loads (PERF.md #71). 12ac0d6's launch arguments come from its own
`compile_sm90.kernels`, its kernels from the renamed package `.baseline/fla_bwd_12ac0d6`.

    git worktree add /tmp/w12 12ac0d6
    cd scripts && WANT="dq[flag],dkv_per_kv_head[flag]" DT=float32 D=128 GATED=0 \
      PYTHONPATH=/tmp/t36:$REPO:$REPO/scripts python \
      $REPO/benchmarks/results/record-e30fa93-h100/compare_sass_12ac0d6.py
"""
import os
import re
import sys
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.argv = sys.argv[:1]
sys.path.insert(0, os.path.join(REPO, ".baseline"))
import compile_sm90 as C  # noqa: E402

OLD_SCRIPT = os.environ.get("OLD_SCRIPT", "/tmp/w12/scripts/compile_sm90.py")


def old_harness():
    """12ac0d6's compile_sm90.py up to its main(), importing the renamed package: its `kernels()`."""
    with open(OLD_SCRIPT) as f:
        src = f.read().replace("import fla_bwd.ops.attn.parallel as P", "import fla_bwd_12ac0d6.ops.attn.parallel as P")
    mod = types.ModuleType("compile_sm90_12ac0d6")
    exec(compile(src.split("\ndef main(")[0], OLD_SCRIPT, "exec"), mod.__dict__)
    return mod


def stats(compiled) -> str:
    """Resources, SASS instructions, and per loop with matrix products (HGMMA) or > 100 FFMA (fp32 kernels):
    instructions / STL / LDL (`compile_sm90.sass_loops`)."""
    loops = [f"{n}/{c['STL']}/{c['LDL']}" for _, _, n, c in C.sass_loops(compiled, ("FFMA", "HGMMA", "STL", "LDL"))
             if c["FFMA"] > 100 or c["HGMMA"]]
    total = sum(bool(re.match(r"\s+/\*[0-9a-f]+\*/", line)) for line in C.cuobjdump(compiled, "-sass").splitlines())
    return f"{C.resource_report(compiled)} total {total} loops(ins/STL/LDL) {' '.join(loops)}"


def main():
    want = os.environ["WANT"].split(",")  # e.g. dq[flag],dkv_per_kv_head[flag]
    dtype = getattr(C.torch, os.environ.get("DT", "bfloat16"))
    gated, D = os.environ.get("GATED") == "1", int(os.environ.get("D", 128))
    for label, ks in (("HEAD", C.kernels(D, dtype, gated, False, False)),
                      ("12ac0d6", old_harness().kernels(D, dtype, gated=gated, sink=False))):
        for name, kernel, launch, key in ks:
            if name in want:
                cfg = dict(C.tile_config(key, D, dtype))
                nw, ns = cfg.pop("num_warps"), cfg.pop("num_stages")
                print(f"{label:8s} {name:28s} {stats(C.compile_sm90(kernel, dict(launch, **cfg), nw, ns))}", flush=True)


if __name__ == "__main__":
    main()
