# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
from fla_bwd.ops.forgetting_attn.naive import naive_forgetting_attn
from fla_bwd.ops.forgetting_attn.parallel import parallel_forgetting_attn

__all__ = ["naive_forgetting_attn", "parallel_forgetting_attn"]
