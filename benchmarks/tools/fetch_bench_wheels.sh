#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# Download the wheels the (offline) H200 machine needs for the benchmark into .whl/ (git-ignored):
#   fla-core 0.6.0        peer; pure Python; needs einops (+ torch, triton, already on the GPU image)
#   flash-attn3-jax 0.2.3 peer; cp312 manylinux; needs jax and einops (already on the GPU image)
#   tabulate 0.10.0       the runner's tables (benchmarks/ops); pure Python, no dependencies
#   tqdm 4.70.1           the runner's progress bars; pure Python (colorama on Windows only)
# Only these wheels, with --no-deps: nothing may pull in another torch, triton or jax.
# On the GPU machine benchmarks/gpu_run.sh installs them with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.whl}
mkdir -p "$DEST"

PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
COMMON=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d "$DEST")

python3 -m pip download -q "${COMMON[@]}" "${PLAT[@]}" flash-attn3-jax==0.2.3
# a py3-none-any wheel matches --platform any
python3 -m pip download -q "${COMMON[@]}" --platform any fla-core==0.6.0 tabulate==0.10.0 tqdm==4.70.1

# Anything else in the directory would be installed too: keep only what this script fetches.
for f in "$DEST"/*.whl; do
  case "$(basename "$f")" in
    flash_attn3_jax-0.2.3-*.whl|fla_core-0.6.0-*.whl|tabulate-0.10.0-*.whl|tqdm-4.70.1-*.whl) ;;
    *) echo "fetch_bench_wheels: removing unexpected $f" >&2; rm -f "$f" ;;
  esac
done

status=0
for f in "$DEST"/*.whl; do
  # extras and Windows-only requirements are not installed on the (Linux) GPU machine
  reqs=$(unzip -p "$f" '*.dist-info/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' \
         | grep -v -E '(platform_system|sys_platform) *== *"(Windows|win32)"' || true)
  echo "$(basename "$f"): ${reqs//$'\n'/; }"
  # the GPU image already has these; a wheel needing anything else would fail there at import time
  for r in $(echo "$reqs" | sed -E 's/^Requires-Dist: *([A-Za-z0-9_.-]+).*/\1/'); do
    case "${r,,}" in
      jax|einops|torch|triton|numpy) ;;
      *) echo "fetch_bench_wheels: $(basename "$f") needs $r, which the GPU image may lack" >&2; status=1 ;;
    esac
  done
done
ls -la "$DEST"
exit $status
