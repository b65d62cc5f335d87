"""Experiment (issue 18, session 5): the five-product backward with each group's heads split over 2 or 4 programs a
key tile, against seven products (auto dK/dV) on the imbalanced and balanced GQA rows. Backward timed with the
runner's method (CUDA events, L2 flush, median of 30), 2 rounds alternating."""
import json, os, sys
sys.path.insert(0, os.getcwd())
import torch
from fla_bwd.ops.attn import host, parallel_attn
from fla_bwd.settings import dq_path, dkv_path
import fla_bwd.ops.attn.from_ds as F
from benchmarks.ops.timing import Timer, median_us

SHAPES = {  # B, T, HQ, H, D
    "g8-T4096": (1, 4096, 32, 4, 128), "g8-T2048-D128": (2, 2048, 32, 4, 128), "ctl-g16-T2048": (2, 2048, 32, 2, 128),
    "g8-T8192": (1, 8192, 32, 4, 128), "gqa4-long": (2, 2048, 32, 8, 128), "g2-T2048-D128": (2, 2048, 32, 16, 128),
}
CONFIGS = {"seven": ("recompute", "auto"), "five": ("from-ds", "gqa"), "five-s2": ("from-ds", "gqa-split2"),
           "five-s4": ("from-ds", "gqa-split4"), "seven-s2": ("recompute", "gqa-split2")}


def main():
    out = os.environ.get("OUT", ".")
    shapes = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
    confs = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CONFIGS)
    timer = Timer(torch.device("cuda"))
    res = {}
    rec = []
    orig = F.five_product_chunk
    host.five_product_chunk = lambda *a: rec.append(orig(*a)) or rec[-1]
    for name in shapes:
        B, T, HQ, H, D = SHAPES[name]
        torch.manual_seed(0)
        mk = lambda h: torch.randn(B, T, h, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        q, k, v = mk(HQ), mk(H), mk(H)
        do = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
        o = parallel_attn(q, k, v)
        fns, grads = {}, {}
        for c in confs:
            G = HQ // H
            if c.endswith("s4") and G % 4 or c.endswith("s2") and G % 2:
                continue
            dqp, dkvp = CONFIGS[c]

            def fn(dqp=dqp, dkvp=dkvp):
                with dq_path(dqp), dkv_path(dkvp):
                    return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            try:
                grads[c] = fn()
            except ValueError as e:
                print(name, c, "skipped:", e)
                continue
            res.setdefault(f"{name}/{c}", {})["plan"] = str(rec[-1])
            fns[c] = fn
        torch.cuda.synchronize()
        for r in range(2):
            for c in (list(fns) if r == 0 else list(fns)[::-1]):
                t = median_us(fns[c], "cuda", iters=30, timer=timer)
                res[f"{name}/{c}"].setdefault("us", []).append(t)
        ref = grads[next(iter(grads))]
        for c in fns:
            e = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(grads[c], ref)]
            res[f"{name}/{c}"]["vs_seven"] = e
            print(f"{name:14s} {c:9s} {res[name + '/' + c]['plan']:38s} bwd " +
                  " ".join(f"{x:8.1f}" for x in res[f"{name}/{c}"]["us"]) + "  rel-to-seven " +
                  " ".join(f"{x:.1e}" for x in e), flush=True)
        del q, k, v, do, o, grads, fns
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(out, "split.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
