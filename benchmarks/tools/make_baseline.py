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
"""

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WORD = re.compile(r"\bfla_bwd\b")


def module_name(commit: str) -> str:
    return f"fla_bwd_{commit[:7]}"


def make(commit: str, out_dir: str) -> str:
    """Writes the renamed package into out_dir and returns its path."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{commit}^{{commit}}"], cwd=_ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    name = module_name(full)
    archive = subprocess.run(["git", "archive", "--format=tar", full, "fla_bwd"], cwd=_ROOT, check=True,
                             capture_output=True).stdout
    dest = os.path.join(out_dir, name)
    shutil.rmtree(dest, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            rel = os.path.relpath(member.name, "fla_bwd")
            path = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            data = tar.extractfile(member).read()
            if rel.endswith(".py"):
                data = _WORD.sub(name, data.decode()).encode()
            with open(path, "wb") as f:
                f.write(data)
    with open(os.path.join(dest, "BASELINE_COMMIT"), "w") as f:
        f.write(full + "\n")
    return dest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commit", required=True, help="the commit whose package to write (any git revision)")
    p.add_argument("--out", default=os.path.join(_ROOT, ".baseline"), help="directory to write it into")
    args = p.parse_args(argv)
    try:
        dest = make(args.commit, args.out)
    except subprocess.CalledProcessError as e:
        print(f"make_baseline: git failed: {(e.stderr or b'').strip()}", file=sys.stderr)
        return 2
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
