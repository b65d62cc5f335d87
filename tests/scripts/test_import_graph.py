# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for scripts/import_graph.py on a synthetic package built in tmp_path, and on this checkout."""

import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import import_graph  # noqa: E402

# top -> mid -> low -> top (cycle, `low` imports `top` at its bottom); low -> settings; mid -> top lazily
TREE = {
    "fla_bwd/__init__.py": "",
    "fla_bwd/settings.py": "X = 1\n",
    "fla_bwd/ops/__init__.py": "",
    "fla_bwd/ops/top.py": "from fla_bwd.ops import mid\n",
    "fla_bwd/ops/mid.py": "import fla_bwd.ops.low\n\n\ndef f():\n    from fla_bwd.ops.top import g\n    return g\n",
    "fla_bwd/ops/low.py": "from fla_bwd import settings\nfrom . import helper\n\nfrom fla_bwd.ops.top import T\n",
    "fla_bwd/ops/helper.py": "import os\nfrom fla_bwd.ops.low import nothing_like_a_module\n",
}
LAYERS = "fla_bwd.ops.top\nfla_bwd.ops.mid  # middle\nfla_bwd.ops.low fla_bwd.ops.helper\nfla_bwd.settings\n"


def build(tmp_path: Path) -> Path:
    for rel, text in TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "layers.txt").write_text(LAYERS)
    return tmp_path


def test_synthetic_package(tmp_path):
    root = build(tmp_path)
    r = import_graph.report(root, import_graph.read_layers(root / "layers.txt"))
    edges = {(e["importer"], e["imported"]): e for e in r["edges"]}
    assert set(edges) == {("fla_bwd.ops.top", "fla_bwd.ops.mid"), ("fla_bwd.ops.mid", "fla_bwd.ops.low"),
                          ("fla_bwd.ops.mid", "fla_bwd.ops.top"), ("fla_bwd.ops.low", "fla_bwd.settings"),
                          ("fla_bwd.ops.low", "fla_bwd.ops.helper"), ("fla_bwd.ops.low", "fla_bwd.ops.top"),
                          ("fla_bwd.ops.helper", "fla_bwd.ops.low")}
    assert edges[("fla_bwd.ops.mid", "fla_bwd.ops.top")]["lazy"]
    assert not edges[("fla_bwd.ops.low", "fla_bwd.ops.top")]["lazy"]
    assert edges[("fla_bwd.ops.low", "fla_bwd.ops.top")]["lines"] == [4]
    (cycle,) = r["cycles"]
    assert cycle["modules"] == ["fla_bwd.ops.helper", "fla_bwd.ops.low", "fla_bwd.ops.mid", "fla_bwd.ops.top"]
    assert ["fla_bwd.ops.low", "fla_bwd.ops.top", "fla_bwd.ops.mid", "fla_bwd.ops.low"] in cycle["cycles"]
    assert r["cycles_with_lazy"] == []  # the lazy edge closes no cycle the import-time edges do not
    upward = {(u["importer"], u["imported"]) for u in r["upward"]}
    assert upward == {("fla_bwd.ops.mid", "fla_bwd.ops.top"), ("fla_bwd.ops.low", "fla_bwd.ops.top")}
    assert r["settings_importers"] == {"fla_bwd.settings": ["fla_bwd.ops.low"]}
    assert r["unlayered"] == ["fla_bwd", "fla_bwd.ops"]


def test_cli_on_this_checkout():
    out = subprocess.run([sys.executable, str(SCRIPTS / "import_graph.py")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "## import-time cycles" in out.stdout and "## importers of the settings" in out.stdout
