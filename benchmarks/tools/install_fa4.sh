#!/usr/bin/env bash
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
#
# Install FlashAttention-4 (flash-attn-4 4.0.0b36, the `fa4` and `fa4-det` peers) on the offline GPU machine from the
# two carry folders scripts/stage_fa4.sh made (.whl/fa4a: part 1 of the xz'd nvidia-cutlass-dsl-libs-cu12 4.8.1 tree;
# .whl/fa4b: part 2 and the small wheels; cu12: see that script's header), into a folder of its own (.fa4/site),
# nothing pulled from elsewhere (--no-index --no-deps: torch, einops, cuda-bindings and protobuf stay the image's).
# Run it from the repository root once both parts have arrived; it prints the one line to evaluate:
#
#   eval "$(bash benchmarks/tools/install_fa4.sh)"
#
# which exports PYTHONPATH: the site folder and the CuTe DSL's dsl_packages/ (a .pth file in a wheel puts that on
# sys.path, but Python reads .pth files only in site-packages, not in a folder on PYTHONPATH). It fails loudly (exit
# 1, one line why) on a missing or corrupt part, and when flash_attn.cute then does not import.
# Knobs: FA4_PARTS (the folder holding fa4a/ and fa4b/, default .whl), FA4_SITE (default .fa4/site), PYTHON (python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
PARTS=${FA4_PARTS:-.whl}
SITE=${FA4_SITE:-.fa4/site}
PY=${PYTHON:-python3}

die() {
  echo "install_fa4: $*" >&2
  exit 1
}

for f in fa4a/libs_cu12.tar.xz.part1 fa4a/SHA256SUMS fa4b/libs_cu12.tar.xz.part2 fa4b/libs_cu12.tar.xz.sha256 \
    fa4b/SHA256SUMS; do
  [ -s "$PARTS/$f" ] || die "missing $PARTS/$f: carry .whl/fa4a in one command and .whl/fa4b in the next, \
on the same warm machine (scripts/stage_fa4.sh makes them)"
done
for d in fa4a fa4b; do
  (cd "$PARTS/$d" && sha256sum --quiet -c SHA256SUMS >&2) || die "$PARTS/$d does not match its SHA256SUMS"
done
shopt -s nullglob
wheels=("$PARTS"/fa4b/*.whl)
[ "${#wheels[@]}" -eq 7 ] || die "$PARTS/fa4b holds ${#wheels[@]} wheels, not the 7 stage_fa4.sh puts there"
want=$(cut -d' ' -f1 "$PARTS/fa4b/libs_cu12.tar.xz.sha256")
got=$(cat "$PARTS/fa4a/libs_cu12.tar.xz.part1" "$PARTS/fa4b/libs_cu12.tar.xz.part2" | sha256sum | cut -d' ' -f1)
[ "$want" = "$got" ] || die "the two parts of libs_cu12.tar.xz do not make the staged archive (sha256 $got)"

rm -rf "$SITE"
mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${wheels[@]}" >&2 \
  || die "pip install --target $SITE failed"
# after pip: pip --target replaces a top-level folder it installs (nvidia_cutlass_dsl/) whole, so the libs tree
# is laid over what the base and core wheels put there
cat "$PARTS/fa4a/libs_cu12.tar.xz.part1" "$PARTS/fa4b/libs_cu12.tar.xz.part2" | "$PY" -c '
import sys, tarfile
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz") as t:
    t.extractall(sys.argv[1], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
' "$SITE" || die "unpacking libs_cu12.tar.xz into $SITE failed"

site=$(cd "$SITE" && pwd)
path="$site:$site/nvidia_cutlass_dsl/dsl_packages"
PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c '
import cutlass, cutlass.cute, flash_attn.cute
from importlib.metadata import version
print("install_fa4: flash-attn-4", version("flash-attn-4"), "with nvidia-cutlass-dsl", cutlass.__version__,
      "from", flash_attn.cute.__file__)
' >&2 || die "installed into $SITE, but flash_attn.cute does not import (the error is above)"
echo "export PYTHONPATH=\"$path\${PYTHONPATH:+:\$PYTHONPATH}\""
