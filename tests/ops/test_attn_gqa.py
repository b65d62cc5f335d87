# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The frozen correctness contract of the KV-head-owned dK/dV kernel ("gqa") and of its dispatch.

Every correctness case compares o and every gradient (dq, dk, dv, dg, dsink) with the fp32 oracle at error ratio
< 0.005 with poisoned buffers, and checks (through a spy on `host.dkv_kernel`) which dK/dV kernel actually ran.
"""

import pytest
import torch
from conftest import DEVICE, assert_close
from helpers import Case, DkvSpy, check_against_oracle, make_inputs, params, run_parallel

from fla_bwd.ops.attn import dkv_path, select_dkv_kernel

f16, bf16, f32 = torch.float16, torch.bfloat16, torch.float32

# The exact packed gated case of the contract: G = 8, bf16, D = 128, cu_seqlens [0, 33, 161, 390].
PACKED_G8 = Case(T=390, HQ=32 if DEVICE == "cuda" else 8, H=4 if DEVICE == "cuda" else 1, K=128, dtype=bf16,
                 gate=True, cu_seqlens=(0, 33, 161, 390))

# The "gqa" bucket: fp16/bf16, K == V in {64, 128}, G in {2, 4, 8}; every combination once, with T not a multiple
# of the tile, B > 1, gates, sinks, windows and packing spread over them.
CPU_CASES = [
    Case(B=2, T=63, HQ=2, H=1, K=64, dtype=f16),
    Case(B=1, T=111, HQ=4, H=2, K=64, dtype=bf16),
    Case(B=2, T=15, HQ=8, H=4, K=128, dtype=f16),
    Case(B=1, T=100, HQ=8, H=2, K=128, dtype=bf16),
    Case(B=2, T=45, HQ=4, H=1, K=64, dtype=f16, gate=True),
    Case(B=1, T=111, HQ=2, H=1, K=128, dtype=bf16, gate=True),
    Case(B=1, T=63, HQ=8, H=1, K=64, dtype=bf16, gate=True, sink=float("nan")),
    Case(B=2, T=33, HQ=4, H=2, K=128, dtype=f16, sink=float("nan")),
    Case(B=1, T=1, HQ=4, H=1, K=64, dtype=bf16, gate=True),
    Case(B=2, T=77, HQ=8, H=1, K=64, dtype=f16),
    Case(B=1, T=50, HQ=2, H=1, K=128, dtype=f16, gate=True, window=20),
    Case(B=2, T=63, HQ=8, H=2, K=128, dtype=bf16),
    # Gated GQA over unequal packed lengths (length-1 sequences, several KV heads), and the contract's case.
    Case(T=96, HQ=4, H=2, K=64, dtype=bf16, gate=True, cu_seqlens=(0, 1, 2, 50, 96)),
    Case(T=80, HQ=8, H=2, K=128, dtype=f16, gate=True, sink=float("nan"), cu_seqlens=(0, 17, 18, 80)),
    PACKED_G8,
    # Sliding-window boundaries: W = 1, around the tile sizes (16 / 32 / 33), just below / at / above T.
    Case(B=2, T=63, HQ=4, H=2, K=64, dtype=f16, window=1),
    Case(B=1, T=111, HQ=2, H=1, K=64, dtype=bf16, window=16, gate=True),
    Case(B=1, T=111, HQ=8, H=1, K=128, dtype=f16, window=32),
    Case(B=2, T=70, HQ=4, H=1, K=128, dtype=bf16, window=33),
    Case(B=1, T=111, HQ=4, H=2, K=64, dtype=f16, window=110, gate=True),
    Case(B=1, T=63, HQ=2, H=1, K=128, dtype=bf16, window=63),
    Case(B=1, T=63, HQ=8, H=4, K=64, dtype=bf16, window=64),
    # Packed sliding-window GQA.
    Case(T=111, HQ=4, H=2, K=64, dtype=bf16, window=16, cu_seqlens=(0, 1, 45, 46, 111)),
    Case(T=100, HQ=8, H=1, K=128, dtype=f16, window=33, gate=True, cu_seqlens=(0, 40, 41, 100)),
]

GPU_CASES = CPU_CASES + [
    Case(B=2, T=1024, HQ=16, H=8, K=128, dtype=bf16),
    Case(B=1, T=2048, HQ=32, H=8, K=128, dtype=bf16, gate=True),
    Case(B=1, T=4096, HQ=32, H=4, K=128, dtype=bf16),
    Case(B=1, T=4096, HQ=16, H=8, K=64, dtype=f16, gate=True),
    Case(B=2, T=2048, HQ=32, H=16, K=64, dtype=bf16, window=128),
    Case(B=1, T=4096, HQ=32, H=4, K=128, dtype=bf16, window=1000, gate=True, sink=float("nan")),
    Case(T=4096, HQ=32, H=8, K=128, dtype=bf16, gate=True, cu_seqlens=(0, 1, 1000, 1001, 3000, 4096)),
    Case(T=4096, HQ=16, H=4, K=128, dtype=f16, window=257, cu_seqlens=(0, 511, 2048, 2049, 4096)),
]

CASES = GPU_CASES if DEVICE == "cuda" else CPU_CASES


@pytest.fixture
def spy(monkeypatch):
    return DkvSpy(monkeypatch)


@pytest.fixture
def auto_env(monkeypatch):
    """No process-wide override: `select_dkv_kernel` in auto mode."""
    monkeypatch.delenv("FLA_BWD_DKV_PATH", raising=False)


def _tensors(HQ, H, K, V=None, dtype=bf16, device=DEVICE):
    V = K if V is None else V
    return (torch.empty(1, 1, HQ, K, dtype=dtype, device=device), torch.empty(1, 1, H, K, dtype=dtype, device=device),
            torch.empty(1, 1, H, V, dtype=dtype, device=device))


# ------------------------------------------------------------------------------------------------------------
# The KV-head-owned kernel, forced and through the dispatch
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", params(CASES))
def test_gqa_path_matches_oracle(case, spy, auto_env):
    x = make_inputs(case)
    picked = select_dkv_kernel(x.q, x.k, x.v, case.window, x.cu_seqlens)
    if case in CPU_CASES:
        # In the bucket and small (on the GPU no program's critical path exceeds 64 query blocks): always "gqa".
        assert picked.name == "gqa", "this case is in the gqa bucket"
    else:
        # Large GPU shapes: the load-balance rule may keep "legacy" (test_dispatch_load_balance_rule_on_gpu).
        assert picked.name in ("gqa", "gqa-split2", "gqa-split4", "per-query-head")
    with dkv_path("gqa"):
        check_against_oracle(case, x)
    assert spy.paths == ["gqa"]


# Split paths: cases with G >= 2 / >= 4 (dense, gated, sliding-window, packed), each group's heads dealt to 2 or 4
# programs whose fp32 partials the host sums.
_SPLIT_CASES = ([CPU_CASES[i] for i in (0, 3, 4, 6, 13)]
                + [c for c in CPU_CASES if c.window and c.HQ // c.H >= 4][:2])
if DEVICE == "cuda":  # shapes the dispatch sends to a split on the H200 (test_dispatch_load_balance_rule_on_gpu)
    _SPLIT_CASES += [Case(B=1, T=4096, HQ=32, H=4, K=128, dtype=bf16),
                     Case(B=2, T=2048, HQ=32, H=4, K=64, dtype=f16, gate=True),
                     Case(T=4096, HQ=32, H=4, K=128, dtype=bf16, gate=True, sink=float("nan"),
                          cu_seqlens=(0, 1000, 1001, 2500, 4096))]


@pytest.mark.parametrize("path", ["gqa-split2", "gqa-split4"])
@pytest.mark.parametrize("case", params(_SPLIT_CASES))
def test_gqa_split_path_matches_oracle(case, path, spy, auto_env):
    if (case.HQ // case.H) % int(path[-1]):
        with dkv_path(path), pytest.raises(ValueError, match=f"{path}.*multiple of {path[-1]}.*HQ // H = 2"):
            check_against_oracle(case)
        return
    with dkv_path(path):
        check_against_oracle(case)
    assert spy.paths == [path]


@pytest.mark.parametrize("case", params([CASES[1], CASES[6], CASES[13]]))
def test_gqa_path_through_auto_dispatch(case, spy, auto_env):
    check_against_oracle(case)
    assert spy.paths == ["gqa"]


# ------------------------------------------------------------------------------------------------------------
# Dispatch
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [f16, bf16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("G", [2, 4, 8])
def test_dispatch_picks_gqa(G, D, dtype, auto_env):
    for H in (1, 3):
        assert select_dkv_kernel(*_tensors(G * H, H, D, dtype=dtype)).name == "gqa"


@pytest.mark.parametrize(
    "HQ, H, K, V, dtype",
    [
        pytest.param(4, 4, 64, 64, bf16, id="MHA-bf16"),
        pytest.param(1, 1, 128, 128, f16, id="MHA-fp16"),
        pytest.param(16, 1, 128, 128, bf16, id="G16"),
        pytest.param(32, 2, 64, 64, f16, id="G16-H2"),
        pytest.param(12, 4, 64, 64, bf16, id="G3"),
        pytest.param(8, 1, 64, 64, f32, id="fp32-G8"),
        pytest.param(4, 2, 128, 128, f32, id="fp32-G2"),
        pytest.param(4, 1, 60, 60, bf16, id="D60"),
        pytest.param(4, 1, 100, 100, f16, id="D100"),
        pytest.param(4, 1, 256, 256, bf16, id="D256"),
        pytest.param(4, 1, 32, 32, f16, id="D32"),
        pytest.param(4, 1, 64, 32, bf16, id="K64-V32"),
        pytest.param(4, 1, 128, 64, f16, id="K128-V64"),
        pytest.param(8, 2, 64, 128, bf16, id="K64-V128"),
    ],
)
def test_dispatch_picks_legacy(HQ, H, K, V, dtype, auto_env):
    assert select_dkv_kernel(*_tensors(HQ, H, K, V, dtype)).name == "per-query-head"


def test_dispatch_off_gpu_ignores_load_balance(auto_env):
    """Off the GPU the bucket always takes "gqa", whatever the shape (meta tensors: nothing is allocated)."""
    q = torch.empty(1, 4096, 32, 128, dtype=bf16, device="meta")
    k = torch.empty(1, 4096, 4, 128, dtype=bf16, device="meta")
    assert select_dkv_kernel(q, k, k).name == "gqa"
    assert select_dkv_kernel(q, k, k, 1000).name == "gqa"


@pytest.mark.skipif(DEVICE != "cuda", reason="the load-balance rule applies only to GPU tensors")
def test_dispatch_load_balance_rule_on_gpu(auto_env):
    """The measured cases of `_gqa_split`: G8 B1 T4096 H4 and G8 B2 T2048 H4 (critical path 2x the
    average program) take a split of 2, GQA B2 T2048 H8 plain "gqa"; short sequences and narrow windows always
    "gqa"; a long single-KV-head G2 call, which no split below G balances, keeps "legacy"."""
    def pick(B, T, HQ, H, W=None):
        q = torch.empty(B, T, HQ, 128, dtype=bf16, device=DEVICE)
        k = torch.empty(B, T, H, 128, dtype=bf16, device=DEVICE)
        return select_dkv_kernel(q, k, k, W).name
    assert pick(1, 4096, 32, 4) == "gqa-split2"
    assert pick(2, 2048, 32, 4) == "gqa-split2"
    assert pick(1, 8192, 8, 1) == "gqa-split4"
    assert pick(1, 8192, 2, 1) == "per-query-head"
    assert pick(2, 2048, 32, 8) == "gqa"
    assert pick(1, 8192, 32, 4) == "gqa"
    assert pick(1, 390, 32, 4) == "gqa"
    assert pick(1, 4096, 32, 4, W=256) == "gqa"


def test_dispatch_overrides(monkeypatch):
    gqa_bucket, legacy_bucket = _tensors(8, 2, 64), _tensors(4, 4, 64)
    monkeypatch.delenv("FLA_BWD_DKV_PATH", raising=False)
    with dkv_path("legacy"):
        assert select_dkv_kernel(*gqa_bucket).name == "per-query-head"
        with dkv_path("gqa"):
            assert select_dkv_kernel(*legacy_bucket).name == "gqa"
        assert select_dkv_kernel(*legacy_bucket).name == "per-query-head"
    with dkv_path("auto"):
        assert select_dkv_kernel(*gqa_bucket).name == "gqa"
        assert select_dkv_kernel(*legacy_bucket).name == "per-query-head"
    # The environment variable sets the process-wide default, both ways; `dkv_path` overrides it, both ways.
    monkeypatch.setenv("FLA_BWD_DKV_PATH", "gqa")
    assert select_dkv_kernel(*legacy_bucket).name == "gqa"
    with dkv_path("legacy"):
        assert select_dkv_kernel(*gqa_bucket).name == "per-query-head"
    with dkv_path("auto"):
        assert select_dkv_kernel(*legacy_bucket).name == "per-query-head", \
            "dkv_path('auto') is the dispatch, over the env"
    monkeypatch.setenv("FLA_BWD_DKV_PATH", "legacy")
    assert select_dkv_kernel(*gqa_bucket).name == "per-query-head"
    with dkv_path("gqa"):
        assert select_dkv_kernel(*legacy_bucket).name == "gqa"
    monkeypatch.setenv("FLA_BWD_DKV_PATH", "auto")
    assert select_dkv_kernel(*gqa_bucket).name == "gqa"
    assert select_dkv_kernel(*legacy_bucket).name == "per-query-head"


def test_dispatch_invalid_names(monkeypatch):
    monkeypatch.delenv("FLA_BWD_DKV_PATH", raising=False)
    with pytest.raises(ValueError, match="dkv_path"):
        with dkv_path("fast"):
            pass
    with pytest.raises(ValueError, match="dkv_path"):
        with dkv_path("GQA"):
            pass
    monkeypatch.setenv("FLA_BWD_DKV_PATH", "bogus")
    with pytest.raises(ValueError, match="FLA_BWD_DKV_PATH"):
        select_dkv_kernel(*_tensors(8, 2, 64))
    with dkv_path("gqa"):  # the context manager wins over a bad environment value
        assert select_dkv_kernel(*_tensors(8, 2, 64)).name == "gqa"
    # A failed `with dkv_path(...)` leaves no override behind.
    monkeypatch.delenv("FLA_BWD_DKV_PATH")
    assert select_dkv_kernel(*_tensors(4, 4, 64)).name == "per-query-head"


def test_env_var_override_runs_that_kernel(monkeypatch, spy):
    """FLA_BWD_DKV_PATH is read at backward time and picks the kernel that runs."""
    case = Case(B=1, T=40, HQ=4, H=2, K=64, dtype=bf16, gate=True)
    monkeypatch.setenv("FLA_BWD_DKV_PATH", "legacy")
    check_against_oracle(case)
    monkeypatch.setenv("FLA_BWD_DKV_PATH", "gqa")
    check_against_oracle(Case(B=1, T=40, HQ=2, H=2, K=60, dtype=f32, gate=True))
    assert spy.paths == ["per-query-head", "gqa"]


# ------------------------------------------------------------------------------------------------------------
# Both kernels correct everywhere: legacy through the dispatch, gqa forced on legacy buckets
# ------------------------------------------------------------------------------------------------------------

LEGACY_AUTO = [
    Case(B=2, T=63, HQ=4, H=4, K=64, dtype=f16, gate=True),
    Case(B=1, T=63, HQ=16, H=1, K=64, dtype=bf16),
    Case(B=1, T=50, HQ=4, H=2, K=64, dtype=f32, window=16),
    Case(T=70, HQ=4, H=1, K=100, dtype=bf16, gate=True, cu_seqlens=(0, 1, 33, 70)),
]


@pytest.mark.parametrize("case", params(LEGACY_AUTO))
def test_legacy_path_through_auto_dispatch(case, spy, auto_env):
    check_against_oracle(case)
    assert spy.paths == ["per-query-head"]


GQA_FORCED_ON_LEGACY_BUCKETS = [
    Case(B=2, T=63, HQ=4, H=2, K=64, V=32, dtype=f16, gate=True),
    Case(B=1, T=70, HQ=4, H=2, K=100, V=60, dtype=bf16, window=33),
    Case(B=1, T=63, HQ=8, H=2, K=64, dtype=f32, gate=True),
    Case(B=1, T=63, HQ=16, H=1, K=64, dtype=bf16),
    Case(B=2, T=45, HQ=2, H=2, K=128, dtype=f16, sink=float("nan")),
    Case(B=1, T=40, HQ=6, H=2, K=60, dtype=bf16, gate=True),
    Case(T=64, HQ=4, H=1, K=32, V=64, dtype=f16, gate=True, cu_seqlens=(0, 1, 30, 64)),
]


@pytest.mark.parametrize("case", params(GQA_FORCED_ON_LEGACY_BUCKETS))
def test_gqa_path_forced_on_legacy_bucket(case, spy, auto_env):
    x = make_inputs(case)
    assert select_dkv_kernel(x.q, x.k, x.v).name == "per-query-head"
    with dkv_path("gqa"):
        check_against_oracle(case, x)
    assert spy.paths == ["gqa"]


def test_legacy_path_forced_on_gqa_bucket(spy, auto_env):
    case = Case(T=80, HQ=8, H=2, K=128, dtype=bf16, gate=True, sink=float("nan"), window=40,
                cu_seqlens=(0, 17, 18, 80))
    with dkv_path("legacy"):
        check_against_oracle(case)
    assert spy.paths == ["per-query-head"]


# ------------------------------------------------------------------------------------------------------------
# Determinism and agreement between the two kernels
# ------------------------------------------------------------------------------------------------------------

AGREEMENT_CASES = [
    Case(B=2, T=63, HQ=8, H=2, K=64, dtype=bf16, gate=True),
    Case(T=100, HQ=4, H=1, K=128, dtype=f16, gate=True, sink=float("nan"), window=33, cu_seqlens=(0, 1, 60, 100)),
    Case(B=1, T=50, HQ=4, H=2, K=100, V=60, dtype=f32, sink=float("nan")),
]


@pytest.mark.parametrize("path", ["gqa", "legacy"])
@pytest.mark.parametrize("case", params(AGREEMENT_CASES[:2]))
def test_backward_is_deterministic(case, path):
    x = make_inputs(case)
    with dkv_path(path):
        first = run_parallel(case, x)
        second = run_parallel(case, x)
    for name in first:
        assert torch.equal(first[name], second[name]), f"{name} differs between two identical calls ({path})"


@pytest.mark.parametrize("case", params(AGREEMENT_CASES))
def test_gqa_and_legacy_agree(case):
    x = make_inputs(case)
    with dkv_path("gqa"):
        gqa = run_parallel(case, x)
    with dkv_path("legacy"):
        legacy = run_parallel(case, x)
    for name in gqa:
        assert gqa[name].dtype == legacy[name].dtype
        assert_close(f"{name}[gqa~legacy]", legacy[name], gqa[name])
    # Only dK/dV (and the per-head gate/sink terms computed next to them) depend on the kernel.
    assert torch.equal(gqa["o"], legacy["o"]) and torch.equal(gqa["dq"], legacy["dq"])
