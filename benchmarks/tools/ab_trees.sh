#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# A/B of two source trees of the package on one GPU: `benchmarks/tools/tune_attn.py` run alternately against this checkout's
# fla_bwd (A) and another tree's (B), ROUNDS times each, every run a fresh process, then the bwd medians side by side.
# The other tree is a copy of a branch's package in `.ab/` (untracked, not ignored: it travels to the device; never commit it):
#     mkdir -p .ab/NAME && git archive BRANCH fla_bwd | tar -x -C .ab/NAME
#     bash benchmarks/tools/ab_trees.sh .ab/NAME --shapes g8-T8192,gqa4-long --paths auto      # tune_attn.py options after
# Logs and JSON go to $OUT (or ./ab_out); prints one line per shape: A and B bwd us per round, and B/A.
set -uo pipefail
cd "$(dirname "$0")/../.."
TREE=${1:?usage: ab_trees.sh TREE [tune_attn.py options]}
shift
[ -d "$TREE/fla_bwd" ] || { echo "ab_trees.sh: $TREE has no fla_bwd/ package" >&2; exit 2; }
ROUNDS=${ROUNDS:-2}
LOGS=${OUT:-$PWD/ab_out}
mkdir -p "$LOGS"
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    if [ "$side" = A ]; then path=$PWD; else path=$(cd "$TREE" && pwd); fi
    # which package the run imports (from / : python -c puts the working directory first on sys.path)
    (cd / && PYTHONPATH=$path python3 -c 'import fla_bwd; print("run", "'$side$r'", "imports", fla_bwd.__file__)') \
      >> "$LOGS/ab.log" 2>&1
    PYTHONPATH=$path python3 benchmarks/tools/tune_attn.py --json "$LOGS/$side$r.json" "$@" >> "$LOGS/ab.log" 2>&1 \
      || echo "ab_trees.sh: run $side$r failed (see $LOGS/ab.log)" >&2
  done
done
python3 - "$LOGS" "$ROUNDS" <<'PY'
import json, os, statistics, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
bwd = {}
for side in "AB":
    for r in range(1, rounds + 1):
        path = os.path.join(logs, f"{side}{r}.json")
        if not os.path.exists(path):
            continue
        for res in json.load(open(path))["results"]:
            if "bwd_us" in res:
                key = (res["shape"], res["variant"], res["path"])
                bwd.setdefault(key, {"A": [], "B": []})[side].append(min(res["bwd_us"]))
for (shape, variant, path), t in bwd.items():
    a, b = t["A"], t["B"]
    ratio = f"{statistics.median(b) / statistics.median(a):.3f}" if a and b else "-"
    print(f"{shape:18s} {variant:10s} {path:14s} A {' '.join(f'{x:8.1f}' for x in a)}  "
          f"B {' '.join(f'{x:8.1f}' for x in b)}  B/A {ratio}")
PY
