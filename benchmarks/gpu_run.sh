#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The full H200 benchmark in one command, from the repository root, with .whl/ carried
# (scripts/fetch_bench_wheels.sh fills it):
#     bash benchmarks/gpu_run.sh
# Installs the carried peer wheels into /tmp/site, runs the correctness gate and every registered shape (bwd and
# fwdbwd; fwd on the forward control) with the dispatch-vs-legacy A/B and all peers, then writes into $OUT:
#     summary.json  summary.md  bwd_tflops.png  logs/{run,report,pip,env}.log
# and prints the backward-alone table last. Finishes in about BENCH_TOTAL_S seconds (default 450) at most.
# Knobs (environment): BENCH_TOTAL_S, GATE_TIMEOUT_S, ITERS, REPEATS, PEERS, SHAPES, OVERHEAD_SHAPES.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-$PWD/bench_out}
mkdir -p "$OUT/logs"
TOTAL=${BENCH_TOTAL_S:-450}
GATE_TIMEOUT=${GATE_TIMEOUT_S:-200}
ITERS=${ITERS:-10}
REPEATS=${REPEATS:-5}
PEERS=${PEERS:-flex,sdpa-cudnn,sdpa-fa2,fla,fa3}
SHAPES=${SHAPES:-all}
if [ "$SHAPES" = all ]; then OVERHEAD_SHAPES=${OVERHEAD_SHAPES-mha-short,gqa4-short}; else OVERHEAD_SHAPES=${OVERHEAD_SHAPES-}; fi
OVERHEAD_ARGS=()
[ -n "$OVERHEAD_SHAPES" ] && OVERHEAD_ARGS=(--overhead "$OVERHEAD_SHAPES")
PY=${PYTHON:-python3}
since() { echo $(( $(date +%s) - T0 )); }
say() { echo "[gpu_run +$(since)s] $*"; }

# 1. peer wheels (fla-core 0.6.0, flash-attn3-jax 0.2.3), --no-deps: nothing may replace torch, triton or jax
if compgen -G ".whl/*.whl" > /dev/null; then
  for w in .whl/*.whl; do  # one at a time: a wheel that fails to install does not take the other down
    if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w" \
         >> "$OUT/logs/pip.log" 2>&1; then
      say "installed $(basename "$w")"
    else
      say "could not install $(basename "$w") (its peer will be skipped): $(tail -n 1 "$OUT/logs/pip.log")"
    fi
  done
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
else
  say "no .whl/ carried: the fla and fa3 peers will be skipped (carry .whl, filled by scripts/fetch_bench_wheels.sh)"
fi
export FLA_DISABLE_BACKEND_DISPATCH=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
unset TRITON_INTERPRET FLA_BWD_DKV_PATH

{
  nvidia-smi || true
  $PY -c 'import sys, torch, triton; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda,
"triton", triton.__version__, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' || true
  $PY -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>&1 | tail -n 2 || true
} > "$OUT/logs/env.log" 2>&1
say "$(grep -m1 '^torch' "$OUT/logs/env.log")"

# 2. gate + benchmark. The runner's own budget stops new peers and then new shapes in time; `timeout -s TERM`
#    is the backstop (the runner then summarises what it has); the JSON is rewritten after every shape.
LEFT=$(( TOTAL - $(since) - 30 ))
BUDGET=$(( LEFT - 60 ))
say "running the gate and the benchmark: budget ${BUDGET}s, hard stop ${LEFT}s"
timeout -s TERM -k 20 "$LEFT" $PY -u -m benchmarks.ops.run --op parallel_attn --shapes "$SHAPES" --ab \
  --peers "$PEERS" --repeats "$REPEATS" --iters "$ITERS" --fa3-calls 30 --gate-timeout "$GATE_TIMEOUT" \
  --budget-s "$BUDGET" ${OVERHEAD_ARGS[@]+"${OVERHEAD_ARGS[@]}"} --json "$OUT/summary.json" 2>&1 | tee "$OUT/logs/run.log"
RC=${PIPESTATUS[0]}
say "runner exit code $RC (0 ok, 2 usage, 3 gate red, 4 an op error, 124/130 stopped)"

# 3. Markdown table + plot, then the backward-alone table as the very last output
ANCHORS=""
for a in benchmarks/results/anchors-h200-2026-11-29.jsonl shared/anchors/h200-2026-11-29.jsonl; do
  [ -f "$a" ] && ANCHORS="--anchors $a" && break
done
if [ -f "$OUT/summary.json" ]; then
  # shellcheck disable=SC2086
  $PY benchmarks/report.py "$OUT/summary.json" --out-dir "$OUT" $ANCHORS > "$OUT/logs/report.log" 2>&1 \
    || say "report failed: $(tail -n 3 "$OUT/logs/report.log")"
  say "done in $(since)s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  $PY benchmarks/report.py "$OUT/summary.json" --out-dir "$OUT" --no-plot --print-mode bwd 2>&1 | grep -v '^wrote '
else
  say "no summary.json was written; see $OUT/logs/run.log"
fi
exit "$RC"
