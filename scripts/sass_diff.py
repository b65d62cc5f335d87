#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Compare two directories of `compile_sm90.py --sass-hash` outputs, one file a variant (same file names in both):

    python scripts/sass_diff.py BEFORE_DIR AFTER_DIR [--rename old=new ...]

Lines are matched by (variant file, head dim, kernel name with its mode, e.g. `dq[flag]`; the Hopper kernel by its
ACC_IN/ACC_OUT/gated/dtype label); `--rename old=new` maps a kernel renamed since BEFORE (the name without its
mode). Prints per variant how many kernels are equal and each one that is not: "sass and ptx differ" (other code),
"sass differs, ptx equal" (the same PTX instructions, which ptxas compiled differently: register allocation or
spill slots moved with the line information), or missing on one side. Exit status 1 on any of those. A kernel
whose SASS is equal and PTX not is listed, not counted.
"""

import argparse
import re
import sys
from pathlib import Path

LINE = re.compile(r"^D=\s*(\d+) (\S+?)(\[\w+\])?\s+(.*?)\s+sass (\w+)(?:\s+ptx (\w+))?")
HOPPER = re.compile(r"^(hopper .*?):\s+(.*?)\s+sass (\w+)(?:\s+ptx (\w+))?")


def parse(path: Path, rename: dict) -> dict:
    """(head dim, kernel[mode]) -> (resources, sass hash, ptx hash or None) of one output file."""
    out = {}
    for line in path.read_text().splitlines():
        m = LINE.match(line)
        if m:
            D, name, mode, res, sass, ptx = m.groups()
            out[(int(D), rename.get(name, name) + (mode or ""))] = (res, sass, ptx)
        elif HOPPER.match(line):
            label, res, sass, ptx = HOPPER.match(line).groups()
            out[(0, label)] = (res, sass, ptx)
    return out


def compare(before: Path, after: Path, rename: dict) -> int:
    bad = 0
    for path in sorted(before.glob("*.txt")):
        old = parse(path, rename)
        if not old:
            continue
        other = after / path.name
        new = parse(other, {}) if other.is_file() else {}
        if not new:
            print(f"{path.stem}: {len(old)} kernels, no hashes in {other}")
            bad += 1
            continue
        notes, info = [], []
        for key in sorted(set(old) | set(new)):
            where = f"D={key[0]} {key[1]}" if key[0] else key[1]
            if key not in new or key not in old:
                notes.append(f"  {where}: only {'before' if key in old else 'after'}")
            elif old[key][1] != new[key][1]:
                same_ptx = old[key][2] is not None and old[key][2] == new[key][2]
                notes.append(f"  {where}: sass differs, ptx {'equal' if same_ptx else 'differs'}\n"
                             f"    before {old[key][0]}\n    after  {new[key][0]}")
            elif None not in (old[key][2], new[key][2]) and old[key][2] != new[key][2]:
                info.append(f"  {where}: sass equal, ptx differs (not counted)")
        equal = len(set(old) & set(new)) - sum("differs" in n for n in notes)
        print(f"{path.stem}: {equal} of {len(set(old) | set(new))} equal" + ("" if notes else " (all)"))
        if notes or info:
            print("\n".join(notes + info))
        bad += len(notes)
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                    help="a kernel's name in BEFORE and its name in AFTER (without the [mode]); repeatable")
    args = ap.parse_args(argv)
    rename = dict(r.split("=", 1) for r in args.rename)
    sys.exit(1 if compare(args.before, args.after, rename) else 0)


if __name__ == "__main__":
    main()
