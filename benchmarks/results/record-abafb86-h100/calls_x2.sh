#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The device calls PERF.md #73 plans for a two-GPU machine (nvidia-h100-x2 / nvidia-h200-x2), each one command, from
# the repository root, with [".whl", ".baseline"] carried (for "ab", first here: run51's make_trees.sh and the
# graph-rule candidate's package, graph-rule/ab.sh's header):
#   bash benchmarks/results/record-abafb86-h100/calls_x2.sh ab           # short rows' paths beside run51's A/B
#   bash benchmarks/results/record-abafb86-h100/calls_x2.sh parts12 COMMIT   # the record's parts 1 and 2
#   bash benchmarks/results/record-abafb86-h100/calls_x2.sh part3 COMMIT     # part 3 beside the GPU test suite
# Each writes under $OUT/gpu0 and $OUT/gpu1 (benchmarks/tools/two_gpus.sh) and fits the 600 s command limit.
set -uo pipefail
cd "$(dirname "$0")/../../.."
R5=benchmarks/results/five-product/run51-kv-early-dq-hot
case "${1:-}" in
  ab)
    exec bash benchmarks/tools/two_gpus.sh "bash benchmarks/results/record-abafb86-h100/graph-rule/ab.sh" \
      "BUDGET_S=480 bash $R5/ab.sh; python3 $R5/ratios.py \$OUT/ab.json" ;;
  parts12)
    [ -n "${2:-}" ] || { echo "calls_x2.sh parts12 COMMIT" >&2; exit 2; }
    exec bash benchmarks/tools/two_gpus.sh "BENCH_COMMIT=$2 PART=1 bash benchmarks/gpu_run.sh" \
      "BENCH_COMMIT=$2 PART=2 bash benchmarks/gpu_run.sh" ;;
  part3)
    [ -n "${2:-}" ] || { echo "calls_x2.sh part3 COMMIT" >&2; exit 2; }
    exec bash benchmarks/tools/two_gpus.sh "BENCH_COMMIT=$2 PART=3 bash benchmarks/gpu_run.sh" \
      "timeout 540 bash scripts/gpu_tests.sh 480" ;;
  *) echo "usage: calls_x2.sh ab | parts12 COMMIT | part3 COMMIT" >&2; exit 2 ;;
esac
