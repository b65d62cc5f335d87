#!/bin/bash
# Session 28, call 2: chunk count, dQ knobs and dQ beside dK/dV at four chunks (2056 MiB) on g8-T8192.
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
O=${OUT:-/tmp/out}; mkdir -p "$O"
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$O/gpu.txt"
for row in g8-T8192 g8-T8192-gated; do
  echo "== $row"
  timeout 270 python3 -m benchmarks.tools.five_ab --rows $row \
    --cands five+o0,five@1028+o0,five-1chunk+o0,five@2056+o16,five@2056+o24,five+o0+s4,five+o0+w8,five+o0+s2 \
    --rounds 3 --json "$O/ab-$row.json" > "$O/ab-$row.log" 2>&1
  echo "rc $? at $(( $(date +%s) - T0 )) s"
  grep -o '"bwd_us": {[^}]*}' "$O/ab-$row.log"
  grep -o '"chunks_equal": {[^}]*}' "$O/ab-$row.log"
  python3 - "$O/ab-$row.log" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{"row"'):
        r = json.loads(line)
        for c, k in r["kernels"].items():
            print(c, {n[-22:]: v for n, v in k.items()})
PY
done
