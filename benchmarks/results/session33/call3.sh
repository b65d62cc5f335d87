#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# Session 33's third device call (PERF.md #74), from the repository root with .whl and .baseline carried, on HEAD
# with kv-early-chunked, dq-hot-first and five products for shorter ungated calls on the Hopper kernel:
# 1. the short rows and the T = 2048 bar rows, backward alone, beside 12ac0d6 (eager medians and paired graph
#    kernels; the runner's legacy column is seven products: the eager cost of five on the short rows);
# 2. the GPU tests of what changed: test_attn_gluon_dkv.py, test_attn_five_product.py, test_attn_cuda_graph.py
#    (its T = 1024 D = 128 case now runs five products, eager and captured), test_attn.py, test_attn_gqa.py.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
LOGS=${OUT:-$PWD/call3_out}
mkdir -p "$LOGS"
T0=$(date +%s)
END=$(( T0 + ${BUDGET_S:-460} ))
left() { local l=$(( END - $(date +%s) )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/tabulate-*.whl .whl/tqdm-*.whl > "$LOGS/pip.log" 2>&1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
unset TRITON_INTERPRET FLA_BWD_DKV_PATH FLA_BWD_DQ_PATH FLA_BWD_DS_KERNEL
ROWS=mha-short,mha-short-fp16,gqa4-short,mha-long,gqa4-long
BASE=(--baseline .baseline/fla_bwd_12ac0d6)
timeout "$(left 100)" python3 -m benchmarks.tools.prewarm --shapes "$ROWS" --paths auto,legacy "${BASE[@]}" \
  --workers 14 > "$LOGS/prewarm.log" 2>&1
echo "prewarm rc $? ($(( $(date +%s) - T0 )) s): $(tail -n 1 "$LOGS/prewarm.log")"
timeout -s TERM "$(left 130)" python3 -u -m benchmarks.ops.run --shapes "$ROWS" --modes bwd --skip-gate \
  --peers none --repeats 3 --iters 10 --overhead "$ROWS" "${BASE[@]}" --json "$LOGS/short.json" > "$LOGS/short.log" 2>&1
echo "runner rc $? ($(( $(date +%s) - T0 )) s)"
grep -E "^check|^  [a-z0-9-]+ +bwd" "$LOGS/short.log" | cut -c1-420
lim=$(left 300)
echo "== GPU tests (limit $lim s)"
timeout "$lim" python3 -m pytest -q -n 14 -p no:cacheprovider tests/ops/test_attn_gluon_dkv.py \
  tests/ops/test_attn_five_product.py tests/ops/test_attn_cuda_graph.py tests/ops/test_attn.py tests/ops/test_attn_gqa.py \
  > "$LOGS/tests.log" 2>&1
echo "tests rc $? ($(( $(date +%s) - T0 )) s): $(tail -n 1 "$LOGS/tests.log")"
grep -E "FAILED|Error" "$LOGS/tests.log" | head -n 20
rm -f "$LOGS/prewarm.log" "$LOGS/pip.log"  # few files come back
