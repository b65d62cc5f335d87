# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for scripts/find_dependent_tests.py, run as a subprocess on a synthetic tree built in tmp_path."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "find_dependent_tests.py"

# path -> source. Import edges (A -> B means A imports B):
#   tests/test_x.py -> pkg.b -> pkg.a (chain); pkg.sibling is imported by nobody but tests/test_sibling.py
#   pkg/sub/rel.py -> pkg.sub.helper (`from . import`) and pkg.a (`from ..a import`)
#   pkg.cyc1 <-> pkg.cyc2 (cycle), tests/test_cycle.py -> pkg.cyc1
#   tests/ops/test_local.py -> tests/ops/helpers.py (sys.path style) -> pkg.sub.deep (`import pkg.sub.deep`)
TREE = {
    "pkg/__init__.py": "",
    "pkg/a.py": "import os\n\nA = 1\n",
    "pkg/b.py": "from pkg.a import A\n\nB = A\n",
    "pkg/sibling.py": "S = 2\n",
    "pkg/cyc1.py": "from pkg import cyc2\n",
    "pkg/cyc2.py": "import pkg.cyc1\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/helper.py": "H = 3\n",
    "pkg/sub/deep.py": "D = 4\n",
    "pkg/sub/rel.py": "from . import helper\nfrom ..a import A\n",
    "pkg/data.txt": "not python\n",
    "outside.py": "import torch\n",
    "tests/test_x.py": "import pkg.b\n",
    "tests/test_sibling.py": "from pkg.sibling import S\n",
    "tests/test_rel.py": "def test():\n    from pkg.sub import rel\n",
    "tests/test_cycle.py": "import pkg.cyc1\n",
    "tests/test_plain.py": "import torch\n",
    "tests/ops/helpers.py": "import pkg.sub.deep\n",
    "tests/ops/test_local.py": "from helpers import D\n",
    "tests/ops/conftest.py": "",
    "tests/other/test_other.py": "",
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    for rel, source in TREE.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root


def run(root, *args):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *args], cwd=root, capture_output=True, text=True, timeout=30
    )
    return proc


def select(root, *files):
    proc = run(root, *files)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") <= 1
    return proc.stdout.split()


def test_chain_is_transitive(tree):
    assert select(tree, "pkg/a.py") == ["tests/test_rel.py", "tests/test_x.py"]
    assert select(tree, "pkg/b.py") == ["tests/test_x.py"]


def test_sibling_module_not_selected(tree):
    assert select(tree, "pkg/sibling.py") == ["tests/test_sibling.py"]


def test_relative_imports(tree):
    assert select(tree, "pkg/sub/helper.py") == ["tests/test_rel.py"]


def test_package_init_selects_everything_importing_the_package(tree):
    everything = ["tests/ops/test_local.py", "tests/test_cycle.py", "tests/test_rel.py"]
    everything += ["tests/test_sibling.py", "tests/test_x.py"]
    assert select(tree, "pkg/__init__.py") == everything
    assert select(tree, "pkg/sub/__init__.py") == ["tests/ops/test_local.py", "tests/test_rel.py"]


def test_import_cycle_terminates(tree):
    assert select(tree, "pkg/cyc2.py") == ["tests/test_cycle.py"]
    assert select(tree, "pkg/cyc1.py") == ["tests/test_cycle.py"]


def test_test_local_helper_and_dotted_import(tree):
    assert select(tree, "pkg/sub/deep.py") == ["tests/ops/test_local.py"]
    assert select(tree, "tests/ops/helpers.py") == ["tests/ops/test_local.py"]


def test_conftest_selects_tests_below_it(tree):
    assert select(tree, "tests/ops/conftest.py") == ["tests/ops/test_local.py"]


def test_test_file_selects_itself(tree):
    assert select(tree, "tests/test_plain.py") == ["tests/test_plain.py"]
    assert select(tree, "tests/other/test_other.py", "pkg/b.py") == ["tests/other/test_other.py", "tests/test_x.py"]


def test_unrelated_files_select_nothing(tree, tmp_path):
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("import pkg.a\n")
    for args in (["pkg/data.txt"], ["outside.py"], [str(elsewhere)]):
        proc = run(tree, *args)
        assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == "", (args, proc)


def test_absolute_path_and_other_cwd(tree):
    for arg in (str(tree / "pkg/b.py"), "pkg/b.py"):  # a relative path not found in the cwd is taken from --root
        proc = subprocess.run(
            [sys.executable, str(SCRIPT), "--root", str(tree), arg], cwd="/", capture_output=True, text=True
        )
        assert proc.returncode == 0 and proc.stdout == "tests/test_x.py\n", (arg, proc)


def test_missing_file_is_an_error(tree):
    proc = run(tree, "pkg/a.py", "pkg/nope.py")
    assert proc.returncode == 2
    assert "pkg/nope.py" in proc.stderr
    assert proc.stdout == ""


def test_help_explains_usage():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for word in ("--root", "cycle", "relative", "exit status 2", "selects itself"):
        assert word in proc.stdout, word
