# Copyright (c) 2026 fla_bwd authors. SPDX-License-Identifier: MIT
"""`fla_bwd.settings`: the per-call settings follow every way of changing the environment in-process."""

import os
from unittest import mock

import pytest

from fla_bwd import settings


def test_reads_follow_os_environ(monkeypatch):
    monkeypatch.delenv("FLA_BWD_DKV_PATH", raising=False)
    assert settings.forced_dkv_path() == "auto"
    monkeypatch.setenv("FLA_BWD_DKV_PATH", "gqa")
    assert settings.forced_dkv_path() == "gqa"
    os.environ["FLA_BWD_DKV_PATH"] = "gqa-split2"
    assert settings.forced_dkv_path() == "gqa-split2"
    del os.environ["FLA_BWD_DKV_PATH"]
    assert settings.forced_dkv_path() == "auto"
    os.environ.update({"FLA_BWD_CONTAINMENT": "inline", "FLA_BWD_DS_BUDGET_MIB": "2"})
    assert (settings.forced_containment(), settings.ds_budget_bytes()) == ("inline", 2 << 20)
    with mock.patch.dict(os.environ, clear=True):
        assert (settings.forced_containment(), settings.ds_budget_bytes()) == ("auto", 1024 << 20)
        os.environ["FLA_BWD_DQ_PATH"] = "from-ds"
        assert settings.forced_dq_path() == "from-ds"
    assert settings.forced_dq_path() == os.environ.get("FLA_BWD_DQ_PATH", "auto")
    del os.environ["FLA_BWD_CONTAINMENT"], os.environ["FLA_BWD_DS_BUDGET_MIB"]
    with settings.dq_path("recompute"):
        monkeypatch.setenv("FLA_BWD_DQ_PATH", "from-ds")
        assert settings.forced_dq_path() == "recompute"  # a `with` block overrides the variable


def test_reads_through_a_replaced_environ(monkeypatch):
    """A stand-in for os.environ (a plain dict) is read through its own `get`."""
    monkeypatch.setattr(os, "environ", {"FLA_BWD_DS_KERNEL": "triton", "FLA_BWD_CONTAINMENT": "bogus"})
    assert settings.forced_ds_kernel() == "triton"
    with pytest.raises(ValueError, match="FLA_BWD_CONTAINMENT must be one of"):
        settings.forced_containment()


def test_bad_values_name_the_variable(monkeypatch):
    monkeypatch.setenv("FLA_BWD_DS_KERNEL", "cuda")
    with pytest.raises(ValueError, match="FLA_BWD_DS_KERNEL must be one of"):
        settings.forced_ds_kernel()
    monkeypatch.setenv("FLA_BWD_DS_BUDGET_MIB", "-1")
    with pytest.raises(ValueError, match="FLA_BWD_DS_BUDGET_MIB must be a number"):
        settings.ds_budget_bytes()
