#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# One device call for the dQ-from-dS candidates prepared without a GPU (PERF.md #63, #64), each a patch of main's
# from_ds.py:
#   kfks      edge-kf (the edge tiles multiply the key tile with its non-finite elements zeroed for every block, so
#             the raw tile is not live beside it: the gated edge loop's 125 spill stores go) + ks-first (#63);
#             bitwise main's on the CPU interpreter
#   kfksdiag  kfks + the edges' gate sums without the diagonal exclusion (dS_pp enters both sides of dgc at p and
#             cancels there; dg moves ~4e-7 relative on the CPU)
#   ksfirst   run48's ks-first.patch alone (bitwise main's)
# Make the trees first, here: bash benchmarks/results/five-product/run49-dq-edges/make_trees.sh
# then, in the device call, from the repository root: bash benchmarks/results/five-product/run49-dq-edges/ab.sh
# Steps, each under its own limit and all within BUDGET_S (default 585 s): five_ab.py of each tree on gqa4-long-gated,
# gqa4-long and g8-T8192-gated (kernels by the profiler, oracle and determinism checks); run47's four
# gate_grad_of_band configs; the gated and NaN GPU tests of kfksdiag (every code change of the three candidates).
# Writes into $OUT (or ./ab_out). Remove .ab/ afterwards; never commit it.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
LOGS=${OUT:-$PWD/ab_out}
mkdir -p "$LOGS"
T0=$(date +%s)
END=$(( T0 + ${BUDGET_S:-585} ))
left() { local l=$(( END - $(date +%s) )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
TREES=${TREES:-main kfks kfksdiag ksfirst}
for tree in $TREES; do
  [ -d ".ab/$tree/fla_bwd" ] || { echo "ab.sh: .ab/$tree is missing: run make_trees.sh first" >&2; exit 2; }
done

for side in $TREES; do
  lim=$(left "${AB_S:-100}")
  [ "$lim" -gt 20 ] || { echo "== A/B $side skipped: no time left"; continue; }
  echo "== A/B $side (limit $lim s)"
  # From /: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH's tree under test.
  (cd / && PYTHONPATH=$ROOT/.ab/$side:$ROOT timeout "$lim" python3 -m benchmarks.tools.five_ab \
    --rows "${ROWS:-gqa4-long-gated,gqa4-long,g8-T8192-gated}" --cands five+hopper --rounds 3 \
    --json "$LOGS/ab-$side.json") > "$LOGS/ab-$side.log" 2>&1
  echo "rc $? ($(( $(date +%s) - T0 )) s)"; grep '^{' "$LOGS/ab-$side.log" | cut -c1-400
done

lim=$(left 60)
if [ "$lim" -gt 10 ]; then
  echo "== gate_grad_of_band configs (limit $lim s)"
  PYTHONPATH=$ROOT timeout "$lim" python3 benchmarks/results/five-product/run47-gate-grad-bp/gate_grad_bp.py \
    > "$LOGS/bp.json" 2> "$LOGS/bp.log"
  echo "rc $?: $(cat "$LOGS/bp.json")"
else
  echo "== gate_grad_of_band configs skipped: no time left"
fi

lim=$(left 240)
if [ "$lim" -gt 30 ]; then
  echo "== gated and NaN GPU tests of kfksdiag (limit $lim s)"
  (cd .ab/kfksdiag && timeout "$lim" python3 -m pytest -q -x -n 8 -p no:cacheprovider \
    tests/ops/test_attn_five_product.py tests/ops/test_attn_gluon_dkv.py tests/ops/test_attn_nan.py \
    -k "gate or gated or o_lo or nan or capture") > "$LOGS/tests.log" 2>&1
  echo "tests rc $? ($(( $(date +%s) - T0 )) s): $(tail -1 "$LOGS/tests.log")"
else
  echo "== kfksdiag's tests skipped: no time left"
fi
echo "== $(( $(date +%s) - T0 )) s in all"
