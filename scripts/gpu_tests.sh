#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The GPU test run for a device call, from the repository root: every test file spread over every visible GPU (one
# pytest -n WORKERS group per GPU, files dealt out by their measured cost), then the multi-GPU tests when there are two.
# test_kernel_resources.py is left out: it compiles for sm_90 on the CPU and runs in CI; so is test_context_parallel.py
# (gloo processes under the interpreter, which the H200 image's numpy breaks; its GPU run is issue 20's NCCL part).
#     bash scripts/gpu_tests.sh [LIMIT_S]      # default 280 s per group; logs in $OUT (or ./gpu_tests_out)
# Prints each group's summary line and failures. An H200 x2 machine ran the two groups of this split in 151 and 251 s
# (8 workers each).
# One H200 alone (cold Triton cache, 8 workers) got through 56% of the files in 400 s (2026-12-03): there, give it
# two device calls (a file list each) or a limit near a whole command's 600 s.
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:-280}
WORKERS=${WORKERS:-8}
LOGS=${OUT:-$PWD/gpu_tests_out}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
[ "$NGPU" -ge 1 ] || { echo "gpu_tests.sh: no GPU visible" >&2; exit 2; }
# Every test file of the package (tests/ops, tests/ops/utils, tests/test_*.py) but the two run elsewhere, the
# heaviest (measured) first, dealt round-robin to the GPUs. tests/benchmarks and tests/scripts run in CI: they drive
# Triton's interpreter in subprocesses, which the H200 image's numpy 2.5 breaks under Triton 3.6, and read the
# checkout's git index.
HEAVY=(tests/ops/test_attn_gqa.py tests/ops/test_attn.py tests/ops/test_attn_sink.py tests/ops/test_forgetting_attn.py
       tests/ops/test_attn_nan.py)
mapfile -t REST < <(find tests/ops tests/ops/utils tests -maxdepth 1 -name 'test_*.py' | sort \
                    | grep -vE 'test_kernel_resources|test_attn_multigpu|test_context_parallel' \
                    | grep -vxF -f <(printf '%s\n' "${HEAVY[@]}"))
FILES=("${HEAVY[@]}" "${REST[@]}")
declare -a GROUP
for i in "${!FILES[@]}"; do GROUP[$((i % NGPU))]+=" ${FILES[$i]}"; done
t0=$(date +%s)
for g in $(seq 0 $((NGPU - 1))); do
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$g timeout "$LIMIT" python3 -m pytest -q -n "$WORKERS" ${GROUP[$g]} -p no:cacheprovider \
    > "$LOGS/gpu$g.log" 2>&1 &
done
wait
echo "tests on $NGPU GPU(s) took $(( $(date +%s) - t0 )) s"
RC=0
for g in $(seq 0 $((NGPU - 1))); do
  line=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$LOGS/gpu$g.log" | tail -n 1)
  echo "GPU $g:${GROUP[$g]}"
  echo "  ${line:-no summary line (stopped by the ${LIMIT} s limit?): $(grep -o '\[ *[0-9]*%\]' "$LOGS/gpu$g.log" | tail -n 1)}"
  grep -E "^(FAILED|ERROR)" "$LOGS/gpu$g.log" | head -n 20
  [ -n "$line" ] && ! grep -qE "failed|error" <<< "$line" || RC=1
done
if [ "$NGPU" -ge 2 ]; then
  timeout 120 python3 -m pytest -q -rA tests/ops/test_attn_multigpu.py -p no:cacheprovider 2>&1 \
    | grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^single|^ddp" || RC=1
fi
exit $RC
