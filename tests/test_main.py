# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`python -m fla_bwd` (the environment report and self-check, `fla_bwd/__main__.py`) and the package's PEP 561
marker `py.typed`, shipped as package data."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fla_bwd

ROOT = Path(__file__).resolve().parents[1]


def _run(*args, env=None):
    """`python -m fla_bwd ARGS` in a fresh process (the interpreter chosen as a user's run would choose it)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FLA_BWD_")}
    environ.pop("TRITON_INTERPRET", None)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "fla_bwd", *args], capture_output=True, text=True, env=environ,
                          timeout=600)


def _fields(stdout: str) -> dict:
    """The report's `name: value` lines."""
    pairs = (line.split(": ", 1) for line in stdout.splitlines() if ": " in line and not line.startswith(" "))
    return {name: value.strip() for name, value in pairs}


def test_report_and_self_check_pass():
    r = _run()
    assert r.returncode == 0, r.stdout + r.stderr
    fields = _fields(r.stdout)
    assert fields["fla_bwd"].startswith(f"{fla_bwd.__version__} (")
    for name in ("Python", "torch", "Triton", "GPU", "Launch path", "Triton cache", "Settings"):
        assert name in fields, r.stdout
    assert "FLA_BWD_DKV_PATH=auto" in fields["Settings"] and "FLA_BWD_DS_BUDGET_MIB=1024" in fields["Settings"]
    lines = r.stdout.splitlines()
    assert lines[-1] == "PASS"
    assert [line.split()[0] for line in lines[-6:-1]] == ["o", "dq", "dk", "dv", "dg"]
    assert all(line.split()[-1] == "ok" for line in lines[-6:-1])
    import torch
    if not torch.cuda.is_available():
        assert fields["GPU"] == "no GPU: the interpreter (TRITON_INTERPRET=1) runs the kernels"
        assert "the interpreter runs every launch" in fields["Launch path"]


def test_no_check_reports_the_settings_in_effect():
    r = _run("--no-check", env={"FLA_BWD_DQ_PATH": "recompute", "FLA_BWD_DS_BUDGET_MIB": "64"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Self-check" not in r.stdout and "PASS" not in r.stdout
    settings = _fields(r.stdout)["Settings"]
    assert "FLA_BWD_DQ_PATH=recompute" in settings and "FLA_BWD_DS_BUDGET_MIB=64" in settings


def test_invalid_setting_fails():
    r = _run("--no-check", env={"FLA_BWD_DKV_PATH": "bogus"})
    assert r.returncode == 1
    assert "invalid: FLA_BWD_DKV_PATH must be one of" in _fields(r.stdout)["Settings"]


def test_self_check_fails_past_its_tolerance(capsys):
    """In this process (the interpreter already chosen by conftest): a zero tolerance fails every output."""
    from fla_bwd.__main__ import main

    assert main(["--tolerance", "0"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "FAIL"
    assert [line.split()[-1] for line in lines[-6:-1]] == ["FAIL"] * 5


def test_py_typed_in_the_package_and_its_package_data():
    """PEP 561: `py.typed` beside fla_bwd/__init__.py, and listed as package data so that wheels ship it."""
    assert (Path(fla_bwd.__file__).parent / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["fla_bwd"]
