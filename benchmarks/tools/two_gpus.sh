#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# Two device jobs at once on a two-GPU machine, one a GPU, from the repository root: half the device time of running
# them one after the other (device time counts the machine's held time, not its GPUs).
#     bash benchmarks/tools/two_gpus.sh "BENCH_COMMIT=abc1234 PART=1 bash benchmarks/gpu_run.sh" \
#                                       "BENCH_COMMIT=abc1234 PART=2 bash benchmarks/gpu_run.sh"
# Job 1 runs on GPU 0 with OUT=$OUT/gpu0, job 2 on GPU 1 with OUT=$OUT/gpu1, started DELAY_S (default 45) seconds
# later: jobs that install the carried wheels into /tmp/site must not write it at once (gpu_run.sh, ab.sh). Each
# job's output goes to $OUT/gpuN/job.log; the last TAIL (default 40) lines of each are printed when both end. The
# exit status is the first nonzero of the two. The shared host colours host-bound timings (gpu_run.sh's header).
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: two_gpus.sh 'JOB ON GPU 0' 'JOB ON GPU 1'" >&2; exit 2; }
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/two_gpus_out}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 2 ] || { echo "two_gpus.sh: needs two GPUs, nvidia-smi lists $gpus" >&2; exit 2; }
jobs=("$1" "$2")
pids=()
for i in 0 1; do
  mkdir -p "$OUT/gpu$i"
  [ "$i" = 1 ] && sleep "${DELAY_S:-45}"
  echo "[two_gpus +$SECONDS s] GPU $i: ${jobs[$i]}"
  CUDA_VISIBLE_DEVICES=$i OUT=$OUT/gpu$i bash -c "${jobs[$i]}" > "$OUT/gpu$i/job.log" 2>&1 &
  pids+=($!)
done
rc=0
for i in 0 1; do
  wait "${pids[$i]}"
  r=$?
  echo "[two_gpus +$SECONDS s] GPU $i exit $r"
  [ "$rc" = 0 ] && rc=$r
done
for i in 0 1; do
  echo "== GPU $i: last ${TAIL:-40} lines of $OUT/gpu$i/job.log"
  tail -n "${TAIL:-40}" "$OUT/gpu$i/job.log" | cut -c1-400
done
exit "$rc"
