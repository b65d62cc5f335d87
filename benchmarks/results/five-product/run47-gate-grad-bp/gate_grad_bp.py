# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`gate_grad_of_band_kernel` at gqa4-long-gated's launch (B2 T2048 HQ32 H8, split 1, chunk 4: 64 bands) in four
configs (BR keys a block, BP programs' partials a load, warps): main's (1024, 8, 8: one load of [8, 1024] partials,
two a block, two blocks), BP 16 (one load a block), and the whole band as one block (2048: one [16, 2048] load at 8
warps, 245 registers; or BP 8 at 16 warps): CUDA events, L2 flushed, interleaved, medians; and how far each dg is from
main's (the sum over programs changes its tree).

    python benchmarks/results/five-product/run47-gate-grad-bp/gate_grad_bp.py
"""

import json
import statistics

import torch

from benchmarks.ops.timing import Timer, interleaved
from fla_bwd.ops.attn.config import tile_config
from fla_bwd.ops.attn.from_ds import gate_grad_of_band_kernel
from fla_bwd.utils import cdiv


def main() -> None:
    B, T, HQ, H = 2, 2048, 32, 8
    G, split, chunk = HQ // H, 1, HQ // H
    cfg = tile_config("dkv", 128)
    BT, BQ = cfg["BT"], cfg["BS"]
    bands = B * H * split * chunk
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: TRITON_INTERPRET=1, one call each
    torch.manual_seed(0)
    dgk_part = torch.randn(cdiv(T, 2 * BQ), bands, T, device=dev)
    dgc_q = torch.randn(HQ, B * T, device=dev)
    outs = {}

    def launcher(BR, BP, warps):
        dg = torch.full((B, T, HQ), float("nan"), device=dev)
        outs[(BR, BP, warps)] = dg
        return lambda: gate_grad_of_band_kernel[(bands,)](
            dgk_part, dgc_q, dg, T, T, 0, HQ=HQ, H=H, G=G, SPLIT=split, CHUNK=chunk, BT=BT, BQ=BQ, BR=BR, BP=BP,
            NUM_BANDS=bands, num_warps=warps)

    configs = [(1024, 8, 8), (1024, 16, 8), (2048, 16, 8), (2048, 8, 16)]
    fns = {"BR{}-BP{}-w{}".format(*c): launcher(*c) for c in configs}
    res = {}
    if dev.type == "cuda":
        timer = Timer(dev)
        for fn in fns.values():
            timer.warmup(fn)
        rounds = interleaved(timer, fns, rounds=5, iters=40)
        res = {n: statistics.median([x for r in rs for x in r]) for n, rs in rounds.items()}
    else:
        for fn in fns.values():
            fn()
    main = outs[configs[0]]
    res["nan"] = [bool(outs[c].isnan().any()) for c in configs]
    res["max_rel_diff"] = [float((outs[c] - main).abs().max() / main.abs().max()) for c in configs]
    res["BT_BQ"] = [BT, BQ]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
