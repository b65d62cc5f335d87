# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""Shim for tools that still call setup.py; the package is described in pyproject.toml."""
from setuptools import setup

setup()
