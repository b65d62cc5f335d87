#!/usr/bin/env python
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Print the test files that depend on the given changed files, found from the static import graph.

Usage (from the repository root):

    pytest $(python scripts/find_dependent_tests.py fla_bwd/ops/attn/parallel.py)

How it works:

* Every ``*.py`` file under ROOT (skipping hidden, build, dist, cache and virtual-environment folders) is a node.
  Its module name is its path relative to ROOT with ``/`` replaced by ``.`` (``pkg/__init__.py`` is ``pkg``).
* Each file is parsed with ``ast`` (nothing is imported or executed) and gets an edge to every module it imports:
  ``import a.b.c`` (which also runs ``a/__init__.py`` and ``a/b/__init__.py``), ``from a.b import c`` (``c`` may be
  a submodule or a name defined in ``a.b``), and relative imports such as ``from . import x`` and
  ``from ..utils import y``. Imports anywhere in the file count (inside functions, ``try`` or ``if`` blocks too).
  An absolute name is looked up from ROOT first, then from the folder Python or pytest would put on ``sys.path``
  for that file (the nearest ancestor folder without an ``__init__.py``), so ``from helpers import f`` in
  ``tests/ops/test_x.py`` finds ``tests/ops/helpers.py``. Modules outside ROOT (torch, triton, ...) are ignored.
* Importing ``a.b.c`` runs every ``__init__.py`` above it, so a file also depends on its ancestor packages.
* A test file depends on every ``conftest.py`` in its folder and the folders above it (pytest loads them).
* The graph is walked backwards from the changed files with a visited set, so import cycles are harmless.

A test file is ``tests/**/test_*.py``. The output is every test file that reaches a changed file, sorted,
relative to ROOT, space-separated on one line. A changed test file selects itself. A file that exists but no
test reaches (a non-Python file, a file outside the package, a file outside ROOT) selects nothing: nothing is
printed and the exit status is 0. Beware that ``pytest`` with no arguments runs every test, so a caller should
check for empty output. A FILE that does not exist is an error (message on stderr, exit status 2); with
``git diff --name-only`` pass ``--diff-filter=d`` to leave deleted files out.

Relative FILE paths are taken relative to the current folder, or to ROOT when they do not exist there.
Only the standard library is used. Dynamic imports (``importlib.import_module``, ``__import__``) are not seen.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict, deque
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = "tests"
SKIP_DIRS = {"__pycache__", "build", "dist", "node_modules", "venv", "env", "site-packages"}


def iter_python_files(root: Path):
    """Yield every .py file under root as a POSIX path relative to root, skipping hidden and build folders."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and d not in SKIP_DIRS and not d.endswith(".egg-info")
        )
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield (Path(dirpath) / name).relative_to(root).as_posix()


def module_name(rel: str) -> str:
    """'pkg/sub/mod.py' -> 'pkg.sub.mod'; 'pkg/__init__.py' -> 'pkg'."""
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package_init(rel: str) -> bool:
    return rel.rsplit("/", 1)[-1] == "__init__.py"


def sys_path_dir(rel: str, files: set[str]) -> str:
    """Folder Python/pytest puts on sys.path for this file: the nearest ancestor folder without __init__.py."""
    parts = rel.split("/")[:-1]
    while parts and "/".join(parts + ["__init__.py"]) in files:
        parts.pop()
    return "/".join(parts)


def is_test_file(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return rel.startswith(TESTS_DIR + "/") and name.startswith("test_") and name.endswith(".py")


class ImportGraph:
    def __init__(self, root: Path):
        self.root = root
        self.files = set(iter_python_files(root))
        self.modules = {module_name(rel): rel for rel in self.files}  # dotted name (from ROOT) -> file
        self.deps: dict[str, set[str]] = {rel: self._dependencies(rel) for rel in sorted(self.files)}
        self.rdeps: dict[str, set[str]] = defaultdict(set)
        for rel, deps in self.deps.items():
            for dep in deps:
                self.rdeps[dep].add(rel)

    def _lookup(self, name: str, base: str) -> str | None:
        """File of dotted module `name`, searched from ROOT, then from folder `base` ('' is ROOT)."""
        rel = self.modules.get(name)
        if rel is None and base:
            rel = self.modules.get(base.replace("/", ".") + "." + name)
        return rel

    def _resolve(self, name: str, base: str) -> set[str]:
        """Files run by importing dotted `name`: the module itself and every package __init__.py above it."""
        parts = name.split(".")
        found = set()
        for i in range(1, len(parts) + 1):
            rel = self._lookup(".".join(parts[:i]), base)
            if rel is not None:
                found.add(rel)
        return found

    def _dependencies(self, rel: str) -> set[str]:
        deps = set()
        own = module_name(rel)
        package = own if is_package_init(rel) else own.rpartition(".")[0]
        base = sys_path_dir(rel, self.files)
        if "." in own:  # importing this file runs its ancestor packages' __init__.py
            deps |= self._resolve(package, "")
        if is_test_file(rel):  # pytest loads every conftest.py from ROOT down to the test's folder
            folder = rel.split("/")[:-1]
            for i in range(len(folder) + 1):
                conftest = "/".join(folder[:i] + ["conftest.py"])
                if conftest in self.files:
                    deps.add(conftest)
        try:
            tree = ast.parse((self.root / rel).read_bytes(), filename=rel)
        except (SyntaxError, ValueError) as err:
            print(f"find_dependent_tests: warning: cannot parse {rel} ({err}); imports ignored", file=sys.stderr)
            return deps - {rel}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    deps |= self._resolve(alias.name, base)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: anchored at this file's package, `level - 1` packages up
                    anchor = package.split(".") if package else []
                    if node.level - 1 > len(anchor):
                        continue  # beyond the top-level package: Python would raise ImportError
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    target = ".".join(anchor + ([node.module] if node.module else []))
                    if not target:
                        continue
                    lookup_base = ""
                else:
                    target, lookup_base = node.module, base
                deps |= self._resolve(target, lookup_base)
                for alias in node.names:  # `from a import b` imports submodule a.b if there is one
                    if alias.name != "*":
                        deps |= self._resolve(f"{target}.{alias.name}", lookup_base)
        deps.discard(rel)
        return deps

    def dependent_tests(self, changed: set[str]) -> list[str]:
        """Test files that reach any changed file in the import graph (a changed test selects itself)."""
        seen = set(changed)
        queue = deque(changed)
        while queue:
            for importer in self.rdeps.get(queue.popleft(), ()):
                if importer not in seen:
                    seen.add(importer)
                    queue.append(importer)
        return sorted(rel for rel in seen if rel in self.files and is_test_file(rel))


def to_root_relative(arg: str, root: Path) -> tuple[str | None, bool]:
    """(path relative to root or None if outside it, whether the file exists)."""
    path = Path(arg)
    if not path.is_absolute() and not path.exists():
        path = root / path
    if not path.exists():
        return None, False
    try:
        return path.resolve().relative_to(root).as_posix(), True
    except ValueError:
        return None, True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="find_dependent_tests.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="changed files (any type; need not be Python)")
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help=f"repository root whose .py files form the graph (default: the parent of scripts/, {DEFAULT_ROOT})",
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if not root.is_dir():
        print(f"find_dependent_tests: error: --root {args.root} is not a directory", file=sys.stderr)
        return 2

    changed, missing = set(), []
    for arg in args.files:
        rel, exists = to_root_relative(arg, root)
        if not exists:
            missing.append(arg)
        elif rel is not None:
            changed.add(rel)
    if missing:
        for arg in missing:
            print(f"find_dependent_tests: error: no such file: {arg}", file=sys.stderr)
        return 2

    tests = ImportGraph(root).dependent_tests(changed)
    if tests:
        print(" ".join(tests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
