# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
from setuptools import find_packages, setup

setup(
    name="fla_bwd",
    version="0.1.0",
    description="Triton causal softmax attention with a fast, exact, memory-lean backward",
    packages=find_packages(include=["fla_bwd", "fla_bwd.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.5", "triton>=3.6", "einops"],
    extras_require={"test": ["pytest", "pytest-benchmark"]},
)
