# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Tests for scripts/check_header.py, run as a subprocess."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "check_header.py"
HEADER = "# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT"


def run(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=30)


def write(path, text):
    path.write_text(text)
    return str(path)


def test_good_files_pass(tmp_path):
    files = [
        write(tmp_path / "plain.py", HEADER + '\n"""Doc."""\n'),
        write(tmp_path / "shebang.py", "#!/usr/bin/env python\n" + HEADER + "\nimport os\n"),
        write(tmp_path / "only_header.py", HEADER),
        write(tmp_path / "crlf.py", HEADER + "\r\nx = 1\r\n"),
        write(tmp_path / "__init__.py", ""),
    ]
    proc = run(*files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_bad_files_are_listed(tmp_path):
    good = write(tmp_path / "good.py", HEADER + "\n")
    bad = [
        write(tmp_path / "missing.py", "import os\n"),
        write(tmp_path / "second_line.py", '"""Doc."""\n' + HEADER + "\n"),
        write(tmp_path / "wrong_year.py", HEADER.replace("2026", "2025") + "\n"),
        write(tmp_path / "shebang_only.py", "#!/usr/bin/env python\n"),
        write(tmp_path / "indented.py", "  " + HEADER + "\n"),
    ]
    proc = run(good, *bad)
    assert proc.returncode == 1
    listed = [line.split(": ")[0].strip() for line in proc.stdout.splitlines()[1:]]
    assert listed == bad


def test_missing_file_is_an_error(tmp_path):
    proc = run(str(tmp_path / "nope.py"))
    assert proc.returncode == 2
    assert "nope.py" in proc.stderr


def test_no_args_checks_tracked_files_of_this_repo():
    proc = run(cwd="/")
    assert proc.returncode in (0, 1)
    assert "no such file" not in proc.stderr
    for line in proc.stdout.splitlines()[1:]:
        assert line.strip().split(": ")[0].endswith(".py")


def test_no_args_checks_git_tracked_python_files(tmp_path):
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "check_header.py"
    shutil.copy(SCRIPT, script)
    write(tmp_path / "tracked_good.py", HEADER + "\n")
    write(tmp_path / "tracked_bad.py", "x = 1\n")
    write(tmp_path / "untracked_bad.py", "x = 1\n")
    write(tmp_path / "notes.txt", "no header\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    tracked = ["scripts", "tracked_good.py", "tracked_bad.py", "notes.txt"]
    subprocess.run(["git", "add", *tracked], cwd=tmp_path, check=True)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd="/", timeout=30)
    assert proc.returncode == 1
    listed = [Path(line.strip().split(": ")[0]).name for line in proc.stdout.splitlines()[1:]]
    assert listed == ["tracked_bad.py"]
