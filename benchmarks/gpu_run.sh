#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The full H200 benchmark, from the repository root, with .whl/ carried (benchmarks/tools/fetch_bench_wheels.sh fills
# it: the peers' wheels and the runner's tabulate and tqdm).
# Split into parts that each fit one device command (<= 9 minutes; benchmarks/ops/plan.py balances them):
#     PART=1 bash benchmarks/gpu_run.sh      # the gate + part 1 of PARTS (default 5: four no longer leave headroom
#                                            # since the "variants" rows, `python -m benchmarks.ops.plan --parts 4`)
#     PART=2 bash benchmarks/gpu_run.sh      # part 2: no gate (inherits part 1's stamp, else deferred to the merge)
#     PART=3 bash benchmarks/gpu_run.sh
#     PART=4 bash benchmarks/gpu_run.sh
#     PART=5 bash benchmarks/gpu_run.sh
# On a two-GPU machine two parts may run at once, one per GPU (CUDA_VISIBLE_DEVICES=0/1, separate OUT), the
# second started ~45 s after the first (both install the wheels into /tmp/site). The shared host then colours the
# host-bound short rows.
# Two parts beside each other need the device command's full 600 s: each runs ~430 s, the second starts 45 s
# later, and a command killed at its limit returns only a few of its files (2026-11-30: a 480 s limit lost part 3).
#     python benchmarks/merge.py .../summary-part1.json ... .../summary-part5.json --out-dir DIR
# or, unsplit (too long for one 10-minute command with every peer): bash benchmarks/gpu_run.sh
# Installs the carried peer wheels into /tmp/site, runs the correctness gate and the shapes (bwd and fwdbwd; fwd on
# the forward control) with the dispatch-vs-legacy A/B and all peers, then writes into $OUT:
#     summary[-partK].json  summary[-partK].md  peer_ratios[-partK].png  logs/{run[-partK],prewarm[-partK],report,pip,env,plan}.log
# and prints the backward-alone table last. Finishes in about BENCH_TOTAL_S seconds at most (default 540 for a
# part, 450 unsplit). Knobs (environment): PART, PARTS, GATE (auto|run|defer), GATE_STAMP, GATE_WORKERS,
# BASELINE (an earlier commit's package dir, default .baseline/fla_bwd_12ac0d6 where carried; empty: none),
# BENCH_COMMIT, BENCH_TOTAL_S, GATE_TIMEOUT_S, ITERS, REPEATS, PEERS, SHAPES, OVERHEAD_SHAPES, PREWARM (1: fill
# Triton's cache for the part's shapes first, benchmarks/tools/prewarm.py; 0: not), PREWARM_WORKERS, PREWARM_TIMEOUT_S.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT/logs"
PART=${PART:-}
PARTS=${PARTS:-5}
GATE=${GATE:-auto}
GATE_STAMP=${GATE_STAMP:-/tmp/fla_bwd-bench-gate.json}  # outside the tree: survives between commands on one machine
if [ -n "$PART" ]; then
  case "$PART" in *[!0-9]*) echo "PART must be a number, got '$PART'" >&2; exit 2;; esac
  if [ "$PART" -lt 1 ] || [ "$PART" -gt "$PARTS" ]; then echo "PART must be 1..$PARTS, got $PART" >&2; exit 2; fi
  TOTAL=${BENCH_TOTAL_S:-540}
  TAG="-part$PART"
else
  TOTAL=${BENCH_TOTAL_S:-450}
  TAG=""
fi
case "$GATE" in
  auto) if [ -n "$PART" ] && [ "$PART" -gt 1 ]; then GATE=defer; else GATE=run; fi;;
  run|defer) ;;
  *) echo "GATE must be auto, run or defer, got '$GATE'" >&2; exit 2;;
esac
# The gate took 131 s with 12 workers on 2026-11-29; on 2026-11-30, from a cold Triton cache with another part
# starting beside it, it ran past 200 s (and 57 s with the cache warm).
GATE_TIMEOUT=${GATE_TIMEOUT_S:-360}
ITERS=${ITERS:-10}
REPEATS=${REPEATS:-5}
PEERS=${PEERS:-flex,sdpa-cudnn,sdpa-fa2,fla,fa3}
SHAPES=${SHAPES:-all}
# Whole-step CUDA-graph kernel times beside the eager medians: the short rows, and every T = 2048 row that issue 18's
# bars name or that sits at the host/GPU line on the H200's host (its eager median then carries host time).
HOST_LINE_ROWS=mha-short,gqa4-short,mha-long,mha-long-fp16,gqa4-long,gqa4-long-gated,g2-T2048-D128,g8-T2048-D128
HOST_LINE_ROWS+=,ctl-g16-T2048,ctl-K128-V64-g8-T2048,g8-T2048-D64
# An earlier commit's package timed beside ours on every row (backward alone), written by
# benchmarks/tools/make_baseline.py and carried as .baseline/: issue 18's bar against the record at 12ac0d6.
BASELINE=${BASELINE-.baseline/fla_bwd_12ac0d6}
BASELINE_ARGS=()
if [ -n "$BASELINE" ] && [ -d "$BASELINE" ]; then
  BASELINE_ARGS=(--baseline "$BASELINE")
  # its shorter rows compare whole-step graph kernel times: every T <= 2048 dense row gets one
  HOST_LINE_ROWS+=,mha-short-fp16,g2-T2048-D64,g4-T2048-D64,ctl-mha-T2048
fi
if [ "$SHAPES" = all ] || [ -n "$PART" ]; then OVERHEAD_SHAPES=${OVERHEAD_SHAPES-$HOST_LINE_ROWS}; else OVERHEAD_SHAPES=${OVERHEAD_SHAPES-}; fi
OVERHEAD_ARGS=()
[ -n "$OVERHEAD_SHAPES" ] && OVERHEAD_ARGS=(--overhead "$OVERHEAD_SHAPES")
PART_ARGS=()
[ -n "$PART" ] && PART_ARGS=(--part "$PART/$PARTS")
if [ "$GATE" = defer ]; then PART_ARGS+=(--defer-gate --gate-stamp "$GATE_STAMP")
else PART_ARGS+=(--gate-stamp "$GATE_STAMP"); fi
PREWARM=${PREWARM:-1}
PREWARM_TIMEOUT=${PREWARM_TIMEOUT_S:-200}  # 51-72 s a part with 12-14 workers on 2026-12-04
PREWARM_WORKERS=${PREWARM_WORKERS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
case "$PREWARM" in 0|1) ;; *) echo "PREWARM must be 0 or 1, got '$PREWARM'" >&2; exit 2;; esac
PY=${PYTHON:-python3}
since() { echo $(( $(date +%s) - T0 )); }
say() { echo "[gpu_run +$(since)s] $*"; }

# 1. carried wheels (peers fla-core 0.6.0, flash-attn3-jax 0.2.3; the runner's tabulate 0.10.0, tqdm 4.70.1),
#    --no-deps: nothing may replace torch, triton or jax
if compgen -G ".whl/*.whl" > /dev/null; then
  for w in .whl/*.whl; do  # one at a time: a wheel that fails to install does not take the other down
    if [ -f "/tmp/site/.installed-$(basename "$w")" ] && cmp -s "$w" "/tmp/site/.installed-$(basename "$w")"; then
      say "already installed $(basename "$w") (same machine as an earlier part)"
      continue
    fi
    if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w" \
         >> "$OUT/logs/pip.log" 2>&1; then
      say "installed $(basename "$w")"
      cp "$w" "/tmp/site/.installed-$(basename "$w")" 2>/dev/null || true
    else
      say "could not install $(basename "$w") (its peer will be skipped): $(tail -n 1 "$OUT/logs/pip.log")"
    fi
  done
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  say "no .whl/ carried: the fla and fa3 peers will be skipped, and tabulate and tqdm must come from the image" \
      "(carry .whl, filled by benchmarks/tools/fetch_bench_wheels.sh)"
fi
export FLA_DISABLE_BACKEND_DISPATCH=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
unset TRITON_INTERPRET FLA_BWD_DKV_PATH

{
  $PY -m torch.utils.collect_env || true  # the runner records the same in its JSON (env.collect_env)
  $PY -c 'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda,
"triton", triton.__version__, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' || true
  $PY -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | tail -n 2 || true
} > "$OUT/logs/env.log" 2>&1
say "$(grep -m1 '^torch' "$OUT/logs/env.log")"
# Anything else on the GPU or the host colours the times (eager rows are host-bound at T <= 2048): say so up front.
OTHERS=$(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader 2>/dev/null | tr '\n' ';')
BUSY=$(ps -eo pid=,pcpu=,comm= --sort=-pcpu 2>/dev/null | awk -v me=$$ '$1 != me && $2 >= 20 {printf "%s(%s%%) ", $3, $2}')
say "before the run: load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null); other GPU processes: ${OTHERS:-none};" \
    "processes over 20% CPU in their lifetime: ${BUSY:-none}"
if [ ${#BASELINE_ARGS[@]} -gt 0 ]; then
  say "baseline $BASELINE: commit $(cat "$BASELINE/BASELINE_COMMIT" 2>/dev/null || echo '(no BASELINE_COMMIT)')"
elif [ -n "$BASELINE" ]; then
  say "no $BASELINE carried: no baseline column (write it with benchmarks/tools/make_baseline.py, carry .baseline)"
fi
if [ -n "$PART" ]; then
  $PY -m benchmarks.ops.plan --parts "$PARTS" > "$OUT/logs/plan.log" 2>&1 || true
  say "part $PART of $PARTS (gate: $GATE): $(grep "^part $PART/" "$OUT/logs/plan.log")"
fi

# 2. prewarm: compile this part's kernels (both dK/dV paths) in parallel processes into Triton's cache, which the
#    gate and the runner then read (the runner compiles one kernel at a time: 10-60 s a row on a cold cache).
if [ "$PREWARM" = 1 ]; then
  WARM_PART=()
  [ -n "$PART" ] && WARM_PART=(--part "$PART/$PARTS")
  timeout -s TERM -k 10 "$PREWARM_TIMEOUT" $PY -m benchmarks.tools.prewarm --shapes "$SHAPES" ${WARM_PART[@]+"${WARM_PART[@]}"} \
    ${BASELINE_ARGS[@]+"${BASELINE_ARGS[@]}"} \
    --workers "$PREWARM_WORKERS" > "$OUT/logs/prewarm$TAG.log" 2>&1
  say "prewarm exit code $? (0 ok, 1 a task failed, 124 stopped): $(tail -n 1 "$OUT/logs/prewarm$TAG.log")"
fi

# 3. gate + benchmark. The runner's own budget stops new peers and then new shapes in time; `timeout -s TERM`
#    is the backstop (the runner then summarises what it has); the JSON is rewritten after every shape.
#    20 s stay for the report after the hard stop; no shape starts in the last 50 s before it (the longest shape).
LEFT=$(( TOTAL - $(since) - 20 ))
BUDGET=$(( LEFT - 50 ))
JSON="$OUT/summary$TAG.json"
say "running the benchmark${PART:+ part $PART/$PARTS} (gate: $GATE): budget ${BUDGET}s, hard stop ${LEFT}s"
timeout -s TERM -k 20 "$LEFT" $PY -u -m benchmarks.ops.run --op parallel_attn --shapes "$SHAPES" --ab \
  --peers "$PEERS" --repeats "$REPEATS" --iters "$ITERS" --fa3-calls 30 --gate-timeout "$GATE_TIMEOUT" \
  --budget-s "$BUDGET" "${PART_ARGS[@]}" ${OVERHEAD_ARGS[@]+"${OVERHEAD_ARGS[@]}"} \
  ${BASELINE_ARGS[@]+"${BASELINE_ARGS[@]}"} --json "$JSON" 2>&1 \
  | tee "$OUT/logs/run$TAG.log"
RC=${PIPESTATUS[0]}
say "runner exit code $RC (0 ok, 2 usage, 3 gate red, 4 an op error, 124/130 stopped)"

# 4. Markdown table + plot, then the backward-alone table as the very last output
ANCHORS=""
for a in benchmarks/results/anchors-h200-2026-11-29.jsonl shared/anchors/h200-2026-11-29.jsonl; do
  [ -f "$a" ] && ANCHORS="--anchors $a" && break
done
if [ -f "$JSON" ]; then
  # shellcheck disable=SC2086
  $PY benchmarks/report.py "$JSON" --out-dir "$OUT" --suffix="$TAG" $ANCHORS > "$OUT/logs/report$TAG.log" 2>&1 \
    || say "report failed: $(tail -n 3 "$OUT/logs/report$TAG.log")"
  say "done in $(since)s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  $PY benchmarks/report.py "$JSON" --out-dir "$OUT" --suffix="$TAG" --no-plot --print-mode bwd 2>&1 \
    | grep -v '^wrote '
else
  say "no $(basename "$JSON") was written; see $OUT/logs/run$TAG.log"
fi
exit "$RC"
