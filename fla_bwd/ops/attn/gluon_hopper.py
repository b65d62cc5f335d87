# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The Gluon primitives for Hopper that both Gluon kernels (`gluon_fwd`, `gluon_dkv`) use, each under one name across
Triton releases: Triton 3.6 (the GPU machine's) names the TMA copies async_copy_* and the cp.async copy
async_copy_global_to_shared, later releases (3.9 on CI) async_load / async_store. And the softcap's tanh, as the
Triton kernels compute it."""

import math

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

tma_load = getattr(tma, "async_load", tma.async_copy_global_to_shared)
tma_store = getattr(tma, "async_store", tma.async_copy_shared_to_global)
cp_async_load = getattr(async_copy, "async_load", async_copy.async_copy_global_to_shared)  # cp.async, 4 to 16 bytes
cp_async_arrive = async_copy.mbarrier_arrive  # an mbarrier arrival once the thread's cp.async copies have landed

TWO_LOG2E = gl.constexpr(2 * math.log2(math.e))


@gluon.jit
def tanh(x):
    """`inner.tanh` (the same operations, so the same roundings): 1 - 2 / (e^(2x) + 1) in fp32 from one exp2."""
    return 1 - 2 / (gl.exp2(x * TWO_LOG2E) + 1)


__all__ = ["cp_async_arrive", "cp_async_load", "fence_async_shared", "mbarrier", "tanh", "tma", "tma_load",
           "tma_store", "warpgroup_mma", "warpgroup_mma_wait"]
