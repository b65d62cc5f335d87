#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# One device call for two gated-backward candidates prepared without a GPU (PERF.md #63): ks-first.patch (the gated
# dQ-from-dS bulk loop issues its key sums before the tile's products, so that its wait for them finds the last
# tile's products done; bitwise main's on the CPU interpreter) and gate_grad_of_band_kernel's block and load sizes
# (run47's gate_grad_bp.py).
# The two trees are made here, before the call (.ab/ is not ignored: it travels; the device's copy may have no git):
#     H=benchmarks/results/five-product/run48-gated-dq-ks-first; rm -rf .ab && mkdir -p .ab/main .ab/ksfirst
#     git archive HEAD fla_bwd | tar -x -C .ab/main && git archive HEAD fla_bwd tests | tar -x -C .ab/ksfirst
#     patch -p1 -d .ab/ksfirst < $H/ks-first.patch
# then, in the device call, from the repository root:  bash benchmarks/results/five-product/run48-gated-dq-ks-first/ab.sh
# Steps, each with its own limit: the gated GPU tests on the patched tree; four gate_grad_of_band configs; an A/B of
# main against the patched tree (five_ab.py, gqa4-long-gated, g8-T8192-gated and the ungated gqa4-long, kernels by
# the profiler). Writes into $OUT (or ./ab_out). Remove .ab/ afterwards; never commit it.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
LOGS=${OUT:-$PWD/ab_out}
mkdir -p "$LOGS"
T0=$(date +%s)
for tree in .ab/main/fla_bwd .ab/ksfirst/fla_bwd .ab/ksfirst/tests; do
  [ -d "$tree" ] || { echo "ab.sh: $tree is missing: make the trees first (see the header)" >&2; exit 2; }
done
grep -q "b_ones_qb" .ab/ksfirst/fla_bwd/ops/attn/from_ds.py || { echo "ab.sh: .ab/ksfirst is not patched" >&2; exit 2; }

echo "== gated GPU tests of the patched tree (limit ${TESTS_S:=180} s)"
(cd .ab/ksfirst && timeout "$TESTS_S" python3 -m pytest -q -x -n 8 tests/ops/test_attn_five_product.py \
  tests/ops/test_attn_gluon_dkv.py tests/ops/test_attn_nan.py -k "gate or gated or o_lo or nan or capture") \
  > "$LOGS/tests.log" 2>&1
echo "tests rc $? ($(( $(date +%s) - T0 )) s): $(tail -1 "$LOGS/tests.log")"

echo "== gate_grad_of_band configs (limit 60 s)"
PYTHONPATH=$ROOT timeout 60 python3 benchmarks/results/five-product/run47-gate-grad-bp/gate_grad_bp.py \
  > "$LOGS/bp.json" 2> "$LOGS/bp.log"
echo "rc $?: $(cat "$LOGS/bp.json")"

for side in main ksfirst; do
  echo "== A/B $side (limit ${AB_S:=150} s)"
  # From /: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH's tree under test.
  (cd / && PYTHONPATH=$ROOT/.ab/$side:$ROOT timeout "$AB_S" python3 -m benchmarks.tools.five_ab \
    --rows gqa4-long-gated,gqa4-long,g8-T8192-gated --cands five+hopper --rounds 3 --json "$LOGS/ab-$side.json") \
    > "$LOGS/ab-$side.log" 2>&1
  echo "rc $?"; tail -4 "$LOGS/ab-$side.log"
done
echo "== $(( $(date +%s) - T0 )) s in all"
