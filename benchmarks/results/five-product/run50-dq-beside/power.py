# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""g8-T8192 backward, ours and FA3 (flash_attn3_jax), each sustained for 8 s: per-call wall time of blocks of 40
calls (no L2 flush, the FA3 peer's method, for both) beside the SM clock, power and clock-event reasons."""
import os
import statistics
import subprocess
import sys
import time

os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
sys.path.insert(0, "/tmp/site")
import jax  # noqa: E402
import torch  # noqa: E402
from flash_attn3_jax import flash  # noqa: E402

from benchmarks.ops.peers import _to_jax  # noqa: E402
from benchmarks.tools.five_ab import _inputs  # noqa: E402
from fla_bwd.ops.attn import parallel_attn  # noqa: E402


def smi():
    q = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
    return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                          text=True).stdout.strip()


q, k, v, do, _ = _inputs(1, 8192, 32, 4, 128, torch.bfloat16, 0, False)
o = parallel_attn(q, k, v)
ours = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
cfg = dict(softmax_scale=128 ** -0.5, is_causal=True, window_size=(-1, -1))
jq, jk, jv, jdo = (_to_jax(t.detach()) for t in (q, k, v, do))
fwd = jax.jit(lambda q, k, v: flash._flash_mha_fwd(q, k, v, **cfg))
bwd = jax.jit(lambda d, q, k, v, o, lse: flash._flash_mha_bwd(d, q, k, v, o, lse, **cfg))
jo, jlse = jax.block_until_ready(fwd(jq, jk, jv))
fa3 = lambda: bwd(jdo, jq, jk, jv, jo, jlse)  # noqa: E731
syncs = {"ours": lambda r: torch.cuda.synchronize(), "fa3": jax.block_until_ready}
fns = {"ours": ours, "fa3": fa3}


def block(name, calls):
    t0 = time.perf_counter()
    r = None
    for _ in range(calls):
        r = fns[name]()
    syncs[name](r)
    return (time.perf_counter() - t0) * 1e6 / calls


for name in fns:
    for _ in range(3):
        block(name, 3)
for name in ("ours", "fa3", "ours", "fa3"):
    time.sleep(6)
    print(f"== {name}: rested {smi()}; short {block(name, 10):.0f} us", flush=True)
    t0, meds = time.time(), []
    while time.time() - t0 < 8:
        meds.append(block(name, 40))
        if len(meds) % 8 == 0:
            print(f"  t={time.time() - t0:4.1f}s {meds[-1]:.0f} us  {smi()}", flush=True)
    print(f"  {name} sustained: median {statistics.median(meds):.0f} us over {len(meds)} blocks; last {smi()}",
          flush=True)
