#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The candidate of run51 (PERF.md #70), made from this checkout's HEAD on the CPU machine before the device call:
#   .baseline/fla_bwd_<HEAD>_kv_early  the patched package renamed (benchmarks/tools/make_baseline.py --patch): the
#                                      runner times it beside HEAD's in one process, interleaved (carry .baseline)
#   .ab/kvearly/fla_bwd                the patched package under its own name, for the GPU tests (travels untracked)
set -euo pipefail
cd "$(dirname "$0")/../../../.."
DIR=benchmarks/results/five-product/run51-kv-early
python3 -m benchmarks.tools.make_baseline --commit HEAD --patch "$DIR/kv-early.patch"
rm -rf .ab/kvearly && mkdir -p .ab/kvearly
git archive HEAD fla_bwd | tar -x -C .ab/kvearly
patch -p1 -s -d .ab/kvearly -i "$PWD/$DIR/kv-early.patch"
echo "made .ab/kvearly and $(ls -d .baseline/fla_bwd_*_kv_early)"
