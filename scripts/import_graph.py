#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""The import graph of the fla_bwd package, read with `ast` (nothing is imported): its edges, its cycles, the
imports that run upward against a layer order, and the modules that import the settings.

    python scripts/import_graph.py [ROOT] [--layers FILE] [--json]

ROOT: a checkout (default: the one holding this script); every module under ROOT/fla_bwd is read. An edge is
`from fla_bwd.x import y` (to fla_bwd.x.y when that is a module, else to fla_bwd.x), `import fla_bwd.x`, or a
relative import; one inside a function is "lazy" (it runs at the call, not at import). Importing a submodule also
runs its packages' __init__; those implicit edges are not listed.

Cycles are the strongly connected components (more than one module) of the import-time (non-lazy) edges, then
of all edges if that adds any. Layers: top to bottom, each a list of module-name globs (fnmatch); a module is in
the first layer one of whose globs matches it, and an edge from a lower layer to a higher one is "upward". A
--layers file holds one layer a line, globs separated by spaces, `#` comments.
"""

import argparse
import ast
import fnmatch
import json
import sys
from pathlib import Path

PACKAGE = "fla_bwd"
# Top to bottom: the API, autograd, host code, kernels, configs and helpers, the leaves.
DEFAULT_LAYERS = [
    ["fla_bwd", "fla_bwd.ops", "fla_bwd.ops.attn", "fla_bwd.ops.forgetting_attn*", "fla_bwd.ops.attn.parallel",
     "fla_bwd.ops.attn.context_parallel", "fla_bwd.ops.attn.naive", "fla_bwd.ops.attn.api*"],
    ["fla_bwd.ops.attn.autograd*"],
    ["fla_bwd.ops.attn.host*", "fla_bwd.ops.attn.from_ds", "fla_bwd.ops.attn.plan*", "fla_bwd.ops.attn.launches*",
     "fla_bwd.ops.attn.dispatch*"],
    ["fla_bwd.ops.attn.kernels*", "fla_bwd.ops.attn.gluon*", "fla_bwd.ops.attn.inner*", "fla_bwd.ops.attn.*kernel*"],
    ["fla_bwd.ops.attn.config*", "fla_bwd.ops.attn.call*", "fla_bwd.ops.utils*"],
    ["fla_bwd.settings", "fla_bwd._settings", "fla_bwd.*settings*", "fla_bwd.utils*"],
]
SETTINGS = "fla_bwd*settings*"


def modules(root: Path) -> dict:
    """module name -> file (relative to root) of every .py file under root/fla_bwd."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = str(path.relative_to(root))
    return out


def _is_lazy(node, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return True
    return False


def imports(name: str, source: str, known: dict, is_package: bool) -> list:
    """(target module, line, lazy) of every import of a module in `known` by module `name`."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                package = name.split(".") if is_package else name.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join(package + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:  # `import fla_bwd.x.y` names fla_bwd.x.y; an attribute its module
                target = target.rpartition(".")[0]
            if target and target != name and target.split(".")[0] == PACKAGE:
                out.append((target, node.lineno, _is_lazy(node, parents)))
    return out


def graph(root: Path) -> tuple:
    """(modules, edges): edges maps (importer, imported) to a sorted list of (line, lazy)."""
    mods = modules(root)
    edges = {}
    for name, file in mods.items():
        for target, line, lazy in imports(name, (root / file).read_text(), mods, file.endswith("__init__.py")):
            edges.setdefault((name, target), []).append((line, lazy))
    return mods, {k: sorted(set(v)) for k, v in sorted(edges.items())}


def sccs(nodes, edges) -> list:
    """Strongly connected components with more than one node (Tarjan), each sorted, in order of first node."""
    succ = {n: sorted(b for a, b in edges if a == n) for n in nodes}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return sorted(out)


def simple_cycles(comp: list, edges, limit: int = 20) -> list:
    """Up to `limit` elementary cycles within a component, each a list of modules starting at its least one (first
    repeated last), shortest first."""
    succ = {a: sorted(b for x, b in edges if x == a and b in comp) for a in comp}
    out = []

    def walk(path):
        for b in succ[path[-1]]:
            if b == path[0]:
                out.append(path + [b])
            elif b > path[0] and b not in path:
                walk(path + [b])

    for start in sorted(comp):
        walk([start])
    return sorted(out, key=lambda c: (len(c), c))[:limit]


def read_layers(path) -> list:
    if path is None:
        return DEFAULT_LAYERS
    layers = [line.split("#")[0].split() for line in Path(path).read_text().splitlines()]
    return [layer for layer in layers if layer]


def layer_of(module: str, layers: list):
    return next((i for i, globs in enumerate(layers) if any(fnmatch.fnmatchcase(module, g) for g in globs)), None)


def report(root: Path, layers: list) -> dict:
    mods, edges = graph(root)
    eager = [e for e, sites in edges.items() if not all(lazy for _, lazy in sites)]
    cycles = sccs(mods, eager)
    all_cycles = sccs(mods, list(edges))
    level = {m: layer_of(m, layers) for m in mods}
    upward = [dict(importer=a, imported=b, importer_layer=level[a], imported_layer=level[b],
                   lines=[line for line, _ in edges[(a, b)]], lazy=all(lazy for _, lazy in edges[(a, b)]))
              for a, b in edges if None not in (level[a], level[b]) and level[b] < level[a]]
    return dict(
        root=str(root), modules=mods, layers=layers,
        edges=[dict(importer=a, imported=b, lines=[line for line, _ in s], lazy=all(lazy for _, lazy in s))
               for (a, b), s in edges.items()],
        cycles=[dict(modules=c, files=[mods[m] for m in c], cycles=simple_cycles(c, eager)) for c in cycles],
        cycles_with_lazy=[dict(modules=c, files=[mods[m] for m in c], cycles=simple_cycles(c, list(edges)))
                          for c in all_cycles if c not in cycles],
        upward=upward, unlayered=sorted(m for m in mods if level[m] is None),
        settings_importers={t: sorted(a for a, b in edges if b == t)
                            for t in sorted(mods) if fnmatch.fnmatchcase(t, SETTINGS)},
    )


def short(module: str) -> str:
    return module.rpartition(".")[2] if module.count(".") > 1 else module


def print_text(r: dict):
    print(f"# import graph of {r['root']}/{PACKAGE}: {len(r['modules'])} modules, {len(r['edges'])} edges")
    print("\n## edges (importer -> imported: lines; lazy = only inside functions)")
    for e in r["edges"]:
        print(f"{e['importer']} -> {e['imported']}: {','.join(map(str, e['lines']))}{' lazy' if e['lazy'] else ''}")
    for key, title in (("cycles", "import-time cycles"), ("cycles_with_lazy", "further cycles through lazy imports")):
        print(f"\n## {title}: {len(r[key])}")
        for c in r[key]:
            print("component: " + ", ".join(c["files"]))
            for cycle in c["cycles"]:
                print("  " + " -> ".join(map(short, cycle)))
    print(f"\n## layers (top to bottom): {len(r['layers'])}")
    for i, globs in enumerate(r["layers"]):
        members = [m for m in r["modules"] if layer_of(m, r["layers"]) == i]
        print(f"{i}: " + " ".join(globs) + "   = " + ", ".join(members))
    if r["unlayered"]:
        print("unlayered (not checked): " + ", ".join(r["unlayered"]))
    print(f"\n## upward imports: {len(r['upward'])}")
    for u in r["upward"]:
        print(f"{u['importer']} (layer {u['importer_layer']}) -> {u['imported']} (layer {u['imported_layer']}): "
              f"{','.join(map(str, u['lines']))}{' lazy' if u['lazy'] else ''}")
    print("\n## importers of the settings")
    for target, importers in r["settings_importers"].items():
        print(f"{target}: {len(importers)}: " + ", ".join(importers))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--layers", help="layer file: one layer a line, top first, module-name globs")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    if not (root / PACKAGE).is_dir():
        sys.exit(f"no {PACKAGE}/ under {root}")
    r = report(root, read_layers(args.layers))
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print_text(r)


if __name__ == "__main__":
    main()
