# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for the GPU harnesses in benchmarks/tools/: each parses its arguments on a CPU machine, and the parts that
do not need a GPU (tune_attn.py's table overrides, the PYTHONPATH that ab_trees.sh uses to pick the package under
test) run here under the interpreter."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "benchmarks" / "tools"


def run(script, *args, env=None, cwd=None):
    return subprocess.run([sys.executable, str(TOOLS / script), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.parametrize("script", ["tune_attn.py"])
def test_help(script, tmp_path):
    # from another folder: the scripts find the repository's packages themselves
    proc = run(script, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: " + script)


def test_tune_attn_rejects_unknown_names():
    proc = run("tune_attn.py", "--variants", "base,bt128")
    assert proc.returncode == 2
    assert "unknown bt128" in proc.stderr


def test_tune_attn_imports_fla_bwd_from_pythonpath(tmp_path):
    """ab_trees.sh runs tune_attn.py with PYTHONPATH set to the tree under test: that tree's fla_bwd must win over
    the checkout's (the repository root the script adds for `benchmarks`)."""
    (tmp_path / "fla_bwd").mkdir()
    (tmp_path / "fla_bwd" / "__init__.py").write_text('raise SystemExit("the B tree was imported")\n')
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    proc = run("tune_attn.py", "--help", env=env)
    assert proc.returncode == 1
    assert "the B tree was imported" in proc.stderr


def test_shell_scripts_parse():
    for script in [*TOOLS.glob("*.sh"), REPO / "benchmarks" / "gpu_run.sh"]:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"{script}: {proc.stderr}"


def test_tune_attn_variant_overrides_and_restores_the_public_tables():
    from benchmarks.tools import tune_attn as tune
    from fla_bwd.ops.attn import config, host

    tiles = {key: dict(kernels) for key, kernels in config.TILE_CONFIGS.items()}
    passes = dict(config.DELTA_MODES)
    with tune.variant("dkv128s64w8"):
        for key, kernels in config.TILE_CONFIGS.items():
            assert kernels["dkv"] == dict(tiles[key]["dkv"], BT=128, BS=64, num_warps=8, num_stages=2)
            assert kernels["dq"] is tiles[key]["dq"] and kernels["fwd"] is tiles[key]["fwd"]
        assert config.DELTA_MODES == passes
    with pytest.raises(RuntimeError), tune.variant("norefine"):
        assert host.DELTA_MODES is config.DELTA_MODES  # the table the dQ launcher reads
        assert not host._PLANS  # plans built from the base tables are gone
        assert all(p == passes["rounded"] for p in config.DELTA_MODES.values())
        raise RuntimeError  # restored on the way out of an error too
    # the same objects as before
    assert list(config.TILE_CONFIGS) == list(tiles)
    for key, kernels in config.TILE_CONFIGS.items():
        assert list(kernels) == list(tiles[key])
        assert all(kernels[k] is tiles[key][k] for k in kernels)
    assert list(config.DELTA_MODES) == list(passes)
    assert all(config.DELTA_MODES[m] is passes[m] for m in passes)


def test_tune_attn_norefine_reaches_the_dq_launcher():
    """A gated backward under "norefine" skips the fp32 delta refinement: dK/dV then use the rounded delta and
    change a little (dg is not checked: without the refinement pass its query side is not stored, so the variant is
    for timing only); after the block the backward is bitwise the base one again."""
    from benchmarks.tools import tune_attn as tune
    from fla_bwd import parallel_attn

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 48, 4, 32, generator=gen) for _ in range(3))
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()
    g = F.logsigmoid(torch.randn(1, 48, 4, generator=gen))
    do = torch.randn(1, 48, 4, 32, generator=gen)

    def grads():
        ins = [x.clone().requires_grad_() for x in (q, k, v, g)]
        return torch.autograd.grad(parallel_attn(*ins[:3], g=ins[3]), ins, do)

    base = grads()
    with tune.variant("norefine"):
        norefine = grads()
    after = grads()
    assert all(torch.equal(a, b) for a, b in zip(base, after))
    torch.testing.assert_close(norefine[0], base[0])  # dq uses the rounded delta in both
    assert not torch.equal(base[1], norefine[1])
    for i in (1, 2):
        torch.testing.assert_close(norefine[i], base[i], rtol=1e-3, atol=1e-3)
