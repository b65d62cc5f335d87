# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Merge the parts of a split benchmark run (`PART=K bash benchmarks/gpu_run.sh`) into one record, table and plot.

    python benchmarks/merge.py part1/summary-part1.json part2/summary-part2.json part3/summary-part3.json \
        --out-dir benchmarks/results [--anchors benchmarks/results/anchors-h200-2026-11-29.jsonl]

Refuses (exit 2, one line saying why) unless: every file is a part of the same split (same N, each K once, all K
present); every part ran the same code (same source fingerprint; same commit wherever a commit is known); part 1 ran
the gate and it was green, and every later part inherited that green gate or deferred to part 1 (none red or
skipped); the parts agree on op, timer, A/B, repeats, iters, FA3 calls and peers; no shape is measured twice.
`--fill FILE` (repeatable): an unsplit run of the same code (same fingerprint and commit, its own green gate, the same
settings) measures shapes of the split that no part reported (a part stopped early); it fills only those.
Writes OUT_DIR/summary.json (the parts' results in the registry's order, every part's environment and command under
`parts`, geomeans and checks recomputed over the merged shapes), then summary.md and peer_ratios.png (report.py).
"""

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable from the repository root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ops import summary  # noqa: E402
from benchmarks.ops.shapes import MODES  # noqa: E402

SAME_SETTINGS = ("ab", "repeats", "iters", "fa3_calls", "peers", "force_peers", "modes")


class MergeError(ValueError):
    """The parts cannot be merged into one benchmark of record; the message says why."""


def _commit(env: dict):
    for key in ("bench_commit", "git_commit"):
        c = (env.get(key) or "").strip()
        if c and c != "HEAD":
            return c
    return None


def _same_commit(a: str, b: str) -> bool:
    """Equal, or one a prefix of the other (a short and a full hash of one commit)."""
    n = min(len(a), len(b))
    return n >= 7 and a[:n].lower() == b[:n].lower()


def _disagreement(runs: list):
    """Where the runs' measurements are not comparable (op, timer, A/B, repeats, ...), in words; None if nowhere."""
    for key in ("op", "timer", "smoke", "schema"):
        vals = {json.dumps(d.get(key)) for d in runs}
        if len(vals) > 1:
            return f"differ in {key}: {sorted(vals)}"
    for key in SAME_SETTINGS:
        vals = {json.dumps(d.get("settings", {}).get(key)) for d in runs}
        if len(vals) > 1:
            return f"ran with different --{key.replace('_', '-')}: {sorted(vals)}"
    return None


def check_parts(parts: list, names: list) -> None:
    if not parts:
        raise MergeError("no part files given")
    info = []
    for d, n in zip(parts, names):
        p = d.get("part")
        if not p:
            raise MergeError(f"{n} is not a part of a split run (no `part` record; run gpu_run.sh with PART=K)")
        info.append(p)
    ofs = {p["of"] for p in info}
    if len(ofs) != 1:
        raise MergeError(f"the files come from splits into different numbers of parts: {sorted(ofs)}")
    of = ofs.pop()
    idx = [p["index"] for p in info]
    dup = sorted({k for k in idx if idx.count(k) > 1})
    if dup:
        raise MergeError(f"part(s) {dup} given more than once")
    missing = sorted(set(range(1, of + 1)) - set(idx))
    if missing:
        raise MergeError(f"part(s) {missing} of {of} missing: the benchmark of record needs every part")
    # the same code
    fps = {}
    for d, n in zip(parts, names):
        fp = d.get("env", {}).get("source_fingerprint")
        if not fp:
            raise MergeError(f"{n} recorded no source fingerprint: cannot prove it ran the same code")
        fps.setdefault(fp, []).append(n)
    if len(fps) > 1:
        raise MergeError("the parts ran different code (source fingerprints " +
                         "; ".join(f"{fp}: {', '.join(ns)}" for fp, ns in fps.items()) + ")")
    commits = [(c, n) for c, n in ((_commit(d.get("env", {})), n) for d, n in zip(parts, names)) if c]
    for c, n in commits[1:]:
        if not _same_commit(c, commits[0][0]):
            raise MergeError(f"the parts come from different commits: {commits[0][1]} {commits[0][0]}, {n} {c}")
    # the gate: green in part 1, inherited or deferred in the others
    by_index = {p["index"]: d for p, d in zip(info, parts)}
    name_of = {p["index"]: n for p, n in zip(info, names)}
    g1 = by_index[1].get("gate", {})
    if g1.get("skipped") or g1.get("status") == "skipped":
        raise MergeError(f"part 1 ({name_of[1]}) skipped the gate: no speedup of record without a green gate")
    if g1.get("status") != "green" or g1.get("inherited"):
        raise MergeError(f"part 1 ({name_of[1]}) gate is {g1.get('status')!r}, not a green run of the gate: "
                         f"refusing to merge")
    for k in range(2, of + 1):
        g = by_index[k].get("gate", {})
        if g.get("skipped") or g.get("status") == "skipped":
            raise MergeError(f"part {k} ({name_of[k]}) ran with --skip-gate: refusing to merge")
        if g.get("status") not in ("green", "deferred"):
            raise MergeError(f"part {k} ({name_of[k]}) gate is {g.get('status')!r}: refusing to merge")
        if g.get("file") != g1.get("file"):
            raise MergeError(f"part {k} gate files {g.get('file')!r} differ from part 1's {g1.get('file')!r}")
    bad = _disagreement(parts)
    if bad:
        raise MergeError(f"the parts {bad}")
    seen = {}
    for d, n in zip(parts, names):
        for r in d.get("results", []):
            s = r["shape"]["name"]
            if s in seen:
                raise MergeError(f"shape {s} measured in both {seen[s]} and {n}")
            seen[s] = n


def check_fills(fills: list, fill_names: list, parts: list) -> None:
    """Each fill ran the parts' code under a green gate of its own, with their settings, and measured only shapes of
    the split that no part reported."""
    first = parts[0]
    fp = first.get("env", {}).get("source_fingerprint")
    commit = next((c for c in (_commit(d.get("env", {})) for d in parts) if c), None)
    split = set(first["part"].get("all_shapes") or [])
    measured = {r["shape"]["name"] for d in parts for r in d.get("results", [])}
    for d, n in zip(fills, fill_names):
        if d.get("part"):
            raise MergeError(f"fill {n} is part {d['part'].get('index')} of a split: give parts as parts")
        if d.get("env", {}).get("source_fingerprint") != fp:
            raise MergeError(f"fill {n} ran different code (source fingerprint "
                             f"{d.get('env', {}).get('source_fingerprint')}, the parts' {fp})")
        c = _commit(d.get("env", {}))
        if c and commit and not _same_commit(c, commit):
            raise MergeError(f"fill {n} comes from a different commit: {c}, the parts' {commit}")
        g = d.get("gate", {})
        if g.get("skipped") or g.get("status") != "green" or g.get("file") != first.get("gate", {}).get("file"):
            raise MergeError(f"fill {n} gate is {g.get('status')!r} over {g.get('file')!r}: a fill needs its own "
                             f"green gate over the parts' files")
        bad = _disagreement([first, d])
        if bad:
            raise MergeError(f"fill {n} and the parts {bad}")
        for r in d.get("results", []):
            s = r["shape"]["name"]
            if s not in split:
                raise MergeError(f"fill {n} measured {s}, which is in no part of the split")
            if s in measured:
                raise MergeError(f"shape {s} measured in both a part and fill {n}")
            measured.add(s)


def merge(parts: list, names: list = None, fills: list = (), fill_names: list = None) -> dict:
    """One record from the parts and fills (see the module docstring); raises MergeError when they do not belong
    together."""
    names = names or [f"part#{i + 1}" for i in range(len(parts))]
    fill_names = fill_names or [f"fill#{i + 1}" for i in range(len(fills))]
    check_parts(parts, names)
    check_fills(list(fills), fill_names, parts)
    pairs = sorted(zip(parts, names), key=lambda x: x[0]["part"]["index"])
    first = pairs[0][0]
    order = list(first["part"].get("all_shapes") or [])
    pos = {n: i for i, n in enumerate(order)}
    results = [r for d, _ in pairs for r in d.get("results", [])] + [r for d in fills for r in d.get("results", [])]
    results.sort(key=lambda r: pos.get(r["shape"]["name"], len(pos)))
    measured = {r["shape"]["name"] for r in results}
    skipped = {}
    for d, _ in pairs:
        for s, why in d.get("skipped_shapes", {}).items():
            if s not in measured:  # a fill measured it
                skipped[s] = f"part {d['part']['index']}: {why}"
    for d, _ in pairs:
        for s in d["part"].get("shapes", []):
            if s not in measured and s not in skipped:
                skipped[s] = f"part {d['part']['index']}: not reported (the part stopped early)"
    for s in order:
        if s not in measured and s not in skipped:
            skipped[s] = "in no part"
    modes = [m for m in MODES if any(m in r.get("modes", {}) for r in results)]
    env = dict(first.get("env", {}))
    env["command"] = " ; ".join([f"[part {d['part']['index']}/{d['part']['of']}] {d.get('env', {}).get('command')}"
                                 for d, _ in pairs] + [f"[fill] {d.get('env', {}).get('command')}" for d in fills])
    env["started"] = first.get("env", {}).get("started")
    gate = dict(first.get("gate", {}))
    gate["parts"] = {str(d["part"]["index"]): d.get("gate", {}).get("status") for d, _ in pairs}
    peers = []
    for d, _ in pairs:
        peers += [p for p in d.get("peers", []) if p not in peers]
    out = {
        "schema": first.get("schema"), "op": first.get("op"), "smoke": first.get("smoke"), "timer": first.get("timer"),
        "gate": gate, "env": env, "settings": dict(first.get("settings", {}), part=None, json=None),
        "peers": peers, "results": results, "skipped_shapes": skipped, "partial": bool(skipped), "part": None,
        "parts": [{"index": d["part"]["index"], "of": d["part"]["of"], "file": n, "shapes": d["part"].get("shapes"),
                   "estimate_s": d["part"].get("estimate_s"), "elapsed_s": d.get("elapsed_s"),
                   "partial": d.get("partial"), "gate": d.get("gate"), "env": d.get("env"),
                   "command": d.get("env", {}).get("command")} for d, n in pairs],
        "fills": [{"file": n, "shapes": [r["shape"]["name"] for r in d.get("results", [])],
                   "elapsed_s": d.get("elapsed_s"), "gate": d.get("gate"), "env": d.get("env"),
                   "command": d.get("env", {}).get("command")} for d, n in zip(fills, fill_names)],
        "merged": {"files": [n for _, n in pairs] + list(fill_names), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                   "shapes": len(results)},
        "elapsed_s": round(sum(d.get("elapsed_s") or 0.0 for d in [d for d, _ in pairs] + list(fills)), 1),
    }
    out["geomean"] = summary.aggregate(results, modes)  # over the merged shapes, never the parts' own
    out["checks"] = summary.checks(results, modes)  # the gated twins may sit in different parts
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("parts", nargs="+", help="the parts' summary-partK.json files")
    ap.add_argument("--out-dir", required=True, help="writes summary.json, summary.md, peer_ratios.png here")
    ap.add_argument("--fill", action="append", default=[], metavar="FILE",
                    help="an unsplit run of the same code measuring shapes no part reported (repeatable)")
    ap.add_argument("--anchors", default=None, help="peer anchors JSONL (report.py --anchors)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--print-mode", default="bwd", help="print this mode's table last (default bwd; '' for none)")
    a = ap.parse_args(argv)
    loaded = []
    for path in a.parts + a.fill:
        try:
            with open(path) as f:
                loaded.append(json.load(f))
        except (OSError, ValueError) as e:
            print(f"error: cannot read {path}: {e}", file=sys.stderr)
            return 2
    parts, fills = loaded[:len(a.parts)], loaded[len(a.parts):]
    try:
        data = merge(parts, list(a.parts), fills, list(a.fill))
    except MergeError as e:
        print(f"error: not merged: {e}", file=sys.stderr)
        return 2
    os.makedirs(a.out_dir, exist_ok=True)
    path = os.path.join(a.out_dir, "summary.json")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)
    print(f"wrote {path}: {len(data['results'])} shapes from {len(parts)} parts"
          + (f" and {len(fills)} fill(s)" if fills else "")
          + (f"; not run: {', '.join(data['skipped_shapes'])}" if data["skipped_shapes"] else ""))
    from benchmarks import report

    args = [path, "--out-dir", a.out_dir] + (["--anchors", a.anchors] if a.anchors else [])
    args += (["--no-plot"] if a.no_plot else []) + (["--print-mode", a.print_mode] if a.print_mode else [])
    return report.main(args)


if __name__ == "__main__":
    sys.exit(main())
