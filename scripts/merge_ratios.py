#!/usr/bin/env python3
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Merge the per-process largest error ratios that the tests write under FLA_BWD_RATIOS_DIR (see tests/conftest.py)
into one table: the largest ratio per output and the test that produced it.

    FLA_BWD_RATIOS_DIR=/tmp/r pytest -n 8 tests/ops && python scripts/merge_ratios.py /tmp/r
"""

import glob
import json
import os
import sys


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: merge_ratios.py DIR (the FLA_BWD_RATIOS_DIR of a test run)")
    best = {}
    for path in glob.glob(os.path.join(sys.argv[1], "ratios-*.json")):
        with open(path) as f:
            for name, (ratio, test) in json.load(f).items():
                if name not in best or ratio > best[name][0]:
                    best[name] = (ratio, test)
    order = ["o", "dq", "dk", "dv", "dg", "dsink"]
    for name in sorted(best, key=lambda n: (order.index(n) if n in order else len(order), n)):
        print(f"{name:>6}: {best[name][0]:.3e}  ({best[name][1]})")


if __name__ == "__main__":
    main()
