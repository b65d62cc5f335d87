#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# One device call for run51 (PERF.md #70): the Hopper dK/dV kernel with each item's K/V released after its last
# read (kv-early.patch) against HEAD's, then the candidate's GPU tests. From the repository root, after
# make_trees.sh, with .whl and .baseline carried:
#   bash benchmarks/results/five-product/run51-kv-early/ab.sh
# 1. prewarm both packages' kernels for the rows (parallel compile);
# 2. benchmarks.ops.run, backward alone, HEAD against the candidate interleaved round by round (5 x 2 x 10 calls a
#    candidate, L2 flushed, CUDA events), graph kernel times on the T = 2048 rows; the gate is skipped here because
#    step 3 runs the candidate's kernel tests (HEAD's are green: PERF.md #66/#67);
# 3. the candidate's tests/ops/test_attn_gluon_dkv.py on the GPU (oracle, chunks bitwise one launch, gated against
#    the Triton kernel bitwise, NaN/Inf, capture).
# The ratio printed as "fla_bwd@...+kv_early (x)" is candidate / HEAD: under 1 means the candidate is faster.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
ROOT=$PWD
LOGS=${OUT:-$PWD/ab_out}
mkdir -p "$LOGS"
T0=$(date +%s)
END=$(( T0 + ${BUDGET_S:-400} ))
left() { local l=$(( END - $(date +%s) )); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
BASE=$(ls -d .baseline/fla_bwd_*_kv_early 2>/dev/null | head -n 1)
[ -n "$BASE" ] && [ -d .ab/kvearly/fla_bwd ] || { echo "ab.sh: run make_trees.sh first (and carry .baseline)" >&2; exit 2; }
if compgen -G ".whl/*.whl" > /dev/null; then  # the runner's tabulate and tqdm
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/tabulate-*.whl .whl/tqdm-*.whl \
    > "$LOGS/pip.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
unset TRITON_INTERPRET FLA_BWD_DKV_PATH
ROWS=${ROWS:-mha-long,gqa4-long,g8-T8192,gqa4-long-gated,g8-T8192-gated}

echo "== prewarm (limit $(left 150) s)"
timeout "$(left 150)" python3 -m benchmarks.tools.prewarm --shapes "$ROWS" --paths auto --baseline "$BASE" \
  --workers "$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))" > "$LOGS/prewarm.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s): $(tail -n 1 "$LOGS/prewarm.log")"

echo "== A/B, backward alone (limit $(left 200) s)"
timeout -s TERM "$(left 200)" python3 -u -m benchmarks.ops.run --shapes "$ROWS" --modes bwd --skip-gate \
  --repeats 5 --iters 10 --overhead mha-long,gqa4-long,gqa4-long-gated --baseline "$BASE" \
  --json "$LOGS/ab.json" > "$LOGS/ab.log" 2>&1
echo "rc $? ($(( $(date +%s) - T0 )) s)"
grep -E "^  [a-z0-9-]+ +bwd|^check|^geomean" "$LOGS/ab.log" | cut -c1-300

lim=$(left 200)
if [ "$lim" -gt 30 ]; then
  echo "== the candidate's Hopper kernel tests (limit $lim s)"
  # From /: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH's tree under test.
  (cd / && PYTHONPATH=$ROOT/.ab/kvearly:$ROOT timeout "$lim" python3 -m pytest -q -x -n 8 -p no:cacheprovider \
    "$ROOT/tests/ops/test_attn_gluon_dkv.py" && PYTHONPATH=$ROOT/.ab/kvearly python3 -c \
    'import fla_bwd.ops.attn.gluon_dkv as g; print("tested", g.__file__)') > "$LOGS/tests.log" 2>&1
  echo "tests rc $? ($(( $(date +%s) - T0 )) s): $(tail -n 2 "$LOGS/tests.log" | tr '\n' ' ')"
else
  echo "== the candidate's tests skipped: no time left"
fi
