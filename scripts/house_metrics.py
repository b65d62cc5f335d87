#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Housekeeping figures of a checkout, as markdown, to compare a tree before and after a restructuring:

    python scripts/house_metrics.py [ROOT]     # ROOT: a checkout (default: the one holding this script)

Per file of fla_bwd/: lines, definitions (functions and classes, nested ones included), @triton.jit/@gluon.jit
functions, the longest function and its lines (def to last line, decorators excluded). Then every jit kernel (a
jit function whose name holds "kernel") with its parameters and constexpr parameters (annotated
`tl.constexpr`/`gl.constexpr`); the modules that import the settings (scripts/import_graph.py); numbered log
references (`#\\d+[a-z]?\\b`: "PERF.md #17", "#42w") in fla_bwd/, tests/ and scripts/; benchmark code lines;
files under benchmarks/results/; the lines of PERF.md.
"""

import argparse
import ast
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import import_graph  # noqa: E402

LOG_REF = re.compile(r"#\d+[a-z]?\b")
CODE = (".py", ".sh")


def _jit(fn) -> bool:
    """Whether `fn` is decorated with triton.jit or gluon.jit (called or not)."""
    for d in fn.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and d.attr == "jit" and getattr(d.value, "id", None) in ("triton", "gluon"):
            return True
    return False


def _constexpr(arg) -> bool:
    a = arg.annotation
    return isinstance(a, ast.Attribute) and a.attr == "constexpr" and getattr(a.value, "id", None) in ("tl", "gl")


def functions(tree) -> list:
    """(qualified name, node) of every function, nested ones included, in source order."""
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.append((name, child))
                walk(child, name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def file_row(path: Path, rel: str) -> tuple:
    """(table row, kernel rows) of one Python file."""
    text = path.read_text()
    tree = ast.parse(text)
    fns = functions(tree)
    defs = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for n in ast.walk(tree))
    jit = [(name, fn) for name, fn in fns if _jit(fn)]
    longest = max(fns, key=lambda f: f[1].end_lineno - f[1].lineno + 1, default=None)
    long_text = f"`{longest[0]}` {longest[1].end_lineno - longest[1].lineno + 1}" if longest else "-"
    row = f"| {rel} | {len(text.splitlines())} | {defs} | {len(jit)} | {long_text} |"
    kernels = []
    for name, fn in jit:
        if "kernel" in name:
            args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            kernels.append(f"| {rel} | `{name}` | {len(args)} | {sum(map(_constexpr, args))} |")
    return row, kernels


def count_lines(files) -> int:
    return sum(len(f.read_text(errors="replace").splitlines()) for f in files)


def files_under(path: Path, suffixes=None) -> list:
    if not path.is_dir():
        return []
    return sorted(f for f in path.rglob("*") if f.is_file() and "__pycache__" not in f.parts
                  and (suffixes is None or f.suffix in suffixes))


def log_refs(path: Path, suffixes=(".py", ".sh", ".md")) -> int:
    return sum(len(LOG_REF.findall(f.read_text(errors="replace"))) for f in files_under(path, suffixes))


def report(root: Path) -> str:
    out = [f"# House metrics of {root}", "", "| file | lines | defs | jit fns | longest function (lines) |",
           "|---|---:|---:|---:|---|"]
    kernels, totals = [], [0, 0, 0]
    for path in files_under(root / "fla_bwd", (".py",)):
        row, ks = file_row(path, str(path.relative_to(root)))
        out.append(row)
        kernels += ks
        cells = row.split("|")
        totals = [t + int(c) for t, c in zip(totals, cells[2:5])]
    out.append(f"| **total** ({len(files_under(root / 'fla_bwd', ('.py',)))} files) | {totals[0]} | {totals[1]} | "
               f"{totals[2]} | |")
    out += ["", f"## jit kernels: {len(kernels)}", "", "| file | kernel | params | constexpr |", "|---|---|---:|---:|"]
    out += kernels
    graph = import_graph.report(root, import_graph.DEFAULT_LAYERS)
    out += ["", "## modules importing the settings", ""]
    out += [f"- {target}: {len(importers)}: {', '.join(importers)}"
            for target, importers in graph["settings_importers"].items()]
    out += ["", "## numbered log references (`#\\d+[a-z]?\\b`, .py/.sh/.md files)", ""]
    out += [f"- {d}/: {log_refs(root / d)}" for d in ("fla_bwd", "tests", "scripts")]
    bench, results = root / "benchmarks", root / "benchmarks" / "results"
    code = [f for f in files_under(bench, CODE) if results not in f.parents]
    results_code = files_under(results, CODE)
    out += ["", "## benchmarks and records", "",
            f"- benchmark code (benchmarks/ *.py, *.sh, not results/): {len(code)} files, {count_lines(code)} lines",
            f"- code under benchmarks/results/: {len(results_code)} files, {count_lines(results_code)} lines",
            f"- files under benchmarks/results/: {len(files_under(results))} ({len(results_code)} code)",
            f"- PERF.md: {count_lines([root / 'PERF.md']) if (root / 'PERF.md').is_file() else 0} lines"]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    root = Path(ap.parse_args(argv).root).resolve()
    if not (root / "fla_bwd").is_dir():
        sys.exit(f"no fla_bwd/ under {root}")
    print(report(root))


if __name__ == "__main__":
    main()
