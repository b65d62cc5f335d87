#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Write an earlier commit's `fla_bwd` package under another name, so one benchmark process can time it beside
today's on the same GPU (the runner's `--baseline`; issue 18's bar against the record at 12ac0d6 needs that record's
code timed on the GPU the new record runs on).

    python -m benchmarks.tools.make_baseline --commit 12ac0d6          # -> .baseline/fla_bwd_12ac0d6/
    python -m benchmarks.ops.run ... --baseline .baseline/fla_bwd_12ac0d6   (benchmarks/gpu_run.sh: BASELINE=...)

Every whole word `fla_bwd` in the commit's package (imports, docstrings, the torch.library namespaces of its custom
ops) becomes `fla_bwd_<commit>`; nothing else changes, so its kernels are the commit's source. `.baseline/` is
git-ignored: carry it to the device machine (`carry: [".whl", ".baseline"]`). The commit's full hash is in
`<package>/BASELINE_COMMIT`.

With `--patch FILE` the commit's package gets a candidate patch first (`fla_bwd_<commit>_<patch name>`, labelled
`fla_bwd@<commit>+<patch name>`): the runner then times the candidate against this checkout in one process,
interleaved round by round.
"""

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Optional

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WORD = re.compile(r"\bfla_bwd\b")


def _stem(patch: Optional[str]) -> str:
    """The patch's file name as an identifier part ("kv-early.patch" -> "kv_early"), "" without one."""
    if not patch:
        return ""
    return re.sub(r"\W", "_", os.path.basename(patch).rsplit(".", 1)[0])


def module_name(commit: str, patch: Optional[str] = None) -> str:
    return f"fla_bwd_{commit[:7]}" + (f"_{_stem(patch)}" if patch else "")


def make(commit: str, out_dir: str, patch: Optional[str] = None) -> str:
    """Writes the renamed package (with `patch` applied first, `patch -p1` from the repository root) into out_dir
    and returns its path."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=_ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    name = module_name(full, patch)
    archive = subprocess.run(["git", "archive", "--format=tar", full, "fla_bwd"], cwd=_ROOT, check=True,
                             capture_output=True).stdout
    dest = os.path.join(out_dir, name)
    shutil.rmtree(dest, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            try:
                tar.extractall(tmp, filter="data")
            except TypeError:  # Python before 3.10.12 / 3.11.4: no extraction filters (git's own archive)
                tar.extractall(tmp)
        if patch:
            subprocess.run(["patch", "-p1", "-s", "-d", tmp, "-i", os.path.abspath(patch)], check=True,
                           capture_output=True, text=True)
        src = os.path.join(tmp, "fla_bwd")
        for folder, _, files in os.walk(src):
            for f in files:
                rel = os.path.relpath(os.path.join(folder, f), src)
                with open(os.path.join(src, rel), "rb") as fh:
                    data = fh.read()
                if rel.endswith(".py"):
                    data = _WORD.sub(name, data.decode()).encode()
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                with open(os.path.join(dest, rel), "wb") as fh:
                    fh.write(data)
    with open(os.path.join(dest, "BASELINE_COMMIT"), "w") as f:
        f.write(full + "\n" + (f"patch {_stem(patch)}\n" if patch else ""))
    return dest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commit", required=True, help="the commit whose package to write (any git revision)")
    p.add_argument("--patch", default=None, help="a patch (`patch -p1` from the repository root) applied to the "
                   "commit's package first: a candidate timed against the package in the same process")
    p.add_argument("--out", default=os.path.join(_ROOT, ".baseline"), help="directory to write it into")
    args = p.parse_args(argv)
    try:
        dest = make(args.commit, args.out, args.patch)
    except subprocess.CalledProcessError as e:
        print(f"make_baseline: {e.cmd[0]} failed: {str(e.stderr or '').strip()}", file=sys.stderr)
        return 2
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
