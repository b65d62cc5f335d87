#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The next device session's first call (PERF.md #74), from the repository root with .whl and .baseline carried:
#     bash benchmarks/results/session33/next_call1.sh COMMIT
# 1. the GPU test files of what 4d655f7 changed that call 3 did not finish (limit 180 s): test_attn_gluon_dkv.py,
#    test_attn_five_product.py and test_attn_cuda_graph.py;
# 2. part 3 of the record at COMMIT (~350 s; its gate is deferred to part 1's, which runs test_attn.py and
#    test_attn_gqa.py). Then parts 1 and 2 in their own calls: BENCH_COMMIT=COMMIT PART=K bash benchmarks/gpu_run.sh.
set -uo pipefail
cd "$(dirname "$0")/../../.."
[ $# = 1 ] || { echo "usage: $0 COMMIT" >&2; exit 2; }
OUT=${OUT:-$PWD/next_out}
mkdir -p "$OUT"
unset TRITON_INTERPRET FLA_BWD_DKV_PATH FLA_BWD_DQ_PATH FLA_BWD_DS_KERNEL
timeout 180 python3 -m pytest -q -n 14 -p no:cacheprovider tests/ops/test_attn_gluon_dkv.py \
  tests/ops/test_attn_five_product.py tests/ops/test_attn_cuda_graph.py > "$OUT/tests.log" 2>&1
echo "tests rc $? ($SECONDS s): $(tail -n 1 "$OUT/tests.log")"
grep -E "FAILED|Error" "$OUT/tests.log" | head -n 20
BENCH_COMMIT=$1 PART=3 OUT=$OUT/part3 bash benchmarks/gpu_run.sh 2>&1 | tail -n 40
echo "total $SECONDS s"
