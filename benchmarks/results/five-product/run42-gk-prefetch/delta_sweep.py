"""Session 17: delta_kernel launch sweep (BR rows a program, num_warps), gqa4-long and g8-T8192 shapes, with and
without o_lo. CUDA events, L2 flushed, medians of interleaved rounds (benchmarks.ops.timing)."""
import torch, triton
from benchmarks.ops.timing import Timer, interleaved
from fla_bwd.ops.attn.from_ds import delta_kernel
dev = torch.device("cuda")
timer = Timer(dev)
for name, (B, T, HQ, V) in {"gqa4-long": (2, 2048, 32, 128), "g8-T8192": (1, 8192, 32, 128)}.items():
    NTOK, R = B * T, B * T * HQ
    o, do, olo = (torch.randn(NTOK, HQ, V, device=dev, dtype=torch.bfloat16) for _ in range(3))
    ref = {}
    cands = {}
    for lo in (False, True):
        for BR in (32, 64, 128):
            for nw in (4, 8):
                d = torch.full((HQ, NTOK), float("nan"), device=dev)
                key = f"{'o_lo' if lo else 'plain'} BR{BR} w{nw}"
                f = (lambda d=d, BR=BR, nw=nw, lo=lo: delta_kernel[(triton.cdiv(R, BR),)](
                    o=o, o_lo=olo if lo else None, do=do, delta=d, R=R, NTOK=NTOK, HQ=HQ, V=V, BR=BR, BV=V,
                    num_warps=nw))
                f(); torch.cuda.synchronize()
                r = ref.setdefault(lo, d.clone())
                assert torch.allclose(d, r, rtol=1e-5, atol=1e-5), key  # the same sums up to the order
                cands[key] = f
    res = interleaved(timer, cands, rounds=5, iters=20)
    import statistics
    for k, v in res.items():
        print(name, k, round(statistics.median([x for r in v for x in r]), 1), flush=True)
