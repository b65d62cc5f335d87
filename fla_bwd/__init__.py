# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""fla_bwd: Triton causal softmax attention whose backward is fast, exact and memory-lean."""

__version__ = "0.1.0"
