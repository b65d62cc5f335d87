# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`parallel_attn` under torch.compile and at import (issue 6, split out of test_attn_robust.py): one
`torch.compile(fullgraph=True, dynamic=True)` graph for every sequence length, matching eager and the fp32 oracle
`naive_parallel_attn` (0.005 error-ratio rule, `conftest.assert_close`), and the time `import fla_bwd.ops.attn`
adds to `import torch` in a fresh interpreter."""

import subprocess
import sys

import torch
from conftest import DEVICE
from helpers import Case, compare, make_inputs, run_reference

from fla_bwd.ops.attn import parallel_attn

bf16 = torch.bfloat16


# ------------------------------------------------------------------------------------------------------------
# torch.compile(fullgraph=True, dynamic=True): one graph for every sequence length
# ------------------------------------------------------------------------------------------------------------

def test_compile_fullgraph_dynamic_no_recompiles():
    """A compiled function calling parallel_attn (gate + window) then `.sum()`, forward and backward, at three
    sequence lengths: compiled once (a counting backend wraps aot_eager on CPU, inductor on the GPU), no graph
    breaks (fullgraph), and o and every gradient match the eager op bitwise-close and the oracle."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    inner = "inductor" if DEVICE == "cuda" else "aot_eager"
    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(len(gm.graph.nodes))
        return torch._dynamo.lookup_backend(inner)(gm, example_inputs)

    W = 8

    def f(q, k, v, g):
        o = parallel_attn(q, k, v, g=g, window_size=W)
        return o, o.sum()

    compiled = torch.compile(f, backend=counting_backend, fullgraph=True, dynamic=True)
    try:
        for T in (20, 37, 70):
            case = Case(B=2, T=T, HQ=4, H=2, K=32, dtype=bf16, gate=True, window=W)
            x = make_inputs(case)
            x.do = torch.ones_like(x.do)  # d(sum)/do
            o, loss = compiled(x.q, x.k, x.v, x.g)
            wrt = x.grad_inputs()
            grads = torch.autograd.grad(loss, list(wrt.values()))
            out = {"o": o, **dict(zip(wrt, grads))}
            # Eager on the same inputs: o, its sum and every gradient.
            o_eager = parallel_attn(x.q, x.k, x.v, g=x.g, window_size=W)
            eager = {"o": o_eager, **dict(zip(wrt, torch.autograd.grad(o_eager.sum(), list(wrt.values()))))}
            for name in out:
                assert torch.allclose(out[name].float(), eager[name].float(), rtol=1e-3, atol=1e-3), \
                    f"T={T} {name}: compiled != eager"
            assert torch.equal(loss, o_eager.sum()), f"T={T}: compiled loss != eager loss"
            compare(run_reference(case, x), out, tag=f"[compile T={T}]")
            assert len(compiles) == 1, f"recompiled at T={T}: {len(compiles)} compilations"
    finally:
        torch._dynamo.reset()
    print(f"compilations: {len(compiles)}, dynamo counters: {dict(torch._dynamo.utils.counters['stats'])}")


# ------------------------------------------------------------------------------------------------------------
# Import time
# ------------------------------------------------------------------------------------------------------------

def test_import_time():
    """In a fresh interpreter: `import torch`, then `import fla_bwd.ops.attn` on top of it. Sanity bound: the
    package (triton included) under 10 s."""
    code = ("import time; t0 = time.time(); import torch; t1 = time.time(); import fla_bwd.ops.attn; "
            "t2 = time.time(); print(t1 - t0, t2 - t1)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    t_torch, t_pkg = map(float, proc.stdout.split()[-2:])
    print(f"import torch: {t_torch:.2f} s; import fla_bwd.ops.attn after torch: {t_pkg:.2f} s")
    assert t_pkg < 10.0, f"import fla_bwd.ops.attn took {t_pkg:.1f} s (torch itself {t_torch:.1f} s)"
