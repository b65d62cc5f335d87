# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Both launch paths of a plan (`fla_bwd.ops.utils.launch`) on a GPU: the compiled kernels launched directly (the
default) and Triton's normal `kernel[grid](...)` path (FLA_BWD_FAST_LAUNCH=0, or a launch hook installed) give
bitwise the same output and gradients, for every kind of call, and match the oracle. Issue 19: the direct path
calls Triton internals, so a Triton upgrade breaks there first; this is where it shows."""

import pytest
import torch
from helpers import Case, check_against_oracle, make_inputs, run_parallel
from robust_helpers import needs_gpu

from fla_bwd import settings
from fla_bwd.ops.utils import launch

CASES = {
    "dense-gqa": Case(B=2, T=300, HQ=8, H=2, K=128),
    "mha-fp16": Case(B=2, T=200, HQ=4, H=4, K=64, dtype=torch.float16),
    "gated-window": Case(B=2, T=300, HQ=8, H=2, K=64, gate=True, window=64),
    "varlen-sink": Case(T=400, HQ=8, H=1, K=128, sink=float("nan"), cu_seqlens=(0, 37, 300, 300, 400)),
    "fp32": Case(B=1, T=130, HQ=4, H=2, K=32, dtype=torch.float32),
}


@needs_gpu
@pytest.mark.parametrize("name", list(CASES))
def test_direct_and_tritons_path_agree(name):
    case = CASES[name]
    x = make_inputs(case)
    direct = check_against_oracle(case, x)
    direct_again = run_parallel(case, x)  # the second call of a plan launches directly
    settings.set_fast_launch(False)
    try:
        normal = run_parallel(case, x)
    finally:
        settings.set_fast_launch(True)
    hook = lambda *a, **k: None  # noqa: E731 - a hook makes every launch take Triton's path
    launch.knobs.runtime.launch_enter_hook.add(hook)
    try:
        hooked = run_parallel(case, x)
    finally:
        launch.knobs.runtime.launch_enter_hook.remove(hook)
    for other in (direct_again, normal, hooked):
        for key in direct:
            assert torch.equal(direct[key], other[key]), key
