#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# Stage FlashAttention-4 (flash-attn-4 4.0.0b36, the `fa4` and `fa4-det` benchmark peers) for the offline GPU machine,
# in two carry folders (one device command carries at most 64 MiB; the CUDA runtime of the CuTe DSL alone is 60 MiB
# xz'd), both git-ignored:
#   .whl/fa4a/  part 1 of libs_cu12.tar.xz: the nvidia-cutlass-dsl-libs-cu12 4.8.1 wheel (92 MB) unpacked, tar | xz -9
#   .whl/fa4b/  part 2 of it, its sha256, and the small wheels: flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1 (meta),
#               nvidia-cutlass-dsl-libs-base 4.8.1, nvidia-cutlass-dsl-libs-core 4.8.1 (the `cutlass` package itself),
#               apache-tvm-ffi 0.1.15.post2, torch-c-dlpack-ext 0.1.5, quack-kernels 0.6.5
# cu12, not cu13: nvidia-cutlass-dsl 4.8.1 requires libs-base and libs-cu12 by default (libs-cu13 is its `cu13`
# extra); the DSL loads the newest flavour the driver supports, so cu12 runs under the GPU machine's CUDA 13 driver,
# and FA4's SM90 path has no cu13-only code (its one CUDA 12 switch, utils._is_cuda_12, gates an SM100 forward).
# Not carried, the GPU image has them: torch, einops, typing-extensions, cuda-bindings, protobuf, packaging.
# There, benchmarks/tools/install_fa4.sh puts both parts back together (benchmarks/README.md, "FlashAttention-4").
#
#   bash scripts/stage_fa4.sh [SRC]
# SRC (default $FA4_WHEELS, else /tmp/fa4dl) holds the wheels; one that is missing is fetched into it with pip
# download (no dependencies); libs_cu12.tar.xz is made there from the libs-cu12 wheel when absent (xz -9: minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=${1:-${FA4_WHEELS:-/tmp/fa4dl}}
OUT=.whl
LIMIT=$((60 * 1024 * 1024))  # each folder stays well under a command's 64 MiB
mkdir -p "$SRC"

# pip name==version, the wheel's file name pattern
SMALL=(
  "flash-attn-4==4.0.0b36 flash_attn_4-4.0.0b36-py3-none-any.whl"
  "nvidia-cutlass-dsl==4.8.1 nvidia_cutlass_dsl-4.8.1-py3-none-any.whl"
  "nvidia-cutlass-dsl-libs-base==4.8.1 nvidia_cutlass_dsl_libs_base-4.8.1-cp312-*.whl"
  "nvidia-cutlass-dsl-libs-core==4.8.1 nvidia_cutlass_dsl_libs_core-4.8.1-py3-none-any.whl"
  "apache-tvm-ffi==0.1.15.post2 apache_tvm_ffi-0.1.15.post2-cp312-*.whl"
  "torch-c-dlpack-ext==0.1.5 torch_c_dlpack_ext-0.1.5-cp312-*.whl"
  "quack-kernels==0.6.5 quack_kernels-0.6.5-py3-none-any.whl"
)
LIBS="nvidia-cutlass-dsl-libs-cu12==4.8.1 nvidia_cutlass_dsl_libs_cu12-4.8.1-cp312-*.whl"

wheel() {  # the one file in SRC matching pattern $2, fetched with spec $1 when absent
  local f
  f=$(compgen -G "$SRC/$2" | head -n 1 || true)
  if [ -z "$f" ]; then
    echo "stage_fa4: fetching $1" >&2
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform any -d "$SRC" "$1" >&2
    f=$(compgen -G "$SRC/$2" | head -n 1 || true)
    [ -n "$f" ] || { echo "stage_fa4: no $2 in $SRC after pip download" >&2; exit 1; }
  fi
  echo "$f"
}

ARCHIVE="$SRC/libs_cu12.tar.xz"
if [ ! -s "$ARCHIVE" ]; then
  read -r spec pat <<<"$LIBS"
  whl=$(wheel "$spec" "$pat")
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "stage_fa4: unpacking $(basename "$whl") and compressing it (xz -9)" >&2
  python3 -m zipfile -e "$whl" "$tmp/tree"
  tar -C "$tmp/tree" -cf - . | xz -9 -T0 >"$ARCHIVE.tmp"
  mv "$ARCHIVE.tmp" "$ARCHIVE"
fi
# the archive must be the cu12 runtime tree: its loader and the runtime library it loads
names=$(xz -dc "$ARCHIVE" | tar -tf -)
for need in "_cutlass_ir.cu12.cpython-312-x86_64-linux-gnu.so" "cu12/lib/libcute_dsl_runtime.so" \
    "nvidia_cutlass_dsl_libs_cu12-4.8.1.dist-info/METADATA"; do
  grep -q -F "$need" <<<"$names" || { echo "stage_fa4: $ARCHIVE lacks $need" >&2; exit 1; }
done

rm -rf "$OUT/fa4a" "$OUT/fa4b"
mkdir -p "$OUT/fa4a" "$OUT/fa4b"
size=$(stat -c %s "$ARCHIVE")
half=$(((size + 1) / 2))
head -c "$half" "$ARCHIVE" >"$OUT/fa4a/libs_cu12.tar.xz.part1"
tail -c +"$((half + 1))" "$ARCHIVE" >"$OUT/fa4b/libs_cu12.tar.xz.part2"
(cd "$(dirname "$ARCHIVE")" && sha256sum "$(basename "$ARCHIVE")") >"$OUT/fa4b/libs_cu12.tar.xz.sha256"
for entry in "${SMALL[@]}"; do
  read -r spec pat <<<"$entry"
  cp "$(wheel "$spec" "$pat")" "$OUT/fa4b/"
done
(cd "$OUT/fa4a" && sha256sum -- * >SHA256SUMS)
(cd "$OUT/fa4b" && sha256sum -- * >SHA256SUMS)

for d in fa4a fa4b; do
  bytes=$(cat "$OUT/$d"/* | wc -c)
  if [ "$bytes" -gt "$LIMIT" ]; then
    echo "stage_fa4: $OUT/$d is $bytes bytes, over $LIMIT" >&2
    exit 1
  fi
  echo "$OUT/$d: $((bytes / 1024 / 1024)) MiB, $(ls "$OUT/$d" | wc -l) files"
done
echo "first run:  carry [\".whl/fa4a\"]"
echo "second run: carry [\".whl/fa4b\"], command starting with: eval \"\$(bash benchmarks/tools/install_fa4.sh)\""
