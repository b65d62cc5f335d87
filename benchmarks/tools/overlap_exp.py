"""Experiment (issue 18, session 5): the dQ-from-dS launch of chunk n on a second stream beside the dK/dV launch of
chunk n + 1 (two dS buffers). Variants replace host.add_five_product_backward; backward timed with the runner's
method; gradients checked bitwise against the package's five-product backward."""
import json, math, os, statistics, sys
sys.path.insert(0, os.getcwd())
import torch, triton, triton.language as tl
from fla_bwd.ops.attn import host, from_ds, config, parallel_attn
from fla_bwd.ops.attn.config import tile_config
from fla_bwd.ops.attn.from_ds import (delta_kernel, ds_layout, parallel_attn_bwd_kernel_dq_from_ds, _key_ranges,
                                      _dq_ds_edge)
from fla_bwd.ops.attn.inner import ds_tile_index
from fla_bwd.ops.utils.launch import Ref, Launch
from fla_bwd.utils import cdiv, next_power_of_2
from benchmarks.ops.timing import Timer, median_us

STREAMS = {}


def side_stream(prio):
    if prio not in STREAMS:
        STREAMS[prio] = torch.cuda.Stream(priority=prio)
    return STREAMS[prio]


class Side:
    def __init__(self, step, prio):
        self.step, self.prio = step, prio

    def __call__(self, env, device, stream):
        s = side_stream(self.prio)
        if stream is not None:
            self.step(env, device, s.cuda_stream)
        else:
            with torch.cuda.stream(s):
                self.step(env, device, None)


class Record:
    def __init__(self, name, prio=None):
        self.name, self.prio = name, prio

    def __call__(self, env, device, stream):
        ev = torch.cuda.Event()
        ev.record(side_stream(self.prio) if self.prio is not None else torch.cuda.current_stream())
        env[self.name] = ev


class Wait:
    def __init__(self, name, prio=None):
        self.name, self.prio = name, prio

    def __call__(self, env, device, stream):
        (side_stream(self.prio) if self.prio is not None else torch.cuda.current_stream()).wait_event(env[self.name])


@triton.jit(do_not_specialize=["T", "W", "NTILE", "G0"])
def dq_from_ds_persistent(
    k, ds, dq, scale, T, W, NTILE, G0, ITEMS,
    HQ: tl.constexpr, H: tl.constexpr, G: tl.constexpr, CHUNK: tl.constexpr, K: tl.constexpr,
    BT: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, NUM_BANDS: tl.constexpr,
):
    for item in range(tl.program_id(0), ITEMS, tl.num_programs(0)):
        i_band = item % NUM_BANDS
        i_p = ITEMS // NUM_BANDS - 1 - item // NUM_BANDS
        i_b, i_h, i_c = i_band // (H * CHUNK), i_band // CHUNK % H, i_band % CHUNK
        i_hq = i_h * G + G0 + i_c
        bos = i_b.to(tl.int64) * T
        qa = 2 * i_p
        ta = qa * BQ
        lo_a, mid_a, hi_a = _key_ranges(ta, W, BT=BT, BQ=BQ)
        lo_b, mid_b, hi_b = _key_ranges(ta + BQ, W, BT=BT, BQ=BQ)
        b_exists = ta + BQ < T
        ds_base = ds + i_band.to(tl.int64) * NTILE * (BT * BQ)
        k_base = k + (bos * H + i_h) * K
        o_r = tl.arange(0, BT)
        o_c = tl.arange(0, BQ)
        b_dqa = tl.zeros([BQ, BK], dtype=tl.float32)
        b_dqb = tl.zeros([BQ, BK], dtype=tl.float32)
        m = tl.minimum(tl.maximum(mid_a, mid_b), hi_a)
        for i_j in range(lo_a, m):
            b_dqa, b_dqb = _dq_ds_edge(b_dqa, b_dqb, ds_base, k_base, qa, i_j, lo_a, mid_a, hi_a, lo_b, mid_b, hi_b,
                                       b_exists, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK)
        i_ta = ds_tile_index(qa, 0, W, BQ=BQ, BT=BT)
        i_tb = tl.where(b_exists, ds_tile_index(qa + 1, 0, W, BQ=BQ, BT=BT), i_ta)
        o_ds = o_r[:, None] * BQ + o_c[None, :]
        o_kr = o_r[:, None] * (H * K) + tl.arange(0, BK)[None, :]
        m_k = (tl.arange(0, BK) < K)[None, :]
        for i_j in range(m, hi_a):
            b_k = tl.load(k_base + tl.cast(i_j, tl.int64) * (BT * H * K) + o_kr, mask=m_k, other=0)
            b_dsta = tl.load(ds_base + (i_ta + i_j) * (BT * BQ) + o_ds)
            b_dstb = tl.load(ds_base + (i_tb + i_j) * (BT * BQ) + o_ds)
            b_dqa += tl.dot(tl.trans(b_dsta), b_k)
            b_dqb += tl.dot(tl.trans(b_dstb), b_k)
        for i_j in range(hi_a, tl.where(b_exists, hi_b, hi_a) + 1):
            b_dqa, b_dqb = _dq_ds_edge(b_dqa, b_dqb, ds_base, k_base, qa, i_j, lo_a, mid_a, hi_a, lo_b, mid_b, hi_b,
                                       b_exists, T, W, H * K, K=K, BT=BT, BQ=BQ, BK=BK)
        o_k = tl.arange(0, BK)
        p_dq = dq + (bos * HQ + i_hq) * K + o_k[None, :]
        o_t = ta + tl.arange(0, BQ)
        tl.store(p_dq + o_t[:, None].to(tl.int64) * (HQ * K), (b_dqa * scale).to(dq.dtype.element_ty),
                 mask=(o_t < T)[:, None] & (o_k < K)[None, :])
        o_t += BQ
        tl.store(p_dq + o_t[:, None].to(tl.int64) * (HQ * K), (b_dqb * scale).to(dq.dtype.element_ty),
                 mask=(o_t < T)[:, None] & (o_k < K)[None, :])


ORIGINAL = from_ds.add_five_product_backward


def make_builder(mode):
    """mode: heads (query heads of each group a launch, None: package), bufs (1, 2), prio (None: one stream, else
    the side stream's priority), persist (None: one program per item, else programs per SM)."""
    if mode is None:
        return ORIGINAL

    def build(plan, s, chunk, add_dkv_launch):
        G = s.HQ // s.H
        cfg = tile_config("dkv", max(s.K, s.V), s.dtype)
        BT, BQ = cfg["BT"], cfg["BS"]
        NTOK = s.B * s.T
        dq = plan.empty("dq", (s.B, s.T, s.HQ, s.K), s.dtype)
        delta = plan.empty("delta", (s.HQ, NTOK), torch.float32)
        R = NTOK * s.HQ
        BV = next_power_of_2(s.V)
        BR = max(1, 4096 // BV)
        plan.launch(delta_kernel, (cdiv(R, BR),), o=Ref("o"), do=Ref("do"), delta=delta, R=R, NTOK=NTOK,
                    HQ=s.HQ, V=s.V, BR=BR, BV=BV)
        ntile = ds_layout(s.T, s.W, BQ, BT)
        heads = mode["heads"] or math.gcd(chunk, 2 if s.T < config.DS_TWO_HEADS_BELOW_T else 1)
        bands = s.B * s.H * heads
        nbuf = mode["bufs"]
        bufs = [plan.empty(f"ds{i}", (bands * ntile * BT * BQ,), s.dtype) for i in range(nbuf)]
        launches = G // heads
        sums = [(plan.empty(f"dk_sum{i}", (s.B, s.T, s.H, s.K), torch.float32),
                 plan.empty(f"dv_sum{i}", (s.B, s.T, s.H, s.V), torch.float32)) for i in range(min(launches - 1, 2))]
        prio = mode["prio"]
        items = cdiv(s.T, 2 * BQ) * bands
        for n in range(launches):
            last = n == launches - 1
            if n >= nbuf:  # buffer n % nbuf was read by dq launch n - nbuf
                if prio is not None:
                    plan.steps.append(Wait(f"dqdone{n - nbuf}"))
            dk_in, dv_in = sums[(n - 1) % 2] if n > 0 else (None, None)
            add_dkv_launch(plan, s, None if last else sums[n % 2], ds=bufs[n % nbuf], NTILE=ntile, G0=n * heads,
                           CHUNK=heads, HEADS=heads, dk_in=dk_in, dv_in=dv_in, ACC_OUT=not last)
            if prio is not None:
                plan.steps.append(Record(f"dkvdone{n}"))
                plan.steps.append(Wait(f"dkvdone{n}", prio))
            common = dict(k=Ref("k"), ds=bufs[n % nbuf], dq=dq, scale=s.scale, T=s.T, W=s.W, NTILE=ntile,
                          G0=n * heads, HQ=s.HQ, H=s.H, G=G, CHUNK=heads, K=s.K, BT=BT, BQ=BQ,
                          BK=max(16, next_power_of_2(s.K)), NUM_BANDS=bands, **config.DQ_FROM_DS_LAUNCH)
            if mode["persist"]:
                progs = min(items, mode["persist"] * config.sm_count(s.device))
                plan.launch(dq_from_ds_persistent, (progs,), ITEMS=items, **common)
            else:
                plan.launch(parallel_attn_bwd_kernel_dq_from_ds, (items,), **common)
            if prio is not None:
                plan.steps[-1] = Side(plan.steps[-1], prio)
                plan.steps.append(Record(f"dqdone{n}", prio))
        if prio is not None:
            plan.steps.append(Wait(f"dqdone{launches - 1}"))
    return build


SHAPES = {  # B, T, HQ, H, D
    "g8-T8192": (1, 8192, 32, 4, 128),
    "gqa4-long": (2, 2048, 32, 8, 128),
    "g2-T2048-D128": (2, 2048, 32, 16, 128),
}
VARIANTS = {
    "pkg": None,
    "h1b1": dict(heads=None, bufs=1, prio=None, persist=None),   # dq after every launch, one stream
    "h1b2-lo": dict(heads=None, bufs=2, prio=0, persist=None),
    "h1b2-hi": dict(heads=None, bufs=2, prio=-1, persist=None),
    "h1b2-hi-p1": dict(heads=None, bufs=2, prio=-1, persist=1),
    "h1b2-lo-p1": dict(heads=None, bufs=2, prio=0, persist=1),
    "one-b2-hi-p1": dict(heads=1, bufs=2, prio=-1, persist=1),
    "h1b1-p1": dict(heads=None, bufs=1, prio=None, persist=1),
    "h1b1-p2": dict(heads=None, bufs=1, prio=None, persist=2),
    "h1b2-hi-p2": dict(heads=None, bufs=2, prio=-1, persist=2),
}


def main():
    os.environ["FLA_BWD_DQ_PATH"] = "from-ds"
    out = os.environ.get("OUT", ".")
    shapes = sys.argv[1].split(",") if len(sys.argv) > 1 else list(SHAPES)
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else list(VARIANTS)
    timer = Timer(torch.device("cuda"))
    res = {}
    for name in shapes:
        B, T, HQ, H, D = SHAPES[name]
        torch.manual_seed(0)
        q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
        o = parallel_attn(q, k, v)
        ref = None
        for var in variants:
            host.add_five_product_backward = make_builder(VARIANTS[var])
            host.clear_plans()
            fn = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
            grads = fn()
            torch.cuda.synchronize()
            if ref is None:
                ref = grads
            same = all(torch.equal(a, b) for a, b in zip(ref, grads))
            ts = [median_us(fn, "cuda", iters=30, timer=timer) for _ in range(2)]
            res[f"{name}/{var}"] = dict(us=ts, bitwise=same)
            print(f"{name:16s} {var:14s} bwd {ts[0]:8.1f} {ts[1]:8.1f} us  bitwise={same}", flush=True)
        host.add_five_product_backward = ORIGINAL
        host.clear_plans()
        del q, k, v, do, o, ref
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(out, "overlap.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
