#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# Session 33's second device call (PERF.md #74), from the repository root with .whl, .baseline and .ab carried:
# 1. backward alone, HEAD against three candidates interleaved (make_baseline --patch): kv_early_chunked (the Hopper
#    kernel releases K/V early only in items of several heads), dq_hot_first (run51 again), kv_chunked_hot (both);
# 2. the short rows with five products from T = 512 (five-from-512.patch) beside 12ac0d6: eager and graph kernels;
# 3. every launch of an eager step of mha-short(-fp16), HEAD and 12ac0d6 (launches.py);
# 4. kv_chunked_hot's tree: test_attn_gluon_dkv.py and test_attn_five_product.py on the GPU;
# 5. the backward's host steps (profile_host.py --steps) on mha-short, gqa4-short and gqa4-long, under "auto" and
#    with five products forced on the Hopper kernel: where five products' extra host time goes.
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
LOGS=${OUT:-$PWD/call2_out}
mkdir -p "$LOGS"
T0=$(date +%s)
END=$(( T0 + ${BUDGET_S:-560} ))
left() { local l=$(( END - $(date +%s) )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/tabulate-*.whl .whl/tqdm-*.whl > "$LOGS/pip.log" 2>&1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
unset TRITON_INTERPRET FLA_BWD_DKV_PATH FLA_BWD_DQ_PATH FLA_BWD_DS_KERNEL
BASES=()
for name in kv_early_chunked dq_hot_first kv_chunked_hot; do
  BASES+=(--baseline "$(ls -d .baseline/fla_bwd_*_"$name")")
done
ROWS=mha-long,gqa4-long,g8-T8192,g8-T4096,gqa4-long-gated,g8-T8192-gated
echo "== prewarm"
timeout "$(left 150)" python3 -m benchmarks.tools.prewarm --shapes "$ROWS" --paths auto "${BASES[@]}" \
  --workers 14 > "$LOGS/prewarm.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s): $(tail -n 1 "$LOGS/prewarm.log")"
echo "== A/B, backward alone"
timeout -s TERM "$(left 200)" python3 -u -m benchmarks.ops.run --shapes "$ROWS" --modes bwd --skip-gate \
  --repeats 5 --iters 10 --overhead mha-long,gqa4-long,gqa4-long-gated "${BASES[@]}" \
  --json "$LOGS/ab.json" > "$LOGS/ab.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s)"
python3 benchmarks/results/five-product/run51-kv-early-dq-hot/ratios.py "$LOGS/ab.json"
SHORT=mha-short,mha-short-fp16,gqa4-short
SHORT_BASES=(--baseline .baseline/fla_bwd_12ac0d6 --baseline "$(ls -d .baseline/fla_bwd_*_five_from_512)")
echo "== short rows: 12ac0d6 and five products from T = 512 (five-from-512.patch), eager and paired graph kernels"
timeout "$(left 90)" python3 -m benchmarks.tools.prewarm --shapes "$SHORT" --paths auto "${SHORT_BASES[@]}" \
  --workers 14 > "$LOGS/prewarm-short.log" 2>&1
timeout -s TERM "$(left 120)" python3 -u -m benchmarks.ops.run --shapes "$SHORT" --modes bwd --skip-gate \
  --peers none --repeats 3 --iters 10 --overhead "$SHORT" "${SHORT_BASES[@]}" --json "$LOGS/short.json" \
  > "$LOGS/short.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s)"
grep -E "^check|^  [a-z0-9-]+ +bwd" "$LOGS/short.log" | cut -c1-400
echo "== launches of one step, HEAD and 12ac0d6 (limit $(left 60) s)"
PYTHONPATH=$ROOT:$PYTHONPATH timeout "$(left 60)" python3 benchmarks/results/session33/launches.py .baseline/fla_bwd_12ac0d6 > "$LOGS/launches.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s)"; cut -c1-120 "$LOGS/launches.log"
lim=$(left 200)
echo "== kv_chunked_hot: GPU tests (limit $lim s)"
(cd / && PYTHONPATH=$ROOT/.ab/kv_chunked_hot:$ROOT timeout "$lim" python3 -m pytest -q -x -n 14 -p no:cacheprovider \
  "$ROOT/tests/ops/test_attn_gluon_dkv.py" "$ROOT/tests/ops/test_attn_five_product.py") > "$LOGS/tests.log" 2>&1
echo "tests rc $? ($(( $(date +%s) - T0 )) s): $(tail -n 1 "$LOGS/tests.log")"
for mode in auto five; do
  lim=$(left 60)
  [ "$lim" -gt 20 ] || { echo "== host steps $mode: no time left"; continue; }
  echo "== host steps, $mode (limit $lim s)"
  if [ $mode = five ]; then export FLA_BWD_DQ_PATH=from-ds FLA_BWD_DS_KERNEL=hopper; fi
  timeout "$lim" python3 benchmarks/tools/profile_host.py --rows mha-short,gqa4-short,gqa4-long --rounds 2 \
    --calls 50 --steps --json "$LOGS/host-$mode.json" > "$LOGS/host-$mode.log" 2>&1
  echo "rc $? ($(( $(date +%s) - T0 )) s)"
  grep -v "^\s*$" "$LOGS/host-$mode.log" | tail -n 40 | cut -c1-200
done
