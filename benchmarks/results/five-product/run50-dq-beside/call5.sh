#!/bin/bash
cd "$(dirname "$0")/../../../.."
export PYTHONPATH=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/flash_attn3_jax-0.2.3-*.whl 2>&1 | tail -2
timeout 300 python3 benchmarks/results/five-product/run50-dq-beside/power.py 2>&1 | grep -v Warning | tail -60
