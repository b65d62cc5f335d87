# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
from fla_bwd.ops.attn.context_parallel import context_parallel_attn, shard, unshard
from fla_bwd.ops.attn.naive import naive_parallel_attn
from fla_bwd.ops.attn.parallel import DkvKernel, parallel_attn, select_dkv_kernel
from fla_bwd.settings import dkv_path, dq_path

__all__ = ["DkvKernel", "context_parallel_attn", "dkv_path", "dq_path", "naive_parallel_attn", "parallel_attn",
           "select_dkv_kernel", "shard", "unshard"]
