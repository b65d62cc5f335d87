#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# run51's two candidates (PERF.md #70), made from this checkout's HEAD on the CPU machine before the device call:
#   .baseline/fla_bwd_<HEAD>_<name>  each patched package renamed (benchmarks/tools/make_baseline.py --patch): the
#                                    runner times both beside HEAD's in one process, interleaved (carry .baseline)
#   .ab/<name>/fla_bwd               each patched package under its own name, for its GPU tests (travels untracked)
# name: kv_early (kv-early.patch, the Hopper dK/dV kernel) and dq_hot_first (dq-hot-first.patch, dQ from dS).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
DIR=benchmarks/results/five-product/run51-kv-early-dq-hot
for patch in kv-early dq-hot-first; do
  rm -rf .baseline/fla_bwd_*_"${patch//-/_}"  # an earlier HEAD's: ab.sh takes the one package of each name
  python3 -m benchmarks.tools.make_baseline --commit HEAD --patch "$DIR/$patch.patch"
  tree=.ab/${patch//-/_}
  rm -rf "$tree" && mkdir -p "$tree"
  git archive HEAD fla_bwd | tar -x -C "$tree"
  patch -p1 -s -d "$tree" -i "$PWD/$DIR/$patch.patch"
  echo "made $tree"
done
