#!/bin/bash
# Session 28, call 1: A/B of dQ from dS beside dK/dV (FLA_BWD_DQ_OVERLAP_SMS), then the GPU tests of the change.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
O=${OUT:-/tmp/out}; mkdir -p "$O"
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$O/gpu.txt"
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' | tee -a "$O/gpu.txt"
echo "== A/B (limit 300 s)"
timeout 300 python3 -m benchmarks.tools.five_ab --rows g8-T8192,g8-T4096,g8-T8192-gated \
  --cands five+o0,five@300+o0,five+o8,five+o16,five+o24,five+o32 --rounds 3 --json "$O/ab.json" > "$O/ab.log" 2>&1
echo "ab rc $? at $(( $(date +%s) - T0 )) s"
grep -o '"bwd_us": {[^}]*}' "$O/ab.log"
grep -o '"chunks_equal": {[^}]*}' "$O/ab.log"
grep -o '"deterministic": {[^}]*}' "$O/ab.log"
tail -3 "$O/ab.log"
echo "== GPU tests (limit $(( 560 - ($(date +%s) - T0) )) s)"
timeout $(( 560 - ($(date +%s) - T0) )) python3 -m pytest -q -x -n 8 tests/ops/test_attn_five_product.py \
  tests/ops/test_attn_plan_order.py tests/ops/utils/test_launch.py tests/test_settings.py tests/ops/test_attn_gluon_dkv.py \
  > "$O/tests.log" 2>&1
echo "tests rc $? at $(( $(date +%s) - T0 )) s"
tail -25 "$O/tests.log"
