#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# One device call for run51 (PERF.md #70): HEAD against two candidates, each a patch of HEAD:
#   kv_early      the Hopper dK/dV kernel releases each item's K/V after their last read (kv-early.patch)
#   dq_hot_first  the dQ-from-dS bulk loop reads the newest tiles first (dq-hot-first.patch)
# then each candidate's GPU tests. From the repository root, after make_trees.sh, with .whl and .baseline carried:
#   bash benchmarks/results/five-product/run51-kv-early-dq-hot/ab.sh
# 1. prewarm the three packages' kernels for the rows (parallel compile);
# 2. benchmarks.ops.run, backward alone, HEAD and both candidates interleaved round by round (5 x 2 x 10 calls a
#    candidate, L2 flushed, CUDA events), graph kernel times on the T = 2048 rows; the gate is skipped here because
#    step 3 runs the candidates' tests (HEAD's are green: PERF.md #66/#67);
# 3. kv_early's tests/ops/test_attn_gluon_dkv.py and dq_hot_first's test_attn_five_product.py on the GPU.
# A ratio printed as "fla_bwd@...+NAME (x)" is candidate / HEAD: under 1 means the candidate is faster.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
LOGS=${OUT:-$PWD/ab_out}
mkdir -p "$LOGS"
T0=$(date +%s)
END=$(( T0 + ${BUDGET_S:-380} ))
left() { local l=$(( END - $(date +%s) )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
BASES=()
for name in kv_early dq_hot_first; do
  base=$(ls -d .baseline/fla_bwd_*_"$name" 2>/dev/null)
  [ -n "$base" ] && [ -d ".ab/$name/fla_bwd" ] || { echo "ab.sh: run make_trees.sh first (and carry .baseline)" >&2; exit 2; }
  [ "$(echo "$base" | wc -l)" = 1 ] || { echo "ab.sh: more than one $name package in .baseline: $base" >&2; exit 2; }
  BASES+=(--baseline "$base")
done
if compgen -G ".whl/*.whl" > /dev/null; then  # the runner's tabulate and tqdm
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/tabulate-*.whl .whl/tqdm-*.whl \
    > "$LOGS/pip.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
unset TRITON_INTERPRET FLA_BWD_DKV_PATH
ROWS=${ROWS:-mha-long,gqa4-long,g8-T8192,gqa4-long-gated,g8-T8192-gated}

echo "== prewarm (limit $(left 150) s)"
timeout "$(left 150)" python3 -m benchmarks.tools.prewarm --shapes "$ROWS" --paths auto "${BASES[@]}" \
  --workers "$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))" > "$LOGS/prewarm.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s): $(tail -n 1 "$LOGS/prewarm.log")"

echo "== A/B, backward alone (limit $(left 200) s)"
timeout -s TERM "$(left 200)" python3 -u -m benchmarks.ops.run --shapes "$ROWS" --modes bwd --skip-gate \
  --repeats 5 --iters 10 --overhead mha-long,gqa4-long,gqa4-long-gated "${BASES[@]}" \
  --json "$LOGS/ab.json" > "$LOGS/ab.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s)"
grep -E "^  [a-z0-9-]+ +bwd|^check|^geomean" "$LOGS/ab.log" | cut -c1-400

# From /: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH's tree under test.
for pair in kv_early:test_attn_gluon_dkv.py dq_hot_first:test_attn_five_product.py; do
  name=${pair%%:*} file=${pair#*:}
  lim=$(left 110)
  if [ "$lim" -gt 30 ]; then
    echo "== $name: tests/ops/$file on the GPU (limit $lim s)"
    (cd / && PYTHONPATH=$ROOT/.ab/$name timeout "$lim" python3 -c \
      'import fla_bwd.ops.attn.parallel as p; print("testing", p.__file__)' && PYTHONPATH=$ROOT/.ab/$name:$ROOT \
      timeout "$lim" python3 -m pytest -q -x -n 12 -p no:cacheprovider "$ROOT/tests/ops/$file") \
      > "$LOGS/tests-$name.log" 2>&1
    echo "tests rc $? ($(( $(date +%s) - T0 )) s): $(head -n 1 "$LOGS/tests-$name.log"); $(tail -n 1 "$LOGS/tests-$name.log")"
  else
    echo "== $name's tests skipped: no time left"
  fi
done
