# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The house rules, as tests (ARCHITECTURE.md): imports run one way through the layers, with no cycle, at most two
modules read the settings, and the package cites no numbered entries of the performance log."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import import_graph  # noqa: E402

LAYERS = [
    ["fla_bwd", "fla_bwd.__main__", "fla_bwd.ops", "fla_bwd.ops.attn", "fla_bwd.ops.forgetting_attn*",
     "fla_bwd.ops.attn.parallel", "fla_bwd.ops.attn.context_parallel", "fla_bwd.ops.attn.naive"],
    ["fla_bwd.ops.attn.autograd"],
    ["fla_bwd.ops.attn.host", "fla_bwd.ops.attn.dispatch", "fla_bwd.ops.attn.call"],
    ["fla_bwd.ops.attn.kernels", "fla_bwd.ops.attn.from_ds", "fla_bwd.ops.attn.gluon_fwd", "fla_bwd.ops.attn.gluon_dkv",
     "fla_bwd.ops.attn.gluon_hopper",
     "fla_bwd.ops.attn.inner",
     "fla_bwd.ops.utils.cumsum", "fla_bwd.ops.utils.group_sum"],
    ["fla_bwd.ops.attn.config", "fla_bwd.ops.utils*", "fla_bwd.settings", "fla_bwd.utils"],
]


def test_imports_run_one_way():
    r = import_graph.report(ROOT, LAYERS)
    assert r["unlayered"] == [], "every module belongs to a layer of ARCHITECTURE.md"
    assert r["upward"] == [], r["upward"]
    assert r["cycles"] == [], r["cycles"]
    assert r["cycles_with_lazy"] == [], "no cycle hidden behind a lazy import either"


def test_two_modules_read_the_settings():
    r = import_graph.report(ROOT, LAYERS)
    assert r["settings_importers"]["fla_bwd.settings"] == ["fla_bwd.ops.attn.dispatch", "fla_bwd.ops.utils.launch"]


def test_the_package_cites_no_numbered_log_entries():
    cited = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "fla_bwd").rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"#\d+[a-z]?\b", line)]
    assert cited == [], cited
