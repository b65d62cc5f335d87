# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The Hopper forward (`fla_bwd.ops.attn.gluon_fwd`, Gluon, sm_90 only).

On every machine: its dispatch (`dispatch.forward_kernel`, the kernel's scope faked on), that a forced "hopper" raises
where it cannot run, and its plan step (every kernel parameter passed, the inputs described as the kernel reads
them). On an sm_90 GPU: o and every gradient (the backward runs on its lse) against the fp32 oracle with poisoned
buffers, causal with and without windows, non-causal, gated, with sinks, with the user's lse, GQA and MHA, fp16 and
bf16; bitwise repeatable; NaN/Inf containment through its flags and the Triton FIXUP launch; a whole-step CUDA graph.
Gluon has no CPU interpreter; tests/ops/test_kernel_resources.py compiles it for sm_90 on the CPU.
"""

import math

import pytest
import test_attn_lse
import test_attn_nan
import test_attn_softcap
import torch
from conftest import DEVICE
from helpers import Case, check_against_oracle, make_inputs, run_parallel
from test_attn_cuda_graph import test_whole_step_capture_replays_bitwise_like_eager as _capture_replays_like_eager
from test_attn_noncausal import _oracle as _noncausal_oracle
from test_attn_noncausal import _ours as _noncausal_ours
from triton.experimental.gluon import language as gl

import fla_bwd.ops.attn.dispatch as dispatch
import fla_bwd.ops.attn.gluon_fwd as gluon_fwd
import fla_bwd.ops.attn.host as host
from fla_bwd.ops.attn import config
from fla_bwd.ops.attn.call import Shape
from fla_bwd.settings import dq_path, ds_kernel, fwd_kernel

bf16, f16 = torch.bfloat16, torch.float16
HOPPER = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel runs on sm_90 GPUs only (no CPU interpreter)")


def _shape(device=None, **kw) -> Shape:
    d = dict(device=device or torch.device(DEVICE), B=2, T=2048, HQ=8, H=2, K=128, V=128, dtype=bf16, g_dtype=None,
             sink_dtype=None, scale=128 ** -0.5, W=2048, containment="auto")
    d.update(kw)
    return Shape(**d)


class FwdSpy:
    """Records whether each forward ran the Hopper kernel (the plan's `forward`, `host._forward_plan`)."""

    def __init__(self, monkeypatch):
        self.hopper = []
        original = host._forward_plan

        def spy(*args, **kwargs):
            plan = original(*args, **kwargs)
            self.hopper.append(plan.forward[0])
            return plan

        monkeypatch.setattr(host, "_forward_plan", spy)


def test_tiles_match_the_triton_forward():
    """The flags of the FLAG launch index the Triton forward's programs: both take 128 queries a program."""
    for wide in (False, True):  # 16-bit, head dims up to 128 and above
        fwd = config.TILE_CONFIGS[(True, wide)]["fwd"]
        assert fwd["BT"] == gluon_fwd.BM
        assert fwd["BS"] == gluon_fwd.KEYS[256 if wide else 128]  # `_masked` is the Triton forward's key_ranges
    assert gluon_fwd.KEYS[64] == gluon_fwd.KEYS[128]


def test_out_of_scope_calls_say_why():
    assert "CUDA" in dispatch.hopper_fwd_why_not(_shape(), torch.device("cpu"), True)
    if HOPPER:
        cuda = torch.device("cuda")
        assert dispatch.hopper_fwd_why_not(_shape(device=cuda), cuda, True) is None
        assert dispatch.hopper_fwd_why_not(_shape(device=cuda, W=300), cuda, True) is None  # windows run
        assert dispatch.hopper_fwd_why_not(_shape(device=cuda, WR=2048), cuda, True) is None  # non-causal runs
        assert dispatch.hopper_fwd_why_not(_shape(device=cuda, softcap=30.0), cuda, True) is None  # softcap runs
        dims = "K = V in (64, 128, 256)"
        for kw, why in [(dict(K=96, V=96), dims), (dict(K=128, V=64), dims), (dict(dtype=torch.float32), "16-bit"),
                        (dict(T=1000, W=1000), "multiple of 128"), (dict(Q0=128), "tail queries"),
                        (dict(WR=5), "without a window"),
                        (dict(WR=1024, W=64), "without a window"), (dict(B=2**21, T=1024), "B * T")]:
            assert why in dispatch.hopper_fwd_why_not(_shape(device=cuda, **kw), cuda, True), kw
        assert "16-byte aligned" in dispatch.hopper_fwd_why_not(_shape(device=cuda), cuda, False)
        # The gate's cumsum is read by pointer (int64): HQ * B * T past 2**31 runs.
        assert dispatch.hopper_fwd_why_not(_shape(device=cuda, B=2**18, g_dtype=torch.float32), cuda, True) is None
        # Packed (B = 1): sequences of any length, causal only, every query.
        def packed(**kw):
            return _shape(**dict(dict(device=cuda, B=1, T=1000, W=1000), **kw))

        assert dispatch.hopper_fwd_why_not(packed(), cuda, True, dense=False) is None
        assert dispatch.hopper_fwd_why_not(packed(W=64, sink_dtype=bf16), cuda, True, dense=False) is None
        assert "causal attention only" in dispatch.hopper_fwd_why_not(packed(WR=1000), cuda, True, False)
        assert "tail queries" in dispatch.hopper_fwd_why_not(packed(QP=True), cuda, True, False)
        assert dispatch.hopper_fwd_why_not(packed(g_dtype=torch.float32), cuda, True, dense=False) is None


@pytest.mark.parametrize("kw", [dict(), dict(W=256), dict(WR=2048), dict(g_dtype=torch.float32),
                                dict(sink_dtype=torch.float32)], ids=["causal", "window", "noncausal", "gate", "sink"])
def test_dispatch(kw, monkeypatch):
    """Where the kernel can run (faked on here): "auto" (from `config.HOPPER_FWD_MIN_T` on) and "hopper" take it,
    "triton" never, dense or packed; inline containment (it is a FLAG launch) and inputs TMA cannot read keep Triton
    under "auto" and make a forced "hopper" raise."""
    monkeypatch.setattr(dispatch, "hopper_fwd_why_not",
                        lambda s, device, aligned, dense=True: None if aligned else "unaligned")
    s = _shape(**kw)
    assert dispatch.forward_kernel(s, True, True, "auto", False)[0]
    assert dispatch.forward_kernel(s, True, True, "hopper", False)[0]
    assert not dispatch.forward_kernel(s, True, True, "triton", False)[0]
    short = _shape(**dict(kw, T=1024, W=min(kw.get("W", 1024), 1024), WR=kw.get("WR") and 1024))
    hopper, why = dispatch.forward_kernel(short, True, True, "auto", False)  # below config.HOPPER_FWD_MIN_T
    assert not hopper and "T = 1024 < 2048" in why, why
    assert dispatch.forward_kernel(short, True, True, "hopper", False)[0]
    wide = _shape(**dict(kw, K=256, V=256))  # head dim 256: the Triton forward measured faster
    hopper, why = dispatch.forward_kernel(wide, True, True, "auto", False)
    assert not hopper and "head dim 256" in why, why
    assert dispatch.forward_kernel(wide, True, True, "hopper", False)[0]
    assert dispatch.forward_kernel(_shape(**dict(kw, K=64, V=64)), True, True, "auto", False)[0]
    assert dispatch.forward_kernel(s, False, True, "auto", False)[0]  # packed
    capped = _shape(**dict(kw, softcap=30.0))  # softcap: "auto" once config.HOPPER_SOFTCAP says it was measured
    for measured in (False, True):
        monkeypatch.setattr(config, "HOPPER_SOFTCAP", measured)
        hopper, why = dispatch.forward_kernel(capped, True, True, "auto", False)
        assert hopper == measured and (measured or "softcap" in why), why
        assert dispatch.forward_kernel(capped, True, True, "hopper", False)[0]
    for aligned, inline, match in [(True, True, "contains NaN/Inf inline"), (False, False, "unaligned")]:
        hopper, why = dispatch.forward_kernel(s, True, aligned, "auto", inline)
        assert not hopper and match in why
        with pytest.raises(ValueError, match=f"forward kernel 'hopper'.*{match}"):
            dispatch.forward_kernel(s, True, aligned, "hopper", inline)


def test_select_forward_says_why(monkeypatch):
    """`select_forward` gives the kernel the forward of these inputs runs and why, as the plan's (`plan.forward`)."""
    import fla_bwd

    monkeypatch.delenv("FLA_BWD_FWD_KERNEL", raising=False)
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    x = make_inputs(Case(B=1, T=2048, HQ=2, H=1, K=128, dtype=bf16))
    route = fla_bwd.select_forward(x.q, x.k, x.v)
    assert route.kernel == ("hopper" if HOPPER else "triton"), route
    assert route.explain().startswith("forward kernel: ")
    if not HOPPER:
        assert "CUDA GPUs only" in route.why or "sm_90" in route.why
    monkeypatch.setattr(dispatch, "hopper_fwd_why_not", lambda s, device, aligned, dense=True: None)
    assert fla_bwd.select_forward(x.q, x.k, x.v).kernel == "hopper"
    assert fla_bwd.select_forward(x.q, x.k, x.v, cu_seqlens=torch.tensor([0, 100, 2048], device=x.q.device)).why == (
        "hopper: the warp-specialized Gluon kernel runs this call")
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "inline")
    assert "inline" in fla_bwd.select_forward(x.q, x.k, x.v).why
    with fwd_kernel("triton"):
        assert fla_bwd.select_forward(x.q, x.k, x.v) == ("triton", "forced (FLA_BWD_FWD_KERNEL=triton)")
    with fwd_kernel("hopper"), pytest.raises(ValueError, match="forward kernel 'hopper'"):
        fla_bwd.select_forward(x.q, x.k, x.v)


def test_forced_hopper_raises_where_it_cannot_run():
    case = Case(B=1, T=100, HQ=4, H=2, K=128, dtype=bf16)  # T not a multiple of 128 (and, on the CPU, no GPU)
    x = make_inputs(case)
    with fwd_kernel("hopper"), pytest.raises(ValueError, match="forward kernel 'hopper'"):
        run_parallel(case, x)
    with pytest.raises(ValueError, match="fwd_kernel must be one of"):
        with fwd_kernel("gluon"):
            pass


def _step(gated: bool, sink: bool, o_lo: bool, lse_out: bool, packed: bool = False, **kw):
    from fla_bwd.ops.utils.launch import Ref

    s = _shape(device=torch.device("cpu"), **dict(kw, B=1) if packed else kw)
    args = dict(o=Ref("o"), o_lo=Ref("o_lo") if o_lo else None, lse=Ref("lse"), NT=s.T // 128,
                cu_seqlens=Ref("cu_seqlens") if packed else None, chunk_indices=Ref("chunks128") if packed else None,
                lse_out=Ref("lse_out") if lse_out else None, nonfinite=Ref("flags"),
                g_cumsum=Ref("gc") if gated else None, sink_bias=Ref("sink_bias") if sink else None)
    return s, gluon_fwd.HopperFwdLaunch(s, args)


@pytest.mark.parametrize("full", [False, True], ids=["plain", "every-option"])
@pytest.mark.parametrize("causal,packed", [(True, False), (False, False), (True, True)],
                         ids=["causal", "noncausal", "packed"])
def test_plan_step_passes_every_kernel_parameter(full, causal, packed):
    """The plan step launches through `launch.Launch`, whose direct path after the first launch passes its arguments
    in the kernel's parameter order: every parameter must be among them (one left out would be passed as None).
    Programs: `gluon_fwd.programs`."""
    from fla_bwd.ops.utils.launch import Launch, Ref, jit_function

    s, step = _step(full, full, full, full, packed, **({} if causal else dict(WR=1024)))
    assert isinstance(step.launch, Launch)
    params = jit_function(gluon_fwd.parallel_attn_fwd_kernel_hopper).arg_names
    assert set(step.launch.args) == set(params) | {"num_warps"}
    assert step.launch.grid[0] == gluon_fwd.programs(s, s.T // 128 * s.B * s.HQ)
    assert step.launch.args["NT"] == s.T // 128
    assert step.launch.args["W"] == (s.W if causal else None)  # None: every key
    assert step.launch.args["cu_seqlens"] == (Ref("cu_seqlens") if packed else None)
    assert step.launch.args["chunk_indices"] == (Ref("chunks128") if packed else None)
    expected = dict(gc=Ref("gc"), sink_bias=Ref("sink_bias"), o_lo=Ref("o_lo"), lse_out=Ref("lse_out"))
    assert {n: step.launch.args[n] for n in expected} == (expected if full else dict.fromkeys(expected))


def test_persistent_one_program_an_sm():
    """One program an SM on every call (the tiles snake over them), never more programs than tiles."""
    sms = config.sm_count(torch.device("cpu"))
    for kw in [dict(), dict(sink_dtype=bf16), dict(W=512), dict(WR=2048), dict(g_dtype=torch.float32), dict(B=1)]:
        assert gluon_fwd.programs(_shape(**kw), 16 * 2 * 8) == sms, kw
    assert gluon_fwd.programs(_shape(W=512), 40) == 40


@pytest.mark.parametrize("D", gluon_fwd.HEAD_DIMS)
def test_plan_step_describes_the_inputs(D):
    """The step's TMA descriptors (made on the CPU here): q, k and v viewed as `[B * T, heads * D]`, with the
    kernel's block shapes and shared-memory layouts (the kernel reads its head dim from them), the templates holding
    no tensor (o is stored by pointer)."""
    B, T, HQ, H = 1, 256, 4, 2
    _, step = _step(False, False, False, False, B=B, T=T, W=T, HQ=HQ, H=H, K=D, V=D)
    env = dict(q=torch.zeros(B, T, HQ, D, dtype=bf16), o=torch.zeros(B, T, HQ, D, dtype=bf16),
               k=torch.zeros(B, T, H, D, dtype=bf16), v=torch.zeros(B, T, H, D, dtype=bf16))
    step._descriptors(env)
    layout = gl.NVMMASharedLayout.get_default_for
    BN = gluon_fwd.KEYS[D]
    expected = {"q": ([B * T, HQ * D], [64, D], layout([64, D], gl.bfloat16)),
                "k": ([B * T, H * D], [BN, D], layout([BN, D], gl.bfloat16)),
                "v": ([B * T, H * D], [BN, D], layout([BN, D], gl.bfloat16))}
    for name, (shape, block, layout) in expected.items():
        d = env["_hopper_fwd_desc_" + name]
        assert d.base.data_ptr() == env[name].data_ptr(), name
        assert list(d.shape) == shape and list(d.strides) == shape[1:] + [1], name
        assert list(d.block_shape) == block and d.layout == layout, name
    assert all(t.base is None for *_, t in step.templates)
    assert "_hopper_fwd_desc_o" not in env


GPU_CASES = [Case(B=1, T=256, HQ=2, H=2, K=128, dtype=bf16), Case(B=2, T=384, HQ=8, H=2, K=128, dtype=f16),
             Case(B=1, T=512, HQ=8, H=1, K=128, dtype=bf16), Case(B=3, T=128, HQ=4, H=4, K=128, dtype=bf16, scale=0.3),
             Case(B=1, T=640, HQ=4, H=2, K=128, dtype=bf16, window=200),
             Case(B=2, T=512, HQ=4, H=1, K=128, dtype=f16, window=64),  # rows whose first tile shows them nothing
             Case(B=1, T=256, HQ=2, H=2, K=128, dtype=bf16, gate=True),
             Case(B=2, T=384, HQ=8, H=2, K=128, dtype=f16, gate=True, g_dtype=bf16, window=100),
             Case(B=2, T=512, HQ=8, H=2, K=128, dtype=bf16, sink=float("nan")),
             Case(B=1, T=384, HQ=4, H=1, K=128, dtype=f16, sink=2.0, sink_dtype=bf16, gate=True),
             Case(B=1, T=256, HQ=4, H=2, K=128, dtype=bf16, cu_seqlens=(0, 128, 256)),  # runs as the dense [2, 128]
             # Packed: empty and one-token sequences, lengths off the tiles (rows past a sequence are not stored).
             Case(B=1, T=700, HQ=4, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1, 300, 700)),
             Case(B=1, T=530, HQ=8, H=2, K=128, dtype=f16, cu_seqlens=(0, 129, 130, 400, 530), window=100),
             Case(B=1, T=600, HQ=4, H=1, K=128, dtype=bf16, cu_seqlens=(0, 250, 600), sink=1.0),
             # Packed and gated: sequences start off 16 bytes (the gate's cumsum by cp.async).
             Case(B=1, T=700, HQ=4, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1, 301, 700), gate=True),
             Case(B=1, T=530, HQ=8, H=2, K=128, dtype=f16, cu_seqlens=(0, 129, 130, 403, 530), window=100, gate=True,
                  sink=0.5),
             # Head dim 64: the same kernel, its blocks and the P V product's layout from the descriptors.
             Case(B=2, T=384, HQ=8, H=2, K=64, dtype=bf16), Case(B=1, T=640, HQ=4, H=1, K=64, dtype=f16, window=200),
             Case(B=1, T=384, HQ=4, H=2, K=64, dtype=bf16, gate=True, sink=0.5),
             Case(B=1, T=700, HQ=4, H=2, K=64, dtype=bf16, cu_seqlens=(0, 1, 1, 300, 700)),
             # Head dim 256: key tiles of 64 (the diagonal spans two), two stages.
             Case(B=2, T=384, HQ=4, H=2, K=256, dtype=bf16), Case(B=1, T=512, HQ=4, H=1, K=256, dtype=f16, window=100),
             Case(B=1, T=256, HQ=4, H=2, K=256, dtype=bf16, gate=True, sink=0.5),
             Case(B=1, T=530, HQ=4, H=2, K=256, dtype=bf16, cu_seqlens=(0, 129, 130, 400, 530))]


@needs_hopper
@pytest.mark.parametrize("case", GPU_CASES, ids=[c.id for c in GPU_CASES])
def test_matches_oracle(case, monkeypatch):
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")  # these small calls would contain inline (Triton then)
    spy = FwdSpy(monkeypatch)
    with fwd_kernel("hopper"):
        check_against_oracle(case)
    assert spy.hopper == [True], spy.hopper


@needs_hopper
@pytest.mark.parametrize("case", [Case(B=1, T=384, HQ=4, H=2, K=128, dtype=bf16),
                                  Case(B=2, T=256, HQ=4, H=4, K=128, dtype=f16, sink=float("nan")),
                                  Case(B=1, T=256, HQ=8, H=2, K=64, dtype=bf16),
                                  Case(B=1, T=256, HQ=4, H=2, K=256, dtype=bf16)],
                         ids=["g2", "mha-sink", "D64", "D256"])
def test_noncausal_matches_oracle(case, monkeypatch):
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    spy = FwdSpy(monkeypatch)
    with fwd_kernel("hopper"):
        check_against_oracle(case, None, _noncausal_ours(case, (-1, -1)), _noncausal_oracle(case, (-1, -1)))
    assert spy.hopper == [True], spy.hopper


SOFTCAP_CASES = [Case(B=2, T=256, HQ=4, H=2, K=128, dtype=bf16),
                 Case(B=1, T=384, HQ=8, H=2, K=128, dtype=f16, sink=1.0),
                 Case(B=1, T=512, HQ=4, H=1, K=128, dtype=bf16, window=200, gate=True),
                 Case(B=1, T=700, HQ=4, H=2, K=128, dtype=bf16, cu_seqlens=(0, 1, 1, 300, 700)),
                 Case(B=1, T=384, HQ=4, H=2, K=64, dtype=bf16, sink=0.5)]


@needs_hopper
@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=[c.id for c in SOFTCAP_CASES])
def test_softcap_matches_oracle(case, monkeypatch):
    """softcap on the Hopper forward (tests/ops/test_attn_softcap.py's sharp inputs, which the cap bends): o and
    every gradient against the capped fp32 oracle."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    spy = FwdSpy(monkeypatch)
    with fwd_kernel("hopper"):
        check_against_oracle(case, test_attn_softcap._sharp(case), test_attn_softcap._ours(case),
                             test_attn_softcap._oracle(case))
    assert spy.hopper == [True], spy.hopper


@needs_hopper
@pytest.mark.parametrize("case", [Case(B=2, T=256, HQ=4, H=2, K=128, dtype=bf16, sink=1.0, gate=True),
                                  Case(B=1, T=384, HQ=4, H=1, K=128, dtype=f16, window=100)], ids=["gate-sink", "W100"])
def test_lse_matches_oracle(case, monkeypatch):
    """`return_lse`: the user's lse (natural log) and the gradients through it, from the Hopper forward's rows."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    spy = FwdSpy(monkeypatch)
    with fwd_kernel("hopper"):
        test_attn_lse.check_lse_case(case)
    assert spy.hopper == [True], spy.hopper


@needs_hopper
def test_bitwise_repeatable_and_auto_takes_it(monkeypatch):
    """"auto" runs the Hopper kernel on a two-launch call, and a second call gives bitwise the same o and
    gradients; its o agrees with the Triton forward's to the products' rounding."""
    monkeypatch.delenv("FLA_BWD_FWD_KERNEL", raising=False)
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    case = Case(B=1, T=2048, HQ=4, H=2, K=128, dtype=bf16, gate=True)
    x = make_inputs(case)
    spy = FwdSpy(monkeypatch)
    first = run_parallel(case, x)
    again = run_parallel(case, x)
    assert spy.hopper == [True, True], spy.hopper
    for name in first:
        assert torch.equal(first[name], again[name]), name
    with fwd_kernel("triton"):
        triton = run_parallel(case, x)
    assert spy.hopper[-1] is False
    a, b = first["o"].double(), triton["o"].double()
    assert ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item() < 1e-3


@needs_hopper
@pytest.mark.parametrize("kw", [dict(), dict(window_size=300), dict(window_right=-1), dict(gate=True),
                                dict(gate=True, window_size=200), dict(sink=True), dict(packed=True),
                                dict(packed=True, sink=True, window_size=200), dict(D=64), dict(D=64, gate=True),
                                dict(D=64, window_right=-1), dict(D=64, packed=True, window_size=200), dict(D=256),
                                dict(D=256, gate=True, window_size=300), dict(D=256, window_right=-1),
                                dict(D=256, packed=True, sink=True), dict(packed=True, gate=True),
                                dict(D=256, packed=True, gate=True, window_size=200), dict(softcap=2.5),
                                dict(softcap=2.5, gate=True, window_size=300), dict(softcap=2.5, window_right=-1),
                                dict(D=64, softcap=2.5, sink=True), dict(softcap=2.5, packed=True)],
                         ids=["causal", "W300", "noncausal", "gated", "gated-W200", "sink", "packed",
                              "packed-sink-W200", "D64", "D64-gated", "D64-noncausal", "D64-packed-W200", "D256",
                              "D256-gated-W300", "D256-noncausal", "D256-packed-sink", "packed-gated",
                              "D256-packed-gated-W200", "softcap", "softcap-gated-W300", "softcap-noncausal",
                              "D64-softcap-sink", "softcap-packed"])
def test_rounds_as_the_triton_forward(kw, monkeypatch):
    """o, lse and o_lo bitwise the Triton forward's (what containment needs: the Triton FIXUP launch recomputes a
    flagged tile, whose finite rows must be the clean run's), for the rounding each choice of `_softmax` makes."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    if not kw.get("packed") and not (kw.get("softcap") and kw.get("gate")):  # a gated forward then makes o_lo (five
        monkeypatch.setenv("FLA_BWD_DQ_PATH", "from-ds")  # products need it; dense gated calls, no softcap with a gate)
    B, T, HQ, H, D = 2, 1024, 8, 2, kw.get("D", 128)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, n, D, generator=gen, device="cuda", dtype=bf16) for n in (HQ, H, H))
    g = (torch.nn.functional.logsigmoid(torch.randn(B, T, HQ, generator=gen, device="cuda") + 4)
         if kw.get("gate") else None)
    sink = torch.randn(HQ, generator=gen, device="cuda") if kw.get("sink") else None
    cu = None
    if kw.get("packed"):  # the same tokens as one packed batch of mixed lengths
        q, k, v = (x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v))
        g = None if g is None else g.reshape(1, B * T, HQ)
        cu = torch.tensor([0, 1, 1, 300, 1100, B * T], device="cuda", dtype=torch.int32)
    out = {}
    for kernel in ("triton", "hopper"):
        with fwd_kernel(kernel), ds_kernel("hopper" if D == 128 else "triton"):  # the Hopper dK/dV kernel: D 128
            o, lse, _, o_lo, _, _ = host.forward(q, k, v, g, sink, cu, D ** -0.5, kw.get("window_size", 0),
                                                 for_backward=True, window_right=kw.get("window_right"),
                                                 softcap=kw.get("softcap", 0.0))
            out[kernel] = (o, lse, o_lo)
    for name, a, b in zip(("o", "lse", "o_lo"), out["triton"], out["hopper"]):
        assert (a is None) == (b is None), name
        if a is not None:
            assert torch.equal(a, b), f"{name}: {int((a != b).sum())} elements differ"


@needs_hopper
@pytest.mark.parametrize("gate", [False, True], ids=["plain", "gated"])
@pytest.mark.parametrize("which,value", [("q", math.nan), ("k", math.inf), ("v", math.nan), ("q", math.inf)],
                         ids=["q_nan", "k_inf", "v_nan", "q_inf"])
def test_nan_inf_propagation(which, value, gate, monkeypatch):
    """tests/ops/test_attn_nan.py's check at a size this kernel runs: the flags it writes send exactly the tiles
    with a non-finite o to the Triton FIXUP launch, whose finite rows are bitwise this kernel's, and a non-finite
    input reaches only what depends on it. The backward runs on five products (the Hopper dK/dV kernel, which takes
    o_lo from this forward where gated). On seven products at this size a gated q's NaN moved dg by an ulp at
    positions after it on the H100, while this kernel's gated o, lse and o_lo were bitwise the Triton forward's:
    the seven-product backward's (its SAFE recompute of a flagged dK/dV tile rounds the independent keys' dgc_k
    otherwise, as in tests/ops/test_attn_lse.py's nan-two-launch-recompute case; `inner.dkv_block`'s fix for it
    has not run on a GPU yet)."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    for name, value_ in dict(NAN_T=256, NAN_D=128).items():
        monkeypatch.setattr(test_attn_nan, name, value_)
    spy = FwdSpy(monkeypatch)
    with fwd_kernel("hopper"), dq_path("from-ds"), ds_kernel("hopper"):
        out, clean, dep = test_attn_nan._poisoned_run(which, value, None, gate=gate)
    assert set(spy.hopper) == {True}, spy.hopper
    test_attn_nan._check_poisoned(out, clean, dep)


@needs_hopper
def test_whole_step_capture(monkeypatch):
    """Forward + backward in one CUDA graph replays bitwise like eager calls (the descriptors are made at each run of
    the plan, so a capture holds the captured tensors')."""
    monkeypatch.setenv("FLA_BWD_CONTAINMENT", "two-launch")
    spy = FwdSpy(monkeypatch)
    with fwd_kernel("hopper"):
        _capture_replays_like_eager(Case(B=2, T=512, HQ=8, H=2, K=128))
    assert spy.hopper and set(spy.hopper) == {True}, spy.hopper
