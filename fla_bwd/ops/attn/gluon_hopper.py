# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The Gluon primitives for Hopper that both Gluon kernels (`gluon_fwd`, `gluon_dkv`) use, each under one name across
Triton releases: Triton 3.6 (the GPU machine's) names the TMA copies async_copy_*, later releases (3.9 on CI)
async_load / async_store."""

from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

tma_load = getattr(tma, "async_load", tma.async_copy_global_to_shared)
tma_store = getattr(tma, "async_store", tma.async_copy_shared_to_global)

__all__ = ["fence_async_shared", "mbarrier", "tma", "tma_load", "tma_store", "warpgroup_mma", "warpgroup_mma_wait"]
