#!/bin/bash
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
O=${OUT:-/tmp/out}; mkdir -p "$O"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 .ab/gaps.py g8-T8192 five+o0 > "$O/gaps-five.log" 2>&1; echo rc $?
grep -E "events|gap " "$O/gaps-five.log" | head -60
timeout 150 python3 .ab/gaps.py g8-T8192 seven > "$O/gaps-seven.log" 2>&1; echo rc $?
grep -E "events|gap " "$O/gaps-seven.log" | head -30
