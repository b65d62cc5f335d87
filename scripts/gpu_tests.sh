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
# two device calls, one share of the files each: SHARE=1/2 bash scripts/gpu_tests.sh 540, then SHARE=2/2.
# Each group runs in a process group of its own, killed whole when it ends: no pytest worker outlives its limit
# (2026-12-06: a timed-out run's stragglers may have coloured the benchmark part after it).
set -uo pipefail
cd "$(dirname "$0")/.."
LIMIT=${1:-280}
SHARE=${SHARE:-1/1}
[[ "$SHARE" =~ ^([0-9]+)/([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] \
  && [ "${BASH_REMATCH[1]}" -le "${BASH_REMATCH[2]}" ] || { echo "SHARE must be K/N with 1 <= K <= N, got '$SHARE'" >&2; exit 2; }
SHARE_K=${BASH_REMATCH[1]}
SHARE_N=${BASH_REMATCH[2]}
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
ALL=("${HEAVY[@]}" "${REST[@]}")
FILES=()
for i in "${!ALL[@]}"; do [ $((i % SHARE_N + 1)) = "$SHARE_K" ] && FILES+=("${ALL[$i]}"); done
echo "share $SHARE: ${#FILES[@]} of ${#ALL[@]} test files"
declare -a GROUP
for i in "${!FILES[@]}"; do GROUP[$((i % NGPU))]+=" ${FILES[$i]}"; done
t0=$(date +%s)
PGIDS=()
for g in $(seq 0 $((NGPU - 1))); do
  [ -n "${GROUP[$g]:-}" ] || continue
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$g setsid -w timeout "$LIMIT" python3 -m pytest -q -n "$WORKERS" ${GROUP[$g]} \
    -p no:cacheprovider > "$LOGS/gpu$g.log" 2>&1 &
  PGIDS+=($!)
done
wait
for pg in "${PGIDS[@]}"; do kill -KILL -- "-$pg" 2>/dev/null; done  # the group's stragglers, if any
echo "tests on $NGPU GPU(s) took $(( $(date +%s) - t0 )) s"
RC=0
for g in $(seq 0 $((NGPU - 1))); do
  [ -n "${GROUP[$g]:-}" ] || continue
  line=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$LOGS/gpu$g.log" | tail -n 1)
  echo "GPU $g:${GROUP[$g]}"
  echo "  ${line:-no summary line (stopped by the ${LIMIT} s limit?): $(grep -o '\[ *[0-9]*%\]' "$LOGS/gpu$g.log" | tail -n 1)}"
  grep -E "^(FAILED|ERROR)" "$LOGS/gpu$g.log" | head -n 20
  [ -n "$line" ] && ! grep -qE "failed|error" <<< "$line" || RC=1
done
if [ "$NGPU" -ge 2 ] && [ "$SHARE_K" = "$SHARE_N" ]; then  # once, with the last share
  timeout 120 python3 -m pytest -q -rA tests/ops/test_attn_multigpu.py -p no:cacheprovider 2>&1 \
    | grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^single|^ddp" || RC=1
fi
exit $RC
