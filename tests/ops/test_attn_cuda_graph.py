# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Whole-step CUDA-graph capture (issue 19): `o = parallel_attn(...)` and `torch.autograd.grad(o, leaves, do)`
captured in ONE `torch.cuda.CUDAGraph`, as a training loop captures a step, on the dense, gated, windowed, varlen
and sink paths (and both containment modes: inline below `config.INLINE_CONTAINMENT_WORK`, FLAG + FIXUP above).

Protocol: warm-up calls on a side stream, then the capture on it (torch's documented order); the replay's o and
every gradient must be bitwise equal to an eager call on the same inputs, and again after fresh values are copied
into the static inputs (q, k, v, do, g, sink_bias; a replay reads whatever the captured tensors hold). cu_seqlens
keeps its values: a graph replays the launch grids and the host-side tile lists of its capture, so new offsets need
a new capture. GPU only: the interpreter has no streams or graphs."""

import pytest
import torch
import torch.nn.functional as F
from helpers import Case, make_inputs, params, run_parallel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="CUDA graphs need a GPU (Triton's CPU interpreter has no streams or graphs)")

SMALL = dict(B=2, T=256, HQ=8, H=2, K=64)  # bf16, G = 4; inline containment
CU = (0, 100, 357, 512)
CASES = [
    Case(**SMALL),
    Case(**SMALL, gate=True),
    Case(**SMALL, window=64),
    Case(B=1, T=512, HQ=8, H=2, K=64, cu_seqlens=CU),
    Case(**SMALL, sink=float("nan")),
    Case(B=2, T=256, HQ=8, H=8, K=64),  # MHA: the per-query-head dK/dV kernel
    Case(B=1, T=512, HQ=8, H=2, K=64, cu_seqlens=CU, gate=True, window=96, sink=float("nan")),
    Case(B=2, T=1024, HQ=8, H=2, K=128),  # 2**31 work: FLAG + FIXUP launches (two-launch containment)
]


def assert_bitwise(name: str, ref: torch.Tensor, out: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype, (name, out.shape, out.dtype, ref.shape, ref.dtype)
    assert torch.isfinite(ref).all(), f"{name}: the eager result is not finite (a poisoned element left unwritten?)"
    same = ref.contiguous().view(torch.uint8) == out.contiguous().view(torch.uint8)
    if not same.all():
        diff = (ref.float() - out.float()).abs()
        bad = (diff != 0) | ~torch.isfinite(out)
        raise AssertionError(f"{name}: {int(bad.sum())} of {ref.numel()} elements differ from eager, max |diff| "
                             f"{diff.nan_to_num(float('inf')).max().item():.3e}")


def check_replay(case: Case, x, static: dict, graph: "torch.cuda.CUDAGraph", tag: str) -> None:
    graph.replay()
    graph.replay()  # replays repeat: the second must leave what the first left
    torch.cuda.synchronize()
    replayed = {name: t.clone() for name, t in static.items()}
    eager = run_parallel(case, x)
    torch.cuda.synchronize()
    assert eager.keys() == replayed.keys()
    for name in eager:
        assert_bitwise(f"{name} ({tag})", eager[name], replayed[name])


@pytest.mark.parametrize("case", params(CASES))
def test_whole_step_capture_replays_bitwise_like_eager(case):
    x = make_inputs(case)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compiles and fills every host-side cache before the capture
            run_parallel(case, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static = run_parallel(case, x)
    assert not torch.cuda.is_current_stream_capturing()
    check_replay(case, x, static, graph, "captured inputs")
    first = {name: t.clone() for name, t in static.items()}

    with torch.no_grad():
        for t in (x.q, x.k, x.v, x.do):
            t.copy_(torch.randn_like(t))
        if x.g is not None:
            x.g.copy_(F.logsigmoid(torch.randn_like(x.g)))
        if x.sink_bias is not None:
            x.sink_bias.copy_(torch.randn_like(x.sink_bias))
    check_replay(case, x, static, graph, "fresh inputs")
    assert not torch.equal(first["o"], static["o"]), "the replay did not read the new values of the static inputs"
    del graph
