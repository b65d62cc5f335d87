# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
from fla_bwd.ops.attn.context_parallel import context_parallel_attn, shard, unshard
from fla_bwd.ops.attn.dispatch import (
    DkvKernel,
    ForwardRoute,
    Route,
    dkv_path,
    dq_path,
    select_backward,
    select_dkv_kernel,
    select_forward,
)
from fla_bwd.ops.attn.naive import naive_parallel_attn
from fla_bwd.ops.attn.parallel import parallel_attn
from fla_bwd.ops.utils.checks import LayoutWarning

__all__ = ["DkvKernel", "ForwardRoute", "LayoutWarning", "Route", "context_parallel_attn", "dkv_path", "dq_path",
           "naive_parallel_attn", "parallel_attn", "select_backward", "select_dkv_kernel", "select_forward", "shard",
           "unshard"]
