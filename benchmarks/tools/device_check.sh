#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# The first device call after work done without a GPU: the GPU tests of what changed, then an A/B of this checkout
# (B) against an older tree (A) on the rows the change should move, then the host time of a backward in both trees.
# Each step has its own time limit, so a slow step leaves the others their share of one 10-minute device command.
#     mkdir -p .ab/before && git archive BASE fla_bwd | tar -x -C .ab/before     # .ab/ is not ignored: it travels
#     bash benchmarks/tools/device_check.sh .ab/before
# Knobs (environment): TESTS (pytest arguments), TESTS_S, ROWS, CANDS, AB_ROUNDS, AB_S, HOST_ROWS, HOST_S.
# Writes into $OUT (or ./check_out): tests.log, ab-{A,B}.json and .log, host-{A,B}.json and .log (with the backward
# step by step, `host_steps.py`); prints a summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
BEFORE=${1:?usage: device_check.sh TREE (a copy of an older fla_bwd/, see above)}
[ -d "$BEFORE/fla_bwd" ] || { echo "device_check.sh: $BEFORE has no fla_bwd/ package" >&2; exit 2; }
BEFORE=$(cd "$BEFORE" && pwd)
ROOT=$PWD
LOGS=${OUT:-$PWD/check_out}
mkdir -p "$LOGS"
TESTS=${TESTS:-tests/test_settings.py tests/ops/utils/test_launch.py tests/ops/test_attn_launch_paths.py \
tests/ops/test_attn_five_product.py tests/ops/test_attn_gluon_dkv.py tests/ops/test_attn_cuda_graph.py \
tests/ops/test_forgetting_attn.py tests/ops/test_attn_nan.py tests/ops/test_attn_plan_order.py}
ROWS=${ROWS:-gqa4-long-gated,gqa4-long,g8-T8192-gated}
CANDS=${CANDS:-five+hopper}
T0=$(date +%s)

echo "== GPU tests (limit ${TESTS_S:=240} s)"
# shellcheck disable=SC2086
timeout "$TESTS_S" python3 -m pytest -q -x -n 8 $TESTS > "$LOGS/tests.log" 2>&1
echo "tests rc $? ($(( $(date +%s) - T0 )) s): $(tail -1 "$LOGS/tests.log")"

for side in A B; do
  path=$PWD
  [ "$side" = A ] && path=$BEFORE
  echo "== A/B $side ($path), limit ${AB_S:=110} s"
  # From /: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH's tree under test.
  (cd / && PYTHONPATH=$path:$ROOT python3 -c 'import fla_bwd; print("imports", fla_bwd.__file__)') \
    >> "$LOGS/ab-$side.log" 2>&1
  (cd / && PYTHONPATH=$path:$ROOT timeout "$AB_S" python3 -m benchmarks.tools.five_ab --rows "$ROWS" \
    --cands "$CANDS" --rounds "${AB_ROUNDS:-3}" --fwdbwd --json "$LOGS/ab-$side.json") >> "$LOGS/ab-$side.log" 2>&1
  echo "rc $?: $(grep -c . "$LOGS/ab-$side.log") log lines"
done

for side in A B; do
  path=$PWD
  [ "$side" = A ] && path=$BEFORE
  echo "== host time $side, limit ${HOST_S:=60} s"
  PYTHONPATH=$path timeout "$HOST_S" python3 benchmarks/tools/profile_host.py --rows "${HOST_ROWS:-gqa4-long}" --steps \
    --rounds 3 --json "$LOGS/host-$side.json" > "$LOGS/host-$side.log" 2>&1
  echo "rc $?"; tail -4 "$LOGS/host-$side.log"
done

echo "== A/B tables (A = $BEFORE, B = this checkout; $(( $(date +%s) - T0 )) s in all)"
for side in A B; do echo "-- $side"; tail -12 "$LOGS/ab-$side.log"; done
