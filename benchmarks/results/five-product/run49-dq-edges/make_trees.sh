#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# Run on this machine (it needs git and patch), from the repository root, before the device call of ab.sh: makes
# .ab/main (HEAD's fla_bwd) and one tree per candidate (HEAD's fla_bwd and tests, patched). .ab/ is not ignored, so
# it travels with the call; remove it afterwards and never commit it.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
R=benchmarks/results/five-product/run49-dq-edges
rm -rf .ab && mkdir -p .ab/main
git archive HEAD fla_bwd | tar -x -C .ab/main
for t in kfks:$R/kf-ks.patch kfksdiag:$R/kf-ks-diag.patch ksfirst:benchmarks/results/five-product/run48-gated-dq-ks-first/ks-first.patch; do
  name=${t%%:*}
  mkdir -p ".ab/$name"
  git archive HEAD fla_bwd tests | tar -x -C ".ab/$name"
  patch -s -p1 -d ".ab/$name" < "${t#*:}"
done
echo "made: $(ls .ab)"
