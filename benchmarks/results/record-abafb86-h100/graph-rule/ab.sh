#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The short rows' device job of PERF.md #73 (calls_x2.sh ab, GPU 0), from the repository root, with .whl and
# .baseline carried; locally first: python3 -m benchmarks.tools.make_baseline --commit HEAD --patch
#   benchmarks/results/record-abafb86-h100/graph-rule/five-in-graphs.patch
# 1. benchmarks.tools.graph_paths: paired graph kernel times of auto, five products forced on the Hopper and on the
#    Triton dK/dV kernel, and 12ac0d6, on the short rows (at most 300 s);
# 2. the runner on the MHA/GQA short rows, backward alone, with 12ac0d6 and the graph-rule candidate as baselines and
#    graph kernel times (at most 200 s): the candidate's paired graphs run five products (they are captured), its
#    eager calls seven; its "check" lines are the bar as the record will read it.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
LOGS=${OUT:-$PWD/graph_rule_out}
mkdir -p "$LOGS"
SHORT=mha-short,mha-short-fp16,gqa4-short
timeout 300 python3 -m benchmarks.tools.graph_paths --rows $SHORT,g4-T2048-D64 \
  --paths auto,five-hopper,five-triton --baseline .baseline/fla_bwd_12ac0d6 --json "$LOGS/graph_paths.json"
echo "graph_paths rc $? ($SECONDS s)"
cand=$(ls -d .baseline/fla_bwd_*_five_in_graphs 2>/dev/null)
[ -n "$cand" ] || { echo "no .baseline/fla_bwd_*_five_in_graphs: make it with make_baseline --patch (header)" >&2; exit 2; }
[ "$(echo "$cand" | wc -l)" = 1 ] || { echo "more than one candidate package in .baseline: $cand" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site-graph-rule .whl/tabulate-*.whl .whl/tqdm-*.whl \
  > "$LOGS/pip.log" 2>&1
PYTHONPATH=/tmp/site-graph-rule${PYTHONPATH:+:$PYTHONPATH} timeout 200 python3 -u -m benchmarks.ops.run \
  --shapes $SHORT --modes bwd --skip-gate --peers none --repeats 3 --iters 10 --overhead $SHORT \
  --baseline .baseline/fla_bwd_12ac0d6 --baseline "$cand" --json "$LOGS/graph_rule.json" > "$LOGS/graph_rule.log" 2>&1
echo "runner rc $? ($SECONDS s)"
grep -E "^check|bwd alone" "$LOGS/graph_rule.log" | cut -c1-300
