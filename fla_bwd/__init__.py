# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""fla_bwd: Triton causal softmax attention whose backward is fast, exact and memory-lean.

    from fla_bwd import parallel_attn    # = fla_bwd.ops.attn.parallel_attn

The ops are imported on first use (PEP 562 module `__getattr__`), so `import fla_bwd` stays cheap and does not
import torch or triton: set TRITON_INTERPRET=1 (CPU) any time before the first op is touched.
"""

import importlib

__version__ = "0.1.0"  # the one version string; pyproject.toml reads it

# public name -> module that defines it
_LAZY = {
    "parallel_attn": "fla_bwd.ops.attn",
    "naive_parallel_attn": "fla_bwd.ops.attn",
    "select_dkv_kernel": "fla_bwd.ops.attn",
    "select_backward": "fla_bwd.ops.attn",
    "select_forward": "fla_bwd.ops.attn",
    "LayoutWarning": "fla_bwd.ops.attn",
    "dkv_path": "fla_bwd.ops.attn",
    "dq_path": "fla_bwd.ops.attn",
    "context_parallel_attn": "fla_bwd.ops.attn",
    "parallel_forgetting_attn": "fla_bwd.ops.forgetting_attn",
    "naive_forgetting_attn": "fla_bwd.ops.forgetting_attn",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fla_bwd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
