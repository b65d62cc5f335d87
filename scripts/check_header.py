#!/usr/bin/env python
# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Check that Python files start with the project's copyright/SPDX header line.

The first line of every file (the second one when the first is a ``#!`` shebang) must be exactly

    # Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT

Empty files (zero bytes or only whitespace, e.g. a bare ``__init__.py``) hold no code and are accepted.
With no FILE arguments every git-tracked ``*.py`` file of the repository is checked (``git ls-files '*.py'``).
Exit status: 0 if all files pass, 1 if some do not (they are listed on stdout), 2 on a usage error or a
missing file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HEADER = "# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT"
REPO_ROOT = Path(__file__).resolve().parent.parent


def header_problem(path: Path) -> str | None:
    """None if the file is fine, else a short description of what is wrong."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    if not text.strip():
        return None
    lines = text.splitlines()
    index = 1 if lines[0].startswith("#!") else 0
    line = lines[index] if index < len(lines) else ""
    if line.rstrip() == HEADER:
        return None
    where = "line 2 (after the shebang)" if index else "line 1"
    return f"{where} is {line[:80]!r}"


def tracked_python_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout
    return [str(REPO_ROOT / name) for name in out.split("\0") if name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="check_header.py",
        description=__doc__.split("\n\n", 1)[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="*", metavar="FILE", help="files to check (default: all tracked *.py)")
    args = parser.parse_args(argv)
    files = args.files or tracked_python_files()

    bad, missing = [], []
    for name in files:
        path = Path(name)
        if not path.is_file():
            missing.append(name)
            continue
        problem = header_problem(path)
        if problem is not None:
            bad.append((name, problem))
    for name in missing:
        print(f"check_header: error: no such file: {name}", file=sys.stderr)
    if bad:
        print(f"These files do not start with the header line {HEADER!r}:")
        for name, problem in bad:
            print(f"  {name}: {problem}")
    if missing:
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
